"""Attention temperature tuning for NoPE layers, as in Llama 4 (Meta, 2025, "The Llama 4 herd";
the idea from Nakanishi, 2025, "Scalable-Softmax Is Superior for Attention").

Llama 4 interleaves RoPE layers with layers that use no positions at all (iRoPE). Over a long
context the softmax of a NoPE layer spreads over more and more keys and flattens; Llama 4
multiplies the queries at position ``m`` by

    scale(m) = 1 + attn_scale * log(1 + floor((m + 1) / floor_scale))

which is 1 up to ``floor_scale - 2`` tokens and then grows like ``log m``, sharpening the softmax
again. Equal to transformers 5.24's ``Llama4TextAttention`` (``attn_temperature_tuning``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_float, check_positions


def llama4_attn_scale(
    positions: Tensor, *, floor_scale: float = 8192.0, attn_scale: float = 0.1
) -> Tensor:
    """Query scale per position, float32, the shape of ``positions`` (``[L]`` or ``[B, L]``).

    Multiply the queries of a NoPE layer by ``scale[..., None]`` (broadcast over heads and
    channels) before the dot product. Defaults are Llama 4's.
    """
    check_positions("positions", positions)
    floor_scale = check_float("floor_scale", floor_scale, positive=True)
    attn_scale = check_float("attn_scale", attn_scale, minimum=0.0)
    steps = torch.floor((positions.float() + 1.0) / floor_scale)  # [..., L]
    return torch.log1p(steps) * attn_scale + 1.0
