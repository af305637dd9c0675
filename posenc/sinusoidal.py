"""Sinusoidal position encoding (Vaswani et al., 2017, "Attention Is All You Need", sec. 3.5).

    PE[pos, 2i]   = sin(pos / base^(2i/d))
    PE[pos, 2i+1] = cos(pos / base^(2i/d))

``interleaved=True`` is the paper's layout (sin on even channels, cos on odd); ``False`` is the
``[sin..., cos...]`` layout of tensor2tensor and many codebases. An odd ``dim`` is handled: the last
channel is the sine of the slowest frequency (interleaved) or the sine block is one wider.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._checks import (
    check_base,
    check_bool,
    check_device,
    check_dtype,
    check_embed_positions,
    check_float,
    check_int,
    check_tensor,
)

TABLE_LIMIT = 1 << 24
"""The sinusoidal table ends below ``2**24``: its float32 positions are exact up to there."""


def sinusoidal_table(
    num_positions: int,
    dim: int,
    *,
    base: float = 10000.0,
    interleaved: bool = True,
    offset: int = 0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """The table ``PE[offset : offset + num_positions]``, shape ``[num_positions, dim]``.

    Angles are computed in float32 (float64 for a float64 ``dtype``) and cast at the end.
    ``base`` must be > 1; ``interleaved`` must be a bool (a string like ``"false"`` is an error).
    """
    num_positions = check_int("num_positions", num_positions, minimum=0)
    dim = check_int("dim", dim, minimum=1)
    offset = check_int("offset", offset, minimum=0)
    base = check_base("base", base)
    interleaved = check_bool("interleaved", interleaved)
    dtype = check_dtype("dtype", dtype)
    device = check_device("device", device, available=True)
    if offset + num_positions > TABLE_LIMIT:
        raise ValueError(
            f"offset + num_positions must be <= 2**24 = {TABLE_LIMIT} (the table's angles are "
            f"float32 products, exact positions only up to there), got {offset} + {num_positions}"
        )
    work = torch.float64 if dtype == torch.float64 else torch.float32
    half = (dim + 1) // 2  # number of frequencies; the cos block is dim // 2 wide
    inv_freq = base ** (-torch.arange(0, 2 * half, 2, device=device, dtype=work) / dim)  # [half]
    pos = torch.arange(offset, offset + num_positions, device=device, dtype=work)  # [N]
    angles = pos[:, None] * inv_freq[None, :]  # [N, half]
    sin, cos = angles.sin(), angles.cos()[:, : dim // 2]
    if interleaved:
        table = torch.empty(num_positions, dim, device=device, dtype=work)
        table[:, 0::2] = sin
        table[:, 1::2] = cos
    else:
        table = torch.cat([sin, cos], dim=-1)  # [N, dim]
    return table.to(dtype or torch.get_default_dtype())


class SinusoidalPositionalEmbedding(nn.Module):
    """Adds the sinusoidal table to token embeddings ``x [B, L, D]``.

    ``scale=True`` multiplies ``x`` by ``sqrt(D)`` first, as the paper does with its embeddings.
    With ``max_len=None`` the cached table grows on demand; with a ``max_len`` a longer sequence
    raises a ``ValueError``. ``offset`` or explicit ``positions [L]`` / ``[B, L]`` (non-negative
    integers; not both) serve cached decoding and left padding.
    """

    table: Tensor  # [N, dim] buffer, grown on demand

    def __init__(
        self,
        dim: int,
        *,
        max_len: int | None = None,
        base: float = 10000.0,
        interleaved: bool = True,
        dropout: float = 0.0,
        scale: bool = False,
    ) -> None:
        super().__init__()
        self.dim = check_int("dim", dim, minimum=1)
        self.max_len = None if max_len is None else check_int("max_len", max_len, minimum=1)
        self.base = check_base("base", base)
        self.interleaved = check_bool("interleaved", interleaved)
        dropout = check_float("dropout", dropout, minimum=0.0)
        if dropout >= 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(dim) if check_bool("scale", scale) else 1.0
        self.register_buffer("table", self._table(max_len or 512), persistent=False)

    def _table(self, n: int, device: torch.device | None = None) -> Tensor:
        return sinusoidal_table(
            n, self.dim, base=self.base, interleaved=self.interleaved, device=device
        )

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``dropout(x * scale + P[positions])`` for token embeddings ``x [B, L, dim]``; returns
        ``[B, L, dim]`` in ``x``'s dtype.

        The positions are ``offset + arange(L)``, or ``positions`` (``[L]`` or ``[B, L]``,
        non-negative integers; for left padding or packed sequences), not both. The table is
        float32, cast to ``x.dtype`` when added; with ``max_len=None`` it grows to the largest
        position.

        Raises:
            TypeError: ``x`` is not a floating-point tensor, ``positions`` not an integer
                tensor, or ``offset`` not an int.
            ValueError: ``x`` is not ``[B, L, dim]``; ``positions`` is not ``[L]`` or
                ``[B, L]`` (``B`` or 1) or holds a negative entry; ``offset`` is negative or
                given together with ``positions``; a position is ``>= max_len``.
        """
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape [B, L, {self.dim}], got {tuple(x.shape)}")
        positions = check_embed_positions(x, offset, positions)  # [L] or [B, L]
        needed = int(positions.max()) + 1 if positions.numel() else 0
        if self.max_len is not None and needed > self.max_len:
            raise ValueError(
                f"position {needed - 1} is past max_len={self.max_len}; "
                f"use max_len=None to grow the table on demand"
            )
        if needed > self.table.shape[0]:
            self.table = self._table(max(needed, 2 * self.table.shape[0]), x.device)
        pe = self.table.to(x.device)[positions]  # [L, D] or [B, L, D]
        return self.dropout(x * self.scale + pe.to(x.dtype))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}, base={self.base}, interleaved={self.interleaved}"
