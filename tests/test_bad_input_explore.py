"""posenc.lab.explore refuses wrong calls with a clear error naming the argument, and takes the
unusual calls a chapter may make (tensors with grad, bf16, numpy, str values, masked cells).

The wrong calls are those a chapter author, or a reader adapting a chapter, plausibly makes
(/work/notes/review_explore/probe.py has the full list and what each did before the checks).
"""
# ruff: noqa: E501  (one case per line reads best as a table)

from __future__ import annotations

import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posenc.lab import explore
from posenc.lab.explore import Frame

pytest.importorskip("plotly")

X5 = torch.arange(5.0)
LINE = dict(names=["t"], x=X5, xlabel="x", ylabel="y", control_label="c", label="a line")
Z = torch.arange(6.0).view(2, 3)
HEAT = dict(x=[0, 1, 2], y=[0, 1], xlabel="n", ylabel="m", zlabel="z", control_label="c",
            label="a matrix")


def fr(*ys, label="a", value=1, title=None):
    return Frame(label=label, value=value, traces=[{"y": y} for y in ys], title=title)


def line(frames=None, **kw):
    args = {**LINE, **kw}
    return explore.explorable(args.pop("name", "t"), [fr(X5)] if frames is None else frames,
                              **args)


def heat(*zs, **kw):
    zs = zs or (Z, Z + 1)
    frames = [Frame(str(k), k, [{"z": z}]) for k, z in enumerate(zs)]
    return explore.heatmap("h", frames, **{**HEAT, **kw})


def nan_at(i):
    y = X5.clone()
    y[i] = math.nan
    return y


def sphinx_page(mode):
    """The extension's page handler with ``posenc_plotlyjs = mode`` (the environment variable
    cleared for the call, so the configuration decides)."""
    handlers = {}
    app = SimpleNamespace(config=SimpleNamespace(posenc_plotlyjs=mode),
                          add_config_value=lambda *a: None,
                          connect=lambda e, fn, priority=500: handlers.setdefault(e, fn),
                          add_js_file=lambda *a, **k: None,
                          builder=SimpleNamespace(format="html"), outdir="/nonexistent")
    saved = os.environ.pop(explore.PLOTLYJS_ENV, None)
    try:
        explore.setup(app)
        handlers["html-page-context"](app, "p", "page.html", {"body": line().to_html()},
                                      object())
    finally:
        if saved is not None:
            os.environ[explore.PLOTLYJS_ENV] = saved


