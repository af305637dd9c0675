"""Checkers for chapter 9's exercises (positions in today's models)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...axial import axial_rope_cos_sin
from ...mrope import mrope_position_ids
from ...rope_scaling import rope_inv_freq
from . import attempt, compare, verdict

__all__ = ["check_axial", "check_text_resumes"]

_GRIDS = [(3, 4, 16), (2, 5, 8), (1, 1, 4), (4, 2, 32)]


def _layout(h: int, w: int, d: int, *, row: Tensor, col: Tensor, order: str) -> Tensor:
    """cos of a 2-D layout with the given per-axis frequencies (for the hints)."""
    rows = torch.arange(h).repeat_interleave(w)
    cols = torch.arange(w).repeat(h)
    if order == "column-major":
        rows, cols = torch.arange(h).repeat(w), torch.arange(w).repeat_interleave(h)
    angles = torch.cat([rows[:, None] * row, cols[:, None] * col], dim=-1)  # [N, d/2]
    return torch.cat([angles, angles], dim=-1).cos()  # [N, d]


def _hint(got: Tensor, h: int, w: int, d: int) -> str | None:
    inv = rope_inv_freq(d)[0]
    even, odd = inv[0::2], inv[1::2]
    qwen = rope_inv_freq(d // 2)[0]  # Qwen2-VL's vision encoder: the same set for both axes
    known = [
        (dict(row=odd, col=even, order="row-major"),
         "rows and columns are swapped: the row takes the even frequencies (0, 2, 4, ...)"),
        (dict(row=even, col=even, order="row-major"),
         "both axes use the row's frequencies (that is Qwen2-VL's vision encoder); "
         "Pixtral gives the column the odd ones"),
        (dict(row=qwen, col=qwen, order="row-major"),
         "both axes use the row's frequencies (that is Qwen2-VL's vision encoder); "
         "Pixtral gives the column the odd ones"),
        (dict(row=even, col=odd, order="column-major"),
         "patches are in column-major order; patch p sits at row p // width, column p % width"),
    ]
    for kw, msg in known:
        want = _layout(h, w, d, **kw)  # type: ignore[arg-type]  # kw holds row/col tensors and an order str
        if got.shape == want.shape and torch.allclose(got.float(), want, atol=1e-5):
            return msg
    return None


def check_axial(fn: Callable[[int, int, int], tuple[Tensor, Tensor]]) -> bool:
    """``fn(height, width, head_dim) -> (cos, sin)``, each ``[height * width, head_dim]``, equal to
    Pixtral's 2-D RoPE (``posenc.axial_rope_cos_sin``), half layout, row-major patches."""
    for h, w, d in _GRIDS:
        out, err = attempt(fn, h, w, d)
        if err:
            return verdict(False, err)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            return verdict(False, f"return a pair (cos, sin), got {type(out).__name__}")
        cos_want, sin_want = axial_rope_cos_sin(h, w, d)
        for name, got, want in (("cos", out[0], cos_want), ("sin", out[1], sin_want)):
            problem = compare(got, want, what=f"{name} for a {h} x {w} grid, head_dim {d}")
            if problem:
                hint = _hint(got, h, w, d) if name == "cos" and isinstance(got, Tensor) else None
                return verdict(False, hint or problem)
    return verdict(True, "your 2-D frequencies match Pixtral's for every grid tried")


def check_text_resumes(answer: object) -> bool:
    """The position of the ``<vision_end>`` token after a 2 x 3 (merged) image starting at 4."""
    ids = torch.tensor([[1, 2, 3, 5] + [7] * 6 + [6, 4]])  # text, <vs>, 6 x <image>, <ve>, text
    pos, _ = mrope_position_ids(ids, torch.tensor([[1, 4, 6]]), image_token_id=7,
                                vision_start_token_id=5)
    want = int(pos[0, 0, 10])
    if isinstance(answer, bool) or not isinstance(answer, int):
        return verdict(False, f"answer with an int position, got {type(answer).__name__}")
    if answer == want:
        return verdict(True, f"text resumes at {want} = start + max(rows, columns)")
    if answer == 4 + 6:
        return verdict(False, "that counts every image token; M-RoPE advances by max(h, w) only")
    return verdict(False, f"{answer} is off; the image's ids run from 4 to {want - 1} on the widest axis")
