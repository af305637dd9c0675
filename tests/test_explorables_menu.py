"""posenc.lab.explore_menu without a browser: a menu whose entries each bring their own slider
(the data and the slider of every entry travel in the figure; Plotly accepts it; bad input is
refused naming the argument). tests/test_explorables_browser.py operates it in chromium."""

from __future__ import annotations

import pytest
import torch

from posenc.lab import explore
from posenc.lab.explore_menu import MenuEntry, menu_slider

pytest.importorskip("plotly")


def _entry(k: int, points: int) -> MenuEntry:
    x = torch.arange(points, dtype=torch.float64)
    frames = [explore.Frame(label=f"{n}K", value=n * 1024, title=f"entry {k}, {n}K",
                            traces=[{"x": x, "y": x + k + n}, {"x": [0, 1], "y": [n, n]}])
              for n in (4, 8, 16)]
    return MenuEntry(f"model {k}", f"m{k}", frames, active=k % 3)


def _make(**kwargs) -> explore.Explorable:
    args = dict(names=["a", "b"], xlabel="pair", ylabel="wavelength", menu_label="model",
                control_label="target", label="a menu and a slider", active=1)
    args.update(kwargs)
    return menu_slider("test-menu", [_entry(0, 4), _entry(1, 6), _entry(2, 5)], **args)


def test_every_entry_brings_its_data_and_its_slider() -> None:
    ex = _make()
    layout = ex.figure["layout"]
    meta = layout["meta"]["posenc"]
    assert meta["control"] == "menu+slider"
    assert meta["menu"]["values"] == ["m0", "m1", "m2"] and meta["menu"]["active"] == 1
    assert meta["menu"]["steps"] == [[4096, 8192, 16384]] * 3
    assert meta["menu"]["step_labels"] == [["4K", "8K", "16K"]] * 3
    # drawn first: entry 1 at its frame 1 (8K)
    assert ex.figure["data"][0]["y"] == [float(v) for v in torch.arange(6) + 1 + 8]
    assert layout["sliders"][0]["active"] == 1
    (menu,) = layout["updatemenus"]
    assert menu["active"] == 1 and len(menu["buttons"]) == 3
    for k, button in enumerate(menu["buttons"]):
        restyle, relayout, traces = button["args"]
        assert button["method"] == "update" and traces == [0, 1]
        active = k % 3
        n = (4, 8, 16)[active]
        assert restyle["y"][0] == [float(v) for v in torch.arange((4, 6, 5)[k]) + k + n]
        (slider,) = relayout["sliders"]
        assert slider["active"] == active and len(slider["steps"]) == 3
        assert relayout["title.text"] == f"entry {k}, {n}K"
        for step, size in zip(slider["steps"], (4, 8, 16), strict=True):
            assert step["args"][0]["y"][1] == [float(size)] * 2


def test_plotly_accepts_the_figure_and_each_entry_layout() -> None:
    go = pytest.importorskip("plotly.graph_objects")
    ex = _make(ylog=True, yrange=(1, 100))
    go.Figure(data=ex.figure["data"], layout=ex.figure["layout"])
    for button in ex.figure["layout"]["updatemenus"][0]["buttons"]:
        go.Figure(data=ex.figure["data"],
                  layout={**ex.figure["layout"], "sliders": button["args"][1]["sliders"]})


@pytest.mark.parametrize(("entries", "kwargs", "error", "message"), [
    ("abc", {}, TypeError, "entries must be a list of MenuEntry"),
    ([], {}, ValueError, "entries is empty"),
    ([_entry(0, 4)], {}, ValueError, "at least two entries"),
    ([_entry(0, 4), 3], {}, TypeError, r"entries\[1\] must be a MenuEntry"),
    ([_entry(0, 4), _entry(0, 5)], {}, ValueError, "same label"),
    ([_entry(0, 4), _entry(1, 4)], {"active": 2}, ValueError, "active"),
    ([_entry(0, 4), _entry(1, 4)], {"menu_label": 3}, TypeError, "menu_label"),
    ([_entry(0, 4), _entry(1, 4)], {"names": ["a"]}, ValueError, "traces, names has 1"),
])
def test_bad_input(entries, kwargs, error, message) -> None:
    args = dict(names=["a", "b"], xlabel="pair", ylabel="wavelength", menu_label="model",
                control_label="target", label="a menu and a slider")
    args.update(kwargs)
    with pytest.raises(error, match=message):
        menu_slider("bad", entries, **args)
    bad_value = MenuEntry("model 9", "", _entry(0, 4).frames)
    with pytest.raises(TypeError, match=r"entries\[1\].value"):
        menu_slider("bad", [_entry(0, 4), bad_value], **{**args, **{"active": 0}})
