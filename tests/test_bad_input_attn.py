# ruff: noqa: E501  (one case per line reads best as a table)
"""Wrong calls to posenc's attention, ALiBi and scheme API: each raises a clear error that names
the argument (DESIGN.md, "Bad input"). One row per wrong call:
(public name, the call, exception type, a substring of the message naming the argument)."""

import pytest
import torch

from posenc import (
    ALiBi,
    KVCache,
    LearnedPE,
    MultiHeadAttention,
    NoPE,
    PositionScheme,
    RoPE,
    SinusoidalPE,
    T5Bias,
    alibi_bias,
    alibi_score_mod,
    alibi_slopes,
    attend,
    causal_block_mask,
    causal_mask,
    make_scheme,
)
from posenc.alibi import alibi_bias_padded

Q = torch.randn(1, 2, 4, 8)  # [B, H, L, Dh]
X = torch.randn(1, 4, 8)  # [B, L, D]
POS = torch.arange(4)
MASK = torch.tensor([[0, 1, 1, 1]])


def _kv_twice(second: torch.Tensor) -> None:
    cache = KVCache()
    cache.update(Q, Q)
    cache.update(second, second)


CASES = [
    # alibi_slopes
    ("alibi_slopes", lambda: alibi_slopes(0), ValueError, "num_heads must be an int >= 1, got 0"),
    ("alibi_slopes", lambda: alibi_slopes(2.0), TypeError, "num_heads must be an int, got 2.0"),
    ("alibi_slopes", lambda: alibi_slopes("8"), TypeError, "num_heads must be an int, got '8'"),
    ("alibi_slopes", lambda: alibi_slopes(-3), ValueError, "num_heads must be an int >= 1, got -3"),
    # alibi_bias
    ("alibi_bias", lambda: alibi_bias(4, 8, 4), ValueError, "k_len must be >= q_len=8"),
    ("alibi_bias", lambda: alibi_bias(4, -1), ValueError, "q_len must be an int >= 0, got -1"),
    ("alibi_bias", lambda: alibi_bias(0, 4), ValueError, "num_heads must be an int >= 1, got 0"),
    ("alibi_bias", lambda: alibi_bias(4, 2.5), TypeError, "q_len must be an int, got 2.5"),
    ("alibi_bias", lambda: alibi_bias(4, 4, dtype=torch.long), TypeError, "dtype must be None or a floating"),
    ("alibi_bias", lambda: alibi_bias(4, 4, causal="false"), TypeError, "causal must be a bool (True or False), got 'false'"),
    # alibi_bias_padded
    ("alibi_bias_padded", lambda: alibi_bias_padded(4, torch.ones(5)), ValueError, "attention_mask must have shape [B, k_len]"),
    ("alibi_bias_padded", lambda: alibi_bias_padded(4, MASK.float()), TypeError, "attention_mask must be a bool or integer"),
    ("alibi_bias_padded", lambda: alibi_bias_padded(4, MASK * 2), ValueError, "attention_mask must hold only 0 and 1"),
    ("alibi_bias_padded", lambda: alibi_bias_padded(4, MASK, q_len=5), ValueError, "k_len must be >= q_len=5"),
    ("alibi_bias_padded", lambda: alibi_bias_padded(4, MASK, position_ids=torch.arange(3)[None]), ValueError, "position_ids must have the shape of attention_mask"),
    ("alibi_bias_padded", lambda: alibi_bias_padded(4, MASK, position_ids=-POS[None]), ValueError, "position_ids must be >= 0"),
    ("alibi_bias_padded", lambda: alibi_bias_padded(4, [[1, 1]]), TypeError, "attention_mask must be a torch.Tensor"),
    # alibi_score_mod
    ("alibi_score_mod", lambda: alibi_score_mod(torch.ones(2, 2)), ValueError, "slopes must be 1-D [num_heads]"),
    ("alibi_score_mod", lambda: alibi_score_mod(torch.tensor([0.5, float("nan")])), ValueError, "slopes must be finite"),
    ("alibi_score_mod", lambda: alibi_score_mod([0.5, 0.25]), TypeError, "slopes must be a torch.Tensor"),
    ("alibi_score_mod", lambda: alibi_score_mod(torch.ones(2, dtype=torch.long)), TypeError, "slopes must be a floating-point"),
    ("alibi_score_mod", lambda: alibi_score_mod(alibi_slopes(2), q_offset=-1), ValueError, "q_offset must be an int >= 0"),
    # causal_mask
    ("causal_mask", lambda: causal_mask(5, 3), ValueError, "q_len must be <= k_len=3"),
    ("causal_mask", lambda: causal_mask(2.0, 4), TypeError, "q_len must be an int, got 2.0"),
    ("causal_mask", lambda: causal_mask(2, -1), ValueError, "k_len must be an int >= 0, got -1"),
    ("causal_mask", lambda: causal_mask(2, 4.0), TypeError, "k_len must be an int, got 4.0"),
    # causal_block_mask
    ("causal_block_mask", lambda: causal_block_mask(300, 200), ValueError, "q_len must be <= k_len=200"),
    ("causal_block_mask", lambda: causal_block_mask(1.5, 200), TypeError, "q_len must be an int, got 1.5"),
    ("causal_block_mask", lambda: causal_block_mask(1, "200"), TypeError, "k_len must be an int, got '200'"),
    # attend
    ("attend", lambda: attend(Q.long(), Q, Q), TypeError, "q must be a floating-point tensor"),
    ("attend", lambda: attend(Q[0], Q, Q), ValueError, "q must have shape [B, H, L, Dh]"),
    ("attend", lambda: attend(Q.half(), Q, Q), TypeError, "q, k, v must share one dtype, got torch.float16, torch.float32"),
    ("attend", lambda: attend(Q, Q, Q, dropout_p=1.5), ValueError, "dropout_p must be in [0, 1], got 1.5"),
    ("attend", lambda: attend(Q, Q, Q, backend="cuda"), ValueError, "backend must be one of"),
    ("attend", lambda: attend(Q, Q, Q, positions=POS.float()), TypeError, "positions must be an integer tensor"),
    ("attend", lambda: attend(Q, Q[:, :, :3], Q[:, :, :3]), ValueError, "q and k must hold the same new tokens"),
    ("attend", lambda: attend(Q, Q, Q, "alibi"), TypeError, "scheme must be a PositionScheme or None, got str"),
    ("attend", lambda: attend(Q, Q, Q, cache=[]), TypeError, "cache must be a KVCache or None, got list"),
    ("attend", lambda: attend(Q, Q, Q, causal="yes"), TypeError, "causal must be a bool (True or False), got 'yes' (str)"),
    # KVCache
    ("KVCache", lambda: KVCache().update(Q, Q[:, :, :3]), ValueError, "k and v must have the same shape"),
    ("KVCache", lambda: KVCache().update(Q, Q.double()), ValueError, "k and v must have the same shape, dtype"),
    ("KVCache", lambda: KVCache().update(Q[0], Q[0]), ValueError, "k must have shape [B, H, L, Dh]"),
    ("KVCache", lambda: KVCache().update(Q.tolist(), Q), TypeError, "k must be a torch.Tensor"),
    ("KVCache", lambda: _kv_twice(torch.randn(1, 3, 1, 8)), ValueError, "new k (1, 3, 1, 8) does not match the cached keys"),
    ("KVCache", lambda: _kv_twice(Q.double()), ValueError, "new k is torch.float64"),
    # a rolling KVCache(max_len=S + W, sinks=S, window=W)
    ("KVCache", lambda: KVCache(6, sinks=2), ValueError, "KVCache: sinks=2 needs window=W too"),
    ("KVCache", lambda: KVCache(sinks=2, window=4), ValueError, "window=4 makes a rolling static cache and needs max_len=sinks + window = 6"),
    ("KVCache", lambda: KVCache(5, sinks=2, window=4), ValueError, "max_len must be 2 + 4 = 6, got max_len=5"),
    ("KVCache", lambda: KVCache(6, sinks=-1, window=4), ValueError, "sinks must be an int >= 0, got -1"),
    ("KVCache", lambda: KVCache(6, sinks=2, window=4.0), TypeError, "window must be an int, got 4.0 (float)"),
    ("KVCache", lambda: KVCache(6, window=0), ValueError, "window must be an int >= 1, got 0"),
    # MultiHeadAttention
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 0), ValueError, "num_heads must be an int >= 1, got 0"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4)(torch.randn(1, 3, 32, dtype=torch.float64)), TypeError, "x must have the layer's dtype torch.float32, got torch.float64"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4, dropout=1.5), ValueError, "dropout must be in [0, 1], got 1.5"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4, dropout=-0.1), ValueError, "dropout must be in [0, 1]"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(30, 4), ValueError, "dim=30 must be divisible by num_heads=4"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4, scheme=ALiBi(8)), ValueError, "built for 8 heads, but num_heads=4"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4, scheme=["rope"]), TypeError, "scheme must be a name or a PositionScheme, got list"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(12, 4, scheme="rope"), ValueError, "dim // num_heads = 12 // 4 = 3 must be even"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4, scheme=RoPE(4)), ValueError, "dim // num_heads = 32 // 4 = 8"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(8, 2)(X[0]), ValueError, "x must have shape [B, L, 8]"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(8, 2, causal="true"), TypeError, "causal must be a bool (True or False)"),
    # make_scheme
    ("make_scheme", lambda: make_scheme("alibi", num_heads=4, foo=1), TypeError, "unexpected keyword argument 'foo'"),
    ("make_scheme", lambda: make_scheme("rope", dim=32, num_heads=4, bse=500.0), TypeError, "make_scheme('rope') got an unexpected keyword argument 'bse'"),
    ("make_scheme", lambda: make_scheme("nope", base=10.0), TypeError, "unexpected keyword argument 'base'"),
    ("make_scheme", lambda: make_scheme("t5", num_heads=4, num_bucket=8), TypeError, "unexpected keyword argument 'num_bucket'"),
    ("make_scheme", lambda: make_scheme(["rope", "alibi"]), TypeError, "scheme must be a name or a PositionScheme, got list"),
    ("make_scheme", lambda: make_scheme("bogus"), ValueError, "unknown scheme 'bogus'; allowed:"),
    ("make_scheme", lambda: make_scheme("alibi"), ValueError, "scheme 'alibi' needs num_heads"),
    ("make_scheme", lambda: make_scheme(ALiBi(4), base=2.0), TypeError, "make_scheme got keyword arguments ['base']"),
    # PositionScheme (the base hooks) and NoPE
    ("PositionScheme", lambda: PositionScheme(foo=1), TypeError, "unexpected keyword argument 'foo'"),
    ("PositionScheme", lambda: PositionScheme().bias(1.5, 2), TypeError, "q_len must be an int, got 1.5"),
    ("PositionScheme", lambda: PositionScheme().attn_mask(2, 1), ValueError, "k_len must be >= q_len=2"),
    ("PositionScheme", lambda: PositionScheme().embed("x", POS), TypeError, "x must be a torch.Tensor"),
    ("NoPE", lambda: NoPE(base=1.0), TypeError, "unexpected keyword argument 'base'"),
    ("NoPE", lambda: NoPE().rotate(Q.long(), Q, POS), TypeError, "q must be a floating-point tensor"),
    ("NoPE", lambda: NoPE().attn_mask(2, 4, dtype=torch.int32), TypeError, "dtype must be None or a floating"),
    ("NoPE", lambda: NoPE().bias(3, 2), ValueError, "k_len must be >= q_len=3"),
    # SinusoidalPE
    ("SinusoidalPE", lambda: SinusoidalPE(8, foo=1), TypeError, "SinusoidalPE got an unexpected keyword argument 'foo'"),
    ("SinusoidalPE", lambda: SinusoidalPE(0), ValueError, "dim must be an int >= 1, got 0"),
    ("SinusoidalPE", lambda: SinusoidalPE(8, max_len=0), ValueError, "max_len must be an int >= 1, got 0"),
    ("SinusoidalPE", lambda: SinusoidalPE(8).embed(torch.randn(1, 4, 6), POS), ValueError, "x must have shape [B, L, 8]"),
    # LearnedPE
    ("LearnedPE", lambda: LearnedPE(8, 0), ValueError, "max_len must be an int >= 1, got 0"),
    ("LearnedPE", lambda: LearnedPE(8, 4, foo=1), TypeError, "LearnedPE got an unexpected keyword argument 'foo'"),
    ("LearnedPE", lambda: LearnedPE(8.0, 4), TypeError, "dim must be an int, got 8.0"),
    ("LearnedPE", lambda: LearnedPE(8, 4).embed(X[0], POS), ValueError, "x must have shape [B, L, 8]"),
    # RoPE
    ("RoPE", lambda: RoPE(7), ValueError, "head_dim"),
    ("RoPE", lambda: RoPE(8, base=-1.0), ValueError, "base must be > 0"),
    ("RoPE", lambda: RoPE(8, bogus=1), TypeError, "RoPE got an unexpected keyword argument 'bogus'"),
    ("RoPE", lambda: RoPE(8).rotate(Q, Q, POS.float()), TypeError, "positions must be an integer tensor"),
    # ALiBi
    ("ALiBi", lambda: ALiBi(0), ValueError, "num_heads must be an int >= 1, got 0"),
    ("ALiBi", lambda: ALiBi(2.0), TypeError, "num_heads must be an int, got 2.0"),
    ("ALiBi", lambda: ALiBi(4, foo=1), TypeError, "unexpected keyword argument 'foo'"),
    ("ALiBi", lambda: ALiBi(4).attn_mask(5, 3), ValueError, "k_len must be >= q_len=5"),
    ("ALiBi", lambda: ALiBi(4).attn_mask(2, 2, dtype=torch.long), TypeError, "dtype must be None or a floating"),
    ("ALiBi", lambda: ALiBi(4).bias(2, 2, causal=1), TypeError, "causal must be a bool (True or False), got 1"),
    # T5Bias
    ("T5Bias", lambda: T5Bias(0), ValueError, "num_heads must be an int >= 1, got 0"),
    ("T5Bias", lambda: T5Bias(4, num_buckets=3), ValueError, "num_buckets must be even"),
    ("T5Bias", lambda: T5Bias(4, foo=1), TypeError, "T5Bias got an unexpected keyword argument 'foo'"),
    ("T5Bias", lambda: T5Bias(4).attn_mask(3, 2), ValueError, "k_len must be >= q_len=3"),
    ("T5Bias", lambda: T5Bias(4).attn_mask(2, 2, causal="no"), TypeError, "causal must be a bool (True or False)"),
]

