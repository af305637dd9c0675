"""The rolling static cache (issue 26 §2): ``KVCache(max_len=S + W, sinks=S, window=W)``.

The reference is a growing :class:`~posenc.cache.KVCache` attended with ``window=W, sinks=S``
and evicted with :func:`~posenc.cache.streaming_keep` after every update (StreamingLLM; Xiao et
al., 2024). The rolling cache must give its outputs at every step, hold its keys (by position),
keep its buffers' shapes, and compile one decode step for any number of steps.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

import posenc
from posenc import KVCache, LayerCaches, attend, streaming_keep

B, H, D = 3, 2, 8
SCHEMES = {
    "rope": lambda: posenc.RoPE(D),
    "alibi": lambda: posenc.ALiBi(H),
    "t5": lambda: posenc.T5Bias(H),
}


def close(a: Tensor, b: Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def left_padded(pads: list[int], length: int) -> tuple[Tensor, Tensor]:
    """``(mask [B, L] bool, positions [B, L])`` for rows with ``pads[b]`` pads on the left."""
    mask = torch.ones(len(pads), length, dtype=torch.bool)
    for b, p in enumerate(pads):
        mask[b, :p] = False
    return mask, (mask.long().cumsum(-1) - 1).clamp(min=0)


class Pair:
    """A rolling cache and its reference, fed the same calls."""

    def __init__(self, scheme, sinks: int, window: int, backend: str = "sdpa") -> None:
        self.scheme, self.S, self.W, self.backend = scheme, sinks, window, backend
        self.roll = KVCache(max_len=sinks + window, sinks=sinks, window=window)
        self.ref = KVCache()

    def step(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
             positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        held = len(self.ref)
        got = attend(q, k, v, self.scheme, cache=self.roll, attention_mask=mask,
                     positions=positions, backend=self.backend)
        ref_mask = None if mask is None else torch.cat(
            [torch.ones(mask.shape[0], held, dtype=torch.bool), mask], dim=-1)  # [B, held + L]
        with warnings.catch_warnings():  # the reference holds a key the window hides
            warnings.simplefilter("ignore")
            want = attend(q, k, v, self.scheme, cache=self.ref, attention_mask=ref_mask,
                          positions=positions, window=self.W, sinks=self.S, backend=self.backend)
        keep, _ = streaming_keep(len(self.ref), self.S, self.W + 1)  # as many keys as the rolling cache
        if len(keep) < len(self.ref):
            self.ref.evict(keep)
        return got, want

    def held_positions(self) -> list[list[int]]:
        """Each row's (real) kept positions, sorted: the rolling cache's, checked equal to the
        reference's."""
        roll, ref = self.roll, self.ref
        roll._flush()  # the latest key into its own slot (idempotent; the next update does it)
        assert roll.positions is not None and roll.valid is not None and ref.positions is not None
        slots = roll._written()
        assert slots is not None
        rows = []
        for b in range(ref.positions.shape[0]):
            mine = roll.positions[b][slots & roll.valid[b]].sort().values.tolist()
            real = (ref.valid[b] if ref.valid is not None
                    else torch.ones_like(ref.positions[b], dtype=torch.bool))
            theirs = ref.positions[b][real].sort().values.tolist()
            assert mine == theirs
            rows.append(mine)
        return rows


def run(pair: Pair, chunks: list[int], pads: list[int], decode: int, seed: int = 0) -> None:
    """A (chunked, maybe left-padded) prefill then ``decode`` single steps; parity at each."""
    gen = torch.Generator().manual_seed(seed)
    prompt = sum(chunks)
    mask, pos = left_padded(pads, prompt)
    start = 0
    for L in chunks + [1] * decode:
        q, k, v = (torch.randn(len(pads), H, L, D, generator=gen) for _ in range(3))
        if start < prompt:
            sl = slice(start, start + L)
            got, want = pair.step(q, k, v, mask[:, sl] if any(pads) else None,
                                  pos[:, sl] if any(pads) else None)
        else:
            got, want = pair.step(q, k, v)  # default positions, the cache remembers the padding
        if any(pads):  # a pad query is zeros on the reference; compare the real queries
            real = mask[:, start:start + L] if start < prompt else torch.ones(len(pads), L, dtype=torch.bool)
            got, want = got * real[:, None, :, None], want * real[:, None, :, None]
        close(got, want)
        pair.held_positions()
        start += L


