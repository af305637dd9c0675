"""KVCache's protocol for attention (issue 33, architecture review §3.9): imposed_rule,
next_positions, mask_columns, held_document_ids and append compute what attention.py
computed from the cache's fields before the protocol (written out here as references)."""

import pytest
import torch
import torch.nn.functional as F

from posenc.cache import KVCache, MaskColumns
from posenc.cache_slots import CacheView, Growing, Slots, Static
from posenc.rolling_cache import Rolling

B, H, D = 2, 2, 4


def _kv(L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, L, D, generator=g), torch.randn(B, H, L, D, generator=g)


def _caches():
    """(name, cache) after a prefill of 5 (row 1 left-padded by 2) and one decode step."""
    out = []
    for name, make in (("growing", KVCache), ("static", lambda: KVCache(max_len=12)),
                       ("rolling", lambda: KVCache(max_len=6, sinks=2, window=4))):
        cache = make()
        pad = torch.tensor([[True] * 5, [False, False, True, True, True]])
        k, v = _kv(5)
        with pytest.warns(UserWarning) if name == "rolling" else _nothing():
            cache._update(k, v, torch.arange(5), None, pad)
        k, v = _kv(1, 1)
        cache._update(k, v, None, None, None, True)
        out.append((name, cache))
    return out


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# The references: attention.py's reading of the cache's fields before the protocol.

def _ref_key_valid(mask, cache, Lq, Lk_new):
    """_key_valid's width rule: the widened mask, or None when the width is refused."""
    T = mask.shape[-1]
    if cache.rolling:
        return None if T < Lq else mask[:, T - Lq:]
    Lk = cache.max_len if cache.static else (0 if cache.k is None else cache.k.shape[-2]) + Lk_new
    if cache.static and T < Lk:
        held = 0 if cache.filled is None else int(cache.filled)
        if T < held + Lq:
            return None
        mask = F.pad(mask, (0, Lk - T), value=False)
    return mask if mask.shape[-1] == Lk else None


def _ref_pair_fits(cache, Lk_new, T):
    held = len(cache) if cache.k is not None else 0
    want = held + Lk_new
    return T == want or (cache.max_len is not None and want <= T <= cache.max_len)


def _ref_new_valid(key_valid, cache, Lq):
    if cache.rolling:
        return key_valid.expand(B, Lq)
    if cache.static:
        start = cache.filled if cache.filled is not None else torch.zeros((), dtype=torch.long)
        return key_valid.index_select(1, start + torch.arange(Lq)).expand(B, Lq)
    new = key_valid[:, key_valid.shape[-1] - Lq:].expand(B, Lq)
    return None if cache.valid is None and bool(new.all()) else new


def _ref_merge(key_valid, cache, written):
    if cache.rolling:
        return written
    if cache.valid is not None:
        key_valid = cache.valid if key_valid is None else key_valid & cache.valid
    if written is not None:
        key_valid = written[None] if key_valid is None else key_valid & written
    return key_valid


def test_kinds_and_imposed_rule():
    assert isinstance(KVCache()._s, Growing) and KVCache().imposed_rule() is None
    assert type(KVCache(max_len=4)._s) is Static and KVCache(max_len=4).imposed_rule() is None
    roll = KVCache(max_len=6, sinks=2, window=4)
    assert isinstance(roll._s, Rolling) and isinstance(roll._s, Static)
    assert roll.imposed_rule() == (4, 2)
    assert all(isinstance(c._s, Slots) for c in (KVCache(), roll))


@pytest.mark.parametrize("Lq", [1, 3])
def test_mask_columns_match_attention(Lq):
    for name, cache in _caches() + [("empty static", KVCache(max_len=12)), ("empty", KVCache())]:
        cols = cache.mask_columns(Lq)
        assert isinstance(cols, MaskColumns) and cols.new == Lq, name
        for T in range(0, 16):
            mask = torch.rand(B, T, generator=torch.Generator().manual_seed(T)) > 0.3
            ref = _ref_key_valid(mask, cache, Lq, Lq)
            assert cols.padding_fits(T) == (ref is not None), (name, T)
            if ref is None:
                continue
            widened = cols.widen(mask)
            assert widened.shape[-1] == cols.width and torch.equal(widened, ref), (name, T)
            got, want = cols.new_columns(widened, B), _ref_new_valid(ref, cache, Lq)
            assert (got is None) == (want is None) and (got is None or torch.equal(got, want))
            if not cache.rolling:
                assert cols.pairs_fit(T) == _ref_pair_fits(cache, Lq, T), (name, T)


def test_mask_columns_new_keys_sit_at_the_write_pointer():
    static = KVCache(max_len=8)
    static._update(*_kv(3), None, None)
    cols = static.mask_columns(1)
    assert isinstance(cols.start, torch.Tensor) and int(cols.start) == 3  # a tensor: no guard
    assert cols.start is static.filled
    grow = KVCache()
    grow._update(*_kv(3), None, None)
    assert grow.mask_columns(2).start == 3 and grow.mask_columns(2).width == 5
    assert KVCache(max_len=6, sinks=2, window=4).mask_columns(2).cut


