"""Compiled and drop-in (issue 15): ``torch.compile(fullgraph=True)`` traces attention, RoPE and
the lab model with every option and no graph break, gives the eager outputs, and a static cache
decodes 32 steps with at most two compilations (prefill and step).

Tracing is checked with dynamo's ``eager`` backend (fast: it only traces, and ``fullgraph=True``
turns any graph break into an error); a few cases also run through Inductor."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

import posenc
from posenc import KVCache, MultiHeadAttention, RotaryEmbedding, attend, make_scheme

close = torch.testing.assert_close
SCHEMES = ("rope", "alibi", "t5", "nope", "sinusoidal", "learned")
MASK = torch.tensor([[1] * 10, [0] * 3 + [1] * 7])
DOCS = torch.tensor([[0] * 4 + [1] * 6, [0] * 10])
CALLS = {
    "plain": {},
    "padded": {"attention_mask": MASK, "positions": posenc.positions_from_mask(MASK)},
    "packed": {"document_ids": DOCS},
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def layer(name: str, **kwargs) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(64, 4, scheme=name, max_len=32, **kwargs).eval()


@pytest.mark.parametrize("options", [{}, {"num_kv_heads": 2, "window": 4}], ids=["mha", "gqa+window"])
@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_attention_traces_in_one_graph(name, options):
    m = layer(name, **options)
    x = torch.randn(2, 10, 64)
    for call, kwargs in CALLS.items():
        counter = CompileCounter()
        y = torch.compile(m, backend=counter, fullgraph=True)(x, **kwargs)
        assert counter.frame_count == 1, call  # one graph, no break (fullgraph would raise)
        close(y, m(x, **kwargs))


@pytest.mark.parametrize("name", ("rope", "alibi"))
def test_inductor_output_and_gradients_equal_eager(name):
    m = layer(name, num_kv_heads=2, window=6)
    x = torch.randn(2, 10, 64, requires_grad=True)
    kw = CALLS["padded"]
    eager = m(x, **kw)
    (g_eager,) = torch.autograd.grad(eager.square().sum(), x)
    compiled = torch.compile(m, fullgraph=True)(x, **kw)
    (g_comp,) = torch.autograd.grad(compiled.square().sum(), x)
    close(compiled, eager, atol=1e-5, rtol=1e-5)
    close(g_comp, g_eager, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_embedding_and_attend_compile(interleaved):
    rot = RotaryEmbedding(16, interleaved=interleaved)
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16)
    pos = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11]] * 2)
    counter = CompileCounter()
    got = torch.compile(rot, backend=counter, fullgraph=True)(q, k, positions=pos)
    want = rot(q, k, positions=pos)
    close(got[0], want[0])
    close(got[1], want[1])
    got = torch.compile(rot, backend=counter, fullgraph=True)(q, k, offset=5)
    want = rot(q, k, offset=5)
    close(got[0], want[0])
    sch = make_scheme("alibi", num_heads=4)
    v = torch.randn(2, 2, 9, 16)

    def f(q, k, v):
        return attend(q, k, v, sch, attention_mask=MASK[:, :9], window=3)

    close(torch.compile(f, backend=counter, fullgraph=True)(q, k, v), f(q, k, v))


def test_the_lab_model_compiles_in_one_graph():
    from posenc.lab.model import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(scheme="rope", dim=32, num_heads=2, num_layers=2, vocab_size=50).eval()
    tokens = torch.randint(0, 50, (2, 12))
    counter = CompileCounter()
    with torch.no_grad():
        close(torch.compile(model, backend=counter, fullgraph=True)(tokens), model(tokens))
    assert counter.frame_count == 1


@pytest.mark.parametrize("name", ("rope", "alibi"))
@torch.no_grad()
def test_static_cache_decodes_32_steps_with_two_compilations(name):
    """Prefill compiles once and the step once: the cache keeps its shape, and its write
    pointer and the positions are tensors, so no step recompiles. The tokens equal eager's."""
    from posenc.lab.model import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(scheme=name, dim=32, num_heads=4, num_layers=2, vocab_size=40).eval()
    prompt = torch.randint(0, 40, (2, 6))

    def decode(fn, steps=32):
        caches = [KVCache(max_len=6 + steps) for _ in model.blocks]
        logits = fn(prompt, caches=caches)
        out = [logits[:, -1].argmax(-1, keepdim=True)]
        for _ in range(steps - 1):
            out.append(fn(out[-1], caches=caches)[:, -1].argmax(-1, keepdim=True))
        return torch.cat(out, 1)

    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    tokens = decode(compiled)
    assert counter.frame_count <= 2
    assert torch.equal(tokens, decode(model))
    # and the static cache gives the tokens of the growing one
    caches = [KVCache() for _ in model.blocks]
    ref = [model(prompt, caches=caches)[:, -1].argmax(-1, keepdim=True)]
    for _ in range(31):
        ref.append(model(ref[-1], caches=caches)[:, -1].argmax(-1, keepdim=True))
    assert torch.equal(tokens, torch.cat(ref, 1))


