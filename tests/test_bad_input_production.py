# ruff: noqa: E501  (one case per line reads best as a table)
"""Wrong calls to the production features (issue 15): positions helpers, GQA, masks, windows,
key positions, the static cache, and the bounds that fail before allocating. Each raises a clear
error naming the argument, the value and what is allowed."""

import pytest
import torch

import posenc
from posenc import (
    KVCache,
    MultiHeadAttention,
    attend,
    make_scheme,
    packed_positions,
    positions_from_mask,
    shard_positions,
)

Q = torch.randn(2, 4, 6, 8)  # [B, H, L, Dh]
KV = torch.randn(2, 2, 6, 8)  # [B, H_kv, L, Dh]
ROPE = make_scheme("rope", dim=32, num_heads=4)
ALIBI = make_scheme("alibi", num_heads=4)

CASES = [
    ("positions_from_mask", lambda: positions_from_mask(torch.ones(6)), ValueError, "attention_mask must have shape [B, L]"),
    ("positions_from_mask", lambda: positions_from_mask(torch.ones(2, 6, dtype=torch.complex64)), TypeError, "attention_mask must be a bool, integer or float tensor"),
    ("positions_from_mask", lambda: positions_from_mask(torch.full((2, 6), 2)), ValueError, "attention_mask must hold only 0 and 1"),
    ("positions_from_mask", lambda: positions_from_mask([[1, 1]]), TypeError, "attention_mask must be a torch.Tensor"),
    ("packed_positions", lambda: packed_positions(torch.tensor([0.0, 1.0])), TypeError, "document_ids must be an integer tensor"),
    ("packed_positions", lambda: packed_positions(torch.zeros(1, 2, 3, dtype=torch.long)), ValueError, "document_ids must have shape [L] or [B, L]"),
    ("packed_positions", lambda: packed_positions(torch.tensor([0, 0, 1, 0])), ValueError, "one contiguous run"),
    ("shard_positions", lambda: shard_positions(10, 0, 2), ValueError, "seq_len=10 must be divisible by 2 * world_size = 4"),
    ("shard_positions", lambda: shard_positions(8, 2, 2), ValueError, "rank must be in [0, world_size=2)"),
    ("shard_positions", lambda: shard_positions(8, 0, 0), ValueError, "world_size must be an int >= 1"),
    ("shard_positions", lambda: shard_positions(8, 0, 2, load_balance=1), TypeError, "load_balance must be a bool"),
    ("attend", lambda: attend(Q, torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)), ValueError, "q has 4 heads and k/v have 3"),
    ("attend", lambda: attend(Q, KV, KV, attention_mask=torch.ones(2, 5, dtype=torch.long)), ValueError, "attention_mask must have shape [2, 6]"),
    ("attend", lambda: attend(Q, KV, KV, window=0), ValueError, "window must be an int >= 1"),
    ("attend", lambda: attend(Q, KV, KV, window=2.0), TypeError, "window must be an int"),
    ("attend", lambda: attend(Q, KV, KV, document_ids=torch.zeros(2, 5, dtype=torch.long)), ValueError, "document_ids must have shape [6] or [2, 6]"),
    ("attend", lambda: attend(Q, torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)), ValueError, "or give key_positions"),
    ("attend", lambda: attend(Q, torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8), key_positions=torch.arange(8)), ValueError, "key_positions must have shape [9] or [2, 9]"),
    ("attend", lambda: attend(Q, KV, KV, positions=torch.tensor([0, 1, 2, 3, 4, 2**31])), ValueError, "positions must be < 2**31"),
    ("KVCache", lambda: KVCache(max_len=0), ValueError, "max_len must be an int >= 1"),
    ("KVCache", lambda: KVCache(max_len=4).update(KV, KV), ValueError, "KVCache(max_len=4) holds 0 tokens and cannot take 6 more"),
    ("KVCache", lambda: KVCache(max_len=8).evict(torch.tensor([0])), ValueError, "evict works on a growing KVCache"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4, num_kv_heads=3), ValueError, "num_heads=4 must be a multiple of num_kv_heads=3"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4, window=-1), ValueError, "window must be an int >= 1"),
    ("MultiHeadAttention", lambda: MultiHeadAttention(32, 4, num_kv_heads=0), ValueError, "num_kv_heads must be an int >= 1"),
    ("alibi_bias", lambda: posenc.alibi_bias(8, 10**6), ValueError, "exceeds 2**31"),
    ("alibi_bias", lambda: posenc.alibi_bias(8, 4, device="cuda:7"), ValueError, "is not available on this machine"),
    ("T5RelativeBias", lambda: posenc.T5RelativeBias(8)(10**6), ValueError, "exceeds 2**31"),
    ("RotaryEmbedding", lambda: posenc.RotaryEmbedding(8)(Q[..., :8], Q[..., :8], positions=torch.tensor([0, 1, 2, 3, 4, 2**40])), ValueError, "positions must be < 2**31"),
    ("sinusoidal_table", lambda: posenc.sinusoidal_table(2**40, 8), ValueError, "must be <= 2**24"),
    ("sinusoidal_table", lambda: posenc.sinusoidal_table(4, 8, device="cuda:7"), ValueError, "is not available on this machine"),
    ("axial_rope_cos_sin", lambda: posenc.axial_rope_cos_sin(2, 2, 8, device="cuda:7"), ValueError, "is not available on this machine"),
]


@pytest.mark.parametrize("name, call, exc, text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_wrong_call_raises_naming_the_argument(name, call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)


def test_right_calls_that_transformers_accepts_still_work():
    # a [1, seq, d] table broadcasts exactly (Pixtral's unsqueeze_dim=0); a [B>1, seq, d] one is refused
    cos, sin = posenc.rope_cos_sin(torch.arange(6), posenc.rope_inv_freq(8)[0], interleaved=False)
    x = torch.randn(2, 4, 6, 8)
    want = posenc.apply_rope(x, cos, sin, interleaved=False)
    torch.testing.assert_close(posenc.apply_rope(x, cos[None], sin[None], interleaved=False), want)
    torch.testing.assert_close(posenc.apply_rope(x, cos[None, None], sin[None, None], interleaved=False), want)
    with pytest.raises(ValueError, match="ambiguous"):
        posenc.apply_rope(x, cos.expand(2, 6, 8), sin.expand(2, 6, 8), interleaved=False)
