"""The cache's lifecycle (issue 26 §1, §2): ``reset``, ``crop``, ``select`` (and ``evict``) on
growing and static caches, and default positions that follow the keys the cache holds.

The reference recomputes attention from the kept keys (unrotated) and their positions with
:func:`posenc.attend` and ``key_positions``, with no cache at all."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch._dynamo.testing import CompileCounter

import posenc
from posenc import KVCache, LayerCaches, attend, streaming_keep

B, H, D = 3, 2, 8
SCHEMES = {"rope": lambda: posenc.RoPE(D), "alibi": lambda: posenc.ALiBi(H)}


def close(a: Tensor, b: Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


class Reference:
    """The unrotated keys, values and positions a cache should hold, row by row."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # [B, H, T, D]
        self.v: Tensor | None = None
        self.pos: Tensor | None = None  # [B, T]

    def next(self, b: int, L: int) -> Tensor:
        if self.pos is None or self.pos.shape[-1] == 0:
            return torch.arange(L).expand(b, L)
        return self.pos.amax(-1, keepdim=True) + 1 + torch.arange(L)

    def step(self, scheme, q: Tensor, k: Tensor, v: Tensor, pos: Tensor | None = None) -> Tensor:
        b, L = q.shape[0], q.shape[-2]
        pos = self.next(b, L) if pos is None else pos.expand(b, L)
        if self.k is None or self.v is None or self.pos is None:
            self.k, self.v, self.pos = k, v, pos
        else:
            self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
            self.pos = torch.cat([self.pos, pos], 1)
        return attend(q, self.k, self.v, scheme, positions=pos, key_positions=self.pos)

    def keep(self, slots: Tensor) -> None:
        assert self.k is not None and self.v is not None and self.pos is not None
        self.k, self.v, self.pos = self.k[:, :, slots], self.v[:, :, slots], self.pos[:, slots]

    def crop(self, n: int) -> None:
        if self.pos is None:
            return
        T = self.pos.shape[-1]
        self.keep(torch.arange(n if n >= 0 else T + n))

    def select(self, rows: Tensor) -> None:
        assert self.k is not None and self.v is not None and self.pos is not None
        self.k, self.v, self.pos = self.k[rows], self.v[rows], self.pos[rows]

    def reset(self) -> None:
        self.k = self.v = self.pos = None


def nxt(cache: KVCache, L: int, b: int = B) -> list[list[int]]:
    return cache.next_positions(L, torch.device("cpu")).expand(b, L).tolist()


def qkv(b: int, L: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.randn(b, H, L, D, generator=gen) for _ in range(3))  # type: ignore[return-value]


def run(scheme, cache: KVCache, ref: Reference, b: int, L: int, gen: torch.Generator) -> None:
    q, k, v = qkv(b, L, gen)
    close(attend(q, k, v, scheme, cache=cache), ref.step(scheme, q, k, v))


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("max_len", [None, 32])
def test_crop_then_decode_is_the_cropped_prefix(name, max_len):
    scheme, gen = SCHEMES[name](), torch.Generator().manual_seed(0)
    cache, ref = KVCache(max_len=max_len), Reference()
    run(scheme, cache, ref, B, 10, gen)
    cache.crop(-3)  # rejected draft tokens
    ref.crop(-3)
    assert len(cache) == 7
    assert nxt(cache, 1) == [[7]] * B
    for L in (1, 2, 1):
        run(scheme, cache, ref, B, L, gen)
    cache.crop(4)
    ref.crop(4)
    run(scheme, cache, ref, B, 1, gen)
    cache.crop(len(cache))  # keeps everything
    run(scheme, cache, ref, B, 1, gen)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("max_len", [None, 32])
