"""Figures and tables of chapter 6 (side by side), kept out of the reading path.

The experiment is the one of Press et al. (2022), "Train Short, Test Long: Attention with Linear
Biases Enables Input Length Extrapolation": every scheme trained on short inputs, evaluated on
longer ones. Each function draws one figure in the book's style (:mod:`posenc.lab.plot`) or builds
one HTML table, from numbers the chapter has already computed. The words a figure draws come from
the chapter's figure text ``text`` (:mod:`posenc.lab.labels.ch06`, in the book's language); legend
entries name each scheme by ``text["schemes"][scheme]``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .. import plot

__all__ = ["html_table", "score_panels", "training_curves", "loss_by_length", "loss_by_position"]


def html_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, caption: str = ""):
    """An ``IPython.display.HTML`` table (Markdown tables do not survive ``display(Markdown)``).

    Cells are escaped; numbers are shown as given (format them first)."""
    from IPython.display import HTML

    def cells(tag: str, values: Sequence[object]) -> str:  # padded: output tables have none
        pad = 'style="padding: 0.2em 0.6em"'
        return "".join(f"<{tag} {pad}>{html.escape(str(v))}</{tag}>" for v in values)

    head = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return HTML(f"<table>{head}<thead><tr>{cells('th', header)}</tr></thead><tbody>{body}</tbody></table>")


def score_panels(panels: Sequence[tuple[str, Tensor]], causal: Tensor, text: Mapping[str, Any]):
    """2 x 2 heatmaps of toy score matrices ``[L, L]``; future keys (``~causal``) left blank."""
    fig, axes = plot.figure(2, 2, height=6.4, sharex=True, sharey=True)
    for ax, (title, s) in zip(axes.flat, panels, strict=True):
        shown = s.masked_fill(~causal, float("nan"))  # a causal model never sees future keys
        im = ax.imshow(shown, cmap=plot.SEQUENTIAL)
        ax.set_title(title)
        ax.grid(False)
        fig.colorbar(im, ax=ax, shrink=0.85)
    for ax in axes[1]:
        ax.set_xlabel(text["key_n"])
    for ax in axes[:, 0]:
        ax.set_ylabel(text["query_m"])
    return fig


def _smooth(values: Sequence[float], window: int) -> Tensor:
    v = torch.tensor(values, dtype=torch.float32)
    kernel = torch.ones(1, 1, window) / window
    return torch.nn.functional.conv1d(v[None, None], kernel)[0, 0]


def training_curves(histories: Mapping[str, Sequence[float]], text: Mapping[str, Any], *,
                    window: int = 25):
    """Training loss per step (running mean of ``window``), one line per scheme."""
    fig, ax = plot.figure(height=4.0)
    for s, h in histories.items():
        y = _smooth(h, window)
        x = torch.arange(len(y)) + window // 2
        ax.plot(x, y, label=text["schemes"][s], color=plot.SCHEME_COLORS.get(s))
    ax.set(xlabel=text["training_step"], ylabel=text["loss_nats"], ylim=(1.0, 3.5))
    ax.legend(ncol=2)
    return fig


def loss_by_length(losses: Mapping[str, Sequence[float]], lengths: Sequence[int], train_len: int,
                   text: Mapping[str, Any]):
    """Mean loss at each evaluation length (log axis), one line per scheme."""
    fig, ax = plot.figure(height=4.2)
    for s, ys in losses.items():
        ax.plot(lengths, ys, marker="o", label=text["schemes"][s], color=plot.SCHEME_COLORS.get(s))
    ax.axvline(train_len, color="grey", ls=":")
    ax.set_xscale("log")
    ax.set_xticks(lengths, [f"{n}\n({n // train_len}×)" for n in lengths])
    ax.minorticks_off()
    ax.set(xlabel=text["eval_length"], ylabel=text["mean_loss_nats"])
    ax.legend(ncol=2, loc="upper left")
    return fig


def _log_binned(per_position: Tensor, bins: int) -> tuple[list[float], list[float]]:
    """Mean of ``per_position`` in bins whose width grows with the position."""
    n = len(per_position)
    edges = sorted(set(torch.logspace(0, math.log10(n), bins).round().long().tolist()) | {0, n})
    pairs = list(zip(edges[:-1], edges[1:], strict=True))
    centres = [(a + b - 1) / 2 for a, b in pairs]
    means = [per_position[a:b].mean().item() for a, b in pairs]
    return centres, means


def loss_by_position(per_position: Mapping[str, Tensor], train_len: int, text: Mapping[str, Any], *,
                     bins: int = 24):
    """Loss at each position of a long input (log-binned), one line per scheme."""
    fig, ax = plot.figure(height=4.2)
    for s, pp in per_position.items():
        centres, means = _log_binned(pp, bins)
        ax.plot([c + 1 for c in centres], means, label=text["schemes"][s],
                color=plot.SCHEME_COLORS.get(s))
    ax.axvline(train_len, color="black", ls="--", lw=1)
    ax.set_xscale("log")
    n = len(next(iter(per_position.values())))
    ax.set(xlabel=text["position_in_input"].format(length=n), ylabel=text["loss_nats"])
    ax.legend(ncol=2)
    return fig
