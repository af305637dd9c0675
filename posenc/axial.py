"""2-D (axial) RoPE for image patches, as in Pixtral's vision encoder (Mistral AI, 2024,
"Pixtral 12B"; Heo et al., 2024, "Rotary Position Embedding for Vision Transformer").

A patch at row ``r`` and column ``c`` of the grid rotates half of its frequency pairs by ``r`` and
the other half by ``c``. Pixtral takes the 1-D RoPE frequencies ``1 / base^(2i / head_dim)`` and
gives the even ones (``i = 0, 2, 4, ...``) to the row and the odd ones to the column, so both
axes get fast and slow pairs; the score between two patches then depends only on
``(dr, dc)``. Qwen2-VL's vision encoder instead gives both axes the same frequencies,
``1 / base^(4i / head_dim)``. Equal to transformers 5.24's ``PixtralVisionRotaryEmbedding``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_device, check_dtype, check_float, check_int
from .rope_angles import rope_angles
from .rope_scaling import rope_inv_freq


def axial_rope_cos_sin(
    height: int,
    width: int,
    head_dim: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """``cos``/``sin`` ``[height * width, head_dim]`` for a row-major patch grid, half layout.

    Use with ``apply_rope(x, cos, sin, interleaved=False)`` on ``x [..., height * width,
    head_dim]``; patch ``p`` sits at row ``p // width``, column ``p % width``.
    """
    height = check_int("height", height, minimum=1)
    width = check_int("width", width, minimum=1)
    head_dim = check_int("head_dim", head_dim, minimum=4)
    if head_dim % 4:
        raise ValueError(
            f"head_dim must be divisible by 4 (a rotary pair per axis per frequency), got {head_dim}"
        )
    base = check_float("base", base, positive=True)
    dtype = check_dtype("dtype", dtype)
    device = check_device("device", device, available=True)
    inv_freq = rope_inv_freq(head_dim, base=base)[0].to(device)  # [d/2] float32
    rows = torch.arange(height, device=device).repeat_interleave(width)  # [N]
    cols = torch.arange(width, device=device).repeat(height)  # [N]
    angles = torch.cat(
        [rope_angles(rows, inv_freq[0::2], max_position=height - 1),
         rope_angles(cols, inv_freq[1::2], max_position=width - 1)], dim=-1,
    )  # [N, d/2]: row on the even frequencies, column on the odd ones (rope_cos_sin's angles)
    angles = torch.cat([angles, angles], dim=-1)  # [N, d]
    cos, sin = angles.cos(), angles.sin()
    return (cos, sin) if dtype is None else (cos.to(dtype), sin.to(dtype))