@pytest.mark.parametrize("rows", [[2, 0], [1, 1, 0], [2, 1, 0], [0]])
def test_select_is_the_rows_decoded_alone(name, max_len, rows):
    scheme, gen = SCHEMES[name](), torch.Generator().manual_seed(1)
    cache = KVCache(max_len=max_len)
    q, k, v = qkv(B, 6, gen)
    attend(q, k, v, scheme, cache=cache)
    cache.select(torch.tensor(rows))
    for _ in range(2):
        q2, k2, v2 = qkv(len(rows), 1, gen)
        got = attend(q2, k2, v2, scheme, cache=cache)
        k, v = torch.cat([k[rows], k2], 2), torch.cat([v[rows], v2], 2)
        for i, r in enumerate(rows):  # row r alone, from scratch
            want = attend(torch.cat([q[r:r + 1], q2[i:i + 1]], 2), k[i:i + 1], v[i:i + 1],
                          scheme)[:, :, -1:]
            close(got[i:i + 1], want)
        q = torch.cat([q[rows], q2], 2)
        rows = list(range(len(rows)))


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("max_len", [None, 16])
def test_reset_then_reuse_is_a_fresh_cache(name, max_len):
    scheme, gen = SCHEMES[name](), torch.Generator().manual_seed(2)
    cache = KVCache(max_len=max_len)
    cache.claim("layer0")
    attend(*qkv(B, 9, gen), scheme, cache=cache)
    buffers = cache.k
    cache.reset()
    assert len(cache) == 0 and cache.owner == "layer0" and cache.seen == 0
    assert (cache.k is buffers) == (max_len is not None)  # a static cache keeps its buffers
    q, k, v = qkv(B, 5, gen)
    fresh = KVCache(max_len=max_len)
    close(attend(q, k, v, scheme, cache=cache), attend(q, k, v, scheme, cache=fresh))
    q, k, v = qkv(B, 1, gen)
    close(attend(q, k, v, scheme, cache=cache), attend(q, k, v, scheme, cache=fresh))
    cache.reset()  # a new batch of another size
    q, k, v = qkv(2, 4, gen)
    close(attend(q, k, v, scheme, cache=cache), attend(q, k, v, scheme))


@pytest.mark.parametrize("name", SCHEMES)
def test_rollback_by_evict_follows_the_kept_keys(name):
    scheme, gen = SCHEMES[name](), torch.Generator().manual_seed(3)
    cache, ref = KVCache(), Reference()
    run(scheme, cache, ref, B, 10, gen)
    cache.evict(torch.arange(7))
    ref.keep(torch.arange(7))
    assert nxt(cache, 2) == [[7, 8]] * B
    run(scheme, cache, ref, B, 1, gen)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("max_len", [None, 16])
def test_left_padded_prefill_then_default_positions(name, max_len):
    """Prefill with ``positions_from_mask``; a decode step without positions continues each
    row from its own last position (not from the slot count)."""
    scheme, gen = SCHEMES[name](), torch.Generator().manual_seed(4)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    pos = posenc.positions_from_mask(mask)
    cache = KVCache(max_len=max_len)
    q, k, v = qkv(B, 5, gen)
    attend(q, k, v, scheme, positions=pos, attention_mask=mask, cache=cache)
    assert nxt(cache, 1) == [[3], [5], [1]]
    q2, k2, v2 = qkv(B, 1, gen)
    mask2 = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], 1)
    got = attend(q2, k2, v2, scheme, attention_mask=mask2, cache=cache)
    for r in range(B):  # the row's real tokens alone, positions from 0
        keep = mask2[r].bool()
        want = attend(torch.cat([q[r:r + 1], q2[r:r + 1]], 2)[:, :, keep],
                      torch.cat([k[r:r + 1], k2[r:r + 1]], 2)[:, :, keep],
                      torch.cat([v[r:r + 1], v2[r:r + 1]], 2)[:, :, keep], scheme)[:, :, -1:]
        close(got[r:r + 1], want)


def test_empty_cache_positions_and_seen():
    cache = KVCache()
    assert cache.next_positions(3, torch.device("cpu")).tolist() == [0, 1, 2]
    attend(*qkv(2, 4, torch.Generator().manual_seed(5)), posenc.RoPE(D), cache=cache)
    assert cache.seen == 4 and nxt(cache, 1, 2) == [[4], [4]]
    cache.crop(0)
    assert len(cache) == 0 and nxt(cache, 1, 2) == [[0], [0]]


