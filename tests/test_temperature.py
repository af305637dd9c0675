"""Llama 4 attention temperature tuning: equal to transformers' Llama4TextAttention."""

import math

import pytest
import torch

from posenc.temperature import llama4_attn_scale


def test_formula_written_out():
    pos = torch.tensor([0, 1, 6, 7, 8, 15, 16, 100])
    got = llama4_attn_scale(pos, floor_scale=8, attn_scale=0.1)
    want = [1 + 0.1 * math.log(1 + (p + 1) // 8) for p in pos.tolist()]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32))
    assert got.dtype == torch.float32


def test_one_below_floor_scale_then_grows():
    s = llama4_attn_scale(torch.arange(100_000))  # Llama 4 defaults: floor_scale 8192, attn_scale 0.1
    assert (s[:8191] == 1).all() and s[8191] > 1
    assert (s.diff() >= 0).all()


def test_batched_positions_keep_shape():
    pos = torch.tensor([[0, 5, 9], [3, 4, 20]])
    s = llama4_attn_scale(pos, floor_scale=4, attn_scale=0.5)
    assert s.shape == (2, 3)
    torch.testing.assert_close(s[1], llama4_attn_scale(pos[1], floor_scale=4, attn_scale=0.5))


@pytest.mark.parametrize("past", [0, 5])
def test_nope_layer_equals_llama4_text_attention(past):
    """A NoPE layer of HF's Llama 4 (attn_temperature_tuning on) against plain attention whose
    queries are multiplied by llama4_attn_scale: the same output, also with a KV cache."""
    tf = pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    cfg = tf.Llama4TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                              num_hidden_layers=1, no_rope_layers=[0], floor_scale=3, attn_scale=0.3,
                              attn_temperature_tuning=True, attention_bias=False, intermediate_size=64,
                              intermediate_size_mlp=64, vocab_size=50)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = Llama4TextAttention(cfg, 0).eval()
    assert not attn.use_rope
    L, total = 7, 7 + past
    x = torch.randn(1, total, 32)
    mask = torch.full((total, total), float("-inf")).triu(1)[None, None]  # [1, 1, L, L] causal
    cache = None
    if past:
        cache = tf.DynamicCache(config=cfg)
        with torch.no_grad():
            attn(x[:, :past], None, mask[..., :past, :past], cache=cache)
    with torch.no_grad():
        out_hf, _ = attn(x[:, past:], None, mask[..., past:, :], cache=cache)

    q = attn.q_proj(x).view(1, total, 4, 8).transpose(1, 2)  # [B, H, L, Dh]
    k = attn.k_proj(x).view(1, total, 4, 8).transpose(1, 2)
    v = attn.v_proj(x).view(1, total, 4, 8).transpose(1, 2)
    scale = llama4_attn_scale(torch.arange(total), floor_scale=3, attn_scale=0.3)  # [L]
    q = q * scale[:, None]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8) + mask[0, 0]
    out = (s.softmax(-1) @ v).transpose(1, 2).reshape(1, total, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn.o_proj(out)[:, past:], out_hf)
    assert L == out_hf.shape[1]
