"""The one table of which backend runs a call and why (posenc.backends.effective_backend),
read without running attention: every fallback named in one place."""

from __future__ import annotations

import pytest
import torch

from posenc.backends import PLAIN, Route, Softmax, effective_backend

SINK = Softmax(sink_logits=torch.zeros(4))
CAP = Softmax(softcap=30.0)
DROP = Softmax(dropout_p=0.1)


@pytest.mark.parametrize("path", ["one_query", "fast", "rule"])
@pytest.mark.parametrize("backend", ["sdpa", "math", "flex"])
def test_a_plain_call_runs_where_asked(backend, path):
    assert effective_backend(backend, PLAIN, path=path) == Route(backend)
    assert effective_backend(backend, PLAIN, path=path, device_type="cuda", needs_grad=True) == (
        Route(backend))


@pytest.mark.parametrize(
    ("softmax", "device", "grad", "want", "why", "warning"),
    [
        (SINK, "cpu", False, "sdpa", "sink logits", "flex-sink"),
        (SINK, "cuda", False, "sdpa", "sink logits", "flex-sink"),
        (DROP, "cpu", False, "sdpa", "dropout", None),
        (DROP, "cuda", True, "sdpa", "dropout", None),
        (PLAIN, "cpu", True, "sdpa", "training on the CPU", "cpu-grad"),
        (PLAIN, "cuda", True, "flex", "", None),
        (CAP, "cpu", False, "flex", "", None),  # flex caps in its score_mod
        (Softmax(softcap=30.0, dropout_p=0.1), "cpu", False, "math", "softcap", None),
        (Softmax(softcap=30.0, sink_logits=torch.zeros(4)), "cpu", False, "math", "softcap",
         "flex-sink"),
    ],
)
def test_flex_falls_back_for_a_named_reason(softmax, device, grad, want, why, warning):
    route = effective_backend("flex", softmax, path="rule", device_type=device, needs_grad=grad)
    assert route.backend == want
    assert why in route.reason and (route.reason == "") == (why == "")
    assert route.warning == warning


def test_sdpa_runs_written_out_for_softcap_under_a_rule():
    route = effective_backend("sdpa", CAP, path="rule")
    assert route.backend == "math" and "softcap" in route.reason
    assert effective_backend("math", CAP, path="rule") == Route("math")
    assert effective_backend("sdpa", SINK, path="rule") == Route("sdpa")  # an extra key


@pytest.mark.parametrize("softmax", [PLAIN, DROP])
def test_fast_paths_keep_sdpa_and_math(softmax):
    for path in ("one_query", "fast"):
        assert effective_backend("sdpa", softmax, path=path) == Route("sdpa")
        assert effective_backend("math", softmax, path=path) == Route("math")
    assert effective_backend("flex", DROP, path="fast").backend == "sdpa"
    assert effective_backend("flex", PLAIN, path="fast", needs_grad=True).warning == "cpu-grad"


def test_softmax_is_plain_without_cap_or_sink_logit():
    assert PLAIN.plain and DROP.plain and Softmax(scale=0.5).plain
    assert not CAP.plain and not SINK.plain
    with pytest.raises(AttributeError):
        PLAIN.scale = 2.0  # type: ignore[misc]  # frozen


def test_warnings_point_at_the_callers_line():
    import posenc

    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    from posenc import backends

    backends._warned.discard("cpu-grad")
    with pytest.warns(UserWarning, match="no backward on CPU") as got:
        posenc.attend(q, q, q, window=2, backend="flex")
    assert got[0].filename == __file__