def test_static_crop_and_reset_compiled_without_recompiling():
    scheme, gen = posenc.RoPE(D), torch.Generator().manual_seed(6)
    cache, eager = KVCache(max_len=16), KVCache(max_len=16)
    q, k, v = qkv(B, 6, gen)
    attend(q, k, v, scheme, cache=cache)
    attend(q, k, v, scheme, cache=eager)

    def step(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attend(q, k, v, scheme, cache=cache)

    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    for action in ("none", "none", "crop", "none", "crop", "reset", "none"):
        if action == "crop":
            cache.crop(-2)
            eager.crop(-2)
        elif action == "reset":
            cache.reset()
            eager.reset()
        q, k, v = qkv(B, 1, gen)
        close(compiled(q, k, v), attend(q, k, v, scheme, cache=eager))
    assert counter.frame_count == 1


def test_layer_caches_verbs():
    scheme, gen = posenc.ALiBi(H), torch.Generator().manual_seed(7)
    caches, refs = LayerCaches(2), [Reference(), Reference()]
    for c, r in zip(caches, refs, strict=True):
        run(scheme, c, r, B, 6, gen)
    caches.crop(-1)
    caches.evict(torch.tensor([0, 2, 4]))
    caches.select([1, 2])
    for r in refs:
        r.crop(-1)
        r.keep(torch.tensor([0, 2, 4]))
        r.select(torch.tensor([1, 2]))
    for c, r in zip(caches, refs, strict=True):
        run(scheme, c, r, 2, 1, gen)
    with pytest.raises(ValueError, match="crop: n must be in"):
        caches.crop(9)
    assert [len(c) for c in caches] == [4, 4]  # checked before any layer is cropped
    caches.reset()
    assert [len(c) for c in caches] == [0, 0]


def test_streaming_keep_in_the_library():
    from posenc.lab import production

    assert production.streaming_keep is streaming_keep and "streaming_keep" in production.__all__
    keep, delta = streaming_keep(10, 2, 5)  # the latest window - 1: room for the next token
    assert keep.tolist() == [0, 1, 6, 7, 8, 9] and delta.tolist() == [0, 0, -4, -4, -4, -4]
    for args, err, msg in (((-1, 0, 1), ValueError, "length must be an int >= 0, got -1"),
                           ((5, -1, 1), ValueError, "sinks must be an int >= 0, got -1"),
                           ((5, 1, 0), ValueError, "window must be an int >= 1, got 0"),
                           ((5.0, 1, 1), TypeError, "length must be an int")):
        with pytest.raises(err, match=msg):
            streaming_keep(*args)


def filled(max_len: int | None, L: int = 5) -> KVCache:
    cache = KVCache(max_len=max_len)
    attend(*qkv(B, L, torch.Generator().manual_seed(8)), posenc.RoPE(D), cache=cache)
    return cache


@pytest.mark.parametrize("max_len", [None, 8])
def test_bad_input(max_len):
    cache = filled(max_len)
    bad = [
        (lambda: cache.crop(6), ValueError, r"crop: n must be in \[-5, 5\] \(the cache holds 5 keys.*got 6"),
        (lambda: cache.crop(-6), ValueError, r"got -6"),
        (lambda: cache.crop(2.0), TypeError, "n must be an int"),
        (lambda: cache.crop(True), TypeError, "n must be an int"),
        (lambda: cache.select(torch.tensor([3])), ValueError, r"rows of the 3 .*\[-3, 3\).*from 3 to 3"),
        (lambda: cache.select([0, -4]), ValueError, r"from -4 to 0"),
        (lambda: cache.select(torch.tensor([0.0])), TypeError, "batch_index must be an integer tensor"),
        (lambda: cache.select(torch.tensor([True])), TypeError, "integer tensor, got torch.bool"),
        (lambda: cache.select(torch.tensor([[0]])), ValueError, "1-D with at least one row"),
        (lambda: cache.select([]), ValueError, "1-D with at least one row"),
        (lambda: cache.select([0.5]), TypeError, "batch_index must hold ints"),
        (lambda: cache.select("0"), TypeError, "got str"),
        (lambda: KVCache().select([0]), ValueError, "select: the cache is empty"),
        (lambda: KVCache().crop(1), ValueError, r"in \[0, 0\]"),
    ]
    for call, err, msg in bad:
        with pytest.raises(err, match=msg):
            call()
    assert len(cache) == 5 and cache.k is not None and cache.k.shape[0] == B  # unchanged


def test_messages_name_reset_and_windows():
    cache = filled(None)
    with pytest.raises(ValueError, match=r"holds 5 keys from earlier calls; cache.reset\(\)"):
        attend(*qkv(2, 1, torch.Generator().manual_seed(9)), posenc.RoPE(D), cache=cache)
    small = filled(6)
    with pytest.raises(ValueError, match="make max_len larger.*sliding-window layer's cache needs "
                       "only the last W keys"):
        attend(*qkv(B, 2, torch.Generator().manual_seed(9)), posenc.RoPE(D), cache=small)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.integers(1, 3)),
        st.tuples(st.just("evict"), st.integers(0, 2**16)),
        st.tuples(st.just("crop"), st.integers(-4, 4)),
        st.tuples(st.just("select"), st.lists(st.integers(0, 2), min_size=1, max_size=3)),
        st.tuples(st.just("reset"), st.just(0)),
    ),
    min_size=1, max_size=10,
)


