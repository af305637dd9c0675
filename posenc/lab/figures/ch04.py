"""Figures of chapter 4 (RoPE; Su et al., 2024, "RoFormer"), drawn in the book's style.

Each function takes the tensors the chapter computed and returns the matplotlib figure; the
chapter's cells call them with ``hide-input`` so a reader sees the figure, not the plotting.
Every word a figure draws comes from ``text``, the chapter's labels in the book's language
(``posenc.lab.labels.labels("ch04", LANG)``); English when it is not given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .. import plot
from ..labels import labels

__all__ = ["rotating_query", "fixed_offset_scores", "rotation_angles", "wavelengths",
           "score_grid", "score_profile", "decay_bound", "bf16_errors"]

_ROPE = plot.SCHEME_COLORS["rope"]
_DARK = "#0072B2"


def _text(text: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return labels("ch04", "en") if text is None else text


def _cmap_colors(k: int) -> list:
    """``k`` colours of the book's sequential map (after :func:`plot.figure`, which registers it
    and keeps the language's font; calling ``use_book_style()`` here would reset it to English)."""
    import matplotlib as mpl

    cmap = mpl.colormaps[plot.SEQUENTIAL]
    return [cmap(i / max(k - 1, 1)) for i in range(k)]


def rotating_query(rq: Tensor, q: Tensor, theta: float, count: int = 8,
                   text: Mapping[str, Any] | None = None):
    """Arrows of the query rotated to positions ``0 .. count - 1`` (rows of ``rq``: ``[P, 2]``)."""
    text = _text(text)
    fig, ax = plot.figure(height=5.2)
    colors = _cmap_colors(count)
    pts = rq[:count].detach().cpu()
    r = float(torch.linalg.vector_norm(q))
    t = torch.linspace(0, 2 * math.pi, 200)
    ax.plot(r * t.cos(), r * t.sin(), color="0.6", lw=1, zorder=0)
    for m in range(count):
        ax.annotate("", xy=pts[m].tolist(), xytext=(0, 0),
                    arrowprops={"arrowstyle": "->", "color": colors[m], "lw": 2.5})
        ax.text(*(1.2 * pts[m]).tolist(), f"m={m}", color=colors[m], ha="center", va="center")
    ax.set_aspect("equal")
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.5, 1.5)
    ax.set_xlabel(text["channel_0"])
    ax.set_ylabel(text["channel_1"])
    ax.set_title(text["circle_title"].format(last=count - 1, theta=theta))
    return fig