CASES = [
    # Frame
    ("explore.Frame", lambda: Frame(None, 1, [{"y": X5}]), TypeError, "label"),
    ("explore.Frame", lambda: Frame("a", None, [{"y": X5}]), TypeError, "value"),
    ("explore.Frame", lambda: Frame("a", torch.tensor(4.0), [{"y": X5}]), TypeError, ".item()"),
    ("explore.Frame", lambda: Frame("a", math.nan, [{"y": X5}]), ValueError, "finite"),
    ("explore.Frame", lambda: Frame("a", [1, 2], [{"y": X5}]), TypeError, "value"),
    ("explore.Frame", lambda: Frame("a", True, [{"y": X5}]), TypeError, "value"),
    ("explore.Frame", lambda: Frame("a", 1, {"y": X5}), TypeError, "traces"),
    ("explore.Frame", lambda: Frame("a", 1, [X5]), TypeError, "traces[0]"),
    ("explore.Frame", lambda: fr(X5, title=5), TypeError, "title"),
    # explorable: frames
    ("explore.explorable", lambda: line([]), ValueError, "frames is empty"),
    ("explore.explorable", lambda: line(fr(X5)), TypeError, "frames must be a list"),
    ("explore.explorable", lambda: line([{"label": "a", "value": 1, "traces": [{"y": X5}]}]), TypeError, "frames[0]"),
    ("explore.explorable", lambda: line([fr(X5, label="a", value=1), fr(X5, label="a", value=2)]), ValueError, "same label 'a'"),
    ("explore.explorable", lambda: line([fr(X5, label="a", value=1), fr(X5, label="b", value=1)]), ValueError, "same value 1"),
    # explorable: the data of each frame
    ("explore.explorable", lambda: line([fr(X5), fr(X5[:4], label="b", value=2)]), ValueError, "frame 'b', trace 0: 'y' holds 4 values, x= holds 5"),
    ("explore.explorable", lambda: line([fr(torch.arange(6.0))]), ValueError, "'y' holds 6 values, x= holds 5"),
    ("explore.explorable", lambda: line([Frame("a", 1, [{"x": X5, "y": X5[:3]}])], x=None), ValueError, "its 'x' holds 5"),
    ("explore.explorable", lambda: line([fr(X5), Frame("b", 2, [{"x": X5}])], x=None), ValueError, "frame 'b', trace 0 has no 'y'"),
    ("explore.explorable", lambda: line([Frame("a", 1, [{"x": X5, "y": X5}])]), ValueError, "not both"),
    ("explore.explorable", lambda: line([fr(nan_at(2))]), ValueError, "frame 'a', trace 0, 'y' must be finite, got nan at index 2"),
    ("explore.explorable", lambda: line([fr(torch.tensor([0.0, math.inf, 1, 2, 3]))]), ValueError, "'y' must be finite, got inf"),
    ("explore.explorable", lambda: line([fr(torch.zeros(5, device="meta"))]), ValueError, "meta device"),
    ("explore.explorable", lambda: line([fr(torch.zeros(1, 5))]), ValueError, "'y' must be 1-D, got a 2-D tensor"),
    ("explore.explorable", lambda: line([fr(torch.tensor(3.0))]), ValueError, "'y' must be 1-D"),
    ("explore.explorable", lambda: line([fr(np.zeros((5, 1)))]), ValueError, "'y' must be 1-D, got a 2-D array"),
    ("explore.explorable", lambda: line([fr(torch.ones(5, dtype=torch.complex64))]), TypeError, "must be real"),
    ("explore.explorable", lambda: line([fr("01234")]), TypeError, "got a str"),
    ("explore.explorable", lambda: line([fr([0, 1, None, 3, 4])]), TypeError, "'y'[2] must hold numbers, got None"),
    ("explore.explorable", lambda: line([fr([])], x=[]), ValueError, "empty"),
    ("explore.explorable", lambda: line(x=nan_at(0)), ValueError, "x= must be finite"),
    ("explore.explorable", lambda: line(xlog=True), ValueError, "xlog=True needs values > 0, but x= holds 0.0"),
    ("explore.explorable", lambda: line([fr(X5 - 1)], x=X5 + 1, ylog=True), ValueError, "ylog=True needs values > 0"),
    # explorable: names and the other arguments
    ("explore.explorable", lambda: line([fr(X5, X5)], names="ab"), TypeError, "names must be a list of str"),
    ("explore.explorable", lambda: line([fr(X5, X5)], names=["t", "t"]), ValueError, "names holds 't' twice"),
    ("explore.explorable", lambda: line([Frame("a", 1, [])], names=[]), ValueError, "names is empty"),
    ("explore.explorable", lambda: line(names=None), TypeError, "names must be a list"),
    ("explore.explorable", lambda: line(names=[1]), TypeError, "names[0] must be a str"),
    ("explore.explorable", lambda: line(names=["a", "b"]), ValueError, "has 1 traces, names has 2"),
    ("explore.explorable", lambda: line([fr(X5), fr(X5, label="b", value=2)], active=1.0), TypeError, "active must be an int, got 1.0"),
    ("explore.explorable", lambda: line(active=-1), ValueError, "active must be in 0..0"),
    ("explore.explorable", lambda: line(xlabel=None), TypeError, "xlabel must be a str"),
    ("explore.explorable", lambda: line(ylabel=3), TypeError, "ylabel must be a str"),
    ("explore.explorable", lambda: line(control_label=None), TypeError, "control_label must be a str"),
    ("explore.explorable", lambda: line(label=None), TypeError, "label must be a str"),
    ("explore.explorable", lambda: line(name=None), TypeError, "name must be a non-empty str"),
    ("explore.explorable", lambda: line(control="Slider"), ValueError, "control must be"),
    ("explore.explorable", lambda: line(xlog="yes"), TypeError, "xlog must be True or False"),
    ("explore.explorable", lambda: line(x=X5 + 1, xlog=True, xrange=(0, 4)), ValueError, "xrange is on a log axis"),
    ("explore.explorable", lambda: line(yrange=(0, 1, 2)), ValueError, "yrange must be two numbers"),
    ("explore.explorable", lambda: line(yrange=(1, 1)), ValueError, "yrange must be two different"),
    ("explore.explorable", lambda: line(yrange="01"), ValueError, "yrange must be two numbers"),
    ("explore.explorable", lambda: line(digits=-1), ValueError, "digits must be in 1..17"),
    ("explore.explorable", lambda: line(height="460"), TypeError, "height must be an int"),
    ("explore.explorable", lambda: line(height=10), ValueError, "height must be in"),
    ("explore.explorable", lambda: line(static={"x": [0, 1], "y": [0, 0]}), TypeError, "static must be a list"),
    ("explore.explorable", lambda: line(static=[{"x": X5, "y": X5}]), TypeError, "static[0] must hold plain lists"),
    ("explore.explorable", lambda: line(static=[{"x": [0], "y": [math.nan]}]), TypeError, "static[0]"),
    ("explore.explorable", lambda: line(lang="fr"), TypeError, "lang"),
    # heatmap
    ("explore.heatmap", lambda: explore.heatmap("h", [], **HEAT), ValueError, "frames is empty"),
    ("explore.heatmap", lambda: heat(torch.zeros(1, 2, 3)), ValueError, "'z' must be 2-D [len(y), len(x)], got a 3-D tensor"),
    ("explore.heatmap", lambda: heat([[[0, 1, 2], [0, 1, 2]]]), ValueError, "'z' must be 2-D"),
    ("explore.heatmap", lambda: heat(torch.zeros(3)), ValueError, "'z' must be 2-D"),
    ("explore.heatmap", lambda: heat(torch.zeros(3, 2)), ValueError, "z must be [len(y), len(x)] = [2, 3]"),
    ("explore.heatmap", lambda: heat([[0, 1, 2], [0, 1]], Z), ValueError, "frame '0': z must be"),
    ("explore.heatmap", lambda: heat(torch.tensor([[0.0, math.inf, 1], [0, 0, 0]])), ValueError, "not inf (at [0][1])"),
    ("explore.heatmap", lambda: heat(torch.ones(2, 3, dtype=torch.complex64), Z), TypeError, "must be real"),
    ("explore.heatmap", lambda: heat([[0, "a", 2], [0, 1, 2]], Z), TypeError, "'z'[0][1] must hold numbers"),
    ("explore.heatmap", lambda: explore.heatmap("h", [Frame("a", 1, [{"y": Z}])], **HEAT), ValueError, "'z' only"),
    ("explore.heatmap", lambda: heat(x=[0, math.nan, 2]), ValueError, "x= must be finite"),
    ("explore.heatmap", lambda: heat(x=torch.zeros(1, 3)), ValueError, "x= must be 1-D"),
    ("explore.heatmap", lambda: heat(y="ab"), TypeError, "y= must be a list"),
    ("explore.heatmap", lambda: heat(xticktext=[["a"], ["b"]]), ValueError, "one label per x value"),
    ("explore.heatmap", lambda: heat(yticktext="pq"), TypeError, "yticktext must be a list"),
    ("explore.heatmap", lambda: heat(zrange=(0,)), ValueError, "zrange must be two numbers"),
    ("explore.heatmap", lambda: heat(zrange=(5, 0)), ValueError, "low < high"),
    ("explore.heatmap", lambda: heat(zrange=(0, math.nan)), ValueError, "zrange must be two different finite"),
    ("explore.heatmap", lambda: heat(masked_color=None), TypeError, "masked_color must be a str"),
    ("explore.heatmap", lambda: heat(reversed_y="no"), TypeError, "reversed_y must be True or False"),
    ("explore.heatmap", lambda: heat(zlabel=None), TypeError, "zlabel must be a str"),
    ("explore.heatmap", lambda: heat(active=2), ValueError, "active must be in 0..1"),
    # power_label, frame_data, setup
    ("explore.power_label", lambda: explore.power_label("1e4"), TypeError, "power_label needs a number"),
    ("explore.power_label", lambda: explore.power_label(True), TypeError, "power_label needs a number"),
    ("explore.power_label", lambda: explore.power_label(0), ValueError, "positive"),
    ("explore.power_label", lambda: explore.power_label(math.inf), ValueError, "finite"),
    ("explore.frame_data", lambda: explore.frame_data(line(), 10), ValueError, "index must be in -1..0"),
    ("explore.frame_data", lambda: explore.frame_data(line(), 0, key="z"), ValueError, "key must be one of ['y']"),
    ("explore.frame_data", lambda: explore.frame_data(line().figure, 0), TypeError, "needs an Explorable"),
    ("explore.frame_data", lambda: explore.frame_data(line(), 0.0), TypeError, "index must be an int"),
    ("explore.setup", lambda: sphinx_page("offline"), ValueError, "'cdn' or 'local', got 'offline'"),
    ("explore.setup", lambda: sphinx_page("CDN"), ValueError, "got 'CDN'"),
    ("explore.setup", lambda: sphinx_page(5), ValueError, "got '5'"),
]


