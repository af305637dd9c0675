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
"""

from __future__ import annotations

import html
import importlib
import json
import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import plot

__all__ = ["Frame", "Explorable", "explorable", "heatmap", "frame_data", "power_label",
           "plotlyjs_url", "PLOTLYJS_ENV", "setup"]

PLOTLYJS_ENV = "POSENC_PLOTLYJS"
"""Environment variable of the site build: ``cdn`` (the default, the published site) or
``local`` (copy ``plotly.min.js`` from the installed package into the build: no network)."""

FONT = 14  # px; tick labels 13 px, the slider's labels 13 px
COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#555555", "#E69F00", "#56B4E9"]
"""The book's Okabe-Ito colours, in the order the traces of an explorable get them."""
_FONT_FAMILY = ('"Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", "Microsoft YaHei", '
                "-apple-system, BlinkMacSystemFont, 'Segoe UI', Helvetica, Arial, sans-serif")


@dataclass
class Frame:
    """One setting of the control: its label, its value and the data of every trace.

    ``traces`` holds one mapping per trace with the arrays that change (``"y"``, and ``"x"``
    when it changes too); tensors and arrays are accepted and stored as lists of floats."""

    label: str
    value: float | int | str
    traces: Sequence[Mapping[str, Any]]
    title: str | None = None


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_label(value: float) -> str:
    """A short control label for a power of ten or a multiple of one: ``1e4`` -> ``10⁴``,
    ``5e5`` -> ``5·10⁵`` (short enough for six labels on a 390 px phone)."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"power_label needs a positive number, got {value!r}")
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = value / 10**exponent
    if not math.isclose(mantissa, round(mantissa), rel_tol=1e-9):
        return f"{value:g}"
    power = "10" + str(exponent).translate(_SUPERSCRIPT)
    return power if round(mantissa) == 1 else f"{round(mantissa)}·{power}"


def _floats(values: Any, digits: int) -> list[float]:
    """A tensor, an array or a sequence as a list of floats rounded to ``digits`` significant
    digits (JSON stays small; the frames are checked against posenc to that precision)."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().double().tolist()
    elif hasattr(values, "tolist"):
        values = values.tolist()
    out = []
    for v in values:
        v = float(v)
        if not math.isfinite(v):
            raise ValueError(f"explorable data must be finite, got {v!r}")
        out.append(float(f"{v:.{digits}g}"))
    return out


def plotlyjs_version() -> str:
    """The version of plotly.js that the installed ``plotly`` package bundles."""
    return str(importlib.import_module("plotly.offline").get_plotlyjs_version())


def plotlyjs_url() -> str:
    """The CDN address of the plotly.js that the installed ``plotly`` package bundles."""
    return f"https://cdn.plot.ly/plotly-{plotlyjs_version()}.min.js"


def plotlyjs_file() -> Path:
    """The installed package's ``plotly.min.js`` (what the offline build and the tests serve)."""
    package = Path(str(importlib.import_module("plotly").__file__)).parent
    return package / "package_data" / "plotly.min.js"


@dataclass
class Explorable:
    """A Plotly figure (``.figure``, a dict: data, layout, config) that shows itself in a
    notebook and on the site. ``.values`` are the control's values, one per frame."""

    name: str
    figure: dict[str, Any]
    values: list[Any] = field(default_factory=list)
    height: int = 460

    def to_json(self) -> str:
        return json.dumps(self.figure, ensure_ascii=False, separators=(",", ":"))

    def to_html(self) -> str:
        """A ``<div>``, the figure as JSON and a loader: Plotly from the page (the site), or from
        the CDN, loaded once per page (Colab, the classic notebook)."""
        div_id = "posenc-explorable-" + re.sub(r"[^A-Za-z0-9_-]", "-", self.name)
        spec = self.to_json().replace("</", "<\\/")  # never close the script tag early
        label = html.escape(self.figure["layout"]["meta"]["posenc"]["label"], quote=True)
        return f"""<div class="posenc-explorable" id="{div_id}" data-explorable="{html.escape(self.name)}"
 role="figure" aria-label="{label}" style="width:100%;min-height:{self.height}px"></div>
<script type="application/json" id="{div_id}-spec">{spec}</script>
<script>
(function () {{
  var id = "{div_id}";
  function draw() {{
    var spec = JSON.parse(document.getElementById(id + "-spec").textContent);
    window.Plotly.newPlot(id, spec.data, spec.layout, spec.config);
  }}
  if (window.Plotly) {{ draw(); return; }}
  var s = document.getElementById("posenc-plotlyjs");
  if (!s) {{
    s = document.createElement("script");
    s.id = "posenc-plotlyjs"; s.charset = "utf-8"; s.src = "{plotlyjs_url()}";
    document.head.appendChild(s);
  }}
  s.addEventListener("load", draw);
}})();
</script>"""

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {
            "application/vnd.plotly.v1+json": self.figure,
            "text/html": self.to_html(),
            "text/plain": f"<explorable figure {self.name!r}: {len(self.values)} settings>",
        }