def fixed_offset_scores(scores: Tensor, offsets: range = range(4), count: int = 24,
                        text: Mapping[str, Any] | None = None):
    """``scores[m, m + offset]`` against ``m``: flat lines, one per offset."""
    text = _text(text)
    fig, ax = plot.figure()
    colors = _cmap_colors(len(offsets))
    ms = torch.arange(count)
    for color, off in zip(colors, offsets, strict=True):
        ax.plot(ms, scores[ms, ms + off].detach().cpu(), "o-", ms=4, color=color,
                label=f"n − m = {off}")
    ax.set_xlabel(text["query_position_m"])
    ax.set_ylabel(text["score"])
    ax.set_title(text["fixed_offset_title"])
    ax.legend(ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return fig


def rotation_angles(angles: Tensor, text: Mapping[str, Any] | None = None):
    """Heatmap of ``cos(m * theta_i)``: pairs on the y axis, positions on the x axis."""
    text = _text(text)
    fig, ax = plot.figure(height=4.0)
    im = ax.imshow(angles.cos().T.detach().cpu(), aspect="auto", cmap=plot.DIVERGING,
                   vmin=-1, vmax=1, origin="lower", interpolation="nearest")
    ax.grid(False)
    ax.set_xlabel(text["position_m"])
    ax.set_ylabel(text["pair_i"])
    ax.set_title(f"cos(m θ_i), d = {2 * angles.shape[-1]}")
    fig.colorbar(im, ax=ax, label=text["cosine"])
    return fig


def wavelengths(wavelength: Tensor, window: int, text: Mapping[str, Any] | None = None):
    """Tokens per full turn of each pair (log scale), with a line at ``window`` tokens."""
    text = _text(text)
    fig, ax = plot.figure()
    ax.semilogy(range(len(wavelength)), wavelength.detach().cpu(), "o-", ms=4, color=_ROPE,
                label="2π / θ_i")
    ax.axhline(window, color="0.4", ls="--", label=text["window_line"].format(window=window))
    ax.set_xlabel(text["pair_i"])
    ax.set_ylabel(text["tokens_per_turn"])
    ax.set_title(text["wavelength_title"])
    ax.legend(loc="upper left")
    return fig


def score_grid(S: Tensor, text: Mapping[str, Any] | None = None):
    """The ``[m, n]`` grid of scores of one query and one key at every position pair."""
    text = _text(text)
    fig, ax = plot.figure(height=5.2)
    vmax = S.abs().max().item()
    im = ax.imshow(S.detach().cpu(), cmap=plot.DIVERGING, vmin=-vmax, vmax=vmax)
    ax.grid(False)
    ax.set_xlabel(text["key_position_n"])
    ax.set_ylabel(text["query_position_m"])
    ax.set_title(text["grid_title"])
    fig.colorbar(im, ax=ax, label=text["score"])
    return fig


def score_profile(offsets: Tensor, profile: Tensor, text: Mapping[str, Any] | None = None):
    """Score against the offset ``n - m``: one number per diagonal of the grid."""
    text = _text(text)
    fig, ax = plot.figure()
    ax.plot(offsets.cpu(), profile.detach().cpu(), color=_ROPE)
    ax.axhline(0, color="0.5", lw=1)
    ax.set_xlabel(text["offset_n_m"])
    ax.set_ylabel(text["score"])
    ax.set_title(text["profile_title"])
    return fig


def decay_bound(dist: Tensor, bound: Tensor, near: float, d: int,
                text: Mapping[str, Any] | None = None):
    """RoFormer's relative upper bound against distance (log x), raw and in log-spaced bins."""
    text = _text(text)
    fig, ax = plot.figure(height=4.0)
    edges = torch.unique(torch.logspace(0, math.log10(len(dist)), 60).long())
    centers = (edges[:-1].double() * edges[1:].double()).sqrt()
    binned = [bound[a:b].mean().item() for a, b in zip(edges[:-1], edges[1:], strict=True)]
    ax.semilogx(dist[1:], bound[1:], color=_ROPE, lw=0.6, alpha=0.35, label=text["bound"])
    ax.semilogx(centers, binned, "o-", color=_DARK, ms=3, label=text["log_bins"])
    ax.axvspan(1000, 2000, color="0.5", alpha=0.2, label=text["far_band"])
    ax.axhline(near, color="0.3", ls="--", lw=1, label=text["near_mean"])
    ax.set_xlabel(text["distance_log"])
    ax.set_ylabel(text["relative_bound"])
    ax.set_title(text["decay_title"].format(d=d))
    ax.legend(loc="lower left", fontsize=plot.FONT_SIZE - 2)
    return fig


def bf16_errors(positions: Tensor, err_bf16: Tensor, err_f32: Tensor, eps: float,
                floor: float = 1e-5, text: Mapping[str, Any] | None = None):
    """Largest error of cos/sin per position: bf16 angles vs float32 angles cast to bf16."""
    text = _text(text)
    fig, ax = plot.figure(height=4.0)
    ax.semilogy(positions, err_bf16.clamp_min(floor), color=_ROPE, lw=1, label=text["bf16_angles"])
    ax.semilogy(positions, err_f32.clamp_min(floor), color=_DARK, lw=1,
                label=text["f32_angles"])
    ax.axhline(eps, color="0.3", ls="--", lw=1, label=text["bf16_eps"])
    ax.set_xlabel(text["position_m"])
    ax.set_ylabel(text["max_error"])
    ax.set_title(text["bf16_title"])
    ax.legend(loc="lower right", fontsize=plot.FONT_SIZE - 2)
    return fig
