"""Figures of chapter 5 (ALiBi; Press et al., 2022, "Train Short, Test Long"), in the book's style.

Each function takes the tensors the chapter computed and the chapter's figure text ``text``
(``posenc.lab.labels.labels("ch05", LANG)``) and returns the matplotlib figure; the chapter's
cells call them with ``hide-input``. The head slope is written ``lambda_h`` (the paper's
``m``; the book keeps ``m`` for the query position).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .. import plot

__all__ = ["slopes_vs_article", "bias_heatmaps", "log_weights", "window_share", "bias_memory"]

_ALIBI = plot.SCHEME_COLORS["alibi"]
_OTHER = "#D55E00"


def _cmap_colors(k: int) -> list:
    """``k`` colours of the book's sequential map; call after ``plot.figure`` (which registers it
    and keeps the language's font; ``use_book_style()`` here would reset it to English)."""
    import matplotlib as mpl

    cmap = mpl.colormaps[plot.SEQUENTIAL]
    return [cmap(i / max(k - 1, 1)) for i in range(k)]


def slopes_vs_article(paper: Tensor, article: Tensor, text: Mapping[str, Any]):
    """Slope per head (log2 scale): the paper's rule against the article's ``1 / 2**i``."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = plot.figure(height=4.0)
    heads = torch.arange(len(paper))
    ax.plot(heads, paper, "o-", color=_ALIBI, label=text["paper"])
    ax.plot(heads, article, "s--", color=_OTHER, label=text["article"])
    ax.set_yscale("log", base=2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(text["head_index"])
    ax.set_ylabel(text["slope_log"])
    ax.set_title(text["slopes_title"].format(heads=len(paper)))
    ax.legend(loc="lower left")
    return fig


def bias_heatmaps(bias: Tensor, slopes: Tensor, shown: tuple[int, ...], text: Mapping[str, Any]):
    """One heatmap per head in ``shown`` (a 2 x 2 grid), future keys in grey, one colour bar."""
    import matplotlib as mpl

    fig, axes = plot.figure(2, 2, height=5.6, sharex=True, sharey=True)
    cmap = mpl.colormaps[plot.SEQUENTIAL].copy()
    cmap.set_bad("0.85")  # future keys (-inf): masked
    finite = bias[list(shown)].clamp_min(-1e30)
    vmin = finite[finite > -1e30].min().item()
    for ax, h in zip(axes.flat, shown, strict=True):
        img = ax.imshow(torch.where(bias[h].isinf(), math.nan, bias[h]), cmap=cmap,
                        vmin=vmin, vmax=0)
        ax.grid(False)
        ax.set_title(text["head_slope"].format(head=h, inverse=round(1 / slopes[h].item())))
    for ax in axes[1]:
        ax.set_xlabel(text["key_n"])
    for ax in axes[:, 0]:
        ax.set_ylabel(text["query_m"])
    fig.colorbar(img, ax=axes, label=text["bias"], shrink=0.8)
    return fig


def log_weights(log_w: Tensor, slopes: Tensor, L_train: int, text: Mapping[str, Any],
                dmax: int = 600):
    """log10 attention weight against the distance, one line per head."""
    fig, ax = plot.figure(height=5.2)
    colors = _cmap_colors(len(slopes))
    for h in range(len(slopes)):
        ax.plot(range(dmax), log_w[h, :dmax], color=colors[h], label=f"{h}")
    ax.axvline(L_train, color="0.2", ls="--", lw=1)
    ax.text(L_train - 8, -45, text["training_length"], ha="right")
    ax.set_ylim(-50, 0.5)
    ax.set_xlabel(text["distance"])
    ax.set_ylabel(text["log10_weight"])
    ax.set_title(text["log_weights_title"])
    ax.legend(title=text["head"], ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    return fig


def window_share(frac: dict[int, Tensor], limit: Tensor, L_train: int, text: Mapping[str, Any]):
    """Bars: share of attention within the last ``L_train`` keys, per head and length."""
    fig, ax = plot.figure(height=4.4)
    lengths = list(frac)
    colors = _cmap_colors(len(lengths) + 1)
    width = 0.8 / len(lengths)
    H = len(limit)
    for k, L in enumerate(lengths):
        offset = (k - (len(lengths) - 1) / 2) * width
        ax.bar(torch.arange(H) + offset, frac[L], width, color=colors[k],
               label=text["length"].format(length=L))
    ax.plot(range(H), limit, "_", color="0.1", ms=20, mew=2, label="L → ∞")
    ax.set_xlabel(text["head"])
    ax.set_ylabel(text["share_last"].format(keys=L_train))
    ax.set_title(text["window_title"])
    ax.set_ylim(0, 1.45)
    ax.legend(ncol=2, loc="upper right")
    return fig


def bias_memory(sizes: dict[str, int], title: str, text: Mapping[str, Any]):
    """Horizontal bars of bytes (log scale) for each way of holding the bias."""
    fig, ax = plot.figure(height=3.6)
    values = list(sizes.values())
    names = [text["memory_rows"][name] for name in sizes]
    bars = ax.barh(names, values, color=_cmap_colors(len(sizes)))
    ax.set_xscale("log")
    ax.set_xlabel(text["bytes_log"])
    ax.set_title(title)
    labels = [f"{s / 2**30:.3g} GiB" if s > 2**20 else f"{s} B" for s in values]
    ax.bar_label(bars, labels=labels, padding=4)
    ax.set_xlim(10, 1e13)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    return fig
