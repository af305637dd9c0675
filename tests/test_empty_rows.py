"""A query row that may see no key is zeros on every backend (issue 22), as FlexAttention gives;
and sdpa, math and flex agree on every row of every layout, empty and padded rows included.

Before, sdpa and math let such a row attend to every key (future ones included) while flex
returned zeros: three answers to one call."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import KVCache, attend, make_scheme

BACKENDS = ("sdpa", "math", "flex")
SCHEMES = ("rope", "alibi", "t5", "nope")
close = torch.testing.assert_close


def scheme(name: str, heads: int = 4):
    s = make_scheme(name, dim=heads * 8, num_heads=heads)
    if name == "t5":
        torch.manual_seed(0)
        torch.nn.init.normal_(s.rel.embedding.weight)
    return s


def qkv(B=2, H=4, H_kv=2, Lq=9, Lk=None, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    Lk = Lq if Lk is None else Lk
    return (torch.randn(B, H, Lq, D, generator=g), torch.randn(B, H_kv, Lk, D, generator=g),
            torch.randn(B, H_kv, Lk, D, generator=g))


def on_every_backend(call):
    """``call(backend)`` on sdpa, math and flex: equal on every row, and finite."""
    outs = {b: call(b) for b in BACKENDS}
    for b in BACKENDS:
        assert torch.isfinite(outs[b]).all(), b
        close(outs[b], outs["sdpa"], atol=1e-5, rtol=1e-5)
    return outs["sdpa"]


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_queries_before_every_key_are_zeros(name):
    """The issue's call: causal queries at 0..5, keys at 6..11: no query sees a key."""
    q, k, v = qkv(Lq=6)
    out = on_every_backend(lambda b: attend(q, k, v, scheme(name), positions=torch.arange(6),
                                            key_positions=torch.arange(6, 12), backend=b))
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_some_rows_empty_the_others_exact(name):
    """Queries at 0..5, keys at 3..8: rows 0-2 see nothing (zeros), rows 3-5 see keys 3..m."""
    q, k, v = qkv(Lq=6)
    sch = scheme(name)
    kp = torch.arange(3, 9)
    out = on_every_backend(lambda b: attend(q, k, v, sch, positions=torch.arange(6),
                                            key_positions=kp, backend=b))
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))
    # the seeing rows equal a call with only their keys
    want = attend(q[:, :, 3:], k[:, :, :3], v[:, :, :3], sch, positions=torch.arange(3, 6),
                  key_positions=kp[:3])
    close(out[:, :, 3:], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_a_fully_padded_row_is_zeros(name):
    q, k, v = qkv()
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1] = 0
    out = on_every_backend(lambda b: attend(q, k, v, scheme(name), attention_mask=mask, backend=b))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    close(out[0], attend(q[:1], k[:1], v[:1], scheme(name))[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_left_padded_query_rows_are_zeros(name):
    """A causal padded query sees only padded keys: zeros, on every backend."""
    q, k, v = qkv()
    mask = torch.tensor([[1] * 9, [0] * 3 + [1] * 6])
    pos = posenc.positions_from_mask(mask)
    out = on_every_backend(lambda b: attend(q, k, v, scheme(name), positions=pos,
                                            attention_mask=mask, window=4, backend=b))
    assert torch.equal(out[1, :, :3], torch.zeros_like(out[1, :, :3]))
    assert (out[1, :, 3:].abs().sum(-1) > 0).all()


# every layout of tests/test_layouts.py, compared across the three backends on every row


def _padded_windowed(name, b):
    q, k, v = qkv()
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    return attend(q, k, v, scheme(name), positions=posenc.positions_from_mask(mask),
                  attention_mask=mask, window=3, backend=b)


def _packed(name, b):
    q, k, v = qkv()
    docs = torch.tensor([[0] * 4 + [1] * 5, [3] * 2 + [5] * 7])
    return attend(q, k, v, scheme(name), document_ids=docs, backend=b)


def _gqa(name, b):
    q, k, v = qkv(H=6, H_kv=2)
    mask = torch.tensor([[1] * 9, [0] * 4 + [1] * 5])
    return attend(q, k, v, scheme(name, heads=6), attention_mask=mask, backend=b)


def _shards(name, b):
    q, k, v = qkv(Lq=8)
    outs = []
    for lb in (True, False):
        order = torch.cat([posenc.shard_positions(8, r, 2, load_balance=lb) for r in range(2)])
        for r in range(2):
            p = posenc.shard_positions(8, r, 2, load_balance=lb)
            outs.append(attend(q[:, :, p], k[:, :, order], v[:, :, order], scheme(name),
                               positions=p, key_positions=order, backend=b))
    return torch.cat(outs, 2)


def _non_causal_window(name, b):
    q, k, v = qkv()
    return attend(q, k, v, scheme(name), causal=False, window=3,
                  positions=torch.arange(9), backend=b)


def _decode(name, b, static=False, evict=False):
    q, k, v = qkv(Lq=12)
    sch = scheme(name)
    mask = torch.tensor([[1] * 12, [0] * 2 + [1] * 10])
    pos = posenc.positions_from_mask(mask)
    cache = KVCache(max_len=16) if static else KVCache()
    out = [attend(q[:, :, :6], k[:, :, :6], v[:, :, :6], sch, positions=pos[:, :6],
                  attention_mask=mask[:, :6], cache=cache, backend=b)]
    if evict:
        cache.evict(torch.tensor([0, 1, 4, 5]))
        mask = torch.cat([mask[:, [0, 1, 4, 5]], mask[:, 6:]], 1)
    held = 4 if evict else 6
    for t in range(6, 12):
        out.append(attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], sch,
                          positions=pos[:, t:t + 1], attention_mask=mask[:, :held + t - 5],
                          cache=cache, window=5, backend=b))
    return torch.cat(out, 2)


