"""Where the sequence is in ``RotaryEmbedding``'s queries and keys, and the checks that say so
(also of ``apply_rope``'s tables against its ``x``).

``seq_dim=-2`` reads ``q``/``k`` as ``[..., H, L, head_dim]`` (PyTorch's SDPA, Hugging Face);
``seq_dim=-3`` as ``[..., L, H, head_dim]`` (torchtune, flash-attn, Meta's LLaMA code). The
layout is named, never guessed: every shape error below says which dimension is the sequence
and which argument changes it.

Layer: encodings (a helper of :mod:`posenc.rope`).
"""

from __future__ import annotations

from torch import Tensor

from ._checks import check_int, check_tensor, position_range

LAYOUTS = {-2: "[B, H, L, head_dim]", -3: "[B, L, H, head_dim]"}
"""The two values ``seq_dim`` takes and the shapes of ``q``/``k`` they mean."""


def check_seq_dim(seq_dim: object) -> int:
    """``-2`` (``[B, H, L, head_dim]``) or ``-3`` (``[B, L, H, head_dim]``), else an error."""
    seq_dim = check_int("seq_dim", seq_dim)
    if seq_dim not in LAYOUTS:
        raise ValueError(
            f"seq_dim must be -2 (q and k [B, H, L, head_dim], the default: SDPA, Hugging Face) "
            f"or -3 ([B, L, H, head_dim]: torchtune, flash-attn), got {seq_dim}; it counts from "
            "the end so that q and k of any rank read alike ([B, L, H, head_dim]'s dim 1 is -3)"
        )
    return seq_dim


def layout_note(seq_dim: int) -> str:
    """Which dimension is the sequence, and the argument that changes it (for messages)."""
    other = -3 if seq_dim == -2 else -2
    return (
        f"the sequence is dim {seq_dim} of {LAYOUTS[seq_dim]} (seq_dim={seq_dim}); "
        f"for {LAYOUTS[other]} build RotaryEmbedding(..., seq_dim={other})"
    )


def check_qk(q: object, k: object, head_dim: int, seq_dim: int, *, own_keys: bool) -> tuple[Tensor, Tensor]:
    """``q``, ``k``: floating, ending in ``head_dim``, equal but for the head count (and the
    length, when the keys have positions of their own)."""
    s = seq_dim
    q, k = check_tensor("q", q, floating=True), check_tensor("k", k, floating=True)
    for name, x in (("q", q), ("k", k)):
        if x.dim() < -s:
            raise ValueError(
                f"{name} must have at least {-s} dims, got shape {tuple(x.shape)} ({layout_note(s)})"
            )
    qs, ks = q.shape, k.shape
    if qs[-1] != head_dim or ks[-1] != head_dim:
        raise ValueError(
            f"q and k must end in head_dim={head_dim}, got {tuple(qs)} and {tuple(ks)} "
            f"({layout_note(s)})"
        )
    if not own_keys and qs[s] != ks[s]:
        raise ValueError(
            f"q and k must have the same seq length here, got {qs[s]} and {ks[s]} "
            f"({layout_note(s)}); rotate cached keys when they are written, then pass only "
            "the new ones (or give key_positions for keys of their own)"
        )
    if len(qs) != len(ks) or qs[:-3] != ks[:-3]:
        raise ValueError(
            f"q and k shapes must agree except in the head count (dim {-5 - s}), got "
            f"{tuple(qs)} and {tuple(ks)} ({layout_note(s)})"
        )
    return q, k


def check_positions_for(
    positions: object, x: Tensor, seq_dim: int, name: str
) -> tuple[Tensor, int, int]:
    """``positions`` (``[L]`` or ``[B, L]``, integers in ``[0, 2**31)``) for ``x`` (q, or k for
    ``key_positions``): returned on ``x``'s device with their minimum and maximum (0, 0 while
    compiling; 0, -1 when empty)."""
    positions, lo, hi = position_range(name, positions)
    of = "k" if name == "key_positions" else "q"
    seq = x.shape[seq_dim]
    if positions.shape[-1] != seq:
        raise ValueError(
            f"{name} must have {seq} entries per row ({of}'s seq length; {layout_note(seq_dim)}), "
            f"got shape {tuple(positions.shape)}"
        )
    if positions.dim() == 2:
        ranks = (3, 4) if seq_dim == -2 else (4,)
        if x.dim() not in ranks or positions.shape[0] not in (1, x.shape[0]):
            want = "[B, (H,) L, head_dim]" if seq_dim == -2 else "[B, L, H, head_dim]"
            raise ValueError(
                f"{name} of shape {tuple(positions.shape)} ([B, L]) need {of} of shape {want} "
                f"with the same B (or B = 1), got {of} {tuple(x.shape)} ({layout_note(seq_dim)})"
            )
    return positions.to(x.device), lo, hi


def fit(t: Tensor, x: Tensor, seq_dim: int) -> Tensor:
    """A table ``[L, c]`` or ``[B, L, c]`` (cos, sin, cis, xPos's scale) shaped to broadcast
    against ``x``: ``[..., L, 1, c]`` over the heads for ``seq_dim=-3``; ``[B, 1, L, c]`` for a
    per-row table and ``x [B, H, L, head_dim]``; unchanged otherwise."""
    if seq_dim == -3:
        return t.unsqueeze(-2)
    return t[:, None] if t.dim() == 3 and x.dim() == 4 else t


def check_rope_args(x: Tensor, cos: Tensor, sin: Tensor) -> int:
    """``apply_rope``'s ``x [..., seq, head_dim]`` and its ``cos``/``sin`` tables: the rotary
    width (``cos.shape[-1]``), else an error that names the shapes."""
    check_tensor("x", x, floating=True, min_dim=2)
    check_tensor("cos", cos, floating=True, min_dim=2)
    check_tensor("sin", sin, floating=True, min_dim=2)
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    rotary_dim = cos.shape[-1]
    if rotary_dim % 2 or rotary_dim > x.shape[-1]:
        raise ValueError(
            f"cos.shape[-1] (rotary_dim) must be even and <= x.shape[-1]={x.shape[-1]}, got {rotary_dim}"
        )
    if cos.shape[-2] != x.shape[-2]:
        raise ValueError(
            f"cos/sin cover {cos.shape[-2]} positions but x has seq length {x.shape[-2]} "
            f"(x shape {tuple(x.shape)}, cos shape {tuple(cos.shape)})"
        )
    if cos.dim() > x.dim() or (
        cos.dim() not in (2, x.dim()) and any(c != 1 for c in cos.shape[:-2])
    ):
        raise ValueError(
            f"cos/sin must be [seq, rotary_dim], [1, ..., seq, rotary_dim] or have x's rank "
            f"{x.dim()} (e.g. [B, 1, seq, rotary_dim] for x [B, H, seq, head_dim]), got shape "
            f"{tuple(cos.shape)} for x {tuple(x.shape)}; a [B, seq, rotary_dim] table with B > 1 "
            "is ambiguous (it would broadcast over the heads): add the head axis, cos[:, None]"
        )
    for c, n in zip(cos.shape[:-1], x.shape[x.dim() - cos.dim() : -1], strict=True):
        if c not in (1, n):
            raise ValueError(
                f"cos/sin of shape {tuple(cos.shape)} do not broadcast against x of shape "
                f"{tuple(x.shape)} (each leading dim must be 1 or x's; the result has x's shape)"
            )
    if cos.device != x.device:
        raise ValueError(f"cos/sin are on {cos.device} but x is on {x.device}")
    return rotary_dim
