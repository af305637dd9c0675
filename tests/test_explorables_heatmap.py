"""posenc.lab.explore.heatmap without a browser: every frame's matrix is in the figure (masked
cells as null), the slider restyles ``z`` only, Plotly accepts the figure, bad input is refused."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.lab import explore

pytest.importorskip("plotly")

L = 6


def _make(**kwargs) -> tuple[explore.Explorable, torch.Tensor]:
    bias = posenc.alibi_bias(4, L)  # -inf above the diagonal
    frames = [explore.Frame(label=str(h), value=h, traces=[{"z": bias[h]}], title=f"head {h}")
              for h in range(4)]
    args = dict(x=torch.arange(L), y=torch.arange(L), xlabel="n", ylabel="m", zlabel="bias",
                control_label="head", label="bias of one head; a slider chooses it", active=2,
                zrange=(-2.5, 0))
    args.update(kwargs)
    return explore.heatmap("test-heat", frames, **args), bias


def _back(rows: list[list[float | None]]) -> torch.Tensor:
    return torch.tensor([[-math.inf if v is None else v for v in row] for row in rows],
                        dtype=torch.float64)


def test_every_matrix_is_in_the_figure() -> None:
    ex, bias = _make()
    for h in range(4):
        (z,) = explore.frame_data(ex, h, key="z")
        torch.testing.assert_close(_back(z), bias[h].double(), atol=0, rtol=1e-6)
        assert z[0][1] is None and z[1][0] is not None  # masked above the diagonal only
    (trace,) = ex.figure["data"]
    assert trace["type"] == "heatmap" and trace["z"] == explore.frame_data(ex, 2, key="z")[0]
    assert (trace["zmin"], trace["zmax"]) == (-2.5, 0.0)
    layout = ex.figure["layout"]
    meta = layout["meta"]["posenc"]
    assert meta["kind"] == "heatmap" and meta["traces"] == [0] and meta["values"] == [0, 1, 2, 3]
    steps = layout["sliders"][0]["steps"]
    assert [s["args"][1] for s in steps] == [{"title.text": f"head {h}"} for h in range(4)]
    assert all(set(s["args"][0]) == {"z"} and s["args"][2] == [0] for s in steps)
    assert layout["yaxis"]["autorange"] == "reversed"  # row 0 on top, as imshow
    assert layout["xaxis"]["fixedrange"] and layout["yaxis"]["fixedrange"]


def test_plotly_accepts_the_heatmap() -> None:
    go = pytest.importorskip("plotly.graph_objects")
    ex, _ = _make()
    go.Figure(data=ex.figure["data"], layout=ex.figure["layout"])  # raises on a bad key
    assert 'class="posenc-explorable"' in ex.to_html()


@pytest.mark.parametrize(("change", "message"), [
    ({"active": 4}, "active must be in 0..3"),
    ({"x": torch.arange(L + 1)}, "z must be"),
])
def test_bad_input(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _make(**change)


def test_plus_infinity_and_extra_keys_are_refused() -> None:
    z = torch.zeros(2, 2)
    z[0, 0] = math.inf
    common = dict(x=[0, 1], y=[0, 1], xlabel="", ylabel="", zlabel="", control_label="",
                  label="")
    with pytest.raises(ValueError, match="-inf"):
        explore.heatmap("bad", [explore.Frame("1", 1, [{"z": z}])], **common)
    with pytest.raises(ValueError, match="'z' only"):
        explore.heatmap("bad", [explore.Frame("1", 1, [{"z": z, "y": [0]}])], **common)
