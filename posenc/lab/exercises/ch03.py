"""Checkers for chapter 3 (sinusoidal encoding): the table from its formula, and the shift map.

``PE[pos, 2i] = sin(pos / 10000^(2i/d))``, ``PE[pos, 2i+1] = cos(pos / 10000^(2i/d))``
(Vaswani et al., 2017, "Attention Is All You Need", sec. 3.5), and ``PE(pos + k) = M_k PE(pos)``
with ``M_k`` block-diagonal 2x2 rotations by ``omega_i * k``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from . import attempt, check_lang, compare, say, verdict

__all__ = ["check_table", "check_shift_matrix"]


def _table(num_positions: int, dim: int, exponent: float = 2.0, swap: bool = False) -> Tensor:
    """A table with a slip: ``exponent`` replaces the 2 in 2i/d; ``swap`` puts cos first."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # [N, 1]
    i = torch.arange(dim // 2, dtype=torch.float64)[None, :]  # [1, d/2]
    angle = pos * 10000.0 ** (-exponent * i / dim)  # [N, d/2]
    first, second = (angle.cos(), angle.sin()) if swap else (angle.sin(), angle.cos())
    return torch.stack([first, second], dim=-1).flatten(-2)  # [N, d], interleaved


def check_table(fn: Callable[[int, int], Tensor], *, lang: str = "en") -> bool:
    """Check ``fn(num_positions, dim) -> [num_positions, dim]``: the paper's interleaved table
    (sin on even channels, cos on odd ones), for even ``dim``. Compared with
    ``posenc.sinusoidal_table``; the verdict is in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    sep = say(lang, en=": ", zh="：")
    for n, d in [(50, 16), (37, 64), (10, 2), (300, 128)]:
        got, error = attempt(fn, n, d, lang=lang)
        setting = f"num_positions={n}, dim={d}"
        if error:
            return verdict(False, setting + sep + error)
        want = posenc.sinusoidal_table(n, d)
        problem = compare(got, want, what=say(lang, en="the table", zh="编码表"), atol=2e-4,
                          rtol=0, lang=lang)
        if problem is None:
            continue
        if isinstance(got, Tensor) and got.shape == want.shape and got.is_floating_point():
            g = got.detach().double().cpu()
            slips = {
                say(lang, en="the exponent: pair i turns at 10000^(-2i/d), i.e. "
                    "arange(0, d, 2) / d; yours looks like i/d (or 4i/d)",
                    zh="指数不对：第 i 对维度的频率是 10000^(-2i/d)，即 arange(0, d, 2) / d；"
                    "你的看起来是 i/d（或 4i/d）"): [_table(n, d, 1.0), _table(n, d, 4.0)],
                say(lang, en="sin and cos are swapped: sin goes on the even channels",
                    zh="sin 和 cos 放反了：sin 放在偶数维度上"): [_table(n, d, swap=True)],
            }
            for slip, tables in slips.items():
                if any(torch.allclose(g, t, atol=2e-4, rtol=0) for t in tables):
                    return verdict(False, setting + sep + slip)
        return verdict(False, setting + sep + str(problem))
    return verdict(True, say(lang, en="your table equals posenc.sinusoidal_table",
                             zh="你的编码表与 posenc.sinusoidal_table 相等"))


def check_shift_matrix(fn: Callable[[int, int], Tensor], *, lang: str = "en") -> bool:
    """Check ``fn(k, dim) -> [dim, dim]``: the matrix ``M_k`` with ``PE(pos + k) = M_k PE(pos)``
    for every position (interleaved layout), tested on ``posenc.sinusoidal_table`` in float64;
    the verdict is in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    sep = say(lang, en=": ", zh="：")
    table = posenc.sinusoidal_table(400, 16, dtype=torch.float64)  # [400, 16]
    for k, d in [(1, 16), (7, 16), (100, 8), (-5, 16), (0, 4)]:
        got, error = attempt(fn, k, d, lang=lang)
        setting = f"k={k}, dim={d}"
        if error:
            return verdict(False, setting + sep + error)
        if not isinstance(got, Tensor) or got.shape != (d, d):
            shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
            return verdict(False, setting + sep + say(
                lang, en=f"M_k should be a [{d}, {d}] tensor, got {shape}",
                zh=f"M_k 应当是 [{d}, {d}] 的张量，得到的是 {shape}"))
        m = got.detach().double().cpu()
        pe = table[:, :d] if d == 16 else posenc.sinusoidal_table(400, d, dtype=torch.float64)
        start = max(0, -k)
        rows = torch.arange(start, 400 - max(k, 0))
        predicted = pe[rows] @ m.T  # M_k PE(pos) for every pos at once: [P, d]
        what = say(lang, en="M_k PE(pos), compared with PE(pos + k),",
                   zh="M_k PE(pos)（与 PE(pos + k) 相比）")
        problem = compare(predicted, pe[rows + k], what=what, atol=1e-4, rtol=0, lang=lang)
        if problem is None:
            continue
        if torch.allclose(pe[rows] @ m, pe[rows + k], atol=1e-4):
            return verdict(False, setting + sep + say(
                lang, en="you built M_(-k) = M_k^T; each 2x2 block should map "
                "(sin a, cos a) to (sin(a + w k), cos(a + w k))",
                zh="你构造的是 M_(-k) = M_k^T；每个 2×2 块应把 (sin a, cos a) "
                "映射为 (sin(a + w k), cos(a + w k))"))
        return verdict(False, setting + sep + str(problem))
    return verdict(True, say(
        lang, en="M_k PE(pos) equals PE(pos + k) for every position, k and width tried",
        zh="对试过的每个位置、k 和维度，M_k PE(pos) 都等于 PE(pos + k)"))
