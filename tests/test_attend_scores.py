"""attend's scores and visibility as data (issue 26 §3): ``scale``, ``softcap``, ``sink_logits``,
``sinks`` with a window, and a boolean who-sees-whom mask, on every backend, against a
written-out softmax; a speculative tree equals each path alone; bad calls are refused."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import posenc
from posenc.schemes import ALiBi, RoPE, T5Bias

BACKENDS = ("sdpa", "math", "flex")
B, H, H_KV, L, D = 2, 4, 2, 11, 16


def qkv(seed: int = 0, L: int = L) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g) * 3  # scores of a few units: the cap bites
    k = torch.randn(B, H_KV, L, D, generator=g) * 3
    v = torch.randn(B, H_KV, L, D, generator=g)
    return q, k, v


def reference(q, k, v, allowed, *, bias=None, scale=None, softcap=None, sink=None):
    """softmax(cap(q k^T * scale) + bias, masked) v with the sink's logit in the denominator."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    s = q.double() @ k.double().transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if bias is not None:
        s = s + bias.double()
    s = s.masked_fill(~allowed, -math.inf)
    if sink is not None:
        col = sink.double()[None, :, None, None].expand(*s.shape[:-1], 1)
        p = torch.cat([s, col], -1).softmax(-1)[..., :-1]
    else:
        p = s.softmax(-1)
    return (p @ v.double()).float()


def run(backend, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex with sink_logits runs on sdpa, said once
        return posenc.attend(*args, backend=backend, **kwargs)


I = torch.arange(L)
CAUSAL = I[:, None] >= I[None]  # [L, L]


def alibi_bias(scheme: ALiBi) -> torch.Tensor:
    return -scheme.slopes[:, None, None] * (I[:, None] - I[None]).float()  # [H, L, L]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [None, 0.37])
@pytest.mark.parametrize("softcap", [None, 4.0])
@pytest.mark.parametrize("with_sink", [False, True])
def test_scores_equal_written_out_softmax(backend, scale, softcap, with_sink):
    q, k, v = qkv()
    sink = torch.randn(H, generator=torch.Generator().manual_seed(1)) if with_sink else None
    out = run(backend, q, k, v, scale=scale, softcap=softcap, sink_logits=sink)
    want = reference(q, k, v, CAUSAL, scale=scale, softcap=softcap, sink=sink)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
    if softcap is not None:  # the cap changes the answer: the test would see it missing
        assert (reference(q, k, v, CAUSAL, scale=scale, sink=sink) - want).abs().max() > 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_scores_with_a_bias_and_padding(backend):
    q, k, v = qkv(2)
    scheme = ALiBi(H)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :3] = 0
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out = run(backend, q, k, v, scheme, attention_mask=mask, scale=0.2, softcap=3.0,
              sink_logits=sink)
    allowed = CAUSAL[None, None] & mask.bool()[:, None, None, :]
    want = reference(q, k, v, allowed, bias=alibi_bias(scheme), scale=0.2, softcap=3.0, sink=sink)
    want[1, :, :3] = 0  # a padded query sees no key: zeros
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)