@pytest.mark.parametrize(("name", "call", "error", "needle"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input(name, call, error, needle):
    with pytest.raises(error) as exc:
        call()
    assert needle in str(exc.value), (name, str(exc.value))


def test_every_public_explore_function_has_three_cases():
    """posenc.lab.explore is not in posenc.lab.__all__ (test_bad_input_coverage.py does not
    see it): this file holds its coverage."""
    not_called = {"PLOTLYJS_ENV", "Explorable", "plotlyjs_url"}  # a constant, a result, no args
    counts = {n: sum(c[0] == f"explore.{n}" for c in CASES)
              for n in explore.__all__ if n not in not_called}
    assert all(v >= 3 for v in counts.values()), {n: v for n, v in counts.items() if v < 3}


def _strict(ex: explore.Explorable) -> dict:
    """The figure as the page's JSON.parse sees it (no NaN), and accepted by plotly."""
    import plotly.graph_objects as go

    assert 'class="posenc-explorable"' in ex.to_html()
    figure = json.loads(json.dumps(ex.figure, allow_nan=False))
    go.Figure(data=figure["data"], layout=figure["layout"])
    return figure


def test_tensors_with_grad_bf16_and_numpy_are_plotted() -> None:
    y = X5.clone().requires_grad_()
    assert explore.frame_data(_checked(line([fr(y * 2)])), 0) == [[0.0, 2.0, 4.0, 6.0, 8.0]]
    bf = line([fr(X5.bfloat16() / 3)], x=X5.bfloat16())
    assert explore.frame_data(bf, 0)[0][1] == pytest.approx(float(torch.tensor(1 / 3).bfloat16()))
    npy = line([fr(np.arange(5, dtype=np.float32))], x=np.arange(5, dtype=np.int64))
    assert _strict(npy)["data"][0]["x"] == [0.0, 1.0, 2.0, 3.0, 4.0]


def _checked(ex: explore.Explorable) -> explore.Explorable:
    _strict(ex)
    return ex


def test_unusual_values_and_frames() -> None:
    # str values (chapter 9), a menu, numpy scalar values become JSON numbers
    menu = line([fr(X5, label="2×3", value="1,4,6"), fr(X5, label="3×2", value="1,6,4")],
                control="menu")
    assert _strict(menu)["layout"]["meta"]["posenc"]["values"] == ["1,4,6", "1,6,4"]
    numpy_values = line([fr(X5, label="a", value=np.int64(4)),
                         fr(X5, label="b", value=np.float64(5e5))])
    assert _strict(numpy_values)["layout"]["meta"]["posenc"]["values"] == [4, 5e5]
    # per-frame x of different lengths (chapter 5's head counts), a tuple of frames
    per_frame = line(tuple(Frame(str(n), n, [{"x": torch.arange(n), "y": torch.ones(n)}])
                           for n in (4, 8)), x=None)
    assert [len(t) for t in explore.frame_data(per_frame, 1, key="x")] == [8]
    # a Chinese title, a log axis with its range
    titled = line([fr(X5 + 1, title="头 0")], ylog=True, yrange=(1e-3, 10))
    assert _strict(titled)["layout"]["title"]["text"] == "头 0"
    assert explore.power_label(np.float64(5e5)) == "5·10⁵"
    assert explore.frame_data(titled, -1) == explore.frame_data(titled, 0)


def test_heatmap_masked_and_blank_cells_and_numpy() -> None:
    # -inf (masked, chapters 5 and 10), NaN (blank, chapter 9) and None all leave a cell undrawn
    z = torch.tensor([[0.0, -math.inf, math.nan], [1.0, 2.0, 3.0]])
    ex = heat(z, [[0, None, 1], [2, 3, 4]], zrange=(0, 4))
    assert explore.frame_data(ex, 0, key="z") == [[[0.0, None, None], [1.0, 2.0, 3.0]]]
    assert explore.frame_data(ex, 1, key="z") == [[[0.0, None, 1.0], [2.0, 3.0, 4.0]]]
    _strict(ex)
    npy = heat(np.zeros((2, 3)), np.ones((2, 3), dtype=np.float32),
               xticktext=[[0, 1, 2], [3, 4, 5]])
    assert npy.figure["layout"]["sliders"][0]["steps"][1]["args"][1]["xaxis.ticktext"] == \
        ["3", "4", "5"]
    _strict(npy)
