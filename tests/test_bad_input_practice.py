# ruff: noqa: E501  (one case per line reads best as a table)
"""Wrong calls to the practice API (issue 22): the KV cache's positions, eviction and masks, one
cache per layer, document ids as labels, the mask-cache budgets, and an audit of the rest of
``attend`` / ``MultiHeadAttention``. Each raises a ValueError/TypeError naming the argument, the
value and what is allowed; the right calls next to them compute the right answer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
import posenc.schemes as schemes
from posenc import ALiBi, KVCache, LayerCaches, MultiHeadAttention, RoPE, T5Bias, attend, make_scheme

close = torch.testing.assert_close
Q = torch.randn(2, 4, 6, 8)  # [B, H, L, Dh]
KV = torch.randn(2, 2, 6, 8)  # [B, H_kv, L, Dh]
ROPE = make_scheme("rope", dim=32, num_heads=4)
ALIBI = make_scheme("alibi", num_heads=4)
LONG = torch.long


def filled(n: int = 6, **kwargs) -> KVCache:
    """A cache that has seen ``n`` tokens of Q/KV."""
    cache = KVCache(**kwargs)
    attend(Q[:, :, :n], KV[:, :, :n], KV[:, :, :n], ROPE, cache=cache)
    return cache


def step(cache: KVCache, **kwargs) -> torch.Tensor:
    """One decode step of one token."""
    return attend(Q[:, :, :1], KV[:, :, :1], KV[:, :, :1], ROPE, cache=cache, **kwargs)


def two_layers_one_cache():
    cache, x = KVCache(), torch.randn(1, 3, 32)
    a, b = MultiHeadAttention(32, 4), MultiHeadAttention(32, 4)
    a(x, cache=cache)
    b(x, cache=cache)


def lab_model_one_cache_twice():
    from posenc.lab.model import TransformerLM

    model = TransformerLM(scheme="rope", dim=32, num_heads=4, num_layers=2, vocab_size=16)
    cache = KVCache()
    model(torch.zeros(1, 3, dtype=LONG), caches=[cache, cache])


def set_cache_bytes(value):
    make_scheme("alibi", num_heads=4).cache_bytes = value


CASES = [
    # KVCache.update checks positions exactly as attend does
    ("update", lambda: KVCache().update(KV, KV, positions=torch.arange(6.0)), TypeError, "positions must be an integer tensor, got dtype torch.float32"),
    ("update", lambda: KVCache().update(KV, KV, positions=torch.arange(-1, 5)), ValueError, "positions must be >= 0, got a minimum of -1"),
    ("update", lambda: KVCache().update(KV, KV, positions=torch.arange(7)), ValueError, "positions must have shape [6] or [2, 6], got (7,)"),
    ("update", lambda: KVCache().update(KV, KV, positions=torch.arange(6).expand(3, 6)), ValueError, "positions must have shape [6] or [2, 6], got (3, 6)"),
    ("update", lambda: KVCache().update(KV, KV, positions=torch.tensor([0, 1, 2, 3, 4, 2**31])), ValueError, "positions must be < 2**31"),
    ("update", lambda: KVCache().update(KV, KV, document_ids=torch.zeros(2, 6)), TypeError, "document_ids must be an integer tensor (document labels)"),
    ("update", lambda: KVCache().update(KV, KV, document_ids=torch.zeros(2, 5, dtype=LONG)), ValueError, "document_ids must have shape [6] or [2, 6], got (2, 5)"),
    ("update", lambda: KVCache().update(KV[0], KV[0]), ValueError, "k must have shape [B, H, L, Dh]"),
    # evict: no duplicate, no slot past the ones held
    ("streaming_keep", lambda: posenc.streaming_keep(-1, 2, 3), ValueError, "length must be an int >= 0, got -1"),
    ("streaming_keep", lambda: posenc.streaming_keep(10, -1, 3), ValueError, "sinks must be an int >= 0, got -1"),
    ("streaming_keep", lambda: posenc.streaming_keep(10, 2, 0), ValueError, "window must be an int >= 1, got 0"),
    ("streaming_keep", lambda: posenc.streaming_keep(10, 2, 1.5), TypeError, "window must be an int, got 1.5"),
    ("evict", lambda: filled().evict(torch.tensor([0, 0, 1])), ValueError, "keep must name each of the 6 slots the cache holds at most once, got [0, 0, 1]"),
    ("evict", lambda: filled().evict(torch.tensor([0, 1, -6])), ValueError, "keep must name each of the 6 slots the cache holds at most once, got [0, 1, 0]"),
    ("evict", lambda: filled().evict(torch.tensor([0, 6])), ValueError, "keep must index the 6 slots the cache holds (in [-6, 6)), got values from 0 to 6"),
    ("evict", lambda: filled().evict(torch.tensor([-7, 1])), ValueError, "keep must index the 6 slots the cache holds"),
    ("evict", lambda: filled().evict(torch.tensor([True, False])), ValueError, "keep: a bool keep must have shape [6]"),
    ("evict", lambda: filled().evict(torch.tensor([0.0, 1.0])), TypeError, "keep must be a 1-D integer or bool tensor"),
    ("evict", lambda: filled().evict([0, 1]), TypeError, "keep must be a torch.Tensor"),
    # a static cache: the mask covers the cached plus the new keys
    ("static mask", lambda: step(filled(max_len=10), attention_mask=torch.ones(2, 6)), ValueError, "attention_mask covers 6 keys, but the cache held 6 and this call adds 1: it must cover the 7"),
    ("static mask", lambda: step(filled(max_len=10), attention_mask=torch.ones(2, 11)), ValueError, "attention_mask must have shape [2, T] with the cached plus new keys <= T <= max_len=10, got (2, 11)"),
    # one cache, one layer
    ("one cache per layer", two_layers_one_cache, ValueError, "holds the keys of layer 'MultiHeadAttention#"),
    ("one cache per layer", lab_model_one_cache_twice, ValueError, "caches[0] and caches[1] are the same KVCache"),
    ("one cache per layer", lambda: MultiHeadAttention(32, 4)(torch.randn(1, 3, 32), cache=[]), TypeError, "cache must be a KVCache or None, got list"),
    ("LayerCaches", lambda: LayerCaches(0), ValueError, "num_layers must be an int >= 1, got 0"),
    ("LayerCaches", lambda: LayerCaches(2, max_len=0), ValueError, "max_len must be an int >= 1, got 0"),
    ("LayerCaches", lambda: LayerCaches(2)[2], IndexError, "LayerCaches holds 2 layers (one cache each), got index 2"),
    # document ids are labels: any integer, but integers
    ("document_ids", lambda: attend(Q, KV, KV, document_ids=torch.ones(2, 6)), TypeError, "document_ids must be an integer tensor (document labels), got dtype torch.float32"),
    ("document_ids", lambda: attend(Q, KV, KV, document_ids=torch.ones(2, 6, dtype=torch.bool)), TypeError, "document_ids must be an integer tensor (document labels)"),
    ("document_ids", lambda: attend(Q, KV, KV, document_ids=torch.ones(3, 6, dtype=LONG)), ValueError, "document_ids must have shape [6] or [2, 6], got (3, 6)"),
    ("document_ids", lambda: attend(Q, KV, KV, document_ids=[0] * 6), TypeError, "document_ids must be a torch.Tensor"),
    # the mask-cache budgets
    ("cache_bytes", lambda: set_cache_bytes("1GB"), TypeError, "cache_bytes must be an int number of bytes >= 0 (0: cache no mask), got '1GB' (str)"),
    ("cache_bytes", lambda: set_cache_bytes(-1), ValueError, "cache_bytes must be an int number of bytes >= 0"),
    ("cache_bytes", lambda: set_cache_bytes(1.5e9), TypeError, "cache_bytes must be an int number of bytes"),
    # audit: attend
    ("attend", lambda: attend(Q, KV, KV, positions=torch.arange(6.0)), TypeError, "positions must be an integer tensor"),
    ("attend", lambda: attend(Q, KV, KV, positions=torch.arange(6)[None, None]), ValueError, "positions must have shape [L] or [B, L]"),
    ("attend", lambda: attend(Q, KV, KV, positions=torch.arange(6).expand(3, 6)), ValueError, "positions must have shape [6] or [2, 6], got (3, 6)"),
    ("attend", lambda: attend(Q, KV, KV, key_positions=torch.arange(6.0)), TypeError, "key_positions must be an integer tensor"),
    ("attend", lambda: attend(Q, KV, KV, attention_mask=torch.ones(3, 6)), ValueError, "attention_mask must have shape [2, 6] (cached plus new keys), got (3, 6)"),
    ("attend", lambda: attend(Q, KV, KV, attention_mask=torch.zeros(2, 1, 6, 6)), TypeError, "must be bool (True = may see)"),
    ("attend", lambda: attend(Q, KV, KV, attention_mask=torch.full((2, 6), float("-inf"))), ValueError, "attention_mask must hold only 0 and 1"),
    ("attend", lambda: attend(Q, KV, KV, window=-2), ValueError, "window must be an int >= 1, got -2"),
    ("attend", lambda: attend(Q, KV, KV, window=True), TypeError, "window must be an int, got True (bool)"),
    ("attend", lambda: attend(Q, KV, KV, window=torch.tensor(3)), TypeError, "window must be an int"),
    ("attend", lambda: attend(Q, KV, KV, causal=1), TypeError, "causal must be a bool (True or False), got 1 (int)"),
    ("attend", lambda: attend(Q, KV, KV, backend=["sdpa"]), ValueError, "backend must be one of ('sdpa', 'math', 'flex'), got ['sdpa']"),
    ("attend", lambda: attend(Q, KV, KV, dropout_p="0.1"), TypeError, "dropout_p must be a real number"),
    ("attend", lambda: attend(Q, KV, KV, "rope"), TypeError, "scheme must be a PositionScheme or None, got str"),
    ("attend", lambda: attend(Q.half(), KV, KV), TypeError, "q, k, v must share one dtype"),
    ("attend", lambda: attend(Q, KV[:1], KV[:1]), ValueError, "q, k, v must agree in batch and head_dim"),
    ("attend", lambda: attend(Q, torch.randn(2, 0, 6, 8), torch.randn(2, 0, 6, 8)), ValueError, "q has 4 heads and k/v have 0"),
    ("attend", lambda: attend(Q, torch.randn(2, 8, 6, 8), torch.randn(2, 8, 6, 8)), ValueError, "q has 4 heads and k/v have 8"),
    ("attend", lambda: attend(torch.randn(2, 8, 6, 8), KV, KV, ALIBI, window=2), ValueError, "scheme 'alibi' has a bias for 4 heads but q has 8 heads"),
    ("attend", lambda: attend(Q, KV, KV, key_positions=torch.arange(6), document_ids=torch.zeros(6, dtype=LONG)), ValueError, "document_ids with key_positions is not supported"),
    # audit: the cache against the new keys (these failed with torch.cat's size error)
    ("cache", lambda: attend(Q[:1, :, :1], KV[:1, :, :1], KV[:1, :, :1], cache=filled()), ValueError, "new k (1, 2, 1, 8) does not match the cached keys (2, 2, 6, 8)"),
    ("cache", lambda: MultiHeadAttention(32, 4)(torch.randn(1, 3, 32), cache=filled()), ValueError, "does not match the cached keys"),
    ("cache", lambda: step(filled(), document_ids=torch.zeros(2, 1, dtype=LONG), positions=torch.tensor([6])), ValueError, "document_ids must be given on every call with this cache or on none"),
    ("cache", lambda: KVCache().next_positions(-1, torch.device("cpu")), ValueError, "length must be an int >= 0, got -1"),
    ("cache", lambda: KVCache().claim(3), TypeError, "layer must be a str"),
    # audit: MultiHeadAttention.forward
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4)(torch.ones(1, 3, 32, device="meta")), ValueError, "x must be on the layer's device cpu, got meta"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4)(torch.ones(1, 3, 32, dtype=torch.float64)), TypeError, "x must have the layer's dtype torch.float32"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4)(torch.ones(1, 3, 32), attention_mask=torch.ones(1, 4)), ValueError, "attention_mask must have shape [1, 3]"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4)(torch.ones(1, 3, 32), document_ids=torch.zeros(1, 3)), TypeError, "document_ids must be an integer tensor"),
]


@pytest.mark.parametrize("name, call, exc, text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_wrong_call_raises_naming_the_argument(name, call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)


def test_update_positions_are_stored_as_given():
    cache = KVCache()
    cache.update(KV, KV, positions=torch.arange(3, 9, dtype=torch.int32))
    assert cache.positions.dtype == LONG and cache.positions[1].tolist() == list(range(3, 9))


@pytest.mark.parametrize("value", [None, "1GB", -1])
def test_a_wrong_global_budget_is_named_where_it_is_read(monkeypatch, value):
    monkeypatch.setattr(schemes, "MASK_CACHE_BYTES", value)
    sch = make_scheme("alibi", num_heads=4)
    with pytest.raises((TypeError, ValueError), match=r"posenc.schemes.MASK_CACHE_BYTES must be an int number of bytes >= 0"):
        attend(Q, KV, KV, sch)


def test_a_scheme_budget_overrides_the_global_one(monkeypatch):
    monkeypatch.setattr(schemes, "MASK_CACHE_BYTES", 0)
    sch = make_scheme("alibi", num_heads=4)
    attend(Q, KV, KV, sch)
    assert sch._mask is None  # 0: nothing cached
    sch.cache_bytes = 1 << 20
    attend(Q, KV, KV, sch)
    assert sch._mask is not None and sch.cache_bytes == 1 << 20
    sch.cache_bytes = None  # back to the global budget
    assert sch.cache_bytes is None


@torch.no_grad()
def test_document_ids_are_labels_of_any_integer():
    """Ids past 2**24 or negative are fine labels: the same documents give the same output."""
    docs = torch.tensor([[0, 0, 0, 1, 1, 1], [4, 4, 7, 7, 7, 7]])
    want = attend(Q, KV, KV, ALIBI, document_ids=docs)
    for relabel in (docs + 2**40, docs - 10, (docs * 3).to(torch.int32)):
        close(attend(Q, KV, KV, ALIBI, document_ids=relabel), want)


@torch.no_grad()
def test_evict_with_negative_indices_equals_the_positive_ones():
    a, b = filled(), filled()
    a.evict(torch.tensor([0, 1, -2, -1]))
    b.evict(torch.tensor([0, 1, 4, 5]))
    close(step(a), step(b))
    assert a.positions[0].tolist() == [0, 1, 4, 5, 6]


@torch.no_grad()
def test_a_static_cache_takes_a_mask_over_held_plus_new_or_all_slots():
    mask = torch.ones(2, 7, dtype=LONG)
    mask[1, :2] = 0  # a left-padded row
    exact = step(filled(max_len=10), attention_mask=mask)
    padded = torch.cat([mask, torch.zeros(2, 3, dtype=LONG)], 1)  # all max_len slots
    close(step(filled(max_len=10), attention_mask=padded), exact)
    close(step(filled(), attention_mask=mask), exact)  # the growing cache agrees


@torch.no_grad()
def test_layer_caches_decode_as_a_list_of_caches():
    from posenc.lab.model import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(scheme="alibi", dim=32, num_heads=4, num_layers=3, vocab_size=16).eval()
    tokens = torch.randint(0, 16, (2, 7))
    full = model(tokens)
    for caches in (LayerCaches(3), LayerCaches(3, max_len=8), [KVCache() for _ in range(3)]):
        out = [model(tokens[:, :4], caches=caches)] + [
            model(tokens[:, t : t + 1], caches=caches) for t in range(4, 7)
        ]
        close(torch.cat(out, 1), full, atol=1e-5, rtol=1e-5)
        assert [len(c) for c in caches] == [7, 7, 7]
    assert len(LayerCaches(3)) == 3 and "3 layers" in repr(LayerCaches(3))
    assert model.generate(tokens[:, :3], 4).shape == (2, 7)


def test_a_layer_keeps_its_own_cache_across_calls():
    """The same layer (or a compiled wrapper of it) may write its cache on every call."""
    layer = MultiHeadAttention(32, 4, scheme="rope").eval()
    cache = KVCache()
    with torch.no_grad():
        for _ in range(3):
            layer(torch.randn(1, 2, 32), cache=cache)
    assert len(cache) == 6 and cache.owner == layer.layer_name
    with pytest.raises(ValueError, match=r"blocks.1.attn"):
        lab_model_blocks_swapped()


def lab_model_blocks_swapped():
    """Layer 0's cache handed to layer 1 on the next call: refused, naming both blocks."""
    from posenc.lab.model import TransformerLM

    model = TransformerLM(scheme="rope", dim=32, num_heads=4, num_layers=2, vocab_size=16)
    caches = LayerCaches(2)
    tokens = torch.zeros(1, 2, dtype=LONG)
    model(tokens, caches=caches)
    model(tokens, caches=[caches[1], caches[0]])


