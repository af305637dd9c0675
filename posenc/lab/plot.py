"""The book's figure style: one look for every chapter, legible on a desktop and on a phone.

Figures are drawn 6.4 inches wide at 100 dpi (640 px, about the page's text width) with 13 pt
text (18 px). On a 390 px phone the image shrinks to about 360 px and the text stays above 10 px.
They are rendered at twice that resolution (:data:`SAVE_DPI`; in a notebook the inline backend's
``"retina"`` format: a 1280 px PNG shown 640 px wide), so they stay sharp on high-density screens.
Colour maps never end in near-white, which vanishes on a white page: :data:`SEQUENTIAL` is viridis
without its last, pale-yellow tenth, :data:`DIVERGING` is ``RdBu_r`` (its white is the centre of
the scale, never an end).

Usage in a chapter::

    from posenc.lab import plot
    plot.use_book_style(lang=LANG)     # "en", or "zh" for the Chinese edition
    fig, ax = plot.figure()            # 6.4 x 3.6 in

The Chinese edition draws its labels in a CJK font (Noto Sans CJK SC from Debian's
``fonts-noto-cjk``, or another CJK sans-serif font that fontconfig knows); Latin text and digits
come from the same font, so a figure mixes the two scripts without missing glyphs. In Google Colab,
whose matplotlib has no CJK font, :func:`cjk_font` installs ``fonts-noto-cjk`` with apt-get the
first time; anywhere else a missing font raises an error that says how to install one.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

WIDTH = 6.4  # inches; 640 px at 100 dpi
HEIGHT = 3.6
DPI = 100
SAVE_DPI = 200
"""Dots per inch of saved and inline figures, twice ``DPI``, so they stay sharp on a
high-density screen."""
FONT_SIZE = 13

BOOK_STYLE: dict[str, Any] = {
    "figure.figsize": (WIDTH, HEIGHT),
    "figure.dpi": DPI,
    "savefig.dpi": SAVE_DPI,
    "figure.facecolor": "white",  # never transparent: dark ink needs its white page in dark mode
    "savefig.facecolor": "white",
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

# CJK sans-serif fonts, best first: matplotlib uses the first one it has (each covers Latin too)
CJK_FONTS = (
    "Noto Sans CJK SC",
    "Source Han Sans SC",
    "Noto Sans SC",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Microsoft YaHei",
    "PingFang SC",
)
LANGS = ("en", "zh")

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


CJK_PACKAGE = "fonts-noto-cjk"  # Debian's and Ubuntu's package of Noto Sans CJK (SC among them)
INSTALL_HINT = (
    "install one and run this again: `sudo apt-get install fonts-noto-cjk` (Debian, Ubuntu), "
    "`sudo dnf install google-noto-sans-cjk-fonts` (Fedora), "
    "`brew install --cask font-noto-sans-cjk-sc` (macOS); Windows has Microsoft YaHei"
)


def _in_colab() -> bool:
    return "google.colab" in sys.modules


def _install_cjk_font() -> None:
    """Install Debian's ``fonts-noto-cjk`` with apt-get (Colab runs as root), updating the package
    lists first only when the plain install fails. Raises ``RuntimeError`` with apt's message."""
    print(f"installing a CJK font for the Chinese figures (apt-get install {CJK_PACKAGE}) ...")
    install = ["apt-get", "install", "-y", "-q", CJK_PACKAGE]
    if subprocess.run(install, capture_output=True).returncode == 0:
        return
    subprocess.run(["apt-get", "update", "-q"], capture_output=True)
    done = subprocess.run(install, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"apt-get install {CJK_PACKAGE} failed: {done.stderr.strip()[-500:]}")


def _find_cjk_font() -> str | None:
    """The first of ``CJK_FONTS`` that matplotlib's font manager has, after adding the CJK font
    files of fontconfig's directories that its font cache (built earlier) does not list."""
    from matplotlib import font_manager

    def installed() -> str | None:
        names = {font.name for font in font_manager.fontManager.ttflist}
        return next((name for name in CJK_FONTS if name in names), None)

    name = installed()
    if name is None:
        known = {font.fname for font in font_manager.fontManager.ttflist}
        for path in font_manager.findSystemFonts():
            lower = path.lower()
            if path not in known and any(
                key in lower for key in ("cjk", "sourcehansans", "wqy", "notosanssc")
            ):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):  # unreadable file: skip it
                    continue
        name = installed()
    return name


def cjk_font() -> str:
    """The name of an installed CJK sans-serif font (the first of ``CJK_FONTS`` found).

    Fonts installed after matplotlib built its font cache are not in it; then the CJK font files
    that fontconfig's directories hold are added to matplotlib's font manager first. In Google
    Colab, which has none, Debian's ``fonts-noto-cjk`` is installed with apt-get (once, about half
    a minute) and registered. Anywhere else ``RuntimeError`` says how to install one.
    """
    name = _find_cjk_font()
    if name is None and _in_colab():
        _install_cjk_font()
        name = _find_cjk_font()
    if name is None:
        raise RuntimeError(
            "no CJK font found for the Chinese figures (looked for "
            f"{', '.join(CJK_FONTS)}); {INSTALL_HINT}"
        )
    return name


def _sharp_inline_figures() -> None:
    """In a Jupyter kernel, show figures as ``"retina"`` PNGs: twice the pixels, drawn at the
    figure's size (the PNG carries its 1x width and height, which the book's pages keep)."""
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    if shell is None or not hasattr(shell, "kernel"):  # a plain Python process or a terminal
        return
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # pragma: no cover - ipykernel always brings it
        return
    set_matplotlib_formats("retina")


_current_lang = "en"


def use_book_style(lang: str = "en") -> None:
    """Apply the book's matplotlib settings (and register :data:`SEQUENTIAL`); in a notebook, figures
    are shown at twice the pixel density (``"retina"`` PNGs).

    ``lang="zh"`` puts a CJK font (:func:`cjk_font`) first in ``font.sans-serif`` so that Chinese
    titles, labels and legends render; :func:`figure` keeps the language last set here.
    """
    global _current_lang
    if not isinstance(lang, str) or lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    try:
        import matplotlib
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            "posenc.lab.plot needs matplotlib: pip install 'posenc[plot]'"
        ) from err

    _register_colormaps()
    _sharp_inline_figures()
    plt.style.use(BOOK_STYLE)  # rcParams.update for these keys; typed to take a dict[str, Any]
    plt.rcParams["axes.unicode_minus"] = True  # U+2212, which DejaVu and Noto CJK both have
    if lang == "zh":
        plt.rcParams["font.family"] = "sans-serif"
        plt.rcParams["font.sans-serif"] = [cjk_font(), "DejaVu Sans"]
    else:
        plt.rcParams["font.sans-serif"] = matplotlib.rcParamsDefault["font.sans-serif"]
    _current_lang = lang


def figure(nrows: int = 1, ncols: int = 1, *, height: float = HEIGHT, **kwargs: Any) -> tuple[Any, Any]:
    """``plt.subplots`` at the book's width (``height`` in inches), in the current language:
    ``(fig, ax)``, where ``ax`` is one Axes or an array of them, as matplotlib returns it."""
    import matplotlib.pyplot as plt

    use_book_style(_current_lang)
    return plt.subplots(nrows, ncols, figsize=(WIDTH, height), **kwargs)
