"""An explorable with two controls: a drop-down menu of entries, each with its own slider.

"Your model's positions" shows, for a model picked from a menu, each RoPE pair's wavelength at a
target context picked on a slider. The slider's settings depend on the entry (another model has
other pairs and other lengths), so each menu entry carries its own frames, and picking an entry
swaps in that entry's data *and its slider* (Plotly's ``update`` method: a restyle of the
changing traces and a relayout of ``sliders``). Every number is precomputed in Python, as for
:func:`posenc.lab.explore.explorable`; no mathematics is written in JavaScript.

Each entry is first built as an ordinary slider explorable by :func:`explore.explorable`, so its
frames are checked the same way (lengths, finiteness, log axes, distinct labels) and its slider
has the book's style. The figure drawn first is the ``active`` entry at its ``active`` frame.

The figure's ``layout.meta.posenc`` names the explorable, says ``"control": "menu+slider"`` and
lists, per menu entry, its value, its label and the values of its slider's frames, so a browser
test can pick each entry, operate its slider and read the plotted data back
(``tests/test_explorables_browser.py``).

Honest limits: picking an entry resets the slider to that entry's own ``active`` frame (the
menu cannot read the slider); the page carries every frame of every entry.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import explore

__all__ = ["MenuEntry", "menu_slider"]

_FONT = 14  # px, as the other explorables


@dataclass
class MenuEntry:
    """One entry of the menu: its ``label`` (the menu's text), a ``value`` (a str naming it for
    tests, e.g. a family's key), the slider's ``frames`` for it, the frame drawn when it is
    picked (``active``) and, optionally, its x range (another entry may have more points)."""

    label: str
    value: str
    frames: Sequence[explore.Frame]
    active: int = 0
    xrange: Sequence[float] | None = None


def _check_entries(entries: Any) -> list[MenuEntry]:
    if isinstance(entries, (str, bytes, Mapping, MenuEntry)) or not isinstance(entries, Sequence):
        raise TypeError(f"menu_slider: entries must be a list of MenuEntry, got a "
                        f"{type(entries).__name__}")
    if not entries:
        raise ValueError("menu_slider: entries is empty; give at least two MenuEntry")
    for i, entry in enumerate(entries):
        if not isinstance(entry, MenuEntry):
            raise TypeError(f"menu_slider: entries[{i}] must be a MenuEntry, got a "
                            f"{type(entry).__name__}")
        for attribute in ("label", "value"):
            if not isinstance(getattr(entry, attribute), str) or not getattr(entry, attribute):
                raise TypeError(f"menu_slider: entries[{i}].{attribute} must be a non-empty str, "
                                f"got {getattr(entry, attribute)!r}")
    if len(entries) < 2:
        raise ValueError("menu_slider: a menu needs at least two entries, got one")
    for attribute in ("label", "value"):
        seen: dict[str, int] = {}
        for i, entry in enumerate(entries):
            key = getattr(entry, attribute)
            if key in seen:
                raise ValueError(f"menu_slider: entries[{seen[key]}] and entries[{i}] have the "
                                 f"same {attribute} {key!r}")
            seen[key] = i
    return list(entries)


def menu_slider(
    name: str,
    entries: Sequence[MenuEntry],
    *,
    names: Sequence[str],
    xlabel: str,
    ylabel: str,
    menu_label: str,
    control_label: str,
    label: str,
    active: int = 0,
    xlog: bool = False,
    ylog: bool = False,
    yrange: Sequence[float] | None = None,
    digits: int = 7,
    height: int = 520,
) -> explore.Explorable:
    """Line traces that follow a menu of ``entries`` and, within an entry, its slider.

    Args:
        name: a short id, unique in the page.
        entries: one :class:`MenuEntry` per menu item; every frame of every entry gives each
            trace its ``"x"`` and ``"y"`` (entries may differ in length).
        names: the legend entry of each trace (the same traces in every entry).
        xlabel, ylabel: axis titles; ``menu_label``, ``control_label``: the captions of the menu
            and of the slider (from the page's labels, in the book's language).
        label: what the figure shows, in words (its accessible name).
        active: the entry drawn first.
        yrange: the y range every entry shares (the axis does not jump between entries).

    Every entry is checked as :func:`explore.explorable` checks a slider figure (a
    ``TypeError`` or ``ValueError`` naming the frame or the argument).
    """
    entries = _check_entries(entries)
    if isinstance(active, bool) or not isinstance(active, int) \
            or not 0 <= active < len(entries):
        raise ValueError(f"active must be an int in 0..{len(entries) - 1}, got {active!r}")
    if not isinstance(menu_label, str):
        raise TypeError(f"menu_label must be a str, got {menu_label!r}")
    built = [explore.explorable(
        name, entry.frames, names=names, xlabel=xlabel, ylabel=ylabel,
        control_label=control_label, label=label, active=entry.active, xlog=xlog, ylog=ylog,
        xrange=entry.xrange, yrange=yrange, control="slider", digits=digits, height=height)
        for entry in entries]
    figure = copy.deepcopy(built[active].figure)
    layout = figure["layout"]
    trace_ids = layout["meta"]["posenc"]["traces"]
    buttons = []
    for entry, ex in zip(entries, built, strict=True):
        shown = ex.figure["layout"]
        restyle = {key: [trace[key] for trace in ex.figure["data"][trace_ids[0]:]]
                   for key in ("x", "y")}
        relayout: dict[str, Any] = {"sliders": copy.deepcopy(shown["sliders"])}
        relayout["title.text"] = shown.get("title", {}).get("text", "")
        if "range" in shown["xaxis"]:
            relayout["xaxis.range"], relayout["xaxis.autorange"] = shown["xaxis"]["range"], False
        else:
            relayout["xaxis.autorange"] = True
        buttons.append({"method": "update", "label": entry.label,
                        "args": [restyle, relayout, trace_ids]})
    # top to bottom: the title (two lines), the menu's caption, the menu, the legend (up to
    # three rows on a 390 px phone), then the plot; the slider under it, as in explorable()
    top = 200  # px above the plot area
    layout["updatemenus"] = [{
        "type": "dropdown", "active": active, "buttons": buttons, "direction": "down",
        "x": 0, "xanchor": "left", "y": 1, "yanchor": "bottom", "pad": {"b": top - 112},
        "font": {"size": _FONT}, "showactive": True, "bgcolor": "#fff",
        "bordercolor": "#0072B2",
    }]
    layout["annotations"] = [{
        "text": menu_label, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0,
        "y": 1, "xanchor": "left", "yanchor": "bottom", "yshift": top - 80,
        "font": {"size": _FONT},
    }]
    layout["margin"]["t"] = top
    layout["height"] = height + 165
    if "title" in layout:
        layout["title"].update({"y": 1, "yref": "container", "yanchor": "top",
                                "pad": {"t": 20, "l": 4}})
    layout["legend"]["y"] = 1.0
    meta = layout["meta"]["posenc"]
    meta["control"] = "menu+slider"
    meta["menu"] = {"active": active, "values": [e.value for e in entries],
                    "labels": [e.label for e in entries],
                    "steps": [ex.values for ex in built],
                    "step_labels": [[f.label for f in e.frames] for e in entries]}
    return explore.Explorable(name, figure, [e.value for e in entries], height + 165)
