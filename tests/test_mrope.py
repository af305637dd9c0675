"""M-RoPE: cos/sin and 3-D position ids equal transformers 5.24's Qwen2-VL (and Qwen3-VL)."""

import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc as pe
from posenc.mrope import mrope_cos_sin, mrope_position_ids

IMG, START, END = 7, 5, 6  # token ids of <image>, <vision_start>, <vision_end>


def hf_rotary(head_dim, section, base=10000.0, qwen3=False):
    tf = pytest.importorskip("transformers", minversion="5.0")
    params = {"rope_type": "default", "rope_theta": base, "mrope_section": section}
    if qwen3:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as cls

        params["mrope_interleaved"] = True
        cfg = tf.Qwen3VLTextConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                   rope_parameters=params)
    else:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding as cls

        cfg = tf.Qwen2VLTextConfig(hidden_size=2 * head_dim, num_attention_heads=2, rope_parameters=params)
    return cls(cfg)


def hf_rope_index(input_ids, grid, attention_mask=None, merge=2):
    pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    fake = types.SimpleNamespace(config=types.SimpleNamespace(
        vision_config=types.SimpleNamespace(spatial_merge_size=merge)))
    fake.get_vision_position_ids = lambda *a, **k: Qwen2VLModel.get_vision_position_ids(fake, *a, **k)
    mm = (input_ids == IMG).int()  # 5.24 finds images through mm_token_type_ids
    return Qwen2VLModel.get_rope_index(fake, input_ids, mm, image_grid_thw=grid,
                                       attention_mask=attention_mask)