def rotate_written_out(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE by hand, interleaved pairs (2i, 2i + 1) turned by p * base^(-2i/D), in float64."""
    x = x.double()
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # [D/2]
    angle = I.double()[:, None] * theta  # [L, D/2]
    cos, sin = angle.cos(), angle.sin()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)


def written_out(scheme_name, scheme, q, k, v, allowed):
    """The windowed attention with sinks from the formula, scheme by scheme (no posenc route)."""
    if scheme_name == "alibi":
        return reference(q, k, v, allowed, bias=alibi_bias(scheme))
    if scheme_name == "rope":
        assert scheme.rotary.interleaved and scheme.rotary.base == 10000.0
        return reference(rotate_written_out(q), rotate_written_out(k), v, allowed)
    # T5 (causal): bias[h, i, j] = table[bucket(j - i), h]
    rel = I[None] - I[:, None]  # [L, L], j - i
    buckets = posenc.t5.t5_relative_bucket(rel, bidirectional=scheme.rel.bidirectional,
                                           num_buckets=scheme.rel.num_buckets,
                                           max_distance=scheme.rel.max_distance)
    bias = scheme.rel.embedding.weight.detach()[buckets].permute(2, 0, 1)  # [H, L, L]
    return reference(q, k, v, allowed, bias=bias)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scheme_name", ["alibi", "rope", "t5"])
@pytest.mark.parametrize("sinks", [1, 3])
def test_window_with_sinks(backend, scheme_name, sinks):
    q, k, v = qkv(3)
    scheme = {"alibi": ALiBi(H), "rope": RoPE(D), "t5": T5Bias(H)}[scheme_name]
    W = 4
    out = run(backend, q, k, v, scheme, window=W, sinks=sinks)
    allowed = CAUSAL & ((I[:, None] - I[None] < W) | (I[None] < sinks))
    # the same rule as a who-sees-whom matrix: an independent route through the rule
    via_matrix = run("math", q, k, v, scheme, attention_mask=allowed.expand(B, L, L))
    torch.testing.assert_close(out, via_matrix, atol=2e-5, rtol=2e-5)
    want = written_out(scheme_name, scheme, q, k, v, allowed)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
    plain = run(backend, q, k, v, scheme, window=W)
    assert (plain - out)[:, :, W + 1:].abs().max() > 1e-3  # the sinks change late rows


def test_window_with_sinks_equals_streaming_decode():
    """Prefill with window + sinks = decoding one token at a time with StreamingLLM eviction
    (keep the first S keys and the last W - 1, then add the new one)."""
    q, k, v = qkv(4)
    scheme, S, W = ALiBi(H), 2, 4
    full = posenc.attend(q, k, v, scheme, window=W, sinks=S)
    cache = posenc.KVCache()
    for t in range(L):
        step = posenc.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], scheme,
                             positions=torch.tensor([t]), cache=cache, window=W, sinks=S)
        torch.testing.assert_close(step, full[:, :, t:t + 1], atol=2e-6, rtol=2e-5)
        n = len(cache)
        if n > S + W - 1:
            keep = torch.cat([torch.arange(S), torch.arange(n - (W - 1), n)])
            cache.evict(keep)


def tree() -> tuple[torch.Tensor, list[list[int]]]:
    """A draft tree after a prompt of 4: node parents, depth positions, and its paths."""
    parent = [-1, -1, 0, 0, 1, 2]  # nodes 0..5; roots 0 and 1 follow the prompt
    paths = [[0, 2, 5], [0, 3], [1, 4]]
    return torch.tensor(parent), paths


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scheme_name", ["rope", "alibi"])
def test_speculative_tree_equals_each_path_alone(backend, scheme_name):
    """Draft tokens at positions by depth, each seeing the prompt and its ancestors: verifying
    the tree in one call equals decoding each path alone after the prompt."""
    P, parent, paths = 4, *tree()
    N = len(parent)
    depth = torch.zeros(N, dtype=torch.long)
    anc = torch.eye(N, dtype=torch.bool)
    for i in range(N):
        j = int(parent[i])
        while j >= 0:
            anc[i, j] = True
            depth[i] += 1
            j = int(parent[j])
    g = torch.Generator().manual_seed(5)
    scheme = RoPE(D) if scheme_name == "rope" else ALiBi(H)
    q = torch.randn(1, H, P + N, D, generator=g)
    k = torch.randn(1, H_KV, P + N, D, generator=g)
    v = torch.randn(1, H_KV, P + N, D, generator=g)
    cache = posenc.KVCache()
    posenc.attend(q[:, :, :P], k[:, :, :P], v[:, :, :P], scheme, cache=cache)
    see = torch.cat([torch.ones(N, P, dtype=torch.bool), anc], dim=1)  # [N, P + N]
    out = run(backend, q[:, :, P:], k[:, :, P:], v[:, :, P:], scheme, cache=cache,
              positions=P + depth, attention_mask=see[None, None], causal=False)
    for path in paths:
        idx = torch.tensor([*range(P), *(P + i for i in path)])
        alone = posenc.attend(q[:, :, idx], k[:, :, idx], v[:, :, idx], scheme)
        torch.testing.assert_close(out[:, :, path], alone[:, :, P:], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefix_lm(backend):
    """A prefix of 5 sees itself both ways, the rest is causal: a who-sees-whom matrix with
    causal=False equals the written-out softmax under that rule."""
    q, k, v = qkv(6)
    scheme = ALiBi(H)
    allowed = CAUSAL | ((I[:, None] < 5) & (I[None] < 5))
    out = run(backend, q, k, v, scheme, attention_mask=allowed[None], causal=False)
    bias = -scheme.slopes[:, None, None] * (I[:, None] - I[None]).abs().float()
    torch.testing.assert_close(out, reference(q, k, v, allowed, bias=bias), atol=2e-5, rtol=2e-5)


def test_static_cache_takes_a_matrix_over_its_slots():
    q, k, v = qkv(7)
    cache = posenc.KVCache(max_len=16)
    posenc.attend(q[:, :, :6], k[:, :, :6], v[:, :, :6], cache=cache)
    see = CAUSAL[6:, :]  # [5, 11]: the cached plus new keys
    out = posenc.attend(q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], cache=cache,
                        attention_mask=see[None].expand(B, -1, -1))
    torch.testing.assert_close(out, posenc.attend(q, k, v)[:, :, 6:], atol=2e-6, rtol=2e-5)


BAD = [
    (dict(sinks=2), ValueError, "sinks=2 needs window=W too"),
    (dict(sinks=-1, window=3), ValueError, "sinks must be an int >= 0, got -1"),
    (dict(sinks=1.5, window=3), TypeError, "sinks must be an int"),
    (dict(scale=0.0), ValueError, "scale must be > 0"),
    (dict(scale="a"), TypeError, "scale must be a real number"),
    (dict(softcap=-2.0), ValueError, "softcap must be > 0"),
    (dict(softcap=float("inf")), ValueError, "softcap must be finite"),
    (dict(sink_logits=torch.zeros(3)), ValueError, "sink_logits must have shape [4]"),
    (dict(sink_logits=torch.zeros(4, dtype=torch.long)), TypeError, "sink_logits must be a floating"),
    (dict(sink_logits=[0.0] * 4), TypeError, "sink_logits must be a torch.Tensor"),
    (dict(attention_mask=torch.zeros(B, L, L)), TypeError, "must be bool (True = may see)"),
    (dict(attention_mask=torch.ones(B, L, L + 1, dtype=torch.bool)), ValueError,
     f"must have shape [{B}, {L}, {L}]"),
    (dict(attention_mask=torch.ones(B, H, L, L, dtype=torch.bool)), ValueError,
     "[B, 1, Lq, Lk] (one matrix for every head)"),
    (dict(sink_logits=torch.tensor([0.0, float("nan"), 0.0, 0.0])), ValueError,
     "sink_logits must be finite or -inf"),
    (dict(attention_mask=[[1] * L] * B), TypeError, "attention_mask must be a torch.Tensor"),
    (dict(attention_mask=torch.ones(B, 1, 1, L, L, dtype=torch.bool)), ValueError,
     "or be a bool [B, Lq, Lk] or [B, 1, Lq, Lk] who-sees-whom matrix"),
    (dict(max_seqlen=4), ValueError, "max_seqlen=4 is given without cu_seqlens"),
    (dict(cu_seqlens=torch.tensor([0, 11], dtype=torch.int32), positions=torch.arange(L)),
     ValueError, "attend takes no positions"),
]


@pytest.mark.parametrize("kwargs, error, text", BAD)
def test_bad_input(kwargs, error, text):
    q, k, v = qkv()
    with pytest.raises(error) as info:
        posenc.attend(q, k, v, **kwargs)
    assert text in str(info.value)


def test_flat_layout_without_cu_seqlens_names_it():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="varlen layout: give cu_seqlens= too"):
        posenc.attend(q[0], k[0], v[0])


def test_varlen_through_attend():
    q, k, v = qkv(8)
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    flat = [t[0].transpose(0, 1) for t in (q, k, v)]  # [total, H, D]
    out = posenc.attend(*flat, ALiBi(H), cu_seqlens=cu, max_seqlen=7)
    doc = torch.tensor([[0] * 4 + [1] * 7])
    want = posenc.attend(q[:1], k[:1], v[:1], ALiBi(H), document_ids=doc)
    torch.testing.assert_close(out, want[0].transpose(0, 1), atol=2e-6, rtol=2e-5)


def test_window_over_kept_sinks_warns():
    """A window=W call over a cache that kept sinks hides them: a warning names the keys,
    and sinks=S makes the rule show them (no warning)."""
    q, k, v = qkv(9)
    scheme = ALiBi(H)
    cache = posenc.KVCache()
    posenc.attend(q[:, :, :8], k[:, :, :8], v[:, :, :8], scheme, cache=cache)
    cache.evict(torch.tensor([0, 1, 5, 6, 7]))
    one = (q[:, :, 8:9], k[:, :, 8:9], v[:, :, 8:9])
    with pytest.warns(UserWarning, match=r"2 key\(s\) that window=4 hides .*\(positions 0, 1\)"):
        posenc.attend(*one, scheme, cache=cache, window=4, positions=torch.tensor([8]))
    cache.evict(torch.arange(5))  # drop the step just taken, keep the sinks and 5, 6, 7
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = posenc.attend(*one, scheme, cache=cache, window=4, sinks=2, positions=torch.tensor([8]))
    i = torch.tensor([0, 1, 5, 6, 7, 8])
    want = posenc.attend(q[:, :, 8:9], k[:, :, i], v[:, :, i], scheme, positions=torch.tensor([8]),
                         key_positions=i)
    torch.testing.assert_close(out, want, atol=2e-6, rtol=2e-5)


def test_multihead_attention_sinks():
    torch.manual_seed(0)
    layer = posenc.MultiHeadAttention(32, 4, window=3, sinks=2, scheme="alibi")
    x = torch.randn(2, 9, 32)
    y = layer(x)
    q, k, v = (t.transpose(1, 2) for t in layer.qkv(x).unflatten(-1, (3, 4, 8)).unbind(2))
    want = posenc.attend(q, k, v, layer.scheme, window=3, sinks=2)
    torch.testing.assert_close(y, layer.proj(want.transpose(1, 2).flatten(2)))
    with pytest.raises(ValueError, match="sinks=2 needs window=W"):
        posenc.MultiHeadAttention(32, 4, sinks=2)


def test_sinks_without_window_one_message_everywhere():
    """One checker (``_checks.check_sinks``): attend, MultiHeadAttention and KVCache say the same,
    prefixed by who was called; ``sinks=0`` is no sinks and needs no window in any of them."""
    q = torch.randn(1, 2, 4, 8)
    said = []
    for call in (lambda: posenc.attend(q, q, q, sinks=2),
                 lambda: posenc.MultiHeadAttention(16, 2, sinks=2),
                 lambda: posenc.KVCache(6, sinks=2)):
        with pytest.raises(ValueError) as err:
            call()
        said.append(str(err.value))
    assert said[0] == said[1].removeprefix("MultiHeadAttention: ")
    assert said[0] == said[2].removeprefix("KVCache: ")
    assert said[0].startswith("sinks=2 needs window=W too")
    posenc.attend(q, q, q, sinks=0)
    assert posenc.MultiHeadAttention(16, 2, sinks=0).sinks == 0
    assert not posenc.KVCache(6, sinks=0).rolling