def _axis(title: str, log: bool, range_: Sequence[float] | None) -> dict[str, Any]:
    axis: dict[str, Any] = {
        "title": {"text": title, "font": {"size": FONT}},
        "type": "log" if log else "linear",
        "tickfont": {"size": FONT - 1},
        "fixedrange": True,  # no zoom or pan: a finger on the figure scrolls the page
        "gridcolor": "rgba(0,0,0,0.12)",
        "zeroline": False,
        "automargin": True,
        "showline": True,
        "linecolor": "#444",
    }
    if log:
        axis["dtick"] = 1  # 1, 10, 100, ...: no small minor labels between the decades
    if range_ is not None:
        axis["range"] = [math.log10(v) for v in range_] if log else list(range_)
        axis["autorange"] = False
    return axis


def explorable(
    name: str,
    frames: Sequence[Frame],
    *,
    names: Sequence[str],
    x: Any = None,
    xlabel: str,
    ylabel: str,
    control_label: str,
    label: str,
    active: int = 0,
    xlog: bool = False,
    ylog: bool = False,
    xrange: Sequence[float] | None = None,
    yrange: Sequence[float] | None = None,
    static: Sequence[Mapping[str, Any]] = (),
    control: str = "slider",
    digits: int = 7,
    height: int = 460,
) -> Explorable:
    """Line traces whose data follow a slider (``control="slider"``) or a drop-down menu
    (``"menu"``) over precomputed ``frames``.

    Args:
        name: a short id, unique in the page (``"ch03-offset"``).
        frames: one :class:`Frame` per setting of the control, each with the same number of
            traces as ``names``.
        names: the legend entry of each trace.
        x: the x values every trace shares, when the frames change ``"y"`` only.
        xlabel, ylabel, control_label: axis titles and the control's caption (from the chapter's
            labels in the book's language).
        label: what the figure shows, in words (its accessible name, ``aria-label``).
        active: the frame shown first (the static figure's setting).
        static: traces that do not change (a reference curve), as Plotly trace dicts.
        digits: significant digits kept in the JSON.
    """
    if not frames:
        raise ValueError("explorable needs at least one frame")
    if control not in ("slider", "menu"):
        raise ValueError(f"control must be 'slider' or 'menu', got {control!r}")
    if not 0 <= active < len(frames):
        raise ValueError(f"active must index the {len(frames)} frames, got {active}")
    for frame in frames:
        if len(frame.traces) != len(names):
            raise ValueError(f"frame {frame.label!r} has {len(frame.traces)} traces, names has "
                             f"{len(names)}")
    n = len(names)
    changing = sorted({key for frame in frames for trace in frame.traces for key in trace})
    if not set(changing) <= {"x", "y"}:
        raise ValueError(f"frames may change 'x' and 'y' only, got {changing}")
    if "x" not in changing and x is None:
        raise ValueError("give x= (shared by every trace) or an 'x' in every frame's traces")
    encoded = [{key: [_floats(trace[key], digits) for trace in frame.traces] for key in changing}
               for frame in frames]
    data: list[dict[str, Any]] = [dict(t) for t in static]  # drawn under the changing traces
    for i, trace_name in enumerate(names):
        trace: dict[str, Any] = {"type": "scatter", "mode": "lines", "name": trace_name,
                                 "line": {"color": COLORS[i % len(COLORS)], "width": 2.5}}
        for key in ("x", "y"):
            trace[key] = encoded[active][key][i] if key in changing else _floats(x, digits)
        data.append(trace)
    trace_ids = list(range(len(static), len(static) + n))

    def args(k: int) -> list[Any]:
        restyle = dict(encoded[k])
        relayout = {"title.text": frames[k].title} if frames[k].title is not None else {}
        return [restyle, relayout, trace_ids]

    layout: dict[str, Any] = {
        "font": {"size": FONT, "family": _FONT_FAMILY, "color": "#222"},
        "paper_bgcolor": "#fff",
        "plot_bgcolor": "#fff",
        "height": height,
        "autosize": True,
        # r: room for half of the last tick label ("600") at the right edge
        "margin": {"l": 60, "r": 24, "t": 56 if frames[active].title else 16, "b": 10},
        "xaxis": _axis(xlabel, xlog, xrange),
        "yaxis": _axis(ylabel, ylog, yrange),
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom",
                   "font": {"size": FONT - 1}, "bgcolor": "rgba(255,255,255,0.8)"},
        "dragmode": False,
        "hovermode": "x unified",
        "meta": {"posenc": {"name": name, "label": label, "control": control,
                            "values": [f.value for f in frames],
                            "traces": trace_ids,  # the indices of the traces that change
                            "labels": [f.label for f in frames]}},
    }
    if frames[active].title:
        layout["title"] = {"text": frames[active].title, "x": 0, "xanchor": "left",
                           "font": {"size": FONT + 1}}
        layout["legend"]["y"] = 1.02
    steps = [{"method": "update", "label": f.label, "args": args(k)} for k, f in enumerate(frames)]
    if control == "slider":
        layout["sliders"] = [{
            "active": active,
            "steps": steps,
            "currentvalue": {"prefix": control_label + " = ", "font": {"size": FONT + 1},
                             "xanchor": "left"},
            "x": 0.0, "len": 1.0, "y": 0, "yanchor": "top",
            "pad": {"t": 56, "b": 10, "l": 12, "r": 12},
            "font": {"size": FONT - 1},
            "bgcolor": "#d9e6f2", "activebgcolor": "#0072B2", "bordercolor": "#0072B2",
            "borderwidth": 1, "ticklen": 6, "minorticklen": 3,
            "transition": {"duration": 0},
        }]
    else:
        layout["updatemenus"] = [{
            "type": "dropdown", "active": active, "buttons": steps,
            "x": 0, "xanchor": "left", "y": 0, "yanchor": "top", "pad": {"t": 56},
            "font": {"size": FONT}, "showactive": True,
        }]
        layout["annotations"] = [{"text": control_label, "showarrow": False, "xref": "paper",
                                  "yref": "paper", "x": 0, "y": 0, "yanchor": "bottom",
                                  "xanchor": "left", "yshift": -40, "font": {"size": FONT}}]
    config = {"responsive": True, "displayModeBar": False, "scrollZoom": False,
              "doubleClick": False, "showTips": False}
    figure = {"data": data, "layout": layout, "config": config}
    return Explorable(name, figure, [f.value for f in frames], height)


