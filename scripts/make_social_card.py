#!/usr/bin/env python
"""Draw the social card, ``book/_static/social-card.png``: the picture a link preview shows.

1200 x 630 px (the size OpenGraph previews expect), white, with the logo's waves
(:mod:`make_logo`), the book's title in both languages and the schemes it covers. The
Chinese title needs a CJK font (:func:`posenc.lab.plot.cjk_font`). Both editions' pages point
to this one image (``ogp_image`` in ``_config.yml`` and ``book/zh/_config.yml``).

Usage::

    python scripts/make_social_card.py    # rewrites the PNG (commit it)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_logo  # noqa: E402  (the waves and the colours)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "_static" / "social-card.png"
WIDTH, HEIGHT = 1200, 630
TITLE = "Positional Encodings,\nExplained and Tested"
TITLE_ZH = "位置编码：讲清楚，测明白"
SUBTITLE = "How Transformers know token order"
SCHEMES = "sinusoidal · RoPE · ALiBi · T5 bias · NoPE · long context"


def draw(path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from posenc.lab.plot import cjk_font

    fig = plt.figure(figsize=(WIDTH / 100, HEIGHT / 100), dpi=100, facecolor="white")
    band = plt.matplotlib.patches.Rectangle((0, 0), 1, 0.035, transform=fig.transFigure,
                                            facecolor=make_logo.COLORS[0], zorder=-1)  # fmt: skip
    fig.patches.append(band)
    ax = fig.add_axes((0.04, 0.22, 0.26, 0.56))
    make_logo._waves(ax, line_width=6, dot_size=12)
    ink = make_logo.INK
    fig.text(0.35, 0.76, TITLE, color=ink, fontsize=40, fontweight="bold", va="top", linespacing=1.15)
    fig.text(0.35, 0.45, TITLE_ZH, color=ink, fontsize=32, va="top", family=cjk_font())
    fig.text(0.35, 0.32, SUBTITLE, color="#374151", fontsize=24, va="top")
    fig.text(0.35, 0.21, SCHEMES, color="#4b5563", fontsize=19, va="top")
    fig.text(0.04, 0.12, "posenc", color=ink, fontsize=30, fontweight="bold", va="center")
    fig.savefig(path, dpi=100, facecolor="white", metadata=make_logo._META)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the PNG")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    draw(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
