"""posenc.lab.explore without a browser: the figure holds every frame's numbers, Plotly accepts
it, the HTML loads plotly.js once per page, the Sphinx extension adds it only where needed.
(tests/test_explorables_browser.py operates the controls in chromium on the built site.)"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

from posenc.lab import explore

pytest.importorskip("plotly")


def _frames(count: int = 3) -> list[explore.Frame]:
    x = torch.arange(5, dtype=torch.float64)
    return [explore.Frame(label=explore.power_label(10.0 ** (k + 2)), value=10.0 ** (k + 2),
                          traces=[{"y": x * k}, {"y": x + k}]) for k in range(count)]


def _make(**kwargs) -> explore.Explorable:
    args = dict(names=["a", "b"], x=torch.arange(5), xlabel="x", ylabel="y",
                control_label="base", label="two lines; a slider sets the base", active=1)
    args.update(kwargs)
    return explore.explorable("test-one", _frames(), **args)


def test_every_frame_is_in_the_figure() -> None:
    ex = _make()
    for step, frame in enumerate(_frames()):
        stored = explore.frame_data(ex, step)
        assert stored == [t["y"].tolist() for t in frame.traces]
    layout = ex.figure["layout"]
    assert layout["meta"]["posenc"]["values"] == [100.0, 1000.0, 10000.0]
    assert layout["sliders"][0]["active"] == 1
    # the first drawing is the active frame
    assert [t["y"] for t in ex.figure["data"]] == explore.frame_data(ex, 1)
    assert ex.figure["data"][0]["x"] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_static_traces_stay_and_are_not_restyled() -> None:
    ex = _make(static=[{"x": [0, 4], "y": [0, 0], "mode": "lines", "name": "zero"}])
    assert ex.figure["data"][0]["name"] == "zero"
    assert ex.figure["layout"]["meta"]["posenc"]["traces"] == [1, 2]
    for step in ex.figure["layout"]["sliders"][0]["steps"]:
        assert step["method"] == "update" and step["args"][2] == [1, 2]


def test_plotly_accepts_the_figure() -> None:
    go = pytest.importorskip("plotly.graph_objects")
    for control in ("slider", "menu"):
        ex = _make(control=control, x=torch.arange(1, 6), xlog=True, xrange=(1, 4),
                   yrange=(0, 8))
        go.Figure(data=ex.figure["data"], layout=ex.figure["layout"])  # raises on a bad key


def test_the_book_style() -> None:
    layout = _make().figure["layout"]
    sizes = [layout["font"]["size"], layout["xaxis"]["tickfont"]["size"],
             layout["sliders"][0]["font"]["size"], layout["legend"]["font"]["size"]]
    assert min(sizes) >= 12  # px; the house rule is 10 px at least
    assert layout["xaxis"]["fixedrange"] and layout["yaxis"]["fixedrange"]  # a finger scrolls
    assert layout["paper_bgcolor"] == layout["plot_bgcolor"] == "#fff"
    assert _make().figure["data"][0]["line"]["color"] == "#0072B2"


def test_html_loads_plotly_once_and_keeps_the_json_inside_its_tag() -> None:
    ex = _make(label="a </script> in a label")
    html = ex.to_html()
    spec = re.search(r'<script type="application/json" id="([^"]+)-spec">(.*?)</script>',
                     html, re.S)
    assert spec is not None and spec.group(1) == "posenc-explorable-test-one"
    assert json.loads(spec.group(2))["layout"]["meta"]["posenc"]["name"] == "test-one"
    assert "if (window.Plotly)" in html and 'getElementById("posenc-plotlyjs")' in html
    assert explore.plotlyjs_url() in html
    assert re.fullmatch(r"https://cdn\.plot\.ly/plotly-\d+\.\d+\.\d+\.min\.js",
                        explore.plotlyjs_url())
    bundle = ex._repr_mimebundle_()
    assert set(bundle) == {"application/vnd.plotly.v1+json", "text/html", "text/plain"}
    assert explore.plotlyjs_file().is_file()


@pytest.mark.parametrize(("value", "label"), [(100, "10²"), (1e4, "10⁴"), (5e5, "5·10⁵"),
                                              (1e6, "10⁶"), (2500, "2500")])
def test_power_label(value: float, label: str) -> None:
    assert explore.power_label(value) == label


@pytest.mark.parametrize(("change", "message"), [
    ({"names": ["a"]}, "has 2 traces"),
    ({"control": "knob"}, "control must be"),
    ({"active": 3}, "active must be in 0..2"),
    ({"x": None}, "give x="),
])
def test_bad_input(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _make(**change)


def test_not_finite_is_refused() -> None:
    frames = [explore.Frame("1", 1, [{"y": [0.0, float("nan")]}])]
    with pytest.raises(ValueError, match="finite"):
        explore.explorable("bad", frames, names=["a"], x=[0, 1], xlabel="", ylabel="",
                           control_label="", label="")


def _sphinx_app(mode: str, tmp_path):
    handlers: dict[str, object] = {}
    added: list[str] = []
    app = SimpleNamespace(
        config=SimpleNamespace(posenc_plotlyjs=mode),
        add_config_value=lambda *a: None,
        connect=lambda event, fn, priority=500: handlers.setdefault(event, fn),
        add_js_file=lambda name, **kw: added.append(name),
        builder=SimpleNamespace(format="html"),
        outdir=str(tmp_path),
    )
    explore.setup(app)
    return app, handlers, added


def test_sphinx_extension_adds_plotly_only_to_pages_with_an_explorable(tmp_path, monkeypatch):
    monkeypatch.delenv(explore.PLOTLYJS_ENV, raising=False)
    app, handlers, added = _sphinx_app("cdn", tmp_path)
    page = handlers["html-page-context"]
    page(app, "intro", "page.html", {"body": "<p>no figure</p>"}, object())
    assert added == []
    page(app, "book/03", "page.html", {"body": _make().to_html()}, object())
    assert added == [explore.plotlyjs_url()]
    handlers["build-finished"](app, None)
    assert not (tmp_path / "_static" / "plotly.min.js").exists()


def test_sphinx_extension_local_mode_serves_the_package_file(tmp_path, monkeypatch):
    monkeypatch.setenv(explore.PLOTLYJS_ENV, "local")
    app, handlers, added = _sphinx_app("cdn", tmp_path)
    handlers["html-page-context"](app, "p", "page.html", {"body": _make().to_html()}, object())
    assert added == ["plotly.min.js"]
    handlers["build-finished"](app, None)
    copied = tmp_path / "_static" / "plotly.min.js"
    assert copied.read_bytes() == explore.plotlyjs_file().read_bytes()


def test_each_script_once_per_page() -> None:
    from sphinx.builders.html._assets import _JavaScript

    thebe = "const THEBE_JS_URL = 1"
    scripts = [_JavaScript(None, body=thebe), _JavaScript("a.js"),
               _JavaScript("", body=thebe), _JavaScript("a.js", priority=200)]
    context = {"script_files": scripts}
    explore.dedupe_scripts(None, "p", "page.html", context, object())
    assert [str(s.filename) for s in context["script_files"]] == ["None", "a.js"]
    assert len(scripts) == 4  # the builder's own list is left alone


def _heat(**kwargs) -> explore.Explorable:
    z = torch.arange(6.0).view(2, 3)
    frames = [explore.Frame(str(k), k, [{"z": z + k}]) for k in range(2)]
    args = dict(x=[0, 1, 2], y=[0, 1], xlabel="key", ylabel="query", zlabel="offset",
                control_label="layout", label="a matrix and its tick labels", active=1)
    args.update(kwargs)
    return explore.heatmap("test-ticks", frames, **args)


def test_heatmap_tick_labels_follow_the_control() -> None:
    xt, yt = [["a", "b", "c"], ["0", "0", "1"]], [["p", "q"], ["5", "6"]]
    ex = _heat(xticktext=xt, yticktext=yt)
    layout = ex.figure["layout"]
    assert layout["xaxis"]["tickvals"] == [0.0, 1.0, 2.0]
    assert layout["xaxis"]["ticktext"] == xt[1] and layout["yaxis"]["ticktext"] == yt[1]
    for k, step in enumerate(layout["sliders"][0]["steps"]):
        assert step["args"][1]["xaxis.ticktext"] == xt[k]
        assert step["args"][1]["yaxis.ticktext"] == yt[k]
    assert "%{x}" not in ex.figure["data"][0]["hovertemplate"]  # slots are not the ticks
    go = pytest.importorskip("plotly.graph_objects")
    go.Figure(data=ex.figure["data"], layout=layout)  # raises on a bad key
    # without tick labels: the heatmap as before (no tick arrays, the hover names x and y)
    plain = _heat()
    assert "tickvals" not in plain.figure["layout"]["xaxis"]
    assert "xaxis.ticktext" not in plain.figure["layout"]["sliders"][0]["steps"][0]["args"][1]
    assert "%{x}" in plain.figure["data"][0]["hovertemplate"]


@pytest.mark.parametrize(("change", "message"), [
    ({"xticktext": [["a", "b", "c"]]}, "one list per frame"),
    ({"yticktext": [["a"], ["b"]]}, "one label per y value"),
    ({"xticktext": ["abc", "def"]}, "one label per x value"),
])
def test_heatmap_bad_tick_labels(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _heat(**change)


TREES = {"chain": [-1, 0, 1, 2], "two branches": [-1, 0, -1, 2], "top-2 x 2": [-1, -1, 0, 1, 0],
         "fan of 3": [-1, -1, -1]}


def _tree(**kwargs) -> explore.Explorable:
    args = dict(prefix=3, xlabel="key", ylabel="query", zlabel="m - n", control_label="tree",
                label="who sees whom in a draft tree", active=2)
    args.update(kwargs)
    return explore.speculative_tree("test-tree", TREES, **args)


def test_speculative_tree_draws_who_sees_whom_by_depth() -> None:
    """Each step's matrix, recomputed by hand from the parents: a node sees the prefix, its
    ancestors and itself, at positions prefix + depth; the rest (and the padding) is blank."""
    ex = _tree()
    values = ex.figure["layout"]["meta"]["posenc"]["values"]
    size = 3 + max(len(p) for p in TREES.values())
    for step, (name, parents) in enumerate(TREES.items()):
        assert values[step] == explore.tree_value(3, parents)
        P, N = 3, len(parents)
        depth, anc = [0] * N, [{i} for i in range(N)]
        for i, p in enumerate(parents):
            if p >= 0:
                depth[i], anc[i] = depth[p] + 1, anc[p] | {i}
        pos = list(range(P)) + [P + d for d in depth]
        want = torch.full((size, size), float("-inf"), dtype=torch.float64)
        for m in range(P + N):
            for n in range(P + N):
                sees = n <= m if m < P else (n < P or (n - P) in anc[m - P])
                if sees:
                    want[m, n] = pos[m] - pos[n]
        (shown,) = explore.frame_data(ex, step, key="z")
        got = torch.tensor([[float("-inf") if v is None else v for v in row] for row in shown],
                           dtype=torch.float64)
        assert torch.equal(got, want), name
        ticks = ex.figure["layout"]["sliders"][0]["steps"][step]["args"][1]["xaxis.ticktext"]
        assert ticks == [str(p) for p in pos] + [""] * (size - P - N)
    go = pytest.importorskip("plotly.graph_objects")
    go.Figure(data=ex.figure["data"], layout=ex.figure["layout"])  # raises on a bad key


def test_speculative_tree_bad_input() -> None:
    with pytest.raises(TypeError, match="trees must be a non-empty dict"):
        explore.speculative_tree("t", [[-1, 0]], prefix=2, xlabel="", ylabel="", zlabel="",
                                 control_label="", label="")
    with pytest.raises(ValueError, match="prefix must be in 1..64"):
        _tree(prefix=0)
    with pytest.raises(ValueError, match="an earlier node"):
        explore.speculative_tree("t", {"bad": [-1, 3]}, prefix=2, xlabel="", ylabel="",
                                 zlabel="", control_label="", label="")