@settings(max_examples=25, deadline=None)
@given(ops=OPS, static=st.booleans(), name=st.sampled_from(sorted(SCHEMES)), seed=st.integers(0, 99))
def test_property_random_lifecycle(ops, static, name, seed):
    """Random update / evict / crop / select / reset against the reference; every update's
    output equals attention recomputed from the kept keys and their positions."""
    scheme, gen = SCHEMES[name](), torch.Generator().manual_seed(seed)
    cache, ref = KVCache(max_len=32 if static else None), Reference()
    b = B
    run(scheme, cache, ref, b, 2, gen)
    for op, arg in ops:
        T = len(cache)
        if op == "update":
            run(scheme, cache, ref, b, arg, gen)
        elif op == "evict" and not static and T:
            slots = torch.tensor([i for i in range(T) if (arg >> i) & 1 or i == T - 1])
            cache.evict(slots)
            ref.keep(slots)
        elif op == "crop" and -T <= arg <= T:
            cache.crop(arg)
            ref.crop(arg)
        elif op == "select" and T:
            rows = [r % b for r in arg]
            cache.select(rows)
            ref.select(torch.tensor(rows))
            b = len(rows)
        elif op == "reset":
            cache.reset()
            ref.reset()
            b = B
        if len(cache) + 3 > 32:
            cache.reset()
            ref.reset()
            b = B
        assert len(cache) == (0 if ref.pos is None else ref.pos.shape[-1])
    run(scheme, cache, ref, b, 1, gen)


@pytest.mark.parametrize("scheme_name", ["alibi", "rope", "t5"])
@pytest.mark.parametrize("max_len", [None, 16])
def test_cache_remembers_padding(scheme_name, max_len):
    """After a left-padded prefill given its mask, decode steps with neither a mask nor
    positions equal each prompt alone: the cache remembers which keys were padding, and its
    default positions follow each row's real tokens. select keeps the memory with its rows."""
    torch.manual_seed(0)
    Bp, Hp, Lp, Dp, steps = 3, 2, 6, 8, 3
    scheme = {"alibi": posenc.ALiBi(Hp), "rope": posenc.schemes.RoPE(Dp),
              "t5": posenc.schemes.T5Bias(Hp)}[scheme_name]
    q, k, v = (torch.randn(Bp, Hp, Lp + steps, Dp) for _ in range(3))
    mask = torch.ones(Bp, Lp, dtype=torch.long)
    mask[1, :2] = 0
    mask[2, :4] = 0
    cache = KVCache(max_len)
    posenc.attend(q[:, :, :Lp], k[:, :, :Lp], v[:, :, :Lp], scheme, cache=cache,
                  attention_mask=mask, positions=posenc.positions_from_mask(mask))
    cache.select([2, 1])  # drop row 0, swap the others
    outs = [posenc.attend(q[[2, 1], :, t:t + 1], k[[2, 1], :, t:t + 1], v[[2, 1], :, t:t + 1],
                          scheme, cache=cache) for t in range(Lp, Lp + steps)]
    out = torch.cat(outs, dim=2)  # [2, H, steps, D]
    for row, (b, pads) in enumerate([(2, 4), (1, 2)]):
        alone = posenc.attend(q[b:b + 1, :, pads:], k[b:b + 1, :, pads:], v[b:b + 1, :, pads:],
                              scheme)
        torch.testing.assert_close(out[row], alone[0, :, -steps:], atol=2e-6, rtol=2e-5)
    want = torch.tensor([[Lp - 4 + steps], [Lp - 2 + steps]])
    assert torch.equal(cache.next_positions(1, torch.device("cpu")).expand(2, 1), want)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("max_len", [None, 16])
@pytest.mark.parametrize("scheme_name", ["rope", "nope"])
def test_decode_step_without_bias_equals_each_row_alone(scheme_name, max_len, backend):
    """A one-token step of a scheme without a bias takes the short path (the padding the cache
    remembers and a static cache's written slots as a ``[B, 1, 1, T]`` mask, no rule built): it
    equals each prompt decoded alone, on sdpa and math, grouped-query heads included."""
    torch.manual_seed(1)
    Bp, Hq, Hkv, Lp, Dp, steps = 3, 4, 2, 6, 8, 4
    scheme = posenc.schemes.RoPE(Dp) if scheme_name == "rope" else posenc.schemes.NoPE()
    q = torch.randn(Bp, Hq, Lp + steps, Dp)
    k, v = (torch.randn(Bp, Hkv, Lp + steps, Dp) for _ in range(2))
    mask = torch.ones(Bp, Lp, dtype=torch.long)
    mask[1, :2] = 0
    mask[2, :5] = 0
    cache = KVCache(max_len)
    posenc.attend(q[:, :, :Lp], k[:, :, :Lp], v[:, :, :Lp], scheme, cache=cache,
                  attention_mask=mask, positions=posenc.positions_from_mask(mask), backend=backend)
    out = torch.cat([posenc.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], scheme,
                                   cache=cache, backend=backend)
                     for t in range(Lp, Lp + steps)], dim=2)  # [B, H, steps, D]
    for b, pads in enumerate([0, 2, 5]):
        alone = posenc.attend(q[b:b + 1, :, pads:], k[b:b + 1, :, pads:], v[b:b + 1, :, pads:],
                              scheme, backend=backend)
        torch.testing.assert_close(out[b], alone[0, :, -steps:], atol=2e-6, rtol=2e-5)
