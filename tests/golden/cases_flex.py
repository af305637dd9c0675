"""The flex battery (issue 33, "every option of attend on ... flex"): named calls into posenc's
public API on ``backend="flex"``, recorded once at the base commit and compared bit for bit by
``tests/test_golden_flex.py``; the twin of ``cases.py`` (whose helpers it reuses), kept apart
because FlexAttention compiles on the CPU.

Record and check (``record.py --flex``)::

    PYTHONPATH=/path/to/base python tests/golden/record.py --flex          # golden_flex.pt
    PYTHONPATH=$PWD python tests/golden/record.py --flex --check           # list differences

Cost. ``flex_fn`` compiles ``flex_attention`` with ``dynamic=False``: every distinct input
shape, ``score_mod`` (code and constants) and rule (which of causal / window / sinks /
documents / padding / pairs / key positions it holds, and the ints it holds) is its own graph,
~4 s cold, ~0.3 s warm (inductor's on-disk cache). So the cases share shapes (``cases.layout``:
``B=2, H=4, L=8, D=16``; ``mha_case``: ``L=10``) and score_mods (NoPE and the four RoPEs run
without one, so they share a graph per rule), and the decode cases keep their key count
constant (a static cache; a growing cache evicted to a fixed size; a rolling cache). The
battery holds more graphs than dynamo's ``recompile_limit`` (8 per code object), past which
dynamo runs ``flex_attention`` eagerly (other numbers): ``record.record`` raises the limit for
the run, so the results do not depend on which tests compiled flex before in the process.

What runs where (at the base): a scheme with parameters (T5) or inputs that need gradients
make flex fall back to sdpa (no FlexAttention backward on the CPU; warns), so the cases run
under ``torch.no_grad()`` unless they are about that fallback (``grad/...``); ``sink_logits``
and dropout fall back to sdpa too (recorded, they compile nothing).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from cases import (
    LAYOUTS,
    SCHEMES,
    Result,
    attend_case,
    case,
    decode_case,
    dropout_case,
    mha_case,
    varlen_case,
)

CASES: dict[str, Callable[[], Result]] = {}

# the first compile imports inductor, whose import warns once per process (torch.utils.mkldnn:
# "torch.jit.script_method is deprecated"): imported here, so no case records torch's warning
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch._inductor.compile_fx  # noqa: F401


def flex(name: str, fn: Callable[[], Result], grad: bool = False) -> None:
    """Register ``fn`` as ``name``, run under ``torch.no_grad()`` unless ``grad``."""
    if grad:
        case(name, CASES)(fn)
        return

    def no_grad() -> Result:
        with torch.no_grad():
            return fn()
    case(name, CASES)(no_grad)


# every scheme in every layout: causal and not, GQA / MQA, Dv != Dh, key positions, padding
# (left, right, holes), who-sees-whom masks, documents, window, window + sinks.
# alibi/noncausal/flex was wrong at the base (1.10 off math and sdpa, max abs: the fast path's
# ALiBi.score_mod(q_offset) has no causal argument, so causal=False got -m (i - j) where the
# other backends give -m |i - j|); fixed after the redesign and re-recorded, that case alone
for _s in SCHEMES:
    for _l in LAYOUTS:
        flex(f"attend/{_s}/{_l}/flex/f32", attend_case(_s, _l, "flex"))
# softmax options: scale and softcap compile; sink logits fall back to sdpa
for _s in ("nope", "rope_h", "alibi", "t5c"):
    flex(f"attend/{_s}/plain/flex/f32/scale", attend_case(_s, "plain", "flex", scale=0.3))
    flex(f"attend/{_s}/plain/flex/f32/softcap", attend_case(_s, "plain", "flex", softcap=2.0))
    flex(f"attend/{_s}/window/flex/f32/sink_logits",
         attend_case(_s, "window", "flex", sink_logits=True))
flex("attend/alibi/window_sinks/flex/f32/scale_softcap",
     attend_case("alibi", "window_sinks", "flex", scale=0.3, softcap=2.0))
# bfloat16
for _s in ("rope_h", "alibi", "t5c"):
    for _l in ("plain", "pad_holes"):
        flex(f"attend/{_s}/{_l}/flex/bf16", attend_case(_s, _l, "flex", torch.bfloat16))
# gradients: no FlexAttention backward on the CPU, so these run on sdpa (and warn)
for _s in ("nope", "rope_h", "alibi", "t5c"):
    flex(f"grad/{_s}/plain/flex", attend_case(_s, "plain", "flex", grad=True), grad=True)
for _l in ("gqa", "docs", "window_sinks"):
    flex(f"grad/t5c/{_l}/flex", attend_case("t5c", _l, "flex", grad=True), grad=True)
flex("dropout/flex", dropout_case("flex"))


def sinks_and_last_6(n: int) -> torch.Tensor:
    """The slots a growing cache keeps after each step: the 2 first and the 6 latest. Written
    out: streaming_keep(n, 2, W) changed meaning in 0.4.0 (issue 34: W - 1 latest, was W), so
    the same call would evict differently at the base and after it."""
    return torch.arange(n) if n <= 8 else torch.cat([torch.arange(2), torch.arange(n - 6, n)])


# a prefill then decode steps over each kind of cache (outputs and the final state); the key
# count stays fixed after the first steps (evicted, static, rolling): few shapes to compile
for _kind in ("growing", "static", "rolling"):
    for _s in ("rope_h", "alibi", "t5c"):
        flex(f"cache/{_kind}/{_s}/flex",
             decode_case(_kind, _s, "flex", full=False, keep=sinks_and_last_6))
# attend_varlen on flex (a packed row with document ids)
for _s in ("nope", "rope_h", "alibi"):
    flex(f"varlen/{_s}/flex", varlen_case(_s, "flex", [5, 0, 9, 5, 3]))
    flex(f"varlen/{_s}/flex/window", varlen_case(_s, "flex", [7, 0, 12], window=3))
# MultiHeadAttention(backend="flex"), plain and left-padded; with gradients it runs on sdpa
for _s in ("nope", "rope", "alibi", "t5", "sinusoidal"):
    flex(f"mha/{_s}/flex", mha_case(_s, backend="flex"))
flex("mha/learned/flex", mha_case("learned", backend="flex", max_len=16))
flex("mha/rope/gqa_window/flex",
     mha_case("rope", num_kv_heads=2, window=4, sinks=1, backend="flex"))
flex("mha/alibi/flex/grad", mha_case("alibi", backend="flex"), grad=True)