@pytest.mark.parametrize("backend", ("sdpa", "math"))
@pytest.mark.parametrize("pads", ([0, 0, 0], [0, 3, 1]), ids=("unpadded", "left-padded"))
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_rolling_equals_growing_cache_with_streaming_eviction(name, pads, backend):
    """A chunked prefill (the second chunk longer than the window) then 12 steps that wrap the
    window three times: every output equals the reference's, the cache holds the sinks and the
    last W keys at their true positions, and its buffers never grow."""
    torch.manual_seed(0)
    pair = Pair(SCHEMES[name](), sinks=2, window=4, backend=backend)
    run(pair, [3, 6], pads, decode=12)
    assert pair.roll.k is not None and pair.roll.k.shape == (B, H, 2 + 4 + 1, D)  # + scratch slot
    rows = pair.held_positions()
    last = 9 + 12 - 1
    assert rows[0] == [0, 1, last - 3, last - 2, last - 1, last]


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_one_prefill_longer_than_the_cache(name):
    """One call of 15 tokens into a cache of 2 + 4: the prefill's queries see what the growing
    cache's do (every key of the call under the rule), and the cache keeps 0, 1 and 11..14."""
    pair = Pair(SCHEMES[name](), sinks=2, window=4)
    run(pair, [15], [0, 0, 0], decode=3)
    assert pair.held_positions()[0] == [0, 1, 14, 15, 16, 17]


def test_no_sinks():
    """``sinks=0``: a plain sliding window of the last W keys."""
    pair = Pair(SCHEMES["alibi"](), sinks=0, window=3)
    run(pair, [2, 5], [0, 2, 0], decode=5)
    assert pair.held_positions()[0] == [9, 10, 11]


@settings(max_examples=15, deadline=None)
@given(
    sinks=st.integers(0, 3), window=st.integers(1, 4),
    chunks=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    decode=st.integers(0, 6), name=st.sampled_from(sorted(SCHEMES)),
    pads=st.lists(st.integers(0, 2), min_size=2, max_size=2), seed=st.integers(0, 2**16),
)
def test_property_rolling_equals_reference(sinks, window, chunks, decode, name, pads, seed):
    """Random sinks, windows, chunked prefills, left padding and schemes: the rolling cache's
    output equals the growing cache's under StreamingLLM eviction at every call."""
    pads = [min(p, sum(chunks) - 1) for p in pads]  # every row has a real token
    torch.manual_seed(seed)
    run(Pair(SCHEMES[name](), sinks, window), chunks, pads, decode, seed)