def sequence(parts):
    """parts: ints (text lengths) and (t, h, w) grids -> token ids, grids (merge 2)."""
    ids, grids = [], []
    for p in parts:
        if isinstance(p, int):
            ids += [100 + i for i in range(p)]
        else:
            t, h, w = p
            ids += [START] + [IMG] * (t * h * w // 4) + [END]
            grids.append(list(p))
    return ids, grids


@pytest.mark.parametrize("head_dim,section", [(16, [2, 3, 3]), (32, [4, 6, 6]), (128, [16, 24, 24])])
def test_cos_sin_equal_qwen2_vl(head_dim, section):
    torch.manual_seed(0)
    pos = torch.randint(0, 500, (3, 2, 9))
    cos_hf, sin_hf = hf_rotary(head_dim, section)(torch.zeros(1, dtype=torch.float32), pos)
    cos, sin = mrope_cos_sin(pos, pe.rope_inv_freq(head_dim)[0], section)
    torch.testing.assert_close(cos, cos_hf, rtol=0, atol=0)
    torch.testing.assert_close(sin, sin_hf, rtol=0, atol=0)


@pytest.mark.parametrize("head_dim,section", [(16, [4, 2, 2]), (128, [24, 20, 20]), (24, [4, 4, 4])])
def test_cos_sin_equal_qwen3_vl_interleaved(head_dim, section):
    pos = torch.randint(0, 500, (3, 2, 9), generator=torch.Generator().manual_seed(1))
    cos_hf, sin_hf = hf_rotary(head_dim, section, qwen3=True)(torch.zeros(1), pos)
    cos, sin = mrope_cos_sin(pos, pe.rope_inv_freq(head_dim)[0], section, mrope_interleaved=True)
    torch.testing.assert_close(cos, cos_hf, rtol=0, atol=0)
    torch.testing.assert_close(sin, sin_hf, rtol=0, atol=0)


def test_bf16_dtype_and_attention_factor():
    pos = torch.randint(0, 50, (3, 1, 4))
    inv = pe.rope_inv_freq(16)[0]
    cos, sin = mrope_cos_sin(pos, inv, [2, 3, 3], attention_factor=0.5, dtype=torch.bfloat16)
    ref_cos, ref_sin = mrope_cos_sin(pos, inv, [2, 3, 3])
    assert cos.dtype == sin.dtype == torch.bfloat16
    torch.testing.assert_close(cos, (0.5 * ref_cos).bfloat16())
    torch.testing.assert_close(sin, (0.5 * ref_sin).bfloat16())


@given(st.integers(1, 3), st.integers(1, 12), st.booleans())
def test_equal_thw_ids_is_plain_rope(b, L, inter):
    """Text tokens have t = h = w: M-RoPE is then ordinary (half-layout) RoPE."""
    pos = torch.randint(0, 1000, (b, L))
    inv = pe.rope_inv_freq(32)[0]
    cos, sin = mrope_cos_sin(pos.expand(3, b, L), inv, [6, 5, 5], mrope_interleaved=inter)
    ref_cos, ref_sin = pe.rope_cos_sin(pos, inv, interleaved=False)
    torch.testing.assert_close(cos, ref_cos, rtol=0, atol=0)
    torch.testing.assert_close(sin, ref_sin, rtol=0, atol=0)


def test_sections_pick_t_h_w():
    """Chunk i of the frequencies rotates by the id of its axis, and only by it."""
    inv = pe.rope_inv_freq(16)[0]
    pos = torch.tensor([3, 11, 29]).view(3, 1, 1)
    cos, _ = mrope_cos_sin(pos, inv, [2, 3, 3])
    want = torch.cat([3 * inv[:2], 11 * inv[2:5], 29 * inv[5:]]).cos()
    torch.testing.assert_close(cos[0, 0, :8], want)
    torch.testing.assert_close(cos[0, 0, 8:], want)


def test_rope_deltas_decode_next_position():
    """After an image the next token's ids are plain positions + rope_deltas (how decoding works)."""
    ids, grids = sequence([3, (1, 4, 6), 2])
    pos, delta = mrope_position_ids(torch.tensor([ids]), torch.tensor(grids), image_token_id=IMG,
                                    vision_start_token_id=START)
    assert int(delta) == int(pos.max()) + 1 - len(ids)
    # the 6 image tokens (2 x 3 after merging) start at 4: t = 4, rows 4..5, cols 4..6
    img = pos[:, 0, 4:10]
    assert img[0].tolist() == [4] * 6 and img[1].tolist() == [4, 4, 4, 5, 5, 5]
    assert img[2].tolist() == [4, 5, 6, 4, 5, 6]
    assert pos[:, 0, 10].tolist() == [7, 7, 7]  # <vision_end> resumes at 4 + max(2, 3)


@pytest.mark.parametrize("parts", [
    [5],
    [2, (1, 2, 2), 3],
    [1, (1, 4, 6), 2, (1, 6, 2), 4],
    [(1, 8, 4)],
    [0, (2, 4, 4), 1],
])
def test_position_ids_equal_get_rope_index(parts):
    ids, grids = sequence(parts)
    input_ids, grid = torch.tensor([ids]), torch.tensor(grids).view(-1, 3)
    want = hf_rope_index(input_ids, grid if len(grids) else None)
    got = mrope_position_ids(input_ids, grid if len(grids) else None, image_token_id=IMG,
                             vision_start_token_id=START)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


def test_padded_batch_equal_get_rope_index():
    """Left and right padding: padded slots get 0, rope_deltas counts the real tokens only."""
    a, ga = sequence([2, (1, 4, 4), 3])
    b, gb = sequence([1, (1, 2, 6), 1, (1, 2, 2), 2])
    c, _ = sequence([4])
    L = max(len(a), len(b), len(c)) + 2
    rows = [[0] * (L - len(a)) + a, b + [0] * (L - len(b)), [0] + c + [0] * (L - len(c) - 1)]
    mask = [[0] * (L - len(a)) + [1] * len(a), [1] * len(b) + [0] * (L - len(b)),
            [0] + [1] * len(c) + [0] * (L - len(c) - 1)]
    input_ids, mask, grid = torch.tensor(rows), torch.tensor(mask), torch.tensor(ga + gb)
    want = hf_rope_index(input_ids, grid, attention_mask=mask)
    got = mrope_position_ids(input_ids, grid, image_token_id=IMG, vision_start_token_id=START,
                             attention_mask=mask)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    assert (got[0][:, mask == 0] == 0).all()


@pytest.mark.parametrize("merge", [1, 2, 4])
def test_merge_sizes_equal_get_rope_index(merge):
    grid = torch.tensor([[1, 4, 8]])
    n = 4 * 8 // merge**2
    input_ids = torch.tensor([[101, START] + [IMG] * n + [END, 102]])
    want = hf_rope_index(input_ids, grid, merge=merge)
    got = mrope_position_ids(input_ids, grid, image_token_id=IMG, vision_start_token_id=START,
                             spatial_merge_size=merge)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


def test_attention_with_mrope_equals_qwen2_vl_apply():
    """cos/sin with apply_rope(..., interleaved=False) rotate q exactly as HF's apply_multimodal path."""
    pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

    ids, grids = sequence([2, (1, 4, 4), 3])
    pos, _ = mrope_position_ids(torch.tensor([ids]), torch.tensor(grids), image_token_id=IMG,
                                vision_start_token_id=START)
    cos_hf, sin_hf = hf_rotary(16, [2, 3, 3])(torch.zeros(1), pos)
    cos, sin = mrope_cos_sin(pos, pe.rope_inv_freq(16)[0], [2, 3, 3])
    q, k = torch.randn(2, 1, 2, len(ids), 16).unbind(0)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    torch.testing.assert_close(pe.apply_rope(q, cos[:, None], sin[:, None], interleaved=False), q_hf)
    torch.testing.assert_close(pe.apply_rope(k, cos[:, None], sin[:, None], interleaved=False), k_hf)