# ---------------------------------------------------------------- the API review (issue 22, round 2)
X5 = torch.randn(2, 5, 32)  # [B, L, D] for a MultiHeadAttention(32, 4)


def flex_heads(scheme):
    with torch.no_grad():  # flex on CPU only without a gradient
        return attend(Q, KV, KV, scheme, backend="flex")


def set_package_budget():
    posenc.MASK_CACHE_BYTES = 0


REVIEW_CASES = [
    # a scheme with num_heads must match q's heads on every backend (a 1-head bias was broadcast,
    # flex read past the slopes or used the first 4 of 8)
    ("heads", lambda: attend(Q, KV, KV, ALiBi(1)), ValueError, "scheme 'alibi' has a bias for 1 heads but q has 4 heads"),
    ("heads", lambda: attend(Q, KV, KV, T5Bias(1)), ValueError, "scheme 't5' has a bias for 1 heads but q has 4 heads"),
    ("heads", lambda: attend(Q, KV, KV, ALiBi(1), backend="math"), ValueError, "scheme 'alibi' has a bias for 1 heads but q has 4 heads"),
    ("heads", lambda: flex_heads(ALiBi(8)), ValueError, "scheme 'alibi' has a bias for 8 heads but q has 4 heads"),
    ("heads", lambda: flex_heads(ALiBi(2)), ValueError, "scheme 'alibi' has a bias for 2 heads but q has 4 heads"),
    ("heads", lambda: flex_heads(ALiBi(1)), ValueError, "scheme 'alibi' has a bias for 1 heads but q has 4 heads"),
    ("heads", lambda: flex_heads(T5Bias(8)), ValueError, "scheme 't5' has a bias for 8 heads but q has 4 heads"),
    # key_positions alone cannot place the queries
    ("key_positions", lambda: attend(Q[:, :, :2], KV, KV, ALIBI, key_positions=torch.arange(6)), ValueError, "positions is required when key_positions is given"),
    # document ids: one contiguous run per document, positions given or not
    ("document_ids", lambda: attend(Q[:, :, :4], KV[:, :, :4], KV[:, :, :4], positions=torch.arange(4), document_ids=torch.tensor([0, 1, 1, 0])), ValueError, "document_ids must hold each document as one contiguous run"),
    ("document_ids", lambda: attend(Q[:, :, :4], KV[:, :, :4], KV[:, :, :4], positions=torch.arange(4), document_ids=torch.tensor([[0, 0, 1, 1], [5, 6, 5, 6]])), ValueError, "in row 1 [5, 6, 5, 6], 2 id(s) come back after another id"),
    # a class where an instance belongs
    ("class", lambda: attend(Q, KV, KV, RoPE), TypeError, "got the class RoPE; pass an instance, e.g. RoPE(head_dim)"),
    ("class", lambda: attend(Q, KV, KV, ALiBi), TypeError, "got the class ALiBi; pass an instance, e.g. ALiBi(num_heads)"),
    ("class", lambda: MultiHeadAttention(8, 2, scheme=RoPE), TypeError, "got the class RoPE; pass an instance, e.g. RoPE(head_dim)"),
    ("class", lambda: make_scheme(RoPE), TypeError, "got the class RoPE; pass an instance, e.g. RoPE(head_dim) (or a name: 'sinusoidal'"),
    # a window past int64 (the masks compare int64 positions)
    ("window", lambda: attend(Q, KV, KV, window=2**70), ValueError, "window must be an int <= 2**63 - 1 (the masks compare int64 positions; any window longer than the sequence means no window: pass None), got 1180591620717411303424"),
    ("window", lambda: MultiHeadAttention(32, 4, window=2**63), ValueError, "window must be an int <= 2**63 - 1"),
    # the mask-cache budget is read on posenc.schemes only; the package refuses the name
    ("MASK_CACHE_BYTES", set_package_budget, ValueError, "posenc.MASK_CACHE_BYTES is not read by anything: the setting is posenc.schemes.MASK_CACHE_BYTES; set it there (posenc.schemes.MASK_CACHE_BYTES = 0)"),
    # v's head size may differ, but not its batch, heads or length; k's head size must be q's
    ("v", lambda: attend(Q, KV, KV[:, :, :5, :4]), ValueError, "q, k, v must agree in batch and head_dim (k and v in all but v's head size"),
    ("v", lambda: attend(Q, KV[..., :4], KV[..., :4]), ValueError, "q, k, v must agree in batch and head_dim"),
    ("v", lambda: attend(Q[:, :, :1], KV[:, :, :1], KV[:, :, :1, :4], ROPE, cache=filled()), ValueError, "new v (2, 2, 1, 4) does not match the cached values (2, 2, 6, 8)"),
    ("v", lambda: KVCache().update(KV, KV[:, :1]), ValueError, "k and v must have the same shape, dtype and device (v's head size may differ from k's)"),
    ("LayerCaches", lambda: LayerCaches(2)[1.0], TypeError, "LayerCaches index must be an int (a layer), got float"),
    ("LayerCaches", lambda: LayerCaches(2)[True], TypeError, "LayerCaches index must be an int (a layer), got True (bool)"),
    ("LayerCaches", lambda: LayerCaches(2)[np.int64(2)], IndexError, "LayerCaches holds 2 layers (one cache each), got index 2"),
]


