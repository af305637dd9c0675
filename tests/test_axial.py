"""2-D RoPE for patches: equal to Pixtral's vision rotary embedding; scores depend on (dh, dw) only."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc as pe
from posenc.axial import axial_rope_cos_sin


def pixtral_cos_sin(height, width, head_dim, base):
    tf = pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding

    cfg = tf.PixtralVisionConfig(hidden_size=2 * head_dim, num_attention_heads=2,
                                 rope_parameters={"rope_type": "axial", "rope_theta": base})
    h, w = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    position_ids = torch.stack([h.flatten(), w.flatten()], dim=-1)  # [N, 2], as PixtralVisionModel
    return PixtralVisionRotaryEmbedding(cfg)(torch.zeros(1), position_ids)


@pytest.mark.parametrize("height,width,head_dim,base", [
    (3, 5, 8, 10000.0), (4, 4, 16, 10000.0), (7, 2, 64, 10000.0), (16, 16, 64, 10000.0), (2, 3, 32, 500.0),
])
def test_equal_pixtral(height, width, head_dim, base):
    cos_hf, sin_hf = pixtral_cos_sin(height, width, head_dim, base)
    cos, sin = axial_rope_cos_sin(height, width, head_dim, base=base)
    assert cos.shape == (height * width, head_dim)
    torch.testing.assert_close(cos, cos_hf, rtol=0, atol=0)
    torch.testing.assert_close(sin, sin_hf, rtol=0, atol=0)


def test_rotated_queries_equal_pixtral_attention_path():
    pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.pixtral.modeling_pixtral import apply_rotary_pos_emb

    cos_hf, sin_hf = pixtral_cos_sin(3, 4, 16, 10000.0)
    q, k = torch.randn(2, 2, 3, 12, 16).unbind(0)  # [B, H, N, Dh]
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos_hf, sin_hf, unsqueeze_dim=0)
    cos, sin = axial_rope_cos_sin(3, 4, 16)
    torch.testing.assert_close(pe.apply_rope(q, cos, sin, interleaved=False), q_hf)
    torch.testing.assert_close(pe.apply_rope(k, cos, sin, interleaved=False), k_hf)


def test_row_gets_even_frequencies_column_odd():
    inv = pe.rope_inv_freq(16)[0]
    cos, _ = axial_rope_cos_sin(4, 5, 16)
    p = 2 * 5 + 3  # row 2, column 3
    want = torch.cat([2 * inv[0::2], 3 * inv[1::2]]).cos()
    torch.testing.assert_close(cos[p], torch.cat([want, want]))


@given(st.integers(1, 5), st.integers(1, 5), st.sampled_from([8, 16, 32]))
def test_scores_depend_only_on_dh_dw(height, width, head_dim):
    """Same content at every patch: the score of patches a, b is a function of (dh, dw) alone."""
    cos, sin = axial_rope_cos_sin(height, width, head_dim)
    q, k = torch.randn(2, 1, head_dim).unbind(0)
    n = height * width
    qr = pe.apply_rope(q.expand(n, -1), cos, sin, interleaved=False)
    kr = pe.apply_rope(k.expand(n, -1), cos, sin, interleaved=False)
    s = qr @ kr.T  # [N, N]
    rows, cols = torch.arange(n) // width, torch.arange(n) % width
    seen = {}
    for a in range(n):
        for b in range(n):
            key = (int(rows[b] - rows[a]), int(cols[b] - cols[a]))
            seen.setdefault(key, s[a, b])
            torch.testing.assert_close(s[a, b], seen[key], atol=1e-5, rtol=1e-5)  # float32 angles


def test_grid_of_one_row_is_not_1d_rope():
    """A 1 x W grid rotates only the odd frequencies: 2-D RoPE is not 1-D RoPE along a row."""
    cos, sin = axial_rope_cos_sin(1, 6, 16)
    assert torch.equal(cos[:, :4], torch.ones(6, 4))  # the row's (even) frequencies stay at angle 0
    ref, _ = pe.rope_cos_sin(torch.arange(6), pe.rope_inv_freq(16)[0], interleaved=False)
    assert not torch.allclose(cos, ref)


def test_dtype_and_device():
    cos, sin = axial_rope_cos_sin(2, 2, 8, dtype=torch.bfloat16, device="cpu")
    assert cos.dtype == sin.dtype == torch.bfloat16
    torch.testing.assert_close(cos, axial_rope_cos_sin(2, 2, 8)[0].bfloat16())