PUBLIC = {
    "alibi_slopes", "alibi_bias", "alibi_bias_padded", "alibi_score_mod", "causal_mask",
    "causal_block_mask", "attend", "KVCache", "MultiHeadAttention", "make_scheme", "NoPE",
    "SinusoidalPE", "LearnedPE", "RoPE", "ALiBi", "T5Bias", "PositionScheme",
}


@pytest.mark.parametrize(
    "name,call,exc,match", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_wrong_call_raises_a_clear_error(name, call, exc, match):
    if name == "causal_block_mask":
        pytest.importorskip("torch.nn.attention.flex_attention")
    with pytest.raises(exc) as info:
        call()
    assert match in str(info.value), f"{name}: {info.value!s} lacks {match!r}"


def test_every_public_name_has_three_wrong_calls():
    counts = {n: sum(c[0] == n for c in CASES) for n in PUBLIC}
    assert all(n in PUBLIC for n, *_ in CASES)
    assert min(counts.values()) >= 3, counts


@pytest.mark.parametrize(
    "call,unpassed",
    [
        (lambda: MultiHeadAttention(12, 4, scheme="rope"), "head_dim"),
        (lambda: MultiHeadAttention(32, 4, dropout=2.0), "dropout_p"),
        (lambda: make_scheme("rope", dim=12, num_heads=4), "head_dim"),
        (lambda: attend(Q, Q, Q, ALiBi(4)), "num_heads"),
    ],
)
def test_errors_name_only_arguments_the_caller_passed(call, unpassed):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert unpassed not in str(info.value)