@pytest.mark.parametrize("name, call, exc, text", REVIEW_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(REVIEW_CASES)])
def test_review_wrong_call_raises_naming_the_argument(name, call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)


def test_the_package_holds_no_copy_of_the_budget():
    with pytest.raises(AttributeError):  # also an AttributeError, as for any unsettable name
        posenc.MASK_CACHE_BYTES = 0
    assert not hasattr(posenc, "MASK_CACHE_BYTES")
    posenc.some_user_name = 1  # other names are set as usual
    del posenc.some_user_name


def test_layer_caches_take_any_integer_index():
    caches = LayerCaches(3)
    for i in (np.int64(1), np.int32(1), torch.tensor(1), -2):
        assert caches[i] is caches.layers[1]


# ---- a refused call leaves the cache exactly as it was; the right retry gives the right answer


def snapshot(cache: KVCache) -> tuple:
    tensors = (cache.k, cache.v, cache.positions, cache.document_ids, cache.filled)
    return (len(cache), cache.seen, cache.evicted, cache.owner) + tuple(
        None if t is None else t.clone() for t in tensors
    )


def assert_same(a: tuple, b: tuple) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)
        else:
            assert x == y


def held(n: int, scheme=ROPE, **kwargs) -> KVCache:
    """A cache that has seen ``n`` tokens of Q/KV with ``scheme``."""
    cache = KVCache(**kwargs)
    attend(Q[:, :, :n], KV[:, :, :n], KV[:, :, :n], scheme, cache=cache)
    return cache


