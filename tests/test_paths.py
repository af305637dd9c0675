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


# ---------------------------------------------- attend's path: choose_path (issue 33: documents)


def _path_facts(**change):
    """A packed call of two documents in one row, every fact named; ``change`` overrides."""
    from posenc.attend_inputs import Call, Seen
    from posenc.attention import Keys, Where
    from posenc.schemes import NoPE

    L = 6
    doc = torch.tensor([[0, 0, 0, 1, 1, 1]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 2]])
    kv = torch.zeros(1, 2, L, 4)
    facts = dict(scheme=NoPE(), causal=True, window=None, sinks=None, backend="sdpa",
                 dropout_p=0.0, rolling=False, q_pos=pos, k_pos=None, doc=doc, given=False,
                 padding=None, pairs=None, softmax=PLAIN, valid=None, slot=0,
                 evicted=False, by_index=True, compiling=False)
    facts.update(change)
    f = facts
    call = Call(f["scheme"], f["causal"], f["window"], f["sinks"], f["backend"], f["dropout_p"],
                f["rolling"])
    where = Where(f["q_pos"], f["k_pos"], f["doc"], f["given"])
    keys = Keys(kv, kv, f["q_pos"], f["doc"], f["valid"], f["slot"], f["evicted"],
                f["by_index"])
    return call, where, Seen(f["padding"], f["pairs"]), f["softmax"], keys, f["compiling"]


def _path(**change):
    from posenc.attention import choose_path

    call, where, seen, softmax, keys, compiling = _path_facts(**change)
    return choose_path(call, where, seen, softmax, keys, compiling=compiling)


def _scheme(name):
    from posenc.schemes import make_scheme

    return make_scheme(name, dim=8, num_heads=2)


@pytest.mark.parametrize(
    ("change", "want"),
    [
        ({}, "documents"),
        ({"causal": False}, "documents"),
        ({"window": 2}, "documents"),
        ({"window": 2, "causal": False}, "documents"),
        ({"softmax": Softmax(scale=0.5)}, "documents"),
        ({"scheme": "rope"}, "documents"),
        ({"scheme": "alibi"}, "documents"),
        ({"scheme": "t5"}, "documents"),
        ({"given": True}, "documents"),  # NoPE reads no position
        ({"given": True, "scheme": "rope"}, "rule"),  # given positions may not restart
        ({"given": True, "scheme": "alibi"}, "rule"),
        ({"compiling": True}, "rule"),  # the run lengths are a host read
        ({"backend": "math"}, "rule"),
        ({"backend": "flex"}, "rule"),
        ({"sinks": 1, "window": 2}, "rule"),
        ({"padding": torch.ones(1, 6, dtype=torch.bool)}, "rule"),
        ({"pairs": torch.ones(1, 6, 6, dtype=torch.bool)}, "rule"),
        ({"valid": torch.ones(1, 6, dtype=torch.bool)}, "rule"),
        ({"slot": 3}, "rule"),  # a growing cache's earlier keys
        ({"valid": torch.ones(1, 6, dtype=torch.bool), "by_index": False}, "rule"),  # static
        ({"evicted": True, "by_index": False}, "rule"),  # evict leaves slots != keys
        ({"rolling": True}, "rule"),
        ({"k_pos": torch.arange(6)[None]}, "rule"),
        ({"softmax": CAP}, "rule"),
        ({"softmax": SINK}, "rule"),
        ({"softmax": DROP, "dropout_p": 0.1}, "rule"),  # another draw than the dense mask's
        ({"doc": None}, "fast"),
    ],
)
def test_documents_take_the_grouped_path_only_where_it_is_the_same_answer(change, want):
    if isinstance(change.get("scheme"), str):
        change = {**change, "scheme": _scheme(change["scheme"])}
    assert _path(**change) == want
