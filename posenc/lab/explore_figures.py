"""The explorable figures: line traces and heatmaps whose data follow a slider or a menu.

:func:`explorable` and :func:`heatmap` build a Plotly figure from precomputed frames
(:class:`~posenc.lab.explore_frames.Frame`), in the book's style (its colours, 14 px text, no
zoom or pan, a thumb-sized slider); :func:`frame_data` reads a step's arrays back. The module
docstring of :mod:`posenc.lab.explore`, which re-exports these names, says what a figure can and
cannot do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from . import plot
from .explore_frames import (
    Frame,
    _check_frames,
    _check_name,
    _check_static,
    _flag,
    _floats,
    _integer,
    _matrix,
    _range,
    _short,
    _text,
    _ticktext,
)
from .explore_page import Explorable

__all__ = ["explorable", "heatmap", "frame_data", "FONT", "COLORS"]

FONT = 14  # px; tick labels 13 px, the slider's labels 13 px
COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#555555", "#E69F00", "#56B4E9"]
"""The book's Okabe-Ito colours, in the order the traces of an explorable get them."""
_FONT_FAMILY = ('"Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", "Microsoft YaHei", '
                "-apple-system, BlinkMacSystemFont, 'Segoe UI', Helvetica, Arial, sans-serif")


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


# the book's scheme colours come first, so a trace of RoPE is the colour RoPE has everywhere
assert COLORS[0] == plot.SCHEME_COLORS["sinusoidal"]
