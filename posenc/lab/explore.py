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
"""

from __future__ import annotations

import html
import importlib
import json
import math
import numbers
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
    when it changes too); 1-D tensors (any dtype but complex, any device with data, with or
    without grad), arrays and lists of numbers are accepted and stored as lists of floats.
    ``label`` is a str (the control's tick); ``value`` a str, an int or a finite float (numpy
    scalars become Python numbers; a tensor needs ``.item()``); ``title`` a str or None.
    Labels and values must be distinct across the frames of one figure."""

    label: str
    value: float | int | str
    traces: Sequence[Mapping[str, Any]]
    title: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.label, str):
            raise TypeError(f"Frame label must be a str (the control's tick), got "
                            f"{self.label!r}")
        self.value = _frame_value(self.value, self.label)
        if self.title is not None and not isinstance(self.title, str):
            raise TypeError(f"Frame {self.label!r}: title must be a str or None, got "
                            f"{self.title!r}")
        if isinstance(self.traces, (str, bytes, Mapping)) or not isinstance(self.traces,
                                                                            Sequence):
            raise TypeError(f"Frame {self.label!r}: traces must be a list of dicts (one per "
                            f"trace, e.g. [{{'y': ...}}]), got a {type(self.traces).__name__}")
        for i, trace in enumerate(self.traces):
            if not isinstance(trace, Mapping):
                raise TypeError(f"Frame {self.label!r}: traces[{i}] must be a dict such as "
                                f"{{'y': ...}}, got a {type(trace).__name__}")


def _frame_value(value: Any, label: str) -> float | int | str:
    """A frame's control value as a JSON-safe Python value: a str, an int or a finite float
    (numpy scalars become Python numbers; a tensor must be turned into one with ``.item()``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = ": pass .item()" if hasattr(value, "detach") else ""
        raise TypeError(f"Frame {label!r}: value must be a number or a str, got "
                        f"{_short(value)} (a {type(value).__name__}){hint}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if not math.isfinite(float(value)):
        raise ValueError(f"Frame {label!r}: value must be finite (the page's JSON cannot hold "
                         f"it), got {value!r}")
    return float(value)


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_label(value: float) -> str:
    """A short control label for a power of ten or a multiple of one: ``1e4`` -> ``10⁴``,
    ``5e5`` -> ``5·10⁵`` (short enough for six labels on a 390 px phone)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"power_label needs a number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"power_label needs a positive finite number, got {value!r}")
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = value / 10**exponent
    if not math.isclose(mantissa, round(mantissa), rel_tol=1e-9):
        return f"{value:g}"
    power = "10" + str(exponent).translate(_SUPERSCRIPT)
    return power if round(mantissa) == 1 else f"{round(mantissa)}·{power}"


def _plain(values: Any, what: str, ndim: int) -> Any:
    """A tensor or an array as nested lists, checked: real, on a device with data, ``ndim``-D.
    Other sequences are returned as they are (their items are checked by the caller)."""
    shape = "1-D" if ndim == 1 else "2-D [len(y), len(x)]"
    if hasattr(values, "detach"):  # a torch tensor, on any device, of any dtype
        if values.is_complex():
            raise TypeError(f"{what} must be real, got a complex tensor ({values.dtype})")
        if values.device.type == "meta":
            raise ValueError(f"{what} is a tensor on the meta device (no data to plot)")
        if values.dim() != ndim:
            raise ValueError(f"{what} must be {shape}, got a {values.dim()}-D tensor of shape "
                             f"{list(values.shape)}")
        return values.detach().cpu().double().tolist()
    if hasattr(values, "tolist") and hasattr(values, "ndim"):  # a numpy array
        if "complex" in str(getattr(values, "dtype", "")):
            raise TypeError(f"{what} must be real, got a complex array ({values.dtype})")
        if values.ndim != ndim:
            raise ValueError(f"{what} must be {shape}, got a {values.ndim}-D array of shape "
                             f"{list(values.shape)}")
        return values.tolist()
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise TypeError(f"{what} must be a list, a tensor or an array of numbers, got a "
                        f"{type(values).__name__}: {_short(values)}")
    return values


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(v: Any, what: str) -> float:
    if isinstance(v, numbers.Real):
        return float(v)
    if isinstance(v, numbers.Complex):
        raise TypeError(f"{what} must be real, got {v!r}")
    raise TypeError(f"{what} must hold numbers, got {_short(v)} (a {type(v).__name__})")


