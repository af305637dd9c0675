"""Explorable figures: a static figure's interactive twin, drawn by Plotly from precomputed frames.

A chapter computes every number with ``posenc`` for each value of the control (the base, the
width, ...), exactly as it computes its static figure, and hands the frames to :func:`explorable`.
The result is a Plotly figure whose slider (or drop-down menu) swaps in the precomputed data with
Plotly's own ``update`` method: nothing of the mathematics is written in JavaScript, and the figure
needs no kernel. It renders

- on the book's site (Jupyter Book 1 / myst-nb write the output's ``text/html``): Plotly's
  JavaScript is loaded once per page by this module's Sphinx extension (``setup`` below, listed in
  ``_config.yml``), from the CDN like MathJax, or from the installed ``plotly`` package when the
  build runs with ``POSENC_PLOTLYJS=local``;
- in JupyterLab (the ``application/vnd.plotly.v1+json`` output, drawn by the ``jupyterlab-plotly``
  renderer that the ``plotly`` package installs) and in Colab or the classic notebook (the
  ``text/html`` output loads Plotly from the CDN itself, once per page, when no Plotly is there).

Usage in a chapter::

    from posenc.lab import explore
    frames = [explore.Frame(label="10⁴", value=1e4, traces=[{"x": k, "y": f}], title="...")
              for ...]
    explore.explorable("ch03-offset", frames, names=["d = 128"], xlabel=..., ylabel=...,
                       control_label=text["base"])

Every frame's numbers travel in the figure (slider steps), so a test can operate the control in
a browser and read the plotted data back (``tests/test_explorables_browser.py``). The figure's
``layout.meta.posenc`` names the explorable and lists the control's values.

Style: the book's (:mod:`posenc.lab.plot`): the same colours, 14 px text (never below 12 px),
a white card that the site keeps white in dark mode (``book/_static/custom.css``), a width that
follows the page down to a 390 px phone, and a slider with a large grip and a tall rail under
the plot, where a thumb reaches it. Zooming and panning are off, so a finger that scrolls the
page over the figure scrolls the page.

What a figure can and cannot do (honestly):

- It shows only the frames the chapter computed: there is no value between two steps, and
  nothing is recomputed in the browser. Numbers are kept to ``digits`` significant digits
  (7 by default), which is what the chapters' cells check against posenc.
- Every frame travels in the page, so the page grows with frames x points (the browser test
  holds each page to 4 MB with plotly.js).
- The browser test taps every step of every *slider* and reads ``gd.data`` back; drop-down
  menus (``control="menu"``) are built and validated by plotly's Python schema but are not
  yet operated in the browser, and the heatmap's swapped tick labels (``xticktext`` /
  ``yticktext``) are checked in the figure's JSON, not read back from the page. Keyboard
  operation of the control is not tested.
- The accessible name (``label``) describes the figure; a screen reader does not hear the
  numbers of a step.
- Every argument is checked when the figure is built (a clear ``TypeError``/``ValueError``
  naming it: tests/test_bad_input_explore.py); changes a chapter makes to ``.figure``
  afterwards (a trace's colour or markers, a ``texttemplate``) are not checked here, only by
  plotly and the browser test.

The code lives in four modules, one concern each, whose public names this module re-exports
(import them from here): :mod:`~posenc.lab.explore_frames` (:class:`Frame` and the checks of
every argument), :mod:`~posenc.lab.explore_figures` (:func:`explorable`, :func:`heatmap`,
:func:`frame_data`), :mod:`~posenc.lab.explore_page` (:class:`Explorable`'s HTML, plotly.js and
the Sphinx extension ``setup``) and :mod:`~posenc.lab.explore_tree` (chapter 11's
:func:`speculative_tree`).
"""

from __future__ import annotations

from .explore_figures import COLORS as COLORS
from .explore_figures import FONT as FONT
from .explore_figures import explorable, frame_data, heatmap
from .explore_frames import Frame, power_label
from .explore_page import PLOTLYJS_ENV, Explorable, plotlyjs_url, setup
from .explore_page import dedupe_scripts as dedupe_scripts
from .explore_page import plotlyjs_file as plotlyjs_file
from .explore_page import plotlyjs_version as plotlyjs_version
from .explore_tree import speculative_tree as speculative_tree
from .explore_tree import tree_value as tree_value

__all__ = ["Frame", "Explorable", "explorable", "heatmap", "frame_data", "power_label",
           "plotlyjs_url", "PLOTLYJS_ENV", "setup"]