def _sequential_colorscale(stops: int = 11) -> list[list[Any]]:
    """The book's sequential map (:data:`plot.SEQUENTIAL`: viridis without its pale end) as a
    Plotly colour scale."""
    import matplotlib as mpl

    viridis = mpl.colormaps["viridis"]
    scale = []
    for i in range(stops):
        r, g, b, _ = viridis(i / (stops - 1) * 0.9)
        scale.append([i / (stops - 1), f"rgb({round(r * 255)},{round(g * 255)},{round(b * 255)})"])
    return scale


def _matrix(values: Any, digits: int) -> list[list[float | None]]:
    """A 2-D tensor or nested sequence as rows of floats; ``-inf`` and NaN (masked cells) become
    ``None``, which Plotly leaves undrawn (the masked colour shows through); ``+inf`` is refused."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().double().tolist()
    elif hasattr(values, "tolist"):
        values = values.tolist()
    rows = []
    for row in values:
        out: list[float | None] = []
        for v in row:
            v = float(v)
            if math.isnan(v) or v == -math.inf:
                out.append(None)
            elif math.isinf(v):
                raise ValueError(f"heatmap data may hold -inf (masked), not {v!r}")
            else:
                out.append(float(f"{v:.{digits}g}"))
        rows.append(out)
    return rows


def heatmap(
    name: str,
    frames: Sequence[Frame],
    *,
    x: Any,
    y: Any,
    xlabel: str,
    ylabel: str,
    zlabel: str,
    control_label: str,
    label: str,
    active: int = 0,
    zrange: Sequence[float] | None = None,
    masked_color: str = "#d9d9d9",
    reversed_y: bool = True,
    xticktext: Sequence[Sequence[str]] | None = None,
    yticktext: Sequence[Sequence[str]] | None = None,
    digits: int = 7,
    height: int = 480,
) -> Explorable:
    """A heatmap whose matrix follows a slider over precomputed ``frames`` (the twin of an
    ``imshow`` figure).

    Each frame holds one trace, ``{"z": matrix}`` (rows follow ``y``, columns ``x``); ``-inf``
    or NaN cells (a mask) are left undrawn and show ``masked_color``. ``zrange`` fixes the colour
    scale for every frame (one scale, as a static grid of heatmaps shares one colour bar).
    ``reversed_y`` puts row 0 at the top, as ``imshow`` does. The slider, the style and
    ``layout.meta.posenc`` are those of :func:`explorable` (``meta.posenc.kind`` is
    ``"heatmap"``); :func:`frame_data` with ``key="z"`` reads a step's matrix back.

    ``xticktext`` / ``yticktext`` (optional): per frame, one tick label for every column /
    row, which the control swaps in with the matrix (e.g. the position each token gets, when
    the columns are slots); the hover then shows the cell's value only, since the axis values
    (``x``, ``y``) are no longer what the ticks say."""
    if not frames:
        raise ValueError("heatmap needs at least one frame")
    if not 0 <= active < len(frames):
        raise ValueError(f"active must index the {len(frames)} frames, got {active}")
    for frame in frames:
        if len(frame.traces) != 1 or set(frame.traces[0]) != {"z"}:
            raise ValueError(f"frame {frame.label!r} must hold one trace with 'z' only")
    encoded = [_matrix(frame.traces[0]["z"], digits) for frame in frames]
    xs, ys = _floats(x, digits), _floats(y, digits)
    for frame, z in zip(frames, encoded, strict=True):
        if len(z) != len(ys) or any(len(row) != len(xs) for row in z):
            raise ValueError(f"frame {frame.label!r}: z must be [len(y), len(x)]")
    ticks = {axis: _ticktext(axis, given, frames, values)
             for axis, given, values in (("x", xticktext, xs), ("y", yticktext, ys))
             if given is not None}
    trace: dict[str, Any] = {
        "type": "heatmap", "x": xs, "y": ys, "z": encoded[active],
        "colorscale": _sequential_colorscale(), "hoverongaps": False,
        # a horizontal colour bar above the plot, at the right: the matrix and the slider
        # keep the whole width (a thumb-sized slider on a 390 px phone)
        "colorbar": {"title": {"text": zlabel, "side": "top", "font": {"size": FONT}},
                     "orientation": "h", "x": 1, "xanchor": "right", "y": 1.02,
                     "yanchor": "bottom", "len": 0.5, "thickness": 10,
                     "tickfont": {"size": FONT - 1}, "outlinewidth": 0},
        "hovertemplate": f"{xlabel} %{{x}}<br>{ylabel} %{{y}}<br>{zlabel} %{{z:.4g}}"
                         "<extra></extra>",
    }
    if ticks:  # the axis values are not what the ticks say: the hover shows the value only
        trace["hovertemplate"] = f"{zlabel} %{{z:.4g}}<extra></extra>"
    if zrange is not None:
        trace.update(zmin=float(zrange[0]), zmax=float(zrange[1]), zauto=False)
    # the line figure's layout and slider, then what a heatmap changes
    base = explorable(name, [Frame(f.label, f.value, [{"y": [0.0]}], f.title) for f in frames],
                      names=[""], x=[0.0], xlabel=xlabel, ylabel=ylabel,
                      control_label=control_label, label=label, active=active, height=height)
    layout = base.figure["layout"]
    layout["plot_bgcolor"] = masked_color  # the undrawn (masked) cells
    layout["hovermode"] = "closest"
    layout["showlegend"] = False
    layout["xaxis"].update(showgrid=False)  # cells fill the width: no empty band on a desktop
    layout["yaxis"].update(showgrid=False)
    if reversed_y:
        layout["yaxis"]["autorange"] = "reversed"
    layout["meta"]["posenc"]["kind"] = "heatmap"
    layout["meta"]["posenc"]["traces"] = [0]
    for axis, texts in ticks.items():
        layout[f"{axis}axis"].update(tickmode="array", tickvals=xs if axis == "x" else ys,
                                     ticktext=texts[active])
    for k, step in enumerate(layout["sliders"][0]["steps"]):
        relayout: dict[str, Any] = (
            {"title.text": frames[k].title} if frames[k].title is not None else {})
        relayout.update({f"{axis}axis.ticktext": texts[k] for axis, texts in ticks.items()})
        step["args"] = [{"z": [encoded[k]]}, relayout, [0]]
    figure = {"data": [trace], "layout": layout, "config": base.figure["config"]}
    return Explorable(name, figure, [f.value for f in frames], height)


def _ticktext(axis: str, given: Sequence[Sequence[str]], frames: Sequence[Frame],
              values: Sequence[float]) -> list[list[str]]:
    """Per-frame tick labels of one heatmap axis, checked: one label per axis value."""
    if len(given) != len(frames):
        raise ValueError(f"{axis}ticktext must hold one list per frame ({len(frames)}), got "
                         f"{len(given)}")
    out = []
    for frame, texts in zip(frames, given, strict=True):
        if isinstance(texts, str) or len(texts) != len(values):
            raise ValueError(f"frame {frame.label!r}: {axis}ticktext must hold one label per "
                             f"{axis} value ({len(values)})")
        out.append([str(t) for t in texts])
    return out


def frame_data(explorable_: Explorable, index: int, key: str = "y") -> list[list[float]]:
    """The arrays ``key`` of every changing trace at control step ``index``, as stored in the
    figure (what the browser draws after the control is set there)."""
    layout = explorable_.figure["layout"]
    steps = (layout["sliders"][0]["steps"] if "sliders" in layout
             else layout["updatemenus"][0]["buttons"])
    return steps[index]["args"][0][key]


# --- the Sphinx extension: Plotly's JavaScript once per page that holds an explorable ---------

def _page_has_explorable(context: Mapping[str, Any]) -> bool:
    return 'class="posenc-explorable"' in str(context.get("body", ""))


def setup(app: Any) -> dict[str, Any]:
    """Sphinx extension (``sphinx.extra_extensions: [posenc.lab.explore]`` in ``_config.yml``):
    adds plotly.js to the ``<head>`` of every page that holds an explorable, and to no other
    page. From the CDN by default (``posenc_plotlyjs = "cdn"``, the published site); ``"local"``
    (or ``POSENC_PLOTLYJS=local`` in the environment) copies the installed package's
    ``plotly.min.js`` into the build's ``_static/`` instead, for a build that works offline."""
    app.add_config_value("posenc_plotlyjs", os.environ.get(PLOTLYJS_ENV, "cdn"), "html")

    def mode() -> str:
        value = str(os.environ.get(PLOTLYJS_ENV) or app.config.posenc_plotlyjs)
        if value not in ("cdn", "local"):
            raise ValueError(f"{PLOTLYJS_ENV} / posenc_plotlyjs must be 'cdn' or 'local', got "
                             f"{value!r}")
        return value

    def add_plotly(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
        if doctree is None or not _page_has_explorable(context):
            return
        if mode() == "local":
            app.add_js_file("plotly.min.js", charset="utf-8")
        else:
            app.add_js_file(plotlyjs_url(), charset="utf-8")

    def copy_local(app: Any, exception: Exception | None) -> None:
        if exception is None and app.builder.format == "html" and mode() == "local":
            target = Path(app.outdir) / "_static" / "plotly.min.js"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(plotlyjs_file(), target)

    app.connect("html-page-context", add_plotly)
    app.connect("html-page-context", dedupe_scripts, priority=900)  # after every other handler
    app.connect("build-finished", copy_local)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


def _script_key(script: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    attributes = getattr(script, "attributes", None) or {}
    filename = getattr(script, "filename", script) or ""  # an inline script: None or ""
    return (str(filename),
            tuple(sorted((str(k), str(v)) for k, v in attributes.items())))


def dedupe_scripts(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Each script once per page. Jupyter Book 1's extensions register sphinx-thebe's and
    sphinx-togglebutton's inline scripts twice (the same text, once with ``None`` and once with
    ``""`` as the file name), and thebe's declares ``const THEBE_JS_URL``: the second copy threw
    "Identifier 'THEBE_JS_URL' has already been declared" on every page. Pages get a list
    without the repeats (the builder's own list, restored after each page, is left alone)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    unique = []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    if len(unique) < len(scripts):
        context["script_files"] = unique


# the book's scheme colours come first, so a trace of RoPE is the colour RoPE has everywhere
assert COLORS[0] == plot.SCHEME_COLORS["sinusoidal"]
