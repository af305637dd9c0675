"""posenc.lab.serving (chapter 11): each serving-time structure equals posenc's contiguous cache
and attention -- a paged cache, shifted prefix keys, flash-attn's kvcache step, context-parallel
shards merged by log-sum-exp, a bulk rebase, a speculative tree."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.lab import serving
from posenc.schemes import ALiBi, RoPE, T5Bias

H, H_KV, D = 4, 2, 16


def _scheme(name: str):
    torch.manual_seed(0)
    return {"rope": RoPE(D), "alibi": ALiBi(H), "t5": T5Bias(H), "nope": posenc.NoPE()}[name]


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ 1. paged cache


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_paged_cache_equals_the_contiguous_cache(name):
    """Three rows of different lengths, blocks handed out in a scrambled order: every prefill and
    decode step over the paged cache equals posenc.attend over one KVCache per row."""
    scheme = _scheme(name)
    lengths = [5, 11, 3]  # prompt lengths
    order = [6, 2, 9, 0, 7, 4, 11, 1, 10, 3, 8, 5]
    paged = serving.PagedKVCache(12, 4, H_KV, D, block_order=order)
    rows = [paged.add_row() for _ in lengths]
    refs = [posenc.KVCache() for _ in lengths]
    for b, n in enumerate(lengths):  # prefill each row alone (different lengths)
        q, k, v = _randn(1, H, n, D, seed=b), _randn(1, H_KV, n, D, seed=10 + b), \
            _randn(1, H_KV, n, D, seed=20 + b)
        pos = torch.arange(n)
        got = serving.paged_attend(q, k, v, paged, [rows[b]], scheme, positions=pos[None])
        want = posenc.attend(q, k, v, scheme, positions=pos, cache=refs[b])
        torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)
    for step in range(6):  # decode: the three rows together, each at its own position
        q, k, v = (_randn(3, h, 1, D, seed=100 + 3 * step + i) for i, h in enumerate((H, H_KV, H_KV)))
        pos = torch.tensor([[n + step] for n in lengths])  # [B, 1]
        got = serving.paged_attend(q, k, v, paged, rows, scheme, positions=pos)
        for b in range(3):
            want = posenc.attend(q[b:b + 1], k[b:b + 1], v[b:b + 1], scheme, positions=pos[b],
                                 cache=refs[b])
            torch.testing.assert_close(got[b:b + 1], want, atol=2e-6, rtol=2e-5)
    table = paged.block_table()
    assert table.shape == (3, 5)  # row 1: 17 tokens in blocks of 4
    assert table[0, :2].tolist() == [6, 2] and table[1, :3].tolist() == [9, 0, 7]  # scattered
    for b in range(3):  # the gathered keys, values, positions are the contiguous ones
        k, v, p = paged.gather(rows[b])
        assert torch.equal(p, refs[b].positions[0])
        torch.testing.assert_close(k, refs[b].k[0])
        torch.testing.assert_close(v, refs[b].v[0])


def test_slots_are_not_positions():
    """The slot mapping follows the block table; the stored positions are what was given."""
    paged = serving.PagedKVCache(4, 2, 1, 2, block_order=[3, 1, 0, 2])
    row = paged.add_row()
    slots = paged.append(row, torch.ones(1, 3, 2), torch.ones(1, 3, 2), torch.tensor([7, 8, 9]))
    assert slots.tolist() == [6, 7, 2]  # block 3 (slots 6, 7), then block 1 (slot 2)
    assert paged.gather(row)[2].tolist() == [7, 8, 9]
    paged.free_row(row)
    assert paged.free == [0, 2, 3, 1] and paged.lengths[row] == 0


def test_paged_cache_runs_out_of_blocks():
    paged = serving.PagedKVCache(2, 2, 1, 2)
    row = paged.add_row()
    with pytest.raises(ValueError, match="out of blocks"):
        paged.slot_mapping(row, 5)


# ------------------------------------------------------------------ 2. prefix reuse


@pytest.mark.parametrize("interleaved", [True, False])
def test_shifted_prefix_keys_equal_keys_rotated_in_place(interleaved):
    """A chunk's keys cached at positions 100.. and reused at 3000..: wrong as they are, right
    after one rotation by the shift (float32 tolerance), and R(s) R(p) = R(p + s)."""
    rope = posenc.RotaryEmbedding(D, interleaved=interleaved)
    k, q = _randn(1, H_KV, 8, D, seed=1), _randn(1, H_KV, 1, D, seed=2)
    cached_at, reused_at = torch.arange(100, 108), torch.arange(3000, 3008)
    _, k_cached = rope(k, k, positions=cached_at)
    _, k_there = rope(k, k, positions=reused_at)
    q_there, _ = rope(q, q, positions=torch.tensor([3010]))
    scores = lambda keys: (q_there @ keys.transpose(-1, -2))[0, :, 0]  # noqa: E731
    assert (scores(k_cached) - scores(k_there)).abs().max() > 0.1  # reuse at the wrong place
    moved = serving.shift_rotated_keys(k_cached, 2900, rope)
    torch.testing.assert_close(moved, k_there, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(scores(moved), scores(k_there), atol=1e-4, rtol=1e-5)
    back = serving.shift_rotated_keys(k_there, -2900, RoPE(D, interleaved=interleaved))
    torch.testing.assert_close(back, k_cached, atol=2e-5, rtol=1e-5)  # negative shifts too


def test_shift_per_key_and_partial_rotary():
    rope = posenc.RotaryEmbedding(D, partial_rotary_factor=0.5)
    k = _randn(2, 3, D, seed=3)
    p, s = torch.tensor([0, 5, 9]), torch.tensor([4, -5, 1000])
    _, at_p = rope(k, k, positions=p)
    _, at_ps = rope(k, k, positions=p + s)
    torch.testing.assert_close(serving.shift_rotated_keys(at_p, s, rope), at_ps, atol=2e-5,
                               rtol=1e-5)


# ------------------------------------------------------------------ 3. flash_attn_with_kvcache


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("new", [1, 3])
def test_kvcache_step_reference_equals_posenc_cache(interleaved, new):
    """flash-attn's semantics (rotate the new q, k at each row's cache_seqlens, write them into
    the cache, attend causally over the filled prefix) = posenc's KVCache + attend at per-row
    positions."""
    B, S, seqlens = 3, 16, torch.tensor([4, 9, 0])
    scheme = RoPE(D, interleaved=interleaved)
    inv = scheme.rotary.inv_freq
    cos, sin = posenc.rope_cos_sin(torch.arange(S), inv, interleaved=False)  # [S, D]
    cos_half, sin_half = cos[:, : D // 2], sin[:, : D // 2]  # flash-attn: one angle per pair
    k_cache, v_cache = torch.zeros(B, S, H_KV, D), torch.zeros(B, S, H_KV, D)
    refs = []
    for b in range(B):  # the rows' history, rotated at 0 .. n - 1, in both caches
        n = int(seqlens[b])
        refs.append(posenc.KVCache())
        if n:
            kh, vh = _randn(1, H_KV, n, D, seed=b), _randn(1, H_KV, n, D, seed=5 + b)
            posenc.attend(_randn(1, H, n, D, seed=9), kh, vh, scheme, positions=torch.arange(n),
                          cache=refs[b])
            k_cache[b, :n], v_cache[b, :n] = refs[b].k[0].transpose(0, 1), vh[0].transpose(0, 1)
    q, k, v = _randn(B, new, H, D, seed=30), _randn(B, new, H_KV, D, seed=31), \
        _randn(B, new, H_KV, D, seed=32)  # flash-attn's [B, L, H, D]
    out, lse = serving.kvcache_step_reference(
        q, k_cache, v_cache, k, v, cos_half, sin_half, seqlens, causal=True,
        rotary_interleaved=interleaved, return_softmax_lse=True)
    assert out.shape == (B, new, H, D) and lse.shape == (B, H, new)
    for b in range(B):
        n = int(seqlens[b])
        want = posenc.attend(q[b:b + 1].transpose(1, 2), k[b:b + 1].transpose(1, 2),
                             v[b:b + 1].transpose(1, 2), scheme,
                             positions=torch.arange(n, n + new), cache=refs[b])
        torch.testing.assert_close(out[b:b + 1].transpose(1, 2), want, atol=2e-5, rtol=2e-5)
        # the cache was written in place at the row's offset, with the rotated keys
        torch.testing.assert_close(k_cache[b, : n + new], refs[b].k[0].transpose(0, 1),
                                   atol=2e-6, rtol=1e-5)


def test_kvcache_step_reference_over_a_paged_cache():
    """flash-attn's block_table: the same step over PagedKVCache's pages (blocks scattered)
    equals the step over a contiguous cache, and writes the new keys into the right blocks."""
    B, S, new, seqlens = 3, 12, 2, torch.tensor([4, 9, 0])
    paged = serving.PagedKVCache(9, 3, H_KV, D, block_order=[5, 0, 8, 2, 7, 1, 4, 6, 3])
    k_flat, v_flat = torch.zeros(B, S, H_KV, D), torch.zeros(B, S, H_KV, D)
    for b in range(B):
        row, n = paged.add_row(), int(seqlens[b])
        kh, vh = _randn(H_KV, n, D, seed=b), _randn(H_KV, n, D, seed=7 + b)
        paged.append(row, kh, vh, torch.arange(n))
        k_flat[b, :n], v_flat[b, :n] = kh.transpose(0, 1), vh.transpose(0, 1)
        paged.slot_mapping(row, new)  # blocks for the new tokens, as the scheduler allots them
    cos, sin = posenc.rope_cos_sin(torch.arange(S), RoPE(D).rotary.inv_freq)
    args = (_randn(B, new, H, D, seed=1), _randn(B, new, H_KV, D, seed=2),
            _randn(B, new, H_KV, D, seed=3))
    q, k, v = args
    flat = serving.kvcache_step_reference(q, k_flat, v_flat, k, v, cos[:, ::2], sin[:, ::2],
                                          seqlens, causal=True)
    table = paged.block_table()
    got = serving.kvcache_step_reference(q, paged.k_pages, paged.v_pages, k, v, cos[:, ::2],
                                         sin[:, ::2], seqlens, causal=True, block_table=table)
    torch.testing.assert_close(got, flat)
    for b in range(B):
        paged.lengths[b] += new  # the kernel wrote them; the bookkeeping follows
        torch.testing.assert_close(paged.gather(b)[0].transpose(0, 1),
                                   k_flat[b, : int(seqlens[b]) + new])
    with pytest.raises(ValueError, match="block_table"):
        serving.kvcache_step_reference(q, paged.k_pages, paged.v_pages, k, v,
                                       cache_seqlens=seqlens, block_table=table.fill_(-1))


def test_kvcache_step_alibi_and_empty_rows():
    """alibi_slopes as flash-attn adds them; a query that sees no key is 0."""
    B, S = 1, 8
    q, kc, vc = _randn(B, 2, H, D, seed=1), _randn(B, S, H, D, seed=2), _randn(B, S, H, D, seed=3)
    slopes = posenc.alibi_slopes(H)
    out = serving.kvcache_step_reference(q, kc, vc, cache_seqlens=5, causal=True,
                                         alibi_slopes=slopes)
    want = posenc.attend(q.transpose(1, 2), kc[:, :5].transpose(1, 2), vc[:, :5].transpose(1, 2),
                         ALiBi(H), positions=torch.tensor([3, 4]), key_positions=torch.arange(5))
    torch.testing.assert_close(out.transpose(1, 2), want, atol=2e-5, rtol=2e-5)
    # 2 queries over 1 key, causal: the first query (aligned to index -1) sees nothing
    out = serving.kvcache_step_reference(q, kc, vc, cache_seqlens=1, causal=True)
    assert out[0, 0].abs().max() == 0 and out[0, 1].abs().max() > 0


# ------------------------------------------------------------------ 4. context parallelism


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "nope"])
@pytest.mark.parametrize("causal", [True, False])
def test_sharded_attention_equals_full_attention(shards, name, causal):
    L = 24
    scheme = _scheme(name)
    q, k, v = _randn(2, H, L, D, seed=1), _randn(2, H_KV, L, D, seed=2), _randn(2, H_KV, L, D, seed=3)
    want = posenc.attend(q, k, v, scheme, causal=causal, backend="math")
    balanced = [False] + ([True] if L % (2 * shards) == 0 else [])
    for load_balance in balanced:
        got = serving.attend_sharded(q, k, v, scheme, shards=shards, causal=causal,
                                     load_balance=load_balance)
        torch.testing.assert_close(got.output, want, atol=2e-5, rtol=2e-5)
        chunks = shards * (2 if load_balance else 1)
        assert got.computed + got.skipped == chunks**2
        # causal: every chunk pair with its keys wholly in the future is skipped, no other
        assert got.skipped == (chunks * (chunks - 1) // 2 if causal else 0)


def test_the_merge_is_a_softmax_over_the_union():
    """merge_partials over key blocks = one softmax over all keys, lse included; a block a row
    cannot see (lse -inf) contributes nothing."""
    q, k, v = _randn(1, H, 5, D, seed=1), _randn(1, H, 12, D, seed=2), _randn(1, H, 12, D, seed=3)
    qp, kp = torch.arange(7, 12), torch.arange(12)
    whole, whole_lse = serving.partial_attention(q, k, v, qp, kp)
    parts = [serving.partial_attention(q, k[:, :, s], v[:, :, s], qp, kp[s])
             for s in (slice(0, 4), slice(4, 9), slice(9, 12))]
    out, lse = serving.merge_partials([p[0] for p in parts], [p[1] for p in parts])
    torch.testing.assert_close(out, whole, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, whole_lse, atol=1e-6, rtol=1e-6)
    assert torch.isinf(parts[2][1][:, :, :2]).all()  # queries 7, 8 see none of keys 9..11
    # torch's _SDPAMerger step, out - sigmoid(lse_i - lse) (out - out_i), gives the same
    o1, l1 = serving.merge_partials([p[0] for p in parts[:2]], [p[1] for p in parts[:2]])
    o2, l2 = parts[2]
    step = o1 - torch.sigmoid(l2 - l1)[..., None] * (o1 - o2)
    torch.testing.assert_close(step, whole, atol=1e-6, rtol=1e-5)


def test_load_balancing_evens_the_work():
    """Per rank, the blocks computed: contiguous shards are lopsided, head-tail ones even."""
    L, P = 32, 4
    q = k = v = _randn(1, 1, L, 8, seed=0)
    plain = serving.attend_sharded(q, k, v, shards=P)
    balanced = serving.attend_sharded(q, k, v, shards=P, load_balance=True)
    assert plain.computed == P * (P + 1) // 2 and balanced.computed == 2 * P * (2 * P + 1) // 2
    ranks = [posenc.shard_positions(L, r, P) for r in range(P)]
    work = [sum(int(chunk.min() <= qc.max()) for qc in r.view(2, -1)
                for s in ranks for chunk in s.view(2, -1)) for r in ranks]
    assert len(set(work)) == 1  # every rank computes the same number of blocks


# ------------------------------------------------------------------ 5. bulk rebase


def test_rebase_keeps_scores_and_moves_positions_down():
    """A sink plus a window at positions 1000..: one rebase moves the window to 1, 2, ...;
    scores with the next query at its rebased position equal those before (float32)."""
    scheme = RoPE(D)
    cache = posenc.KVCache()
    pos = torch.cat([torch.tensor([0]), torch.arange(1000, 1007)])
    k, v = _randn(1, H_KV, 8, D, seed=1), _randn(1, H_KV, 8, D, seed=2)
    q = _randn(1, H, 1, D, seed=3)
    _, k_rot = scheme.rotate(k, k, pos)
    cache.k, cache.v, cache.positions = k_rot, v, pos[None].clone()  # as attend stores them
    cache._recompute_next()
    q_before, _ = scheme.rotate(q, q[:, :1], torch.tensor([1007]))
    s_before = q_before @ cache.k.repeat_interleave(2, 1).transpose(-1, -2)
    d = serving.rebase_cache(cache, scheme, keep=1)
    assert d == 999 and cache.positions[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert cache.next_positions(1, torch.device("cpu")).tolist() == [8]
    q_after, _ = scheme.rotate(q, q[:, :1], torch.tensor([8]))
    s_after = q_after @ cache.k.repeat_interleave(2, 1).transpose(-1, -2)
    torch.testing.assert_close(s_after[..., 1:], s_before[..., 1:], atol=1e-4, rtol=1e-5)
    assert (s_after[..., :1] - s_before[..., :1]).abs().max() > 1e-3  # the sink: 999 closer
    assert serving.rebase_cache(cache, scheme, keep=1) == 0  # nothing left to close


# ------------------------------------------------------------------ speculative trees


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_verifying_a_tree_equals_each_path_alone(name):
    parents = [-1, -1, 0, 0, 1, 2]
    paths = [[0, 2, 5], [0, 3], [1, 4]]
    P, N = 4, len(parents)
    positions, mask = serving.tree_positions_and_mask(parents, prefix=P)
    assert positions.tolist() == [4, 4, 5, 5, 5, 6]
    assert mask.shape == (N, P + N) and mask[:, :P].all()
    assert mask[5, P:].tolist() == [True, False, True, False, False, True]
    scheme = _scheme(name)
    q, k, v = _randn(1, H, P + N, D, seed=1), _randn(1, H_KV, P + N, D, seed=2), \
        _randn(1, H_KV, P + N, D, seed=3)
    cache = posenc.KVCache()
    posenc.attend(q[:, :, :P], k[:, :, :P], v[:, :, :P], scheme, cache=cache)
    tree = posenc.attend(q[:, :, P:], k[:, :, P:], v[:, :, P:], scheme, positions=positions,
                         attention_mask=mask[None], cache=cache, backend="math")
    for path in paths:
        alone = posenc.KVCache()
        posenc.attend(q[:, :, :P], k[:, :, :P], v[:, :, :P], scheme, cache=alone)
        idx = torch.tensor(path) + P
        want = posenc.attend(q[:, :, idx], k[:, :, idx], v[:, :, idx], scheme, cache=alone)
        torch.testing.assert_close(tree[:, :, torch.tensor(path)], want, atol=2e-6, rtol=2e-5)
    # the target accepts path [0, 2]: keep the prefix and those two nodes, drop the rest
    cache.evict(torch.cat([torch.arange(P), torch.tensor([0, 2]) + P]))
    assert cache.positions[0, P:].tolist() == [4, 5]
    assert cache.next_positions(1, torch.device("cpu")).tolist() == [6]


@pytest.mark.parametrize("sinks", [0, 2])
def test_rebased_stream_stays_small_and_equals_original_positions(sinks):
    """300 decode steps, window 6, a rebase every 4: every position stays below
    sinks + window + 4; without sinks every output equals the stream at original positions
    (the window moved as a whole, 74 roundings later still float32-close)."""
    scheme, W, R, steps = RoPE(D), 6, 4, 300
    qs, ks, vs = (_randn(1, h, steps, D, seed=s) for s, h in ((1, H), (2, H_KV), (3, H_KV)))
    rebased, original = posenc.KVCache(), posenc.KVCache()
    highest = 0
    for t in range(steps):
        sl = slice(t, t + 1)
        pos = rebased.next_positions(1, torch.device("cpu"))
        highest = max(highest, int(pos))
        got = posenc.attend(qs[:, :, sl], ks[:, :, sl], vs[:, :, sl], scheme, positions=pos,
                            cache=rebased)
        want = posenc.attend(qs[:, :, sl], ks[:, :, sl], vs[:, :, sl], scheme,
                             positions=torch.tensor([t]), cache=original)
        if sinks == 0:
            torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        for cache in (rebased, original):
            if len(cache) >= sinks + W:
                cache.evict(posenc.streaming_keep(len(cache), sinks, W)[0])
        if t % R == R - 1:
            serving.rebase_cache(rebased, scheme, keep=sinks)
    assert highest < sinks + W + R
    assert int(original.positions.max()) == steps - 1


# ------------------------------------------------------------------ wrong calls (the probe's)


def test_shift_and_rebase_refuse_keys_of_another_head_dim():
    """A RoPE built for head_dim 8 turns only 8 of 16 channels, by 8-dim frequencies: refused,
    naming the argument, before the cache moves (so are odd head_dims and a RoPE class)."""
    rope = posenc.RotaryEmbedding(8)
    for k in (_randn(1, 2, 4, 16, seed=0), _randn(1, 2, 4, 7, seed=0)):
        with pytest.raises(ValueError, match=r"k must end in rope's head_dim=8.*got shape"):
            serving.shift_rotated_keys(k, 3, rope)
    with pytest.raises(TypeError, match="rope must be .* got the class RotaryEmbedding"):
        serving.shift_rotated_keys(_randn(1, 2, 4, 8, seed=0), 3, posenc.RotaryEmbedding)
    cache = posenc.KVCache()
    x = _randn(1, 2, 4, 16, seed=1)
    posenc.attend(x, x, x, cache=cache, positions=torch.arange(100, 104))
    with pytest.raises(ValueError, match="cached keys must end in rope's head_dim=8"):
        serving.rebase_cache(cache, rope, keep=1)
    assert cache.positions[0].tolist() == [100, 101, 102, 103]  # untouched
    assert serving.rebase_cache(cache, RoPE(16), keep=1) == 100  # the right head_dim


def test_rebase_with_keep_past_the_cache_length():
    """keep >= len(cache): every key is a sink, at 0 .. T - 1, and the next query follows
    them (a fresh stream: nothing moves, 0; keys far away: they move, scores kept)."""
    scheme, q = RoPE(D), _randn(1, H, 1, D, seed=3)
    fresh = posenc.KVCache()
    x = _randn(1, H_KV, 4, D, seed=1)
    posenc.attend(_randn(1, H, 4, D, seed=2), x, x, scheme, cache=fresh)
    k_before = fresh.k.clone()
    assert serving.rebase_cache(fresh, scheme, keep=10) == 0
    assert fresh.positions[0].tolist() == [0, 1, 2, 3] and torch.equal(fresh.k, k_before)
    for keep in (4, 10):  # == and > the length alike
        far = posenc.KVCache()
        posenc.attend(_randn(1, H, 4, D, seed=2), x, x, scheme, cache=far,
                      positions=torch.arange(100, 104))
        want = posenc.attend(q, q[:, :H_KV], q[:, :H_KV], scheme, cache=far)  # at 104
        far.crop(-1)
        assert serving.rebase_cache(far, scheme, keep=keep) == 100
        assert far.positions[0].tolist() == [0, 1, 2, 3]
        assert far.next_positions(1, torch.device("cpu")).tolist() == [4]
        got = posenc.attend(q, q[:, :H_KV], q[:, :H_KV], scheme, cache=far)  # at 4
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert serving.rebase_cache(posenc.KVCache(), scheme, keep=3) == 0  # empty


def test_paged_attend_rows_once_each_list_or_tensor():
    """A row named twice would be written twice and each batch row see another prefix:
    refused before anything is written. A 1-D integer tensor of rows is a list of rows."""
    q, k, v = _randn(2, H, 1, D, seed=1), _randn(2, H_KV, 1, D, seed=2), _randn(2, H_KV, 1, D, seed=3)
    pos = torch.tensor([[0], [0]])
    paged = serving.PagedKVCache(8, 2, H_KV, D)
    rows = [paged.add_row(), paged.add_row()]
    with pytest.raises(ValueError, match=r"rows must name each cache row at most once, got \[0, 0\]"):
        serving.paged_attend(q, k, v, paged, [0, 0], positions=pos)
    assert paged.lengths == [0, 0] and len(paged.free) == 8  # nothing written
    with pytest.raises(TypeError, match="rows must be a list of ints or a 1-D integer tensor"):
        serving.paged_attend(q, k, v, paged, torch.tensor([0.0, 1.0]), positions=pos)
    with pytest.raises(ValueError, match="row must be one of the 2 rows"):
        serving.paged_attend(q, k, v, paged, [0, 5], positions=pos)
    assert paged.lengths == [0, 0]
    twin = serving.PagedKVCache(8, 2, H_KV, D)
    twin.add_row(), twin.add_row()
    want = serving.paged_attend(q, k, v, twin, rows, _scheme("rope"), positions=pos)
    got = serving.paged_attend(q, k, v, paged, torch.tensor(rows), _scheme("rope"), positions=pos)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_paged_cache_is_floating_and_never_casts():
    """Integer pages are refused; a write of another dtype raises as KVCache's does (no silent
    downcast of float64 keys); a cache built in float64 takes float64 keys."""
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype.*torch.int64"):
        serving.PagedKVCache(4, 2, H_KV, D, dtype=torch.long)
    paged = serving.PagedKVCache(4, 2, H_KV, D)
    row = paged.add_row()
    k64 = _randn(H_KV, 1, D, seed=1).double()
    with pytest.raises(ValueError, match="k is torch.float64 on cpu, the cache holds torch.float32"):
        paged.append(row, k64, k64, torch.arange(1))
    q64 = _randn(1, H, 1, D, seed=2).double()
    with pytest.raises(ValueError, match="k is torch.float64"):
        serving.paged_attend(q64, k64[None], k64[None], paged, [row], positions=torch.tensor([[0]]))
    with pytest.raises(TypeError, match="q, k, v must share one dtype"):
        serving.paged_attend(q64.float(), k64[None], k64[None], paged, [row],
                             positions=torch.tensor([[0]]))
    assert paged.lengths == [0]
    wide = serving.PagedKVCache(4, 2, H_KV, D, dtype=torch.float64)
    wide.append(wide.add_row(), k64, k64, torch.arange(1))
    assert torch.equal(wide.gather(0)[0], k64)


def test_kvcache_step_refuses_mixed_dtypes():
    q, kc = _randn(1, 1, H, D, seed=1), torch.zeros(1, 4, H_KV, D)
    k = _randn(1, 1, H_KV, D, seed=2)
    with pytest.raises(TypeError, match=r"q, k_cache, v_cache, k, v must share one dtype.*"
                                        r"k torch.float16"):
        serving.kvcache_step_reference(q, kc, kc.clone(), k.half(), k, cache_seqlens=1)
    with pytest.raises(TypeError, match="q torch.float64, k_cache torch.float32"):
        serving.kvcache_step_reference(q.double(), kc, kc.clone())
    out = serving.kvcache_step_reference(q.double(), kc.double(), kc.double(), k.double(),
                                         k.double(), cache_seqlens=1)
    assert out.dtype == torch.float64


def test_kvcache_step_alibi_slopes_per_head_or_per_row():
    """flash-attn takes alibi_slopes [H] or [B, H]: a [B, H] table is each row's own [H] one;
    another shape is refused, naming the shapes it may have."""
    B, S = 2, 8
    q, kc, vc = _randn(B, 2, H, D, seed=1), _randn(B, S, H, D, seed=2), _randn(B, S, H, D, seed=3)
    slopes = torch.stack([posenc.alibi_slopes(H), 0.5 * posenc.alibi_slopes(H)])  # [B, H]
    got = serving.kvcache_step_reference(q, kc, vc, cache_seqlens=5, causal=True,
                                         alibi_slopes=slopes)
    for b in range(B):
        r = slice(b, b + 1)
        want = serving.kvcache_step_reference(q[r], kc[r], vc[r], cache_seqlens=5, causal=True,
                                              alibi_slopes=slopes[b])
        torch.testing.assert_close(got[r], want, atol=0, rtol=0)
    for bad in (torch.ones(3), torch.ones(B, 3), torch.ones(1, B, H)):
        with pytest.raises(ValueError, match=r"alibi_slopes must have shape \[H=4\] or \[B=2, H=4\]"):
            serving.kvcache_step_reference(q, kc, vc, cache_seqlens=5, alibi_slopes=bad)


def test_partial_attention_checks_the_scheme():
    """A bias for another head count, a scheme class instead of an instance: clear errors
    (not a broadcast's RuntimeError, not a missing attribute)."""
    q = _randn(1, H, 4, D, seed=1)
    pos = torch.arange(4)
    with pytest.raises(ValueError, match="scheme 'alibi' has a bias for 2 heads but q has 4 heads"):
        serving.partial_attention(q, q, q, pos, pos, ALiBi(2))
    with pytest.raises(ValueError, match="scheme 'alibi' has a bias for 2 heads"):
        serving.attend_sharded(q, q, q, ALiBi(2), shards=2)
    with pytest.raises(TypeError, match=r"got the class RoPE; pass an instance, e\.g\. RoPE\(head_dim\)"):
        serving.partial_attention(q, q, q, pos, pos, RoPE)
    with pytest.raises(TypeError, match="got the class RotaryEmbedding; pass a scheme instance"):
        serving.partial_attention(q, q, q, pos, pos, posenc.RotaryEmbedding)
    with pytest.raises(TypeError, match="got a RotaryEmbedding; pass the scheme"):
        serving.attend_sharded(q, q, q, posenc.RotaryEmbedding(D), shards=2)


def test_flash_layout_is_named_where_posenc_layout_is_expected():
    """[B, L, H, Dh] tensors where [B, H, L, Dh] belongs: the error names both layouts."""
    x = _randn(1, 6, 2, 8, seed=1)  # flash-attn's [B, L=6, H=2, Dh]
    layout = r"\[B, H, L, head_dim\]; flash-attn's \[B, L, H, head_dim\] converts with"
    with pytest.raises(ValueError, match=r"q_pos must be \[Lq=2\].*" + layout):
        serving.partial_attention(x, x, x, torch.arange(6), torch.arange(6))
    paged = serving.PagedKVCache(4, 2, 2, 8)
    paged.add_row()
    with pytest.raises(ValueError, match=r"positions must have shape \[B=1, L=2\].*" + layout):
        serving.paged_attend(_randn(1, 3, 2, 8, seed=2), _randn(1, 3, 2, 8, seed=3),
                             _randn(1, 3, 2, 8, seed=4), paged, [0],
                             positions=torch.arange(3)[None])
    with pytest.raises(ValueError, match=r"q must be \[B, H, L, Dh\].*" + layout):
        serving.paged_attend(x, x[:, :, :1], x[:, :, :1], paged, [0],
                             positions=torch.arange(2)[None])


def test_second_probe_messages_name_the_argument():
    """The second wrong-call probe's unclear messages: a huge int shift, grouped-query keys for a
    cache of more heads, a negative cache_seqlens, a per-token shift against transposed keys."""
    rope = posenc.RotaryEmbedding(16)
    k = _randn(1, 4, 6, 16, seed=1)
    with pytest.raises(ValueError, match=r"shift must be between .* got 1000000000000"):
        serving.shift_rotated_keys(k, 10**12 * 10**6, rope)
    with pytest.raises(ValueError, match=r"T is dim -2 of k \[\.\.\., T, head_dim\], shape \(1, 4, 6, 16\)"):
        serving.shift_rotated_keys(k, torch.arange(10), rope)
    paged = serving.PagedKVCache(8, 4, 4, 16)
    paged.add_row(), paged.add_row()
    kv = _randn(2, 2, 1, 16, seed=2)
    with pytest.raises(ValueError, match=r"k, v must be \[B, H_kv=4, L, head_dim=16\] \(the cache's"):
        serving.paged_attend(_randn(2, 4, 1, 16, seed=3), kv, kv, paged, [0, 1], posenc.RoPE(16),
                             positions=torch.zeros(2, 1, dtype=torch.long))
    assert paged.lengths == [0, 0]  # refused before anything was written
    q = _randn(2, 1, 4, 16, seed=4)  # flash-attn's [B, Lq, H, D]
    cache = _randn(2, 8, 4, 16, seed=5)
    with pytest.raises(ValueError, match=r"cache_seqlens must be >= 0 .* got \[-1, 3\]"):
        serving.kvcache_step_reference(q, cache, cache.clone(), cache_seqlens=torch.tensor([-1, 3]))
