"""What the serving helpers of chapter 11 share: the layout hint of their shape errors and the
checks of the RoPE a key is moved with.

Private to :mod:`posenc.lab.serving` and its modules (``LAYOUT`` is re-exported there).
"""

from __future__ import annotations

from torch import Tensor

from posenc.rope import RotaryEmbedding
from posenc.rope_layout import LAYOUTS
from posenc.schemes import PositionScheme, RoPE, _a_class

__all__ = ["LAYOUT"]

LAYOUT = (f"posenc's layout is {LAYOUTS[-2]}; flash-attn's {LAYOUTS[-3]} converts with "
          ".transpose(1, 2)")
"""The end of a shape error where ``[B, H, L, Dh]`` is expected (a ``[B, L, H, Dh]`` tensor
usually fails on a length or head count)."""


def _rotary(rope: object, argument: str = "rope") -> RotaryEmbedding:
    """The :class:`~posenc.rope.RotaryEmbedding` of ``rope`` (the module, or a ``RoPE``
    scheme), refusing what a further rotation cannot move (xPos's per-position scale)."""
    if isinstance(rope, RoPE):
        rope = rope.rotary
    if not isinstance(rope, RotaryEmbedding):
        what = _a_class(rope) if isinstance(rope, type) else f"got {type(rope).__name__}"
        raise TypeError(
            f"{argument} must be a posenc.RotaryEmbedding or a posenc.RoPE scheme, {what}")
    if rope.xpos_scale_base is not None:
        raise ValueError(
            f"{argument}: xPos scales keys by their position, which a rotation cannot move; "
            "shift keys of a plain (or scaled) RoPE"
        )
    return rope


def _check_head_dim(name: str, x: Tensor, rotary: RotaryEmbedding, argument: str) -> None:
    """``x [..., head_dim]`` must end in the head_dim ``rotary`` was built for: its
    frequencies (``inv_freq``) are those of that head_dim, and would turn other channels."""
    if x.shape[-1] != rotary.head_dim:
        raise ValueError(
            f"{name} must end in {argument}'s head_dim={rotary.head_dim} (rotary_dim="
            f"{rotary.rotary_dim}), got shape {tuple(x.shape)}: build the RoPE with the keys' "
            "head_dim"
        )


def _bias_scheme(scheme: PositionScheme) -> PositionScheme | None:
    """What :func:`~posenc.attention.attend` still needs once queries and keys are rotated:
    the bias schemes (ALiBi, T5) themselves, nothing for a rotation or NoPE."""
    return scheme if scheme.has_bias else None