def test_growing_forgets_an_all_real_mask_until_it_saw_padding():
    grow = KVCache()
    grow._update(*_kv(3), None, None)
    cols = grow.mask_columns(1)
    assert cols.new_columns(torch.ones(B, 4, dtype=torch.bool), B) is None
    grow._update(*_kv(1), None, None, torch.tensor([[True], [False]]))
    cols = grow.mask_columns(1)
    assert cols.new_columns(torch.ones(B, 5, dtype=torch.bool), B) is not None


def test_held_document_ids_are_the_written_slots():
    docs = torch.tensor([[0, 0, 1], [0, 1, 1]])
    grow, static = KVCache(), KVCache(max_len=8)
    assert grow.held_document_ids() is None
    for cache in (grow, static):
        cache._update(*_kv(3), torch.arange(3), docs)
        assert torch.equal(cache.held_document_ids(), docs)
    static.crop(2)
    assert torch.equal(static.held_document_ids(), docs[:, :2])


def test_next_positions_follow_each_row():
    for name, cache in _caches():
        pos = cache.next_positions(2, torch.device("cpu"))
        assert torch.equal(pos, torch.tensor([6, 7])), name
    with pytest.raises(ValueError, match="length must be an int >= 0"):
        KVCache().next_positions(-1, torch.device("cpu"))


@pytest.mark.parametrize("Lq", [1, 3])
def test_append_merges_what_attention_merged(Lq):
    twins = zip(_caches(), _caches(), strict=True)
    for (name, a), (_, b) in twins:
        k, v = _kv(Lq, 7)
        real = torch.tensor([[True] * Lq, [False] + [True] * (Lq - 1)])
        old = a._update(k, v, None, None, real, True)
        new = b.append(k, v, None, None, real, True)
        assert isinstance(new, CacheView), name
        for x, y in zip((old.k, old.v, old.positions), (new.k, new.v, new.positions), strict=True):
            assert torch.equal(x, y), name
        want = _ref_merge(None, a, old.valid)
        assert (want is None) == (new.valid is None), name
        if want is not None:
            assert torch.equal(want.expand(B, -1), new.valid.expand(B, -1)), name
        q_old, q_new = old.q_slot, new.q_slot
        assert int(q_old) == int(q_new), name
        for field in ("k", "v", "positions", "valid", "filled", "next_start"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), (name, field)


def test_append_without_padding_keeps_the_fast_path_open():
    grow = KVCache()
    view = grow.append(*_kv(3), None, None)
    assert view.valid is None and grow.positions_are_slots
    grow.evict(torch.tensor([0, 2]))
    assert not grow.positions_are_slots and not KVCache(max_len=4).positions_are_slots


def test_attributes_read_outside_stay_and_write_through():
    cache = KVCache(max_len=6, sinks=2, window=4)
    for name in ("k", "v", "positions", "document_ids", "filled", "valid", "owner"):
        assert getattr(cache, name) is None, name
    assert (cache.max_len, cache.sinks, cache.window) == (6, 2, 4)
    assert cache.static and cache.rolling and not cache.evicted and cache.seen == 0
    grow = KVCache()
    grow._update(*_kv(3), None, None)
    grow.positions = grow.positions + 10  # the lab rebases keys this way
    grow._recompute_next()
    assert torch.equal(grow.next_positions(1, torch.device("cpu")), torch.tensor([13]))
    assert grow._s.positions is grow.positions


def test_growing_appends_into_room_without_touching_views_handed_out():
    cache = KVCache()
    cache.update(*_kv(4))
    cache.update(*_kv(4096))  # 128 KiB of keys: room from here on
    cache.update(*_kv(1, 1))
    first = cache.k.clone()
    held = cache.k  # a view of the buffer with room
    cache.update(*_kv(1, 2))
    assert torch.equal(held, first) and cache.k.shape[-2] == 4102
    assert cache.k.untyped_storage().data_ptr() == held.untyped_storage().data_ptr()  # no copy
    cache.crop(4099)
    before = held.clone()
    cache.update(*_kv(2, 3))  # after a crop: a new buffer, the old view unchanged
    assert torch.equal(held, before) and cache.k.shape[-2] == 4101
    assert torch.equal(cache.positions, torch.arange(4101).expand(B, 4101))


def test_growing_with_gradients_concatenates():
    cache = KVCache()
    k, v = (t.requires_grad_() for t in _kv(3))
    cache.update(k, v)
    k1, v1 = (t.requires_grad_() for t in _kv(1, 1))
    cache.update(k1, v1)
    cache.update(k1 * 2, v1 * 2)
    (cache.k.sum() + cache.v.sum()).backward()
    assert torch.equal(k1.grad, torch.full_like(k1, 3.0))
