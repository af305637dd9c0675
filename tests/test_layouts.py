"""Attention where models really run (issue 15): grouped-query heads, padded batches, packed
documents, sliding windows, keys with their own positions, static and evicting caches.

Every layout is checked against a written-out reference: a naive loop over (query, key) pairs
that applies the scheme from positions and the visibility rule from its definition, or the same
tokens run alone."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import KVCache, MultiHeadAttention, attend, make_scheme

BACKENDS = ("sdpa", "math", "flex")
SCHEMES = ("rope", "alibi", "t5", "nope")
close = torch.testing.assert_close


def scheme(name: str, heads: int = 4, head_dim: int = 8, seed: int = 0):
    s = make_scheme(name, dim=heads * head_dim, num_heads=heads)
    if name == "t5":
        torch.manual_seed(seed)
        torch.nn.init.normal_(s.rel.embedding.weight)  # a table that is not zero
    return s


def rotate_one(rot, x, pos):
    """One head vector ``x [D]`` rotated to position ``pos``."""
    x = x[None, None, None]  # [1, 1, 1, D]
    return rot(x, x, positions=torch.tensor([pos]))[0].flatten()


def naive(q, k, v, name, sch, q_pos, k_pos, visible):
    """softmax(score + bias) v, one (query, key) pair at a time, from positions."""
    B, H, Lq, D = q.shape
    g = H // k.shape[1]
    out = torch.zeros_like(q)
    rot = getattr(sch, "rotary", None)
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                m = int(q_pos[b, i])
                qq = q[b, h, i]
                if rot is not None:
                    qq = rotate_one(rot, qq, m)
                scores = []
                for j in range(k.shape[2]):
                    n = int(k_pos[b, j])
                    kk = k[b, h // g, j]
                    if rot is not None:
                        kk = rotate_one(rot, kk, n)
                    s = qq @ kk / math.sqrt(D)
                    if name == "alibi":
                        s = s - sch.slopes[h] * (m - n)
                    if name == "t5":
                        bucket = posenc.t5_relative_bucket(torch.tensor(n - m), bidirectional=False)
                        s = s + sch.rel.embedding.weight[bucket, h]
                    scores.append(s if visible(b, i, j) else torch.tensor(float("-inf")))
                out[b, h, i] = torch.stack(scores).softmax(0) @ v[b, h // g]
    return out


def qkv(B=2, H=4, H_kv=2, L=9, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, H_kv, L, D, generator=g),
            torch.randn(B, H_kv, L, D, generator=g))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_padded_windowed_gqa_equals_the_naive_loop(name, backend):
    q, k, v = qkv()
    sch = scheme(name)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    pos = posenc.positions_from_mask(mask)
    W = 3
    out = attend(q, k, v, sch, positions=pos, attention_mask=mask, window=W, backend=backend)

    def visible(b, i, j):
        return j <= i and mask[b, j] == 1 and int(pos[b, i]) - int(pos[b, j]) < W

    ref = naive(q, k, v, name, sch, pos, pos, visible)
    real = mask.bool()[:, None, :, None].expand_as(out)
    close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    # the padded queries see only padded keys: rows that see no key are zeros (issue 22)
    assert torch.equal(out[~real], torch.zeros_like(out[~real]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_packed_documents_equal_the_naive_loop(name, backend):
    q, k, v = qkv()
    sch = scheme(name)
    docs = torch.tensor([[0] * 4 + [1] * 5, [3] * 2 + [5] * 7])
    out = attend(q, k, v, sch, document_ids=docs, backend=backend)
    pos = posenc.packed_positions(docs)
    ref = naive(q, k, v, name, sch, pos, pos, lambda b, i, j: j <= i and docs[b, i] == docs[b, j])
    close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_gqa_equals_repeating_the_kv_heads(name):
    q, k, v = qkv(H=6, H_kv=2)
    sch = scheme(name, heads=6)
    rep = [t.repeat_interleave(3, dim=1) for t in (k, v)]
    for backend in BACKENDS:
        close(attend(q, k, v, sch, backend=backend), attend(q, *rep, sch, backend=backend))
    mask = torch.tensor([[1] * 9, [0] * 4 + [1] * 5])
    close(attend(q, k, v, sch, attention_mask=mask), attend(q, *rep, sch, attention_mask=mask))


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_a_padded_batch_equals_each_prompt_alone(name):
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, num_kv_heads=2, scheme=scheme(name)).eval()
    long, short = torch.randn(1, 7, 32), torch.randn(1, 4, 32)
    x = torch.cat([long, torch.cat([torch.zeros(1, 3, 32), short], 1)])  # left-padded
    mask = torch.tensor([[1] * 7, [0] * 3 + [1] * 4])
    y = attn(x, positions=posenc.positions_from_mask(mask), attention_mask=mask)
    close(y[0], attn(long)[0], atol=1e-5, rtol=1e-5)
    close(y[1, 3:], attn(short)[0], atol=1e-5, rtol=1e-5)
    if name != "nope":  # arange positions (no mask) get the padded prompt wrong
        assert not torch.allclose(attn(x)[1, 3:], attn(short)[0], atol=1e-3)


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_packed_rows_equal_each_document_alone(name):
    torch.manual_seed(1)
    attn = MultiHeadAttention(32, 4, scheme=scheme(name)).eval()
    a, b, c = torch.randn(1, 5, 32), torch.randn(1, 3, 32), torch.randn(1, 4, 32)
    row = torch.cat([a, b, c], 1)
    docs = torch.tensor([[0] * 5 + [1] * 3 + [2] * 4])
    y = attn(row, document_ids=docs)
    for part, (s, e) in zip((a, b, c), ((0, 5), (5, 8), (8, 12)), strict=True):
        close(y[:, s:e], attn(part), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_windowed_decoding_equals_the_windowed_full_pass(name, static):
    torch.manual_seed(2)
    attn = MultiHeadAttention(32, 4, num_kv_heads=2, window=4, scheme=scheme(name)).eval()
    x = torch.randn(2, 11, 32)
    full = attn(x)
    cache = KVCache(max_len=16) if static else KVCache()
    steps = [attn(x[:, :5], cache=cache)] + [attn(x[:, t : t + 1], cache=cache) for t in range(5, 11)]
    close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    # and the window is real: the full causal pass differs
    attn.window = None
    assert not torch.allclose(attn(x), full, atol=1e-4)


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_static_cache_decoding_equals_the_full_pass_with_padding(name):
    torch.manual_seed(3)
    attn = MultiHeadAttention(32, 4, num_kv_heads=1, scheme=scheme(name)).eval()
    x = torch.randn(2, 8, 32)
    mask = torch.tensor([[1] * 8, [0] * 2 + [1] * 6])
    pos = posenc.positions_from_mask(mask)
    full = attn(x, positions=pos, attention_mask=mask)
    cache = KVCache(max_len=12)
    out = [attn(x[:, :4], positions=pos[:, :4], attention_mask=mask[:, :4], cache=cache)]
    for t in range(4, 8):
        step = attn(x[:, t : t + 1], positions=pos[:, t : t + 1], attention_mask=mask[:, : t + 1],
                    cache=cache)
        out.append(step)
    y = torch.cat(out, 1)
    close(y[0], full[0], atol=1e-5, rtol=1e-5)
    close(y[1, 2:], full[1, 2:], atol=1e-5, rtol=1e-5)
    assert len(cache) == 8


@pytest.mark.parametrize("name", SCHEMES)
@torch.no_grad()
def test_keys_with_their_own_positions_reproduce_the_full_pass(name):
    """Context parallelism in one process: each shard's queries against every key, rotated and
    biased by global positions, equal the rows of the unsharded pass."""
    q, k, v = qkv(L=8)
    sch = scheme(name)
    full = attend(q, k, v, sch)
    for load_balance in (True, False):
        for rank in range(2):
            p = posenc.shard_positions(8, rank, 2, load_balance=load_balance)
            order = torch.cat([posenc.shard_positions(8, r, 2, load_balance=load_balance) for r in range(2)])
            for backend in BACKENDS:
                out = attend(q[:, :, p], k[:, :, order], v[:, :, order], sch, positions=p,
                             key_positions=order, backend=backend)
                close(out, full[:, :, p], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ("alibi", "t5", "rope"))
@torch.no_grad()
def test_an_evicted_cache_keeps_true_distances(name):
    """StreamingLLM-style eviction (2 sinks + the last 3): the bias follows the keys' positions,
    not their slots in the cache."""
    q, k, v = qkv(B=1, L=10)
    sch = scheme(name)
    cache = KVCache()
    attend(q[:, :, :9], k[:, :, :9], v[:, :, :9], sch, cache=cache)
    keep = torch.tensor([0, 1, 6, 7, 8])
    cache.evict(keep)
    out = attend(q[:, :, 9:], k[:, :, 9:], v[:, :, 9:], sch, cache=cache)
    kept = torch.cat([keep, torch.tensor([9])])
    ref = naive(q[:, :, 9:], k[:, :, kept], v[:, :, kept], name, sch, torch.tensor([[9]]),
                kept[None], lambda b, i, j: True)
    close(out, ref, atol=1e-5, rtol=1e-5)


def test_biases_follow_the_positions_a_caller_passes():
    """Issue 15: the bias schemes used to ignore positions; index distance is not position
    distance in a packed row, so the bias must come from positions."""
    q, k, v = qkv(B=1, L=6)
    sch = scheme("alibi")
    pos = torch.tensor([0, 1, 2, 0, 1, 2])  # two documents, no mask: positions still count
    out = attend(q, k, v, sch, positions=pos)
    ref = naive(q, k, v, "alibi", sch, pos[None], pos[None], lambda b, i, j: j <= i)
    close(out, ref, atol=1e-5, rtol=1e-5)


def test_fast_path_stays_when_no_option_is_used(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v = qkv(H_kv=4)
    attend(q, k, v, scheme("rope"), positions=torch.arange(9))
    assert calls[-1].get("is_causal") and calls[-1].get("attn_mask") is None
    sch = scheme("alibi")
    attend(q, k, v, sch)
    first = calls[-1]["attn_mask"]
    attend(q, k, v, sch)
    assert calls[-1]["attn_mask"].shape == (1, 4, 9, 9)
    assert calls[-1]["attn_mask"].data_ptr() == first.data_ptr()  # the cached mask


def test_the_bias_mask_cache_is_bounded(monkeypatch):
    import posenc.schemes as schemes

    sch = scheme("alibi")
    q, k, v = qkv(H_kv=4, L=16)
    monkeypatch.setattr(schemes, "MASK_CACHE_BYTES", 4 * 16 * 16 * 4 - 1)  # one byte short
    attend(q, k, v, sch)
    assert sch._mask is None
    monkeypatch.setattr(schemes, "MASK_CACHE_BYTES", 4 * 16 * 16 * 4)
    attend(q, k, v, sch)
    assert sch._mask is not None and sch._mask[1].shape == (1, 4, 16, 16)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_packed_positions_restart_in_each_document(lengths):
    ids = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])
    want = torch.cat([torch.arange(n) for n in lengths])
    assert torch.equal(posenc.packed_positions(ids), want)
    assert torch.equal(posenc.packed_positions(ids[None].repeat(2, 1)), want[None].repeat(2, 1))


def test_positions_from_mask_equals_transformers_generate():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2)
    model = transformers.LlamaForCausalLM(cfg)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    ids = torch.ones_like(mask)
    want = model._prepare_position_ids_for_generation(ids, {"attention_mask": mask})
    assert torch.equal(posenc.positions_from_mask(mask), want)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=2, max_size=2), st.integers(1, 6))
def test_positions_from_mask_is_what_generate_builds(pads, real):
    L = max(pads) + real
    mask = torch.stack([torch.cat([torch.zeros(p, dtype=torch.long), torch.ones(L - p, dtype=torch.long)])
                        for p in pads])
    want = mask.long().cumsum(-1) - 1
    want.masked_fill_(mask == 0, 0)  # transformers 5.x's generate
    got = posenc.positions_from_mask(mask)
    assert torch.equal(got, want)
    assert torch.equal(posenc.positions_from_mask(mask, pad_position=1), want.masked_fill(mask == 0, 1))
    for b, p in enumerate(pads):
        assert torch.equal(got[b, p:], torch.arange(L - p))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_head_tail_shards_cover_the_sequence_and_balance_the_work(world):
    L = 8 * world
    shards = [posenc.shard_positions(L, r, world) for r in range(world)]
    assert torch.equal(torch.cat(shards).sort().values, torch.arange(L))
    work = [int((s + 1).sum()) for s in shards]  # causal keys per query: position + 1
    assert len(set(work)) == 1  # head-tail: every rank the same
    chunks = [posenc.shard_positions(L, r, world, load_balance=False) for r in range(world)]
    assert torch.equal(torch.cat(chunks), torch.arange(L))
    if world > 1:
        assert int((chunks[-1] + 1).sum()) > int((chunks[0] + 1).sum())
