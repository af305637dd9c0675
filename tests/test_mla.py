"""MLA's decoupled RoPE with posenc pieces equals transformers 5.24's DeepSeek-V3 attention."""

import math

import pytest
import torch

import posenc as pe
from posenc.mla import mla_rope

H, NOPE, ROPE, V, RANK, HID = 2, 8, 4, 8, 12, 16


def deepseek(rope_interleave, q_lora_rank=None):
    tf = pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    cfg = tf.DeepseekV3Config(hidden_size=HID, num_attention_heads=H, num_key_value_heads=H,
                              q_lora_rank=q_lora_rank, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
                              qk_nope_head_dim=NOPE, v_head_dim=V,
                              rope_interleave=rope_interleave, num_hidden_layers=1, vocab_size=50,
                              intermediate_size=32, moe_intermediate_size=16, attention_bias=False)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return cfg, DeepseekV3Attention(cfg, 0).eval(), DeepseekV3RotaryEmbedding(cfg)


def causal(L):
    return torch.full((L, L), float("-inf")).triu(1)  # [L, L]


def project(attn, x):
    """The projections of DeepSeek-V3's attention: q [B, H, L, nope + rope], latent, k_rope."""
    B, L, _ = x.shape
    q = attn.q_proj(x) if attn.q_proj is not None else attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x)))
    q = q.view(B, L, H, NOPE + ROPE).transpose(1, 2)  # [B, H, L, nope + rope]
    c, k_rope = attn.kv_a_proj_with_mqa(x).split([RANK, ROPE], dim=-1)
    return q, attn.kv_a_layernorm(c), k_rope[:, None]  # [B, L, rank], [B, 1, L, rope]


@pytest.mark.parametrize("rope_interleave", [False, True])
@pytest.mark.parametrize("q_lora_rank", [None, 8])
def test_mla_rope_equals_deepseek_v3_attention(rope_interleave, q_lora_rank):
    cfg, attn, rotary = deepseek(rope_interleave, q_lora_rank)
    B, L = 2, 6
    x = torch.randn(B, L, HID)
    pos = torch.arange(L)[None].expand(B, L)
    with torch.no_grad():
        want, _ = attn(x, rotary(x, pos), causal(L)[None, None])

        q, c, k_rope = project(attn, x)
        cos, sin = pe.rope_cos_sin(pos, pe.rope_inv_freq(ROPE, base=cfg.rope_parameters["rope_theta"])[0],
                                   interleaved=False)  # [B, L, rope]
        q, k_rope = mla_rope(q, k_rope, cos[:, None], sin[:, None], rope_interleave=rope_interleave)
        k_nope, v = attn.kv_b_proj(c).view(B, L, H, NOPE + V).transpose(1, 2).split([NOPE, V], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(-1, H, -1, -1)], dim=-1)  # [B, H, L, nope + rope]
        s = q @ k.transpose(-1, -2) / math.sqrt(NOPE + ROPE) + causal(L)
        out = attn.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, H * V))
    torch.testing.assert_close(out, want)


def test_rope_interleave_is_a_weight_permutation():
    """rope_interleave=True equals plain half-layout RoPE after permuting the rope rows of the weights
    (rope_permutation), the conversion posenc offers for any interleaved checkpoint."""
    _, attn, rotary = deepseek(True)
    _, plain, _ = deepseek(False)
    perm_q = torch.cat([torch.cat([torch.arange(NOPE), NOPE + pe.rope_permutation(ROPE)]) + h * (NOPE + ROPE)
                        for h in range(H)])
    perm_kv = torch.cat([torch.arange(RANK), RANK + pe.rope_permutation(ROPE)])
    with torch.no_grad():
        plain.load_state_dict(attn.state_dict())
        plain.q_proj.weight.copy_(attn.q_proj.weight[perm_q])
        plain.kv_a_proj_with_mqa.weight.copy_(attn.kv_a_proj_with_mqa.weight[perm_kv])
        x = torch.randn(1, 5, HID)
        pe_ = rotary(x, torch.arange(5)[None])
        mask = causal(5)[None, None]
        torch.testing.assert_close(plain(x, pe_, mask)[0], attn(x, pe_, mask)[0])


def test_absorbed_latent_cache_gives_the_same_scores():
    """Cache only (latent c, rotated k_rope): fold W_UK into the query for the nope part, add the rope
    part; the scores equal those of the expanded keys. Folding fails once the keys themselves rotate."""
    _, attn, _ = deepseek(False)
    L = 7
    x = torch.randn(1, L, HID)
    pos = torch.arange(L)
    cos, sin = pe.rope_cos_sin(pos, pe.rope_inv_freq(ROPE)[0], interleaved=False)
    with torch.no_grad():
        q, c, k_rope = project(attn, x)
        q, k_rope = mla_rope(q, k_rope, cos, sin)
        w_uk = attn.kv_b_proj.weight.view(H, NOPE + V, RANK)[:, :NOPE]  # [H, nope, rank]
        k_nope = torch.einsum("hdr,blr->bhld", w_uk, c)  # [B, H, L, nope]: expanded keys
        full = q[..., :NOPE] @ k_nope.transpose(-1, -2) + q[..., NOPE:] @ k_rope.transpose(-1, -2)
        q_lat = torch.einsum("bhld,hdr->bhlr", q[..., :NOPE], w_uk)  # [B, H, L, rank]: absorbed query
        absorbed = q_lat @ c[:, None].transpose(-1, -2) + q[..., NOPE:] @ k_rope.transpose(-1, -2)
        torch.testing.assert_close(absorbed, full)

        # rotate the whole key instead (plain RoPE on k = W_UK c): no fixed query matrix reproduces it
        cos_n, sin_n = pe.rope_cos_sin(pos, pe.rope_inv_freq(NOPE)[0], interleaved=False)
        rotated = pe.apply_rope(q[..., :NOPE], cos_n, sin_n, interleaved=False) @ pe.apply_rope(
            k_nope, cos_n, sin_n, interleaved=False).transpose(-1, -2)
        assert not torch.allclose(q_lat @ c[:, None].transpose(-1, -2), rotated, atol=1e-3)


def test_nope_channels_untouched_and_positions_relative():
    q, k = torch.randn(1, 2, 5, NOPE + ROPE), torch.randn(1, 1, 5, ROPE)
    cos, sin = pe.rope_cos_sin(torch.arange(3, 8), pe.rope_inv_freq(ROPE)[0], interleaved=False)
    qr, kr = mla_rope(q, k, cos, sin)
    assert torch.equal(qr[..., :NOPE], q[..., :NOPE])
    cos0, sin0 = pe.rope_cos_sin(torch.arange(5), pe.rope_inv_freq(ROPE)[0], interleaved=False)
    qr0, kr0 = mla_rope(q, k, cos0, sin0)  # shifting every position by 3 leaves the rope scores alone
    torch.testing.assert_close(qr[..., NOPE:] @ kr.transpose(-1, -2), qr0[..., NOPE:] @ kr0.transpose(-1, -2))
