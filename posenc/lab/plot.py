"""The book's figure style: one look for every chapter, legible on a desktop and on a phone.

Figures are drawn 6.4 inches wide at 100 dpi (640 px, about the page's text width) with 13 pt
text (18 px). On a 390 px phone the image shrinks to about 360 px and the text stays above 10 px.
Colour maps never end in near-white, which vanishes on a white page: :data:`SEQUENTIAL` is viridis
without its last, pale-yellow tenth, :data:`DIVERGING` is ``RdBu_r`` (its white is the centre of
the scale, never an end).

Usage in a chapter::

    from posenc.lab import plot
    plot.use_book_style()
    fig, ax = plot.figure()            # 6.4 x 3.6 in
"""

from __future__ import annotations

from typing import Any

WIDTH = 6.4  # inches; 640 px at 100 dpi
HEIGHT = 3.6
DPI = 100
FONT_SIZE = 13

BOOK_STYLE: dict[str, Any] = {
    "figure.figsize": (WIDTH, HEIGHT),
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "font.size": FONT_SIZE,
    "axes.titlesize": FONT_SIZE,
    "axes.labelsize": FONT_SIZE,
    "xtick.labelsize": FONT_SIZE - 1,
    "ytick.labelsize": FONT_SIZE - 1,
    "legend.fontsize": FONT_SIZE - 1,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 2.0,
    "image.cmap": "posenc_sequential",
    "figure.constrained_layout.use": True,
}

# scheme -> colour, the same in every figure of the book (Okabe-Ito, colour-blind safe, no yellow)
SCHEME_COLORS: dict[str, str] = {
    "sinusoidal": "#0072B2",
    "learned": "#56B4E9",
    "rope": "#D55E00",
    "alibi": "#009E73",
    "t5": "#CC79A7",
    "nope": "#555555",
    "irope": "#E69F00",
}

DIVERGING = "RdBu_r"
"""The diverging colour map, matplotlib's ``RdBu_r`` (white at the centre of the scale)."""
SEQUENTIAL = "posenc_sequential"
"""The sequential colour map, viridis without its pale-yellow last tenth (registered by
:func:`use_book_style`)."""


def _register_colormaps() -> None:
    import matplotlib as mpl
    from matplotlib.colors import ListedColormap

    if SEQUENTIAL in mpl.colormaps:
        return
    viridis = mpl.colormaps["viridis"]
    colors = viridis([i / 255 * 0.9 for i in range(256)])  # stop before the pale yellow end
    mpl.colormaps.register(ListedColormap(colors, name=SEQUENTIAL))


def use_book_style() -> None:
    """Apply the book's matplotlib settings (and register :data:`SEQUENTIAL`)."""
    import matplotlib.pyplot as plt

    _register_colormaps()
    plt.style.use(BOOK_STYLE)  # rcParams.update for these keys; typed to take a dict[str, Any]


def figure(nrows: int = 1, ncols: int = 1, *, height: float = HEIGHT, **kwargs: Any) -> tuple[Any, Any]:
    """``plt.subplots`` at the book's width (``height`` in inches): ``(fig, ax)``, where ``ax`` is
    one Axes or an array of them, as matplotlib returns it (typed ``Any`` for that reason)."""
    import matplotlib.pyplot as plt

    use_book_style()
    return plt.subplots(nrows, ncols, figsize=(WIDTH, height), **kwargs)
