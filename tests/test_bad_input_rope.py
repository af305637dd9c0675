# ruff: noqa: E501  (one case per line reads best as a table)
"""Every public name of posenc/rope.py refuses wrong calls with a clear error (issue 9 §2):
the exception type, and a message naming the argument (and the value or what is allowed)."""

from __future__ import annotations

import math
import re

import pytest
import torch

import posenc.rope as rope
from posenc import rope_inv_freq

x4 = torch.randn(2, 2, 4, 8)  # [B, H, L, D] with B == H: the shape where silent broadcasts hide
inv8, _ = rope_inv_freq(8)
cos8, sin8 = rope.rope_cos_sin(torch.arange(4), inv8)  # [L, D]
cosB, sinB = rope.rope_cos_sin(torch.arange(8).view(2, 4), inv8)  # [B, L, D]
rot8 = rope.RotaryEmbedding(8)
w = torch.randn(16, 5)  # 2 heads x head_dim 8

CASES = [
    # apply_rope
    ("apply_rope", lambda: rope.apply_rope(x4.tolist(), cos8, sin8), TypeError, "x must be a torch.Tensor"),
    ("apply_rope", lambda: rope.apply_rope(x4, cos8, sin8, interleaved="false"), TypeError,
     "interleaved must be a bool.*'false'"),
    ("apply_rope", lambda: rope.apply_rope(x4, cosB, sinB), ValueError,
     r"cos/sin must be \[seq, rotary_dim\], \[1, ..., seq, rotary_dim\] or have x's rank 4.*\(2, 4, 8\).*ambiguous"),
    ("apply_rope", lambda: rope.apply_rope(x4[:1], cosB[:, None], sinB[:, None]), ValueError,
     r"cos/sin of shape \(2, 1, 4, 8\) do not broadcast against x of shape \(1, 2, 4, 8\)"),
    ("apply_rope", lambda: rope.apply_rope(x4.long(), cos8, sin8), TypeError, "x must be a floating-point"),
    ("apply_rope", lambda: rope.apply_rope(x4, cos8, sin8[:, :4]), ValueError, "cos and sin must have the same shape"),
    ("apply_rope", lambda: rope.apply_rope(x4, cos8.tolist(), sin8), TypeError, "cos must be a torch.Tensor"),
    # rope_cos_sin
    ("rope_cos_sin", lambda: rope.rope_cos_sin(torch.arange(4.0), inv8), TypeError,
     "positions must be an integer tensor, got dtype torch.float32"),
    ("rope_cos_sin", lambda: rope.rope_cos_sin([0, 1, 2], inv8), TypeError, "positions must be a torch.Tensor"),
    ("rope_cos_sin", lambda: rope.rope_cos_sin(torch.zeros(1, 2, 3, dtype=torch.long), inv8), ValueError,
     r"positions must have shape \[L\] or \[B, L\]"),
    ("rope_cos_sin", lambda: rope.rope_cos_sin(torch.tensor([-1, 0]), inv8), ValueError, "positions must be >= 0"),
    ("rope_cos_sin", lambda: rope.rope_cos_sin(torch.arange(4), inv8[None]), ValueError, "inv_freq must be 1-D"),
    ("rope_cos_sin", lambda: rope.rope_cos_sin(torch.arange(4), inv8 * math.nan), ValueError,
     "inv_freq must be finite"),
    ("rope_cos_sin", lambda: rope.rope_cos_sin(torch.arange(4), inv8, attention_factor=0.0), ValueError,
     "attention_factor must be > 0"),
    ("rope_cos_sin", lambda: rope.rope_cos_sin(torch.arange(4), inv8, dtype=torch.int64), TypeError,
     "dtype must be None or a floating torch.dtype"),
    ("rope_cos_sin", lambda: rope.rope_cos_sin(torch.arange(4), inv8, interleaved=1), TypeError,
     "interleaved must be a bool"),
    # RotaryEmbedding
    ("RotaryEmbedding", lambda: rope.RotaryEmbedding(7), ValueError, "head_dim=7"),
    ("RotaryEmbedding", lambda: rope.RotaryEmbedding(8, base=math.nan), ValueError, "base must be finite, got nan"),
    ("RotaryEmbedding", lambda: rope.RotaryEmbedding(8, base=math.inf), ValueError, "base must be finite, got inf"),
    ("RotaryEmbedding", lambda: rope.RotaryEmbedding(8, base=-2.0), ValueError, "base must be > 0"),
    ("RotaryEmbedding", lambda: rope.RotaryEmbedding(8, interleaved="false"), TypeError,
     "interleaved must be a bool.*'false'"),
    ("RotaryEmbedding", lambda: rope.RotaryEmbedding(8, xpos_scale_base=0), ValueError, "xpos_scale_base must be > 0"),
    ("RotaryEmbedding", lambda: rot8(x4, x4, positions=torch.arange(4), offset=3), ValueError,
     "positions or offset, not both.*offset=3"),
    ("RotaryEmbedding", lambda: rot8(x4, x4, positions=torch.arange(4.0)), TypeError,
     "positions must be an integer tensor, got dtype torch.float32"),
    ("RotaryEmbedding", lambda: rot8(x4, x4, positions=torch.arange(5)), ValueError,
     r"positions must have 4 entries per row.*\(5,\)"),
    ("RotaryEmbedding", lambda: rot8(x4, x4, positions=torch.arange(12).view(3, 4)), ValueError,
     r"positions of shape \(3, 4\).*same B"),
    ("RotaryEmbedding", lambda: rot8(x4, x4, positions=[0, 1, 2, 3]), TypeError, "positions must be a torch.Tensor"),
    ("RotaryEmbedding", lambda: rot8(x4, x4[:1]), ValueError,
     r"q and k shapes must agree except in the head count.*\(2, 2, 4, 8\) and \(1, 2, 4, 8\)"),
    ("RotaryEmbedding", lambda: rot8(x4, x4[..., :2, :]), ValueError, "same seq length"),
    ("RotaryEmbedding", lambda: rot8(x4, x4.tolist()), TypeError, "k must be a torch.Tensor"),
    ("RotaryEmbedding", lambda: rot8(x4, x4, offset=-1), ValueError, "offset must be an int >= 0, got -1"),
    ("RotaryEmbedding", lambda: rot8(x4, x4, offset=1.5), TypeError, "offset must be an int, got 1.5"),
    ("RotaryEmbedding", lambda: rot8.cos_sin(torch.arange(4.0)), TypeError, "positions must be an integer tensor"),
    # rotate_half / rotate_every_two
    ("rotate_half", lambda: rope.rotate_half(torch.randn(2, 15)), ValueError,
     r"x.shape\[-1\] must be even.*\(2, 15\)"),
    ("rotate_half", lambda: rope.rotate_half([1.0, 2.0]), TypeError, "x must be a torch.Tensor, got list"),
    ("rotate_half", lambda: rope.rotate_half(torch.tensor(1.0)), ValueError, "x must have at least 1 dims"),
    ("rotate_every_two", lambda: rope.rotate_every_two(torch.randn(3, 7)), ValueError,
     r"x.shape\[-1\] must be even.*\(3, 7\)"),
    ("rotate_every_two", lambda: rope.rotate_every_two((1.0, 2.0)), TypeError, "x must be a torch.Tensor, got tuple"),
    ("rotate_every_two", lambda: rope.rotate_every_two(torch.tensor(1.0)), ValueError, "x must have at least 1 dims"),
    # rope_permutation
    ("rope_permutation", lambda: rope.rope_permutation(7), ValueError, "rotary_dim must be even, got 7"),
    ("rope_permutation", lambda: rope.rope_permutation(0), ValueError, "rotary_dim must be an int >= 2"),
    ("rope_permutation", lambda: rope.rope_permutation(8.0), TypeError, "rotary_dim must be an int, got 8.0"),
    ("rope_permutation", lambda: rope.rope_permutation(8, to="halves"), ValueError,
     "to must be 'half' or 'interleaved', got 'halves'"),
    # convert_rope_weight
    ("convert_rope_weight", lambda: rope.convert_rope_weight(w.tolist(), 2), TypeError, "weight must be a torch.Tensor"),
    ("convert_rope_weight", lambda: rope.convert_rope_weight(w, 0), ValueError, "num_heads must be an int >= 1, got 0"),
    ("convert_rope_weight", lambda: rope.convert_rope_weight(w, 3), ValueError,
     "weight.shape.0.=16 is not divisible by num_heads=3"),
    ("convert_rope_weight", lambda: rope.convert_rope_weight(w, 2, rotary_dim=10), ValueError,
     "rotary_dim must be <= head_dim=8, got 10"),
    ("convert_rope_weight", lambda: rope.convert_rope_weight(w, 2, rotary_dim=5), ValueError,
     "rotary_dim must be even, got 5"),
    ("convert_rope_weight", lambda: rope.convert_rope_weight(w, 2, to="x"), ValueError, "to must be 'half' or"),
]  # fmt: skip


@pytest.mark.parametrize("name, call, error, match", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_wrong_call_raises_a_clear_error(name, call, error, match):
    with pytest.raises(error) as info:
        call()
    assert info.type is error  # not a subclass raised by torch's internals
    assert re.search(match, str(info.value)), str(info.value)


def test_every_public_name_has_three_wrong_calls():
    public = ["apply_rope", "rope_cos_sin", "RotaryEmbedding", "rotate_half", "rotate_every_two",
              "rope_permutation", "convert_rope_weight"]  # fmt: skip
    counts = {n: sum(c[0] == n for c in CASES) for n in public}
    assert all(n >= 3 for n in counts.values()), counts
    assert {c[0] for c in CASES} == set(public)