def token(t: int, scheme=ROPE, **kwargs) -> torch.Tensor:
    return attend(Q[:, :, t : t + 1], KV[:, :, t : t + 1], KV[:, :, t : t + 1], scheme, **kwargs)


ONES = torch.ones(2, 9, dtype=LONG)
REFUSED = {  # name: (cache, wrong kwargs, right kwargs, scheme of the step)
    "D10 mask shorter than cached plus new": (lambda: held(4), {"attention_mask": ONES[:, :4]}, {"attention_mask": ONES[:, :5]}, ROPE),
    "D11 static, mask shorter than held plus new": (lambda: held(4, max_len=8), {"attention_mask": ONES[:, :4]}, {"attention_mask": ONES[:, :5]}, ROPE),
    "D12 static, mask longer than max_len": (lambda: held(4, max_len=8), {"attention_mask": ONES[:, :9]}, {"attention_mask": ONES[:, :8]}, ROPE),
    "D13 scheme heads": (lambda: held(4, ALIBI), {}, {}, ALIBI),
    "static, scheme heads": (lambda: held(4, ALIBI, max_len=8), {}, {}, ALIBI),
    "document comes back": (lambda: held_docs(), {"document_ids": torch.tensor([0]), "positions": torch.tensor([2])}, {"document_ids": torch.tensor([1]), "positions": torch.tensor([2])}, ALIBI),
    "key_positions without positions": (lambda: held(4), {"key_positions": torch.tensor([4])}, {}, ROPE),
}