LAYOUTS = {
    "padded+window": _padded_windowed,
    "packed": _packed,
    "gqa+padded": _gqa,
    "shards": _shards,
    "non-causal window": _non_causal_window,
    "decode": _decode,
    "decode static": lambda n, b: _decode(n, b, static=True),
    "decode evicted": lambda n, b: _decode(n, b, evict=True),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_backends_agree_on_every_row_of_every_layout(layout, name):
    on_every_backend(lambda b: LAYOUTS[layout](name, b))


@torch.no_grad()
def test_the_fast_path_has_no_empty_row():
    """Without options every causal query sees at least itself: nothing to zero there."""
    q, k, v = qkv(H_kv=4)
    out = on_every_backend(lambda b: attend(q, k, v, scheme("alibi"), backend=b))
    assert (out.abs().sum(-1) > 0).all()


# ---- v's head size may differ from q's and k's (multi-head latent attention, DeepSeek-V3:
# 192 for q and k, 128 for v), as torch's SDPA allows: every backend, every layout, against a
# written-out softmax


def _naive(q, k, v, allowed, bias=None):
    """``softmax(q k^T / sqrt(d) + bias)`` over the allowed keys, times ``v``; rows that see no
    key are zeros. ``allowed [B, Lq, Lk]``."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # [B, H, Lq, Lk]
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    return s.softmax(-1).nan_to_num(0.0) @ v  # [B, H, Lq, Dv]


def _reference(name, sch, q, k, v, q_pos, k_pos, allowed):
    """The naive answer with the scheme's positions: ``q_pos [B, Lq]``, ``k_pos [B, Lk]``."""
    bias = None
    if name == "rope":
        q, k = sch.rotate(q, k, q_pos, k_pos)
    elif name == "alibi":
        slopes = posenc.alibi_slopes(q.shape[1])  # [H]
        bias = -slopes[None, :, None, None] * (q_pos[:, None, :, None] - k_pos[:, None, None, :])
    elif name == "t5":
        bias = sch.position_bias(q_pos, k_pos)  # [B, H, Lq, Lk]
    return _naive(q, k, v, allowed, bias)


def _dv_qkv(L=9, Dv=4):
    q, k, _ = qkv(Lq=L)  # D = 8
    v = torch.randn(2, 2, L, Dv, generator=torch.Generator().manual_seed(1))
    return q, k, v


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_v_head_size_may_differ_on_every_backend(name):
    sch, (q, k, v) = scheme(name), _dv_qkv()
    B, L = 2, 9
    pos = torch.arange(L).expand(B, L)
    tril = torch.ones(L, L, dtype=torch.bool).tril().expand(B, L, L)
    # plain (the fast path)
    out = on_every_backend(lambda b: attend(q, k, v, sch, backend=b))
    assert out.shape == (2, 4, L, 4)
    close(out, _reference(name, sch, q, k, v, pos, pos, tril), atol=1e-5, rtol=1e-5)
    # left padding and a window of 3 (the rule's path)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :3] = 0
    p = posenc.positions_from_mask(mask)
    out = on_every_backend(lambda b: attend(q, k, v, sch, positions=p, attention_mask=mask, window=3,
                                            backend=b))
    allowed = tril & mask.bool()[:, None, :] & (p[:, :, None] - 3 < p[:, None, :])
    close(out, _reference(name, sch, q, k, v, p, p, allowed), atol=1e-5, rtol=1e-5)
    # packed documents
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2], [0] * 9])
    p = posenc.packed_positions(docs)
    out = on_every_backend(lambda b: attend(q, k, v, sch, document_ids=docs, backend=b))
    allowed = tril & (docs[:, :, None] == docs[:, None, :])
    close(out, _reference(name, sch, q, k, v, p, p, allowed), atol=1e-5, rtol=1e-5)
    # keys of their own, some rows empty
    kp = torch.arange(3, 3 + L)
    out = on_every_backend(lambda b: attend(q, k, v, sch, positions=torch.arange(L), key_positions=kp,
                                            backend=b))
    allowed = (kp[None, :] <= torch.arange(L)[:, None]).expand(B, L, L)
    close(out, _reference(name, sch, q, k, v, pos, kp.expand(B, L), allowed), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("max_len", (None, 12))
@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_v_head_size_may_differ_in_a_cache(name, max_len):
    """A prefill of 5 and 4 single steps, growing or static cache: the rows of one pass."""
    sch, (q, k, v) = scheme(name), _dv_qkv()
    pos = torch.arange(9).expand(2, 9)
    want = _reference(name, sch, q, k, v, pos, pos, torch.ones(9, 9, dtype=torch.bool).tril().expand(2, 9, 9))

    def decode(b):
        cache = KVCache(max_len=max_len)
        outs = [attend(q[:, :, :5], k[:, :, :5], v[:, :, :5], sch, cache=cache, backend=b)]
        outs += [attend(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], sch, cache=cache,
                        backend=b) for t in range(5, 9)]
        assert cache.v.shape[-1] == 4 and len(cache) == 9
        return torch.cat(outs, -2)

    close(on_every_backend(decode), want, atol=1e-5, rtol=1e-5)
