#!/usr/bin/env python
"""Draw the book's logo and favicon: ``book/_static/logo.png`` and ``book/_static/favicon.png``.

The picture is the book's first idea: a position written as waves of many frequencies (the
sinusoidal table's "rulers"), fast to slow, in the scheme colours of :mod:`posenc.lab.plot`,
with a dot marking one position on every wave. The logo adds the word ``posenc``.

Usage::

    python scripts/make_logo.py    # rewrites both PNGs (commit them)
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "_static"

# Okabe-Ito, as posenc.lab.plot.SCHEME_COLORS (sinusoidal, rope, alibi): no near-white, no yellow
COLORS = ("#0072B2", "#D55E00", "#009E73")
INK = "#1f2937"
POSITION = 0.62  # where the dots sit, as a fraction of the width
_META = {"Software": None}  # no version string: the same input draws the same bytes


def _waves(ax: plt.Axes, *, line_width: float, dot_size: float) -> None:
    """Three sinusoids, fast to slow (periods 1/3, 2/3, 4/3 of the width), stacked."""
    n = 400
    xs = [i / (n - 1) for i in range(n)]
    for row, (color, period) in enumerate(zip(COLORS, (1 / 3, 2 / 3, 4 / 3), strict=True)):
        y0 = 2 - row
        ys = [y0 + 0.38 * math.sin(2 * math.pi * x / period) for x in xs]
        ax.plot(xs, ys, color=color, lw=line_width, solid_capstyle="round")
        ax.plot(
            [POSITION], [y0 + 0.38 * math.sin(2 * math.pi * POSITION / period)], "o", color=INK, ms=dot_size
        )
    ax.axvline(POSITION, color=INK, lw=line_width * 0.35, alpha=0.5, zorder=0)
    ax.set_xlim(-0.04, 1.04)
    ax.set_ylim(-0.55, 2.55)
    ax.axis("off")


def draw_logo(path: Path) -> None:
    """400 x 140 px: the waves on the left, the word on the right (transparent background)."""
    fig = plt.figure(figsize=(4.0, 1.4), dpi=100)
    ax = fig.add_axes((0.02, 0.06, 0.36, 0.88))
    _waves(ax, line_width=2.6, dot_size=5)
    fig.text(0.42, 0.5, "posenc", color=INK, fontsize=40, fontweight="bold", va="center", ha="left")
    fig.savefig(path, transparent=True, metadata=_META)
    plt.close(fig)


def draw_favicon(path: Path) -> None:
    """64 x 64 px: the waves alone, on a white rounded tile so they read on dark tab bars."""
    fig = plt.figure(figsize=(0.64, 0.64), dpi=100)
    tile = plt.matplotlib.patches.FancyBboxPatch(
        (0.03, 0.03), 0.94, 0.94, boxstyle="round,pad=0,rounding_size=0.18",
        transform=fig.transFigure, facecolor="white", edgecolor=INK, linewidth=1.2, zorder=-1,
    )  # fmt: skip
    fig.patches.append(tile)
    ax = fig.add_axes((0.1, 0.12, 0.8, 0.76))
    _waves(ax, line_width=2.2, dot_size=2.2)
    fig.savefig(path, transparent=True, metadata=_META)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for logo.png and favicon.png")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    draw_logo(args.out / "logo.png")
    draw_favicon(args.out / "favicon.png")
    for name in ("logo.png", "favicon.png"):
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
