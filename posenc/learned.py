"""Learned absolute position embeddings (Gehring et al., 2017; Devlin et al., 2019 BERT;
Radford et al., 2019 GPT-2): one trained vector per slot, added to the token embeddings.

They cannot represent a slot they were not given: a position at or past ``max_len`` is a clear
``ValueError`` here, not an index error deep inside ``nn.Embedding``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._checks import check_embed_positions, check_float, check_int, check_tensor


class LearnedPositionalEmbedding(nn.Module):
    """``x [B, L, D] + E[offset : offset + L]`` with a trainable table ``E [max_len, D]``.

    ``positions [L]`` or ``[B, L]`` (non-negative integers) replace ``offset`` (not both).
    """

    def __init__(self, max_len: int, dim: int, *, init_std: float = 0.02) -> None:
        super().__init__()
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.dim = check_int("dim", dim, minimum=1)
        init_std = check_float("init_std", init_std, minimum=0.0)
        self.weight = nn.Parameter(torch.randn(max_len, dim) * init_std)  # [max_len, D]

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x + E[positions]`` for token embeddings ``x [B, L, dim]``; returns ``[B, L, dim]`` in
        ``x``'s dtype.

        The positions are ``offset + arange(L)``, or ``positions`` (``[L]`` or ``[B, L]``,
        non-negative integers), not both. The table has no row past ``max_len - 1``: a learned
        embedding cannot extrapolate, so a longer sequence is an error, never a silent wrap.

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
        last = int(positions.max()) if positions.numel() else -1
        if last >= self.max_len:
            raise ValueError(
                f"position {last} is past max_len={self.max_len}: a learned absolute embedding "
                f"has no vector for it (sequence length {x.shape[1]}, offset {offset})"
            )
        return x + self.weight[positions].to(x.dtype)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, dim={self.dim}"