def held_docs() -> KVCache:
    cache = KVCache()
    attend(Q[:, :, :4], KV[:, :, :4], KV[:, :, :4], ALIBI, cache=cache, document_ids=torch.tensor([0, 0, 1, 1]))
    return cache


@pytest.mark.parametrize("case", list(REFUSED))
@torch.no_grad()
def test_a_refused_call_leaves_the_cache_as_it_was(case):
    make, wrong, right, sch = REFUSED[case]
    cache = make()
    before = snapshot(cache)
    wrong_scheme = ALiBi(8) if "heads" in case else sch
    with pytest.raises(ValueError):
        token(4, wrong_scheme, cache=cache, **wrong)
    assert_same(snapshot(cache), before)
    got = token(4, sch, cache=cache, **right)
    assert len(cache) == 5
    if "document" in case:  # the full pass over documents [0, 0, 1, 1, 1]
        want = attend(Q[:, :, :5], KV[:, :, :5], KV[:, :, :5], sch, document_ids=torch.tensor([0, 0, 1, 1, 1]))
    else:
        want = attend(Q[:, :, :5], KV[:, :, :5], KV[:, :, :5], sch)
    close(got, want[:, :, 4:], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_refused_layer_call_leaves_its_cache_unclaimed_and_unchanged():
    """K13: MultiHeadAttention with a mask that misses the new token, then the right mask: the
    token is attended once, as in one full pass. A refused first call claims nothing."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 4, scheme="rope").eval()
    full = layer(X5)
    cache = KVCache()
    with pytest.raises(ValueError, match=r"attention_mask must have shape \[2, 3\]"):
        layer(X5[:, :3], cache=cache, attention_mask=ONES[:, :2])
    assert cache.owner is None and len(cache) == 0 and cache.k is None
    layer(X5[:, :3], cache=cache)
    before = snapshot(cache)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \[2, 4\] \(cached plus new keys\), got \(2, 3\)"):
        layer(X5[:, 3:4], cache=cache, attention_mask=ONES[:, :3])
    assert_same(snapshot(cache), before)
    step4 = layer(X5[:, 3:4], cache=cache, attention_mask=ONES[:, :4])
    step5 = layer(X5[:, 4:5], cache=cache)
    close(torch.cat([step4, step5], 1), full[:, 3:], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_static_cache_refuses_a_first_call_too_long_without_allocating():
    cache = KVCache(max_len=4)
    with pytest.raises(ValueError, match=r"KVCache\(max_len=4\) holds 0 tokens and cannot take 6 more"):
        attend(Q, KV, KV, ROPE, cache=cache)
    assert cache.k is None and cache.filled is None and len(cache) == 0
    attend(Q[:1, :, :2], KV[:1, :, :2], KV[:1, :, :2], ROPE, cache=cache)  # another batch: fine
    assert len(cache) == 2


@torch.no_grad()
def test_documents_are_checked_over_the_cached_tokens():
    """A document id that came before another document in the cache cannot come back."""
    cache = held_docs()
    with pytest.raises(ValueError, match=r"in row 0 \(the cached plus new tokens\) \[0, 0, 1, 1, 0\]"):
        token(4, ALIBI, cache=cache, document_ids=torch.tensor([0]), positions=torch.tensor([2]))
    token(4, ALIBI, cache=cache, document_ids=torch.tensor([2]), positions=torch.tensor([0]))  # a new one
    assert len(cache) == 5


@pytest.mark.parametrize("backend", ("sdpa", "math", "flex"))
@torch.no_grad()
def test_the_largest_window_is_no_window(backend):
    """window = 2**63 - 1 is allowed and means no window, causal or not (n < m + W would
    overflow int64; the mask tests n - W < m)."""
    for causal in (True, False):
        want = attend(Q, KV, KV, ALIBI, causal=causal, backend=backend,
                      attention_mask=ONES[:, :6])  # the rule's path, as a window takes
        got = attend(Q, KV, KV, ALIBI, causal=causal, backend=backend, window=2**63 - 1)
        close(got, want, atol=1e-5, rtol=1e-5)