def _floats(values: Any, digits: int, what: str = "data") -> list[float]:
    """A 1-D tensor, array or sequence as a list of finite floats rounded to ``digits``
    significant digits (JSON stays small; the frames are checked against posenc to that
    precision). ``what`` names the argument in an error."""
    values = _plain(values, what, 1)
    out = []
    for i, v in enumerate(values):
        v = _number(v, f"{what}[{i}]")
        if not math.isfinite(v):
            raise ValueError(f"{what} must be finite, got {v!r} at index {i}")
        out.append(float(f"{v:.{digits}g}"))
    if not out:
        raise ValueError(f"{what} is empty: give at least one value")
    return out


def _text(value: Any, argument: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {_short(value)}")
    return value


def _flag(value: Any, argument: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be True or False, got {value!r}")
    return value


def _integer(value: Any, argument: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{argument} must be an int, got {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{argument} must be in {low}..{high}, got {number}")
    return number


def _range(value: Any, argument: str, log: bool = False,
           increasing: bool = False) -> list[float] | None:
    """An axis or colour range: two finite numbers (both > 0 on a log axis)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) \
            or len(value) != 2:
        raise ValueError(f"{argument} must be two numbers (low, high), got {_short(value)}")
    lo, hi = (_number(v, argument) for v in value)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo == hi:
        raise ValueError(f"{argument} must be two different finite numbers, got "
                         f"{_short(value)}")
    if increasing and lo > hi:
        raise ValueError(f"{argument} must be (low, high) with low < high, got "
                         f"{_short(value)}")
    if log and min(lo, hi) <= 0:
        raise ValueError(f"{argument} is on a log axis: both ends must be > 0, got "
                         f"{_short(value)}")
    return [lo, hi]


def _check_frames(frames: Any, function: str) -> list[Frame]:
    """``frames``: a non-empty list of :class:`Frame`, with distinct labels and values."""
    if isinstance(frames, (str, bytes, Mapping, Frame)) or not isinstance(frames, Sequence):
        raise TypeError(f"{function}: frames must be a list of explore.Frame, got a "
                        f"{type(frames).__name__}")
    if not frames:
        raise ValueError(f"{function}: frames is empty; give at least one explore.Frame")
    for i, frame in enumerate(frames):
        if not isinstance(frame, Frame):
            raise TypeError(f"{function}: frames[{i}] must be an explore.Frame, got a "
                            f"{type(frame).__name__}")
    for attribute in ("label", "value"):
        seen: dict[Any, int] = {}
        for i, frame in enumerate(frames):
            key = getattr(frame, attribute)
            if key in seen:
                raise ValueError(f"{function}: frames[{seen[key]}] and frames[{i}] have the "
                                 f"same {attribute} {key!r}; a {attribute} can appear only once "
                                 f"(not twice) on the control")
            seen[key] = i
    return list(frames)


def _check_static(static: Any) -> list[dict[str, Any]]:
    if isinstance(static, (str, bytes, Mapping)) or not isinstance(static, Sequence):
        raise TypeError(f"static must be a list of Plotly trace dicts, got a "
                        f"{type(static).__name__}")
    out = []
    for i, trace in enumerate(static):
        if not isinstance(trace, Mapping):
            raise TypeError(f"static[{i}] must be a Plotly trace dict, got a "
                            f"{type(trace).__name__}")
        try:
            json.dumps(trace, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise TypeError(f"static[{i}] must hold plain lists of finite numbers and str "
                            f"(a tensor or an array: pass .tolist()): {err}") from None
        out.append(dict(trace))
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


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"name must be a non-empty str (the figure's id in the page), got "
                        f"{name!r}")
    return name


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
        static: traces that do not change (a reference curve), as Plotly trace dicts of
            plain lists (JSON; a tensor needs ``.tolist()``).
        digits: significant digits kept in the JSON (1..17).

    Checked when the figure is built (a ``TypeError`` or ``ValueError`` naming the argument):
    every trace's ``y`` as long as its ``x`` (or ``x=``); data finite and 1-D; ``x=`` or an
    ``"x"`` in every trace, not both; distinct ``names``; values > 0 on a log axis (plotly
    would drop the others silently); ranges of two different finite numbers.
    """
    frames = _check_frames(frames, "explorable")
    name = _check_name(name)
    xlabel, ylabel = _text(xlabel, "xlabel"), _text(ylabel, "ylabel")
    control_label, label = _text(control_label, "control_label"), _text(label, "label")
    xlog, ylog = _flag(xlog, "xlog"), _flag(ylog, "ylog")
    if control not in ("slider", "menu"):
        raise ValueError(f"control must be 'slider' or 'menu', got {control!r}")
    active = _integer(active, "active", 0, len(frames) - 1)
    digits = _integer(digits, "digits", 1, 17)
    height = _integer(height, "height", 150, 2000)
    xrange_, yrange_ = _range(xrange, "xrange", xlog), _range(yrange, "yrange", ylog)
    static_ = _check_static(static)
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise TypeError(f"names must be a list of str (one legend entry per trace), got "
                        f"{_short(names)}")
    names = [_text(n, f"names[{i}]") for i, n in enumerate(names)]
    if not names:
        raise ValueError("names is empty: an explorable draws at least one changing trace")
    for i, trace_name in enumerate(names):
        if trace_name in names[:i]:
            raise ValueError(f"names holds {trace_name!r} twice; each trace needs its own "
                             "legend entry")
    for frame in frames:
        if len(frame.traces) != len(names):
            raise ValueError(f"frame {frame.label!r} has {len(frame.traces)} traces, names has "
                             f"{len(names)}")
    n = len(names)
    changing = sorted({key for frame in frames for trace in frame.traces for key in trace})
    if not set(changing) <= {"x", "y"}:
        raise ValueError(f"frames may change 'x' and 'y' only, got {changing}")
    for key in ("y", *changing):  # first every missing 'y', then an 'x' in some only
        for frame in frames:
            for i, given in enumerate(frame.traces):
                if key not in given:
                    raise ValueError(f"frame {frame.label!r}, trace {i} has no {key!r}; every "
                                     f"trace of every frame needs {changing}")
    if "x" not in changing and x is None:
        raise ValueError("give x= (shared by every trace) or an 'x' in every frame's traces")
    if "x" in changing and x is not None:
        raise ValueError("give x= (shared by every trace) or an 'x' in every frame's traces, "
                         "not both (x= would be ignored)")
    shared_x = _floats(x, digits, "x=") if x is not None else None
    encoded = [{key: [_floats(trace[key], digits, f"frame {frame.label!r}, trace {i}, {key!r}")
                      for i, trace in enumerate(frame.traces)] for key in changing}
               for frame in frames]
    for frame, arrays in zip(frames, encoded, strict=True):
        for i in range(n):
            xs = arrays["x"][i] if shared_x is None else shared_x
            ys = arrays["y"][i]
            where = f"frame {frame.label!r}, trace {i}"
            if len(xs) != len(ys):
                source = "its 'x'" if shared_x is None else "x="
                raise ValueError(f"{where}: 'y' holds {len(ys)} values, {source} holds "
                                 f"{len(xs)}; they must match")
            for key, values, log in (("x", xs, xlog), ("y", ys, ylog)):
                if log and min(values) <= 0:
                    where_key = "x=" if key == "x" and shared_x is not None else \
                        f"{where}, {key!r}"
                    raise ValueError(f"{key}log=True needs values > 0, but {where_key} holds "
                                     f"{min(values)!r} (a log axis drops it)")
    data: list[dict[str, Any]] = list(static_)  # drawn under the changing traces
    for i, trace_name in enumerate(names):
        trace: dict[str, Any] = {"type": "scatter", "mode": "lines", "name": trace_name,
                                 "line": {"color": COLORS[i % len(COLORS)], "width": 2.5}}
        for key in ("x", "y"):
            trace[key] = encoded[active][key][i] if key in changing else shared_x
        data.append(trace)
    trace_ids = list(range(len(static_), len(static_) + n))

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
        "xaxis": _axis(xlabel, xlog, xrange_),
        "yaxis": _axis(ylabel, ylog, yrange_),
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
            "currentvalue": {"prefix": control_label + (  # a Chinese caption takes "：", no " = "
                                 "：" if control_label[-1:] > "\u2e7f" else " = "),
                             "font": {"size": FONT + 1},
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


def _matrix(values: Any, digits: int, what: str = "z") -> list[list[float | None]]:
    """A 2-D tensor, array or nested sequence as rows of floats; ``-inf``, NaN and ``None``
    (masked or blank cells) become ``None``, which Plotly leaves undrawn (the masked colour
    shows through); ``+inf`` is refused."""
    values = _plain(values, what, 2)
    rows = []
    for r, row in enumerate(values):
        if isinstance(row, (str, bytes, Mapping)) or not isinstance(row, Sequence):
            raise ValueError(f"{what} must be 2-D [len(y), len(x)], got row {r} = "
                             f"{_short(row)}")
        out: list[float | None] = []
        for c, v in enumerate(row):
            if v is None:
                out.append(None)
                continue
            if isinstance(v, Sequence) and not isinstance(v, str):
                raise ValueError(f"{what} must be 2-D [len(y), len(x)], got a list at "
                                 f"[{r}][{c}] (3-D?)")
            v = _number(v, f"{what}[{r}][{c}]")
            if math.isnan(v) or v == -math.inf:
                out.append(None)
            elif math.isinf(v):
                raise ValueError(f"{what} may hold -inf or NaN (masked cells), not {v!r} (at "
                                 f"[{r}][{c}])")
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
    frames = _check_frames(frames, "heatmap")
    zlabel = _text(zlabel, "zlabel")
    masked_color = _text(masked_color, "masked_color")
    reversed_y = _flag(reversed_y, "reversed_y")
    digits = _integer(digits, "digits", 1, 17)
    active = _integer(active, "active", 0, len(frames) - 1)
    zrange_ = _range(zrange, "zrange", increasing=True)
    for frame in frames:
        if len(frame.traces) != 1 or set(frame.traces[0]) != {"z"}:
            raise ValueError(f"frame {frame.label!r} must hold one trace with 'z' only")
    encoded = [_matrix(frame.traces[0]["z"], digits, f"frame {frame.label!r}, 'z'")
               for frame in frames]
    xs, ys = _floats(x, digits, "x="), _floats(y, digits, "y=")
    for frame, z in zip(frames, encoded, strict=True):
        if len(z) != len(ys) or any(len(row) != len(xs) for row in z):
            widths = sorted({len(row) for row in z})
            raise ValueError(f"frame {frame.label!r}: z must be [len(y), len(x)] = "
                             f"[{len(ys)}, {len(xs)}], got {len(z)} rows of {widths} values")
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
    if zrange_ is not None:
        trace.update(zmin=zrange_[0], zmax=zrange_[1], zauto=False)
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
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Sequence):
        raise TypeError(f"{axis}ticktext must be a list (one list of labels per frame), got "
                        f"{_short(given)}")
    if len(given) != len(frames):
        raise ValueError(f"{axis}ticktext must hold one list per frame ({len(frames)}), got "
                         f"{len(given)}")
    out = []
    for frame, texts in zip(frames, given, strict=True):
        if isinstance(texts, (str, bytes, Mapping)) or not isinstance(texts, Sequence) \
                or len(texts) != len(values):
            raise ValueError(f"frame {frame.label!r}: {axis}ticktext must hold one label per "
                             f"{axis} value ({len(values)})")
        out.append([str(t) for t in texts])
    return out


def frame_data(explorable_: Explorable, index: int, key: str = "y") -> list[list[float]]:
    """The arrays ``key`` of every changing trace at control step ``index``, as stored in the
    figure (what the browser draws after the control is set there)."""
    if not isinstance(explorable_, Explorable):
        raise TypeError(f"frame_data needs an Explorable (what explorable() or heatmap() "
                        f"return), got a {type(explorable_).__name__}")
    layout = explorable_.figure["layout"]
    steps = (layout["sliders"][0]["steps"] if "sliders" in layout
             else layout["updatemenus"][0]["buttons"])
    index = _integer(index, "index", -len(steps), len(steps) - 1)
    keys = sorted(steps[index]["args"][0])
    if key not in keys:
        raise ValueError(f"key must be one of {keys} for {explorable_.name!r}, got {key!r}")
    return steps[index]["args"][0][key]


def tree_value(prefix: int, parents: Sequence[int]) -> str:
    """The control value :func:`speculative_tree` gives a tree: ``"P:p0,p1,..."`` (the prefix
    length and each node's parent), from which a reader of the page (the browser test) can
    recompute every cell."""
    return f"{prefix}:" + ",".join(str(int(p)) for p in parents)


def speculative_tree(
    name: str,
    trees: Mapping[str, Sequence[int]],
    *,
    prefix: int,
    xlabel: str,
    ylabel: str,
    zlabel: str,
    control_label: str,
    label: str,
    active: int = 0,
    height: int = 480,
) -> Explorable:
    """Who sees whom in a speculative-decoding draft tree, one tree per step of the slider
    (chapter 11): a :func:`heatmap` of the ``prefix`` tokens and the tree's nodes, query rows
    against key columns, each cell the distance ``m - n`` between the positions the two get,
    blank where the query may not see the key.

    ``trees`` maps the control's label of each tree to its ``parents`` (node ``i`` continues
    node ``parents[i]``, ``-1`` the last prefix token; see
    :func:`~posenc.lab.serving.tree_positions_and_mask`). Positions: ``0 .. prefix - 1``, then
    ``prefix + depth`` (siblings share one); the tick labels show them. Trees of different sizes
    are padded with blank rows and columns. Every cell is computed by
    :func:`~posenc.attention.attend` itself (one-hot values under zero queries and keys: a key
    gets weight > 0 exactly where the query sees it) with the tree's boolean mask, checked
    against the mask, and read back from the figure after it is built; a difference raises
    ``RuntimeError``. The frames' values are :func:`tree_value` strings.
    """
    import torch

    import posenc

    from .serving import tree_positions_and_mask

    if not isinstance(trees, Mapping) or not trees:
        raise TypeError(f"trees must be a non-empty dict (control label -> parents), got "
                        f"{_short(trees)}")
    prefix = _integer(prefix, "prefix", 1, 64)
    built = []
    for tree_label, parents in trees.items():
        positions, mask = tree_positions_and_mask(parents, prefix=prefix)  # [N], [N, P + N]
        N = positions.numel()
        T = prefix + N
        allowed = torch.zeros(T, T, dtype=torch.bool)
        allowed[:prefix, :prefix] = torch.ones(prefix, prefix, dtype=torch.bool).tril()
        allowed[prefix:] = mask
        pos = torch.cat([torch.arange(prefix), positions])  # [T]
        zeros = torch.zeros(1, 1, T, T)
        out = posenc.attend(zeros, zeros, torch.eye(T)[None, None], positions=pos,
                            attention_mask=allowed[None], backend="math")
        seen = out[0, 0] > 0  # [T, T]: attend's own visibility
        if not torch.equal(seen, allowed):
            raise RuntimeError(f"tree {tree_label!r}: attend's visibility differs from the mask")
        distance = (pos[:, None] - pos[None, :]).double().masked_fill(~seen, float("-inf"))
        built.append((tree_label, parents, pos, distance))
    size = max(d.shape[0] for *_, d in built)
    frames, ticks, drawn = [], [], []
    for tree_label, parents, pos, distance in built:
        T = distance.shape[0]
        z = torch.full((size, size), float("-inf"), dtype=torch.float64)
        z[:T, :T] = distance
        drawn.append(z)
        ticks.append([str(p) for p in pos.tolist()] + [""] * (size - T))
        frames.append(Frame(label=tree_label, value=tree_value(prefix, list(parents)),
                            traces=[{"z": z}]))
    top = max(float(z[torch.isfinite(z)].max()) for z in drawn)
    slots = list(range(size))
    ex = heatmap(name, frames, x=slots, y=slots, xlabel=xlabel, ylabel=ylabel, zlabel=zlabel,
                 control_label=control_label, label=label, active=active,
                 zrange=(0, max(top, 1.0)), xticktext=ticks, yticktext=ticks, height=height)
    for i, z in enumerate(drawn):  # the figure holds these numbers (blank: None)
        (shown,) = frame_data(ex, i, key="z")
        got = torch.tensor([[float("-inf") if v is None else v for v in row] for row in shown],  # type: ignore[attr-defined]
                           dtype=torch.float64)
        if not torch.equal(got, z):
            raise RuntimeError(f"{name}: step {i} draws other numbers than attend computed")
    return ex


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
