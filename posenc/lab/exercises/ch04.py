"""Checker for chapter 4 (RoPE): rotary embedding built from explicit 2x2 rotations.

Channel pair ``(x_2i, x_2i+1)`` of the token at position ``m`` is rotated by the angle
``m * theta_i`` with ``theta_i = base^(-2i/d)`` (Su et al., 2024, "RoFormer: Enhanced Transformer
with Rotary Position Embedding", eq. 13-15): the interleaved layout of ``posenc.apply_rope``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

import posenc

from . import attempt, check_lang, compare, fail, say, verdict

__all__ = ["check_rope"]


def _rope(x: Tensor, positions: Tensor, base: float, *, interleaved: bool = True,
          sign: float = 1.0, angle_scale: float = 1.0, exponent: float = 2.0) -> Tensor:
    """RoPE with one slip: half layout, the angle's sign, its scale, or the exponent 2i/d."""
    d = x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)  # pair index
    inv_freq = (angle_scale * base ** (-exponent * i / d)).float()  # [d/2]
    cos, sin = posenc.rope_cos_sin(positions, inv_freq, interleaved=interleaved)  # [L, d]
    return posenc.apply_rope(x, cos, sign * sin, interleaved=interleaved)


_SLIPS: list[tuple[str, str, dict[str, Any]]] = [  # (English hint, Chinese hint, the slip)
    ("pairs are (i, i + d/2), the half layout: here a pair is two neighbouring channels "
     "(2i, 2i + 1)",
     "维度对取成了 (i, i + d/2)，那是对半布局；这里的一对是相邻的两个维度 (2i, 2i + 1)",
     {"interleaved": False}),
    ("the angle has the wrong sign: R(a) = [[cos a, -sin a], [sin a, cos a]] turns "
     "(1, 0) towards (0, 1)",
     "角度的符号反了：R(a) = [[cos a, -sin a], [sin a, cos a]] 把 (1, 0) 转向 (0, 1)",
     {"sign": -1.0}),
    ("the angles are twice too large: theta_i = base^(-2i/d), angle = position * theta_i",
     "角度大了一倍：theta_i = base^(-2i/d)，角度 = 位置 * theta_i",
     {"angle_scale": 2.0}),
    ("the angles are half as large as they should be: angle = position * theta_i",
     "角度只有应有值的一半：角度 = 位置 * theta_i",
     {"angle_scale": 0.5}),
    ("a factor of 2 in the frequency: theta_i = base^(-2i/d) for pair i, you used "
     "base^(-i/d)",
     "频率差了因子 2：第 i 对的 theta_i = base^(-2i/d)，你用的是 base^(-i/d)",
     {"exponent": 1.0}),
    ("a factor of 2 in the frequency: theta_i = base^(-2i/d) for pair i (i counts pairs, "
     "not channels), you used base^(-4i/d)",
     "频率差了因子 2：第 i 对的 theta_i = base^(-2i/d)（i 数的是维度对，不是维度），"
     "你用的是 base^(-4i/d)",
     {"exponent": 4.0}),
]


def check_rope(fn: Callable[[Tensor, Tensor, float], Tensor], *, lang: str = "en") -> bool:
    """Check ``fn(x, positions, base) -> Tensor``: ``x`` is ``[L, d]`` (one head, ``d`` even),
    ``positions`` a ``[L]`` integer tensor; pair ``(2i, 2i+1)`` of row ``l`` is rotated by
    ``positions[l] * base^(-2i/d)``. Compared with ``posenc.apply_rope`` (interleaved); the
    verdict is in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    gen = torch.Generator().manual_seed(4)
    cases = [(6, 8, torch.arange(6), 10000.0),
             (5, 16, torch.randint(0, 200, (5,), generator=gen), 10000.0),
             (7, 4, torch.randint(0, 50, (7,), generator=gen), 100.0)]
    for L, d, positions, base in cases:
        x = torch.randn(L, d, generator=gen)
        setting = f"L={L}, d={d}, positions={positions.tolist()}, base={base:g}"
        x_in = x.clone()
        got, error = attempt(fn, x_in, positions.clone(), base, lang=lang)
        if error:
            return fail(error, setting, lang)
        inv_freq, _ = posenc.rope_inv_freq(d, base=base)
        want = posenc.apply_rope(x, *posenc.rope_cos_sin(positions, inv_freq))  # [L, d]
        problem = compare(got, want, what=say(lang, en="the rotated x", zh="旋转后的 x"),
                          atol=1e-4, rtol=1e-4, lang=lang)
        if problem is None:
            if not torch.equal(x_in, x):
                return fail(say(lang, en="the result is right, but your function changed x "
                                 "in place; return a new tensor instead",
                                 zh="结果是对的，但你的函数原地修改了 x；请返回一个新张量"),
                             setting, lang)
            continue
        if isinstance(got, Tensor) and got.shape == want.shape and got.is_floating_point():
            g = got.detach().double().cpu()
            if torch.allclose(g, x.double(), atol=1e-5):
                return fail(say(lang, en="x came back unrotated", zh="x 返回时没有被旋转"),
                             setting, lang)
            for en, zh, kwargs in _SLIPS:
                if torch.allclose(g, _rope(x, positions, base, **kwargs).double(), atol=1e-4,
                                  rtol=1e-4):
                    return fail(say(lang, en=en, zh=zh), setting, lang)
        return fail(str(problem), setting, lang)
    return verdict(True, say(
        lang, en="your 2x2 rotations equal posenc.apply_rope (interleaved pairs)\n"
        "  for every size, position and base tried",
        zh="你的 2×2 旋转与 posenc.apply_rope（交错的维度对）结果一致，\n"
        "  试过的每种大小、位置和基数都一样"))
