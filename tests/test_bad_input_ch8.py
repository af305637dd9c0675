# ruff: noqa: E501  (one case per line reads best as a table)
"""Chapter 8's public functions name the argument, the value and what is allowed."""

import pytest
import torch

from posenc.axial import axial_rope_cos_sin
from posenc.mla import mla_rope
from posenc.mrope import mrope_cos_sin, mrope_position_ids
from posenc.temperature import llama4_attn_scale

inv16 = torch.ones(8)
p3 = torch.zeros(3, 1, 4, dtype=torch.long)
ids = torch.tensor([[1, 5, 7, 7, 7, 7, 6, 2]])  # <vision_start>=5, 4 x <image>=7, <vision_end>=6
grid = torch.tensor([[1, 4, 4]])
ids_kw = {"image_token_id": 7, "vision_start_token_id": 5}
q12, k4 = torch.randn(1, 2, 3, 12), torch.randn(1, 1, 3, 4)
cs4 = torch.ones(3, 4)

CASES = [
    # (public name, call, exception, substring of the message)
    ("mrope_cos_sin", lambda: mrope_cos_sin(torch.zeros(1, 4, dtype=torch.long), inv16, [2, 3, 3]), ValueError, "positions must have shape [3, B, L]"),
    ("mrope_cos_sin", lambda: mrope_cos_sin(p3.float(), inv16, [2, 3, 3]), TypeError, "positions must be an integer tensor"),
    ("mrope_cos_sin", lambda: mrope_cos_sin(p3 - 1, inv16, [2, 3, 3]), ValueError, "positions must be >= 0"),
    ("mrope_cos_sin", lambda: mrope_cos_sin(p3, inv16, [2, 3, 4]), ValueError, "mrope_section must sum to rotary_dim // 2 = inv_freq.numel() = 8, got [2, 3, 4]"),
    ("mrope_cos_sin", lambda: mrope_cos_sin(p3, inv16, [4, 4]), ValueError, "mrope_section must have 3 entries"),
    ("mrope_cos_sin", lambda: mrope_cos_sin(p3, inv16, 8), TypeError, "mrope_section must be a list of 3 ints"),
    ("mrope_cos_sin", lambda: mrope_cos_sin(p3, inv16, [2, 3.0, 3]), TypeError, "mrope_section[1] must be an int"),
    ("mrope_cos_sin", lambda: mrope_cos_sin(p3, inv16, [2, 3, 3], mrope_interleaved=True), ValueError, "mrope_section=[2, 3, 3] cannot be interleaved t h w t h w ... over 8 frequencies (that gives t, h, w [3, 3, 2])"),
    ("mrope_cos_sin", lambda: mrope_cos_sin(p3, inv16.long(), [2, 3, 3]), TypeError, "inv_freq must be a floating-point tensor"),
    ("mrope_cos_sin", lambda: mrope_cos_sin(p3, inv16, [2, 3, 3], attention_factor=0), ValueError, "attention_factor must be > 0, got 0"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids[0], grid, **ids_kw), ValueError, "input_ids must have shape [B, L], got shape (8,)"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids.float(), grid, **ids_kw), TypeError, "input_ids must be an integer tensor"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids, torch.tensor([[1, 4, 8]]), **ids_kw), ValueError, "image 0 has 4 image tokens but image_grid_thw row [1, 4, 8] with spatial_merge_size=2 needs 8"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids, torch.tensor([[1, 3, 4]]), **ids_kw), ValueError, "divisible by spatial_merge_size=2, got [[1, 3, 4]]"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids, None, **ids_kw), ValueError, "more images than the 0 rows of image_grid_thw"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids, torch.cat([grid, grid]), **ids_kw), ValueError, "image_grid_thw has 2 rows but input_ids hold 1 images"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids, grid, image_token_id=7, vision_start_token_id=1), ValueError, "must follow vision_start_token_id=1"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids, grid, **ids_kw, spatial_merge_size=0), ValueError, "spatial_merge_size must be an int >= 1, got 0"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids, grid, **ids_kw, attention_mask=torch.ones(1, 5)), ValueError, "attention_mask must have the shape of input_ids (1, 8), got (1, 5)"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids, grid.view(3), **ids_kw), ValueError, "image_grid_thw must have shape [num_images, 3]"),
    ("mrope_position_ids", lambda: mrope_position_ids(ids, grid, image_token_id=7, vision_start_token_id=7), ValueError, "must differ, both are 7"),
    ("axial_rope_cos_sin", lambda: axial_rope_cos_sin(0, 4, 8), ValueError, "height must be an int >= 1, got 0"),
    ("axial_rope_cos_sin", lambda: axial_rope_cos_sin(4, 2.5, 8), TypeError, "width must be an int, got 2.5"),
    ("axial_rope_cos_sin", lambda: axial_rope_cos_sin(4, 4, 6), ValueError, "head_dim must be divisible by 4"),
    ("axial_rope_cos_sin", lambda: axial_rope_cos_sin(4, 4, 2), ValueError, "head_dim must be an int >= 4, got 2"),
    ("axial_rope_cos_sin", lambda: axial_rope_cos_sin(4, 4, 8, base=-1.0), ValueError, "base must be > 0, got -1.0"),
    ("axial_rope_cos_sin", lambda: axial_rope_cos_sin(4, 4, 8, dtype=torch.int32), TypeError, "dtype must be None or a floating"),
    ("llama4_attn_scale", lambda: llama4_attn_scale(torch.arange(4.0)), TypeError, "positions must be an integer tensor"),
    ("llama4_attn_scale", lambda: llama4_attn_scale(torch.tensor([-1, 2])), ValueError, "positions must be >= 0"),
    ("llama4_attn_scale", lambda: llama4_attn_scale(torch.arange(4), floor_scale=0), ValueError, "floor_scale must be > 0, got 0"),
    ("llama4_attn_scale", lambda: llama4_attn_scale(torch.arange(4), attn_scale=-0.1), ValueError, "attn_scale must be >= 0.0, got -0.1"),
    ("llama4_attn_scale", lambda: llama4_attn_scale([0, 1]), TypeError, "positions must be a torch.Tensor"),
    ("mla_rope", lambda: mla_rope(q12, torch.randn(1, 1, 3, 5), cs4, cs4), ValueError, "k_rope.shape[-1] (rope_dim) must be even and >= 2, got 5"),
    ("mla_rope", lambda: mla_rope(q12, k4, torch.ones(3, 6), torch.ones(3, 6)), ValueError, "cos/sin must cover rope_dim=k_rope.shape[-1]=4 channels, got 6"),
    ("mla_rope", lambda: mla_rope(q12[..., :2], k4, cs4, cs4), ValueError, "q.shape[-1]=2 is smaller than rope_dim=4"),
    ("mla_rope", lambda: mla_rope(q12, k4[..., :2, :], cs4, cs4), ValueError, "q and k_rope must have the same seq length, got 3 and 2"),
    ("mla_rope", lambda: mla_rope(q12.long(), k4, cs4, cs4), TypeError, "q must be a floating-point tensor"),
    ("mla_rope", lambda: mla_rope(q12, k4, cs4, cs4[..., :2]), ValueError, "cos and sin must have the same shape"),
]


@pytest.mark.parametrize("name,fn,exc,msg", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_raises_clear_error(name, fn, exc, msg):
    with pytest.raises(exc) as info:
        fn()
    assert msg in str(info.value), f"{name}: {info.value}"


def test_three_cases_per_public_name():
    names = [c[0] for c in CASES]
    for name in ("mrope_cos_sin", "mrope_position_ids", "axial_rope_cos_sin", "llama4_attn_scale", "mla_rope"):
        assert names.count(name) >= 3, name