@pytest.mark.parametrize("name", ("rope", "alibi"))
@torch.no_grad()
def test_compiled_step_compiles_once_across_wrap_around(name):
    """The decode step under ``torch.compile(fullgraph=True)`` compiles once for 20 steps that
    wrap the window five times (a recompile would raise), and equals the eager reference."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    scheme = SCHEMES[name]()
    pair = Pair(scheme, sinks=2, window=4)
    run(pair, [5], [0, 1, 2], decode=0)
    counter = CompileCounter()

    def step(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attend(q, k, v, scheme, cache=pair.roll)

    compiled = torch.compile(step, backend=counter, fullgraph=True)
    gen = torch.Generator().manual_seed(1)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(20):
            q, k, v = (torch.randn(B, H, 1, D, generator=gen) for _ in range(3))
            got = compiled(q, k, v)
            held = len(pair.ref)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = attend(q, k, v, scheme, cache=pair.ref, window=4, sinks=2)
            assert held == len(pair.ref) - 1
            pair.ref.evict(streaming_keep(len(pair.ref), 2, 5)[0])
            close(got, want)
    assert counter.frame_count == 1
    assert pair.roll.filled is not None and int(pair.roll.filled) == 25


def test_reset_and_select():
    """``reset`` starts anew (as a fresh cache), ``select`` reorders rows in place."""
    pair = Pair(SCHEMES["rope"](), sinks=1, window=3)
    run(pair, [4], [0, 0, 0], decode=5)
    k_buffer = pair.roll.k
    pair.roll.reset()
    pair.ref = KVCache()
    run(pair, [2, 3], [0, 1, 0], decode=6, seed=3)
    assert pair.roll.k is k_buffer  # same batch shape: the buffers are reused
    pair.roll.select([2, 0, 1])
    pair.ref.select([2, 0, 1])
    assert pair.roll.k is k_buffer  # in place
    run(pair, [], [0, 0, 0], decode=6, seed=4)
    pair.roll.select([1])  # fewer rows: new tensors
    pair.ref.select([1])
    run(pair, [], [0], decode=3, seed=5)


def test_layer_caches_roll():
    caches = LayerCaches(2, max_len=5, sinks=1, window=4)
    assert all(c.rolling and c.sinks == 1 and c.window == 4 for c in caches)


def test_refusals_name_the_rolling_cache():
    cache = KVCache(max_len=6, sinks=2, window=4)
    x = torch.randn(1, H, 3, D)
    attend(x, x, x, cache=cache)
    with pytest.raises(ValueError, match="crop: a rolling KVCache.*cannot come back"):
        cache.crop(1)
    with pytest.raises(ValueError, match="crop: a rolling"):
        LayerCaches(1, max_len=6, sinks=2, window=4).crop(0)
    with pytest.raises(ValueError, match="evict works on a growing KVCache.*evicts by itself"):
        cache.evict(torch.tensor([0]))
    with pytest.raises(ValueError, match="window=3 with a rolling KVCache"):
        attend(x, x, x, cache=cache, window=3)
    with pytest.raises(ValueError, match="sinks=0 with a rolling KVCache"):
        attend(x, x, x, cache=cache, window=4, sinks=0)
    with pytest.raises(ValueError, match="document_ids with a rolling"):
        attend(x, x, x, cache=cache, positions=torch.arange(3, 6),
               document_ids=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="who-sees-whom mask cannot be given with a rolling"):
        attend(x, x, x, cache=cache, attention_mask=torch.ones(1, 3, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"T >= 3"):
        attend(x, x, x, cache=cache, attention_mask=torch.ones(1, 2, dtype=torch.bool))
    assert len(cache) == 3 and int(cache.filled) == 3  # refused calls leave the cache as it was


def test_static_overflow_points_to_the_rolling_cache():
    cache = KVCache(max_len=4)
    x = torch.randn(1, H, 3, D)
    attend(x, x, x, cache=cache)
    with pytest.raises(ValueError, match=r"KVCache\(max_len=S \+ W, sinks=S, window=W\)"):
        attend(x, x, x, cache=cache)


@pytest.mark.parametrize("backend", ("sdpa", "math"))
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_decode_steps_equal_one_full_pass(name, backend):
    """Token by token through a rolling cache equals one pass over the whole sequence under
    ``window=W, sinks=S`` (no cache: the rule built in full), an independent reference for the
    short path a one-token step takes."""
    torch.manual_seed(2)
    scheme, L = SCHEMES[name](), 15
    q, k, v = (torch.randn(2, H, L, D) for _ in range(3))
    cache = KVCache(max_len=2 + 4, sinks=2, window=4)
    steps = [attend(q[:, :, :3], k[:, :, :3], v[:, :, :3], scheme, cache=cache, backend=backend)]
    steps += [attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], scheme, cache=cache,
                     backend=backend) for t in range(3, L)]
    full = attend(q, k, v, scheme, window=4, sinks=2, backend=backend)
    close(torch.cat(steps, dim=2), full)


ROLL_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.integers(1, 5)),
        st.tuples(st.just("select"), st.lists(st.integers(0, 2), min_size=1, max_size=3)),
        st.tuples(st.just("reset"), st.just(0)),
    ),
    min_size=1, max_size=8,
)


@settings(max_examples=15, deadline=None)
@given(ops=ROLL_OPS, sinks=st.integers(0, 2), window=st.integers(1, 4),
       name=st.sampled_from(sorted(SCHEMES)), seed=st.integers(0, 2**16))
def test_property_rolling_lifecycle(ops, sinks, window, name, seed):
    """Random updates (one token or a chunk), ``select`` (keep, reorder, drop rows) and
    ``reset`` on a rolling cache and on the reference: every update's output and the kept
    positions agree."""
    gen = torch.Generator().manual_seed(seed)
    pair, b = Pair(SCHEMES[name](), sinks, window), B
    for op, arg in ops:
        if op == "update":
            q, k, v = (torch.randn(b, H, arg, D, generator=gen) for _ in range(3))
            close(*pair.step(q, k, v))
            pair.held_positions()
        elif op == "select" and len(pair.ref):
            rows = [r % b for r in arg]
            pair.roll.select(rows)
            pair.ref.select(rows)
            b = len(rows)
        elif op == "reset":
            pair.roll.reset()
            pair.ref, b = KVCache(), B
    q, k, v = (torch.randn(b, H, 1, D, generator=gen) for _ in range(3))
    close(*pair.step(q, k, v))


@pytest.mark.filterwarnings("ignore")
def test_flex_backend():
    """On ``flex`` (a ``BlockMask`` and ALiBi's ``score_mod``) the rolling cache gives the
    growing cache's outputs under streaming eviction too."""
    pair = Pair(SCHEMES["alibi"](), sinks=2, window=4, backend="flex")
    run(pair, [4], [0, 0, 0], decode=6)


def test_padding_in_the_sink_slots_warns():
    """Left padding puts pads in a rolling cache's sink slots (the wrong-call probe measured the
    padded row 1.08 away from attend(window=, sinks=) by positions, silently): a warning names
    the rows; a cache whose first slots are real tokens stays quiet."""
    import warnings

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g) for _ in range(3))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, :2] = 0
    with pytest.warns(UserWarning, match=r"rows \[1\] start with padding: a rolling KVCache"):
        posenc.attend(q, k, v, cache=posenc.KVCache(max_len=6, sinks=2, window=4), attention_mask=mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        posenc.attend(q, k, v, cache=posenc.KVCache(max_len=6, sinks=2, window=4),
                      attention_mask=torch.ones(2, 5, dtype=torch.long))
