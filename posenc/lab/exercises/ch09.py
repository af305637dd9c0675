"""Checkers for chapter 9's exercises (positions in today's models)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...axial import axial_rope_cos_sin
from ...mrope import mrope_position_ids
from ...rope_scaling import rope_inv_freq
from . import attempt, check_lang, compare, say, verdict

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


def _hint(got: Tensor, h: int, w: int, d: int, lang: str = "en") -> str | None:
    inv = rope_inv_freq(d)[0]
    even, odd = inv[0::2], inv[1::2]
    qwen = rope_inv_freq(d // 2)[0]  # Qwen2-VL's vision encoder: the same set for both axes
    known = [
        (dict(row=odd, col=even, order="row-major"),
         say(lang, en="rows and columns are swapped: the row takes the even frequencies (0, 2, 4, ...)",
             zh="行和列对调了：行取偶数序号的频率（0, 2, 4, ...）")),
        (dict(row=even, col=even, order="row-major"),
         say(lang, en="both axes use the row's frequencies (that is Qwen2-VL's vision encoder); "
                "Pixtral gives the column the odd ones",
             zh="两个轴都用了行的频率（那是 Qwen2-VL 的视觉编码器）；Pixtral 让列取奇数序号的频率")),
        (dict(row=qwen, col=qwen, order="row-major"),
         say(lang, en="both axes use the row's frequencies (that is Qwen2-VL's vision encoder); "
                "Pixtral gives the column the odd ones",
             zh="两个轴都用了行的频率（那是 Qwen2-VL 的视觉编码器）；Pixtral 让列取奇数序号的频率")),
        (dict(row=even, col=odd, order="column-major"),
         say(lang, en="patches are in column-major order; patch p sits at row p // width, column p % width",
             zh="图块排成了列优先顺序；图块 p 应位于第 p // width 行、第 p % width 列")),
    ]
    for kw, msg in known:
        want = _layout(h, w, d, **kw)  # type: ignore[arg-type]  # kw holds row/col tensors and an order str
        if got.shape == want.shape and torch.allclose(got.float(), want, atol=1e-5):
            return msg
    return None


def check_axial(fn: Callable[[int, int, int], tuple[Tensor, Tensor]], *, lang: str = "en") -> bool:
    """``fn(height, width, head_dim) -> (cos, sin)``, each ``[height * width, head_dim]``, equal to
    Pixtral's 2-D RoPE (``posenc.axial_rope_cos_sin``), half layout, row-major patches; the
    verdict and hints in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    for h, w, d in _GRIDS:
        out, err = attempt(fn, h, w, d, lang=lang)
        if err:
            return verdict(False, err)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            kind = type(out).__name__
            return verdict(False, say(lang, en=f"return a pair (cos, sin), got {kind}",
                                      zh=f"应返回一对 (cos, sin)，得到的是 {kind}"))
        cos_want, sin_want = axial_rope_cos_sin(h, w, d)
        for name, got, want in (("cos", out[0], cos_want), ("sin", out[1], sin_want)):
            what = say(lang, en=f"{name} for a {h} x {w} grid, head_dim {d}",
                       zh=f"{h} × {w} 网格、head_dim {d} 时的 {name} ")
            problem = compare(got, want, what=what, lang=lang)
            if problem:
                hint = _hint(got, h, w, d, lang) if name == "cos" and isinstance(got, Tensor) else None
                return verdict(False, hint or problem)
    return verdict(True, say(lang, en="your 2-D frequencies match Pixtral's for every grid tried",
                             zh="在所有试过的网格上，你的二维频率都与 Pixtral 的一致"))


def check_text_resumes(answer: object, *, lang: str = "en") -> bool:
    """The position of the ``<vision_end>`` token after a 2 x 3 (merged) image starting at 4;
    the verdict in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    ids = torch.tensor([[1, 2, 3, 5] + [7] * 6 + [6, 4]])  # text, <vs>, 6 x <image>, <ve>, text
    pos, _ = mrope_position_ids(ids, torch.tensor([[1, 4, 6]]), image_token_id=7,
                                vision_start_token_id=5)
    want = int(pos[0, 0, 10])
    if isinstance(answer, bool) or not isinstance(answer, int):
        kind = type(answer).__name__
        return verdict(False, say(lang, en=f"answer with an int position, got {kind}",
                                  zh=f"请用一个整数位置作答，得到的是 {kind}"))
    if answer == want:
        return verdict(True, say(lang, en=f"text resumes at {want} = start + max(rows, columns)",
                                 zh=f"文本从 {want} = 起点 + max(行数, 列数) 处继续"))
    if answer == 4 + 6:
        return verdict(False, say(lang, en="that counts every image token; M-RoPE advances by max(h, w) only",
                                  zh="这把每个图像词元都算进去了；M-RoPE 只前进 max(h, w)"))
    last = want - 1
    return verdict(False, say(lang, en=f"{answer} is off; the image's ids run from 4 to {last} "
                                       "on the widest axis",
                              zh=f"{answer} 不对；在最宽的轴上，图像的 id 从 4 到 {last}"))
