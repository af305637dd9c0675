"""Compiled and drop-in (issue 15): ``torch.compile(fullgraph=True)`` traces attention, RoPE and
the lab model with every option and no graph break, gives the eager outputs, and a static cache
decodes 32 steps with at most two compilations (prefill and step).

Tracing is checked with dynamo's ``eager`` backend (fast: it only traces, and ``fullgraph=True``
turns any graph break into an error); a few cases also run through Inductor."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

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