def test_checks_stay_in_eager_mode():
    # what compiling skips (a host sync) still raises without the compiler
    m = layer("rope")
    with pytest.raises(ValueError, match="positions must be >= 0"):
        m(torch.randn(1, 3, 64), positions=torch.tensor([0, -1, 2]))


# Issue 22: the rotation written for Inductor (``posenc.rope._rope_compiled``: tables stacked
# from one angle per pair, the channel swap as flip / roll, an analytic backward traced by
# Dynamo). Each case compiles forward and backward with Inductor, so the cases are a covering
# subset: every pair of values of (layout, dtype, partial rotary, xPos, positions) occurs in
# some row, e.g. half layout x bf16 in rows 2 and 6, xPos x positions [B, L] in row 5.
ROPE_CASES = [  # interleaved, dtype, partial_rotary_factor, xpos_scale_base, positions
    (True, torch.float32, 1.0, None, None),
    (False, torch.bfloat16, 0.5, 512.0, None),
    (True, torch.bfloat16, 0.5, None, "L"),
    (False, torch.float32, 1.0, 512.0, "L"),
    (True, torch.float32, 0.5, 512.0, "BL"),
    (False, torch.bfloat16, 1.0, None, "BL"),
]
POSITIONS = {
    None: None,
    "L": torch.arange(3, 12),  # [L]
    "BL": torch.tensor([[0, 2, 5, 9, 14, 20, 27, 35, 44], list(range(7, 16))]),  # [B, L]
}


def _rope_case_id(case) -> str:
    il, dt, prf, xpos, pos = case
    return "-".join((
        "interleaved" if il else "half", str(dt).removeprefix("torch."),
        f"rotary{prf}", "xpos" if xpos else "noxpos", f"pos{pos}",
    ))  # fmt: skip


def _inductor_vs_eager(fn, inputs, seed=1):
    """Outputs and input gradients of ``fn`` eager and under ``torch.compile(fullgraph=True)``
    (Inductor, counted: one graph), for one random upstream gradient per output."""
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    results = []
    for f in (fn, compiled):
        outs = f(*inputs)
        gen = torch.Generator().manual_seed(seed)
        ups = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
        results.append((outs, torch.autograd.grad(outs, inputs, ups)))
    assert counter.frame_count == 1  # one graph: fullgraph=True would raise at a break
    return results


@pytest.mark.parametrize("case", ROPE_CASES, ids=_rope_case_id)
def test_rotary_embedding_inductor_forward_backward_equal_eager(case):
    il, dt, prf, xpos, pos = case
    rot = RotaryEmbedding(16, interleaved=il, partial_rotary_factor=prf, xpos_scale_base=xpos)
    assert rot.rotary_dim == int(16 * prf)
    torch.manual_seed(0)
    q = torch.randn(2, 4, 9, 16, dtype=dt, requires_grad=True)
    k = torch.randn(2, 2, 9, 16, dtype=dt, requires_grad=True)  # grouped-query heads
    positions = POSITIONS[pos]

    def f(q, k):
        return rot(q, k, positions=positions)

    (eager, g_eager), (comp, g_comp) = _inductor_vs_eager(f, (q, k))
    for got, want in zip((*comp, *g_comp), (*eager, *g_eager), strict=True):
        assert got.dtype == want.dtype == dt
        close(got, want)  # torch.testing's default tolerances for the dtype
    if prf < 1:  # the channels past rotary_dim pass through, and so do their gradients
        rd = rot.rotary_dim
        assert torch.equal(comp[0][..., rd:], q[..., rd:])
        assert torch.equal(comp[1][..., rd:], k[..., rd:])


APPLY_CASES = [  # interleaved, dtype, rotary_dim (of head_dim 16), positions, learnable cos/sin
    (False, torch.float32, 8, "BL", False),
    (True, torch.bfloat16, 8, "L", True),
]


@pytest.mark.parametrize(
    "case", APPLY_CASES, ids=["half-float32-rd8-BL-tables", "interleaved-bfloat16-rd8-L-learnable"]
)
def test_apply_rope_inductor_forward_backward_equal_eager(case):
    """Fixed tables take ``_rope_compiled``; learnable ones the textbook form, whose
    gradients reach cos and sin."""
    il, dt, rd, pos, learn = case
    positions = POSITIONS[pos]
    inv_freq, _ = posenc.rope_inv_freq(rd)
    cos, sin = posenc.rope_cos_sin(positions, inv_freq, interleaved=il)  # [(B,) L, rd] float32
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, L, rd]
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 16, dtype=dt, requires_grad=True)
    inputs = (x, cos.requires_grad_(learn), sin.requires_grad_(learn))
    inputs = inputs if learn else inputs[:1]

    def f(x, *tables):
        c, s = tables if tables else (cos, sin)
        return (posenc.apply_rope(x, c, s, interleaved=il),)

    (eager, g_eager), (comp, g_comp) = _inductor_vs_eager(f, inputs)
    assert len(g_comp) == (3 if learn else 1)
    for got, want in zip((*comp, *g_comp), (*eager, *g_eager), strict=True):
        assert got.dtype == want.dtype
        close(got, want)
    assert torch.equal(comp[0][..., rd:], x[..., rd:])


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half"])
def test_compiled_rope_backward_is_the_gradient(interleaved):
    """The analytic backward of ``_RopeCompiled`` (rotation by minus the angle), run eagerly in
    float64: gradcheck against finite differences, and equal to autograd through the eager
    textbook form, with xPos-like tables (cos^2 + sin^2 != 1), partial rotary, [B, 1, L, rd]."""
    from posenc.rope import _rope_compiled, _rope_textbook

    rd = 4
    positions = torch.tensor([[0, 1, 3], [2, 5, 6]])  # [B, L]
    cos, sin = posenc.rope_cos_sin(
        positions, posenc.rope_inv_freq(rd, base=10.0)[0], interleaved=interleaved,
        dtype=torch.float64,
    )  # fmt: skip
    scale = torch.tensor([0.7, 1.3], dtype=torch.float64)  # per pair, as xPos
    scale = scale.repeat_interleave(2) if interleaved else scale.repeat(2)  # the table's layout
    cos, sin = (cos * scale)[:, None], (sin * scale)[:, None]  # [B, 1, L, rd]
    x = torch.randn(2, 2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: _rope_compiled(x, cos, sin, interleaved), (x,))
    y = _rope_compiled(x, cos, sin, interleaved)
    close(y, _rope_textbook(x, cos, sin, interleaved), rtol=1e-12, atol=1e-12)
    up = torch.randn_like(y)
    (g_custom,) = torch.autograd.grad(y, x, up)
    (g_auto,) = torch.autograd.grad(_rope_textbook(x, cos, sin, interleaved), x, up)
    close(g_custom, g_auto, rtol=1e-12, atol=1e-12)
