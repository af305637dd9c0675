"""Checkers for chapter 6 (side by side): the ALiBi bias matrix, built from the formula.

ALiBi (Press et al., 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input
Length Extrapolation") adds ``-slope_h * (m - n)`` to the logit of query ``m`` and key ``n <= m``;
the slopes are the geometric sequence ``2^(-8h/H)``, ``h = 1..H``, for a power-of-two head count
``H`` (other counts: see :func:`posenc.alibi_slopes`). Future keys get ``-inf`` (the causal mask).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from . import attempt, check_lang, compare, say, verdict

__all__ = ["check_alibi_bias"]

SETTINGS = [(8, 6, 6), (4, 3, 10), (12, 5, 5), (1, 1, 4)]  # (heads, q_len, k_len)


def _with_slopes(slopes: Tensor, q_len: int, k_len: int, *, first: bool = False) -> Tensor:
    m = torch.arange(q_len) if first else torch.arange(k_len - q_len, k_len)  # query positions
    n = torch.arange(k_len)
    dist = (m[:, None] - n[None, :]).float()  # [Lq, Lk]: m - n
    bias = -slopes[:, None, None] * dist  # [H, Lq, Lk]
    return bias.masked_fill(dist < 0, float("-inf"))


def check_alibi_bias(fn: Callable[..., Tensor], *, lang: str = "en") -> bool:
    """Check ``fn(num_heads, q_len, k_len) -> [num_heads, q_len, k_len]``: ALiBi's causal bias.

    The queries are the last ``q_len`` of ``k_len`` positions (as with a KV cache), so query
    ``m`` runs over ``k_len - q_len .. k_len - 1`` and key ``n`` over ``0 .. k_len - 1``. Entry
    ``[h, m, n]`` is ``-slope_h * (m - n)`` for ``n <= m`` and ``-inf`` for ``n > m``. Compared
    with :func:`posenc.alibi_bias` for 8, 4, 12 and 1 heads. The verdict is in ``lang``
    (``"en"`` or ``"zh"``).
    """
    check_lang(lang)
    sep = say(lang, en=": ", zh="：")
    what = say(lang, en="the bias", zh="偏置")
    for heads, q_len, k_len in SETTINGS:
        want = posenc.alibi_bias(heads, q_len, k_len)  # [H, Lq, Lk]
        setting = say(lang, en=f"{heads} heads, q_len={q_len}, k_len={k_len}",
                      zh=f"{heads} 个头，q_len={q_len}，k_len={k_len}")
        got, error = attempt(fn, heads, q_len, k_len, lang=lang)
        if error:
            return verdict(False, setting + sep + error)
        if not isinstance(got, Tensor) or got.shape != want.shape:
            return verdict(False, setting + sep + str(compare(got, want, what=what, lang=lang)))
        got = got.detach().float().cpu()
        future = torch.isinf(want)
        if not torch.isneginf(got[future]).all():
            return verdict(False, setting + sep + say(
                lang, en="future keys (n > m) must be -inf, the causal mask; a bias of 0 there "
                "(clamp(min=0)) lets a query see the future",
                zh="未来的键（n > m）必须是 -inf，这就是因果掩码；那里的偏置若是 0"
                "（clamp(min=0)），查询就能看到未来"))
        if compare(got, want, what=what, lang=lang) is None:
            continue
        article = 1.0 / 2.0 ** torch.arange(heads).float()  # the source article's slopes
        if torch.allclose(got, _with_slopes(article, q_len, k_len)):
            return verdict(False, setting + sep + say(
                lang, en="slopes 1/2^h for h = 0, 1, ... (head 0 gets 1) are the source "
                "article's; the paper's are 2^(-8h/H) for h = 1..H",
                zh="h = 0, 1, ... 时的斜率 1/2^h（头 0 的斜率为 1）是中文原文的写法；"
                "论文的斜率是 2^(-8h/H)，h = 1..H"))
        if heads & (heads - 1):
            pow2 = 2 ** math_floor_log2(heads)
            naive = 2.0 ** (-8.0 * torch.arange(1, heads + 1).float() / heads)
            if torch.allclose(got, _with_slopes(naive, q_len, k_len)):
                return verdict(False, setting + sep + say(
                    lang, en=f"{heads} is not a power of two; the paper takes the {pow2} "
                    f"slopes of {pow2} heads, then every other slope of {2 * pow2} heads",
                    zh=f"{heads} 不是 2 的幂；论文先取 {pow2} 个头的 {pow2} 个斜率，"
                    f"再从 {2 * pow2} 个头的斜率里隔一个取一个"))
        slopes = posenc.alibi_slopes(heads)
        if torch.allclose(got, _with_slopes(-slopes, q_len, k_len)):
            return verdict(False, setting + sep + say(
                lang, en="the sign is wrong; far keys get a lower score (-slope * distance)",
                zh="符号反了；远处的键得分应当更低（-斜率 * 距离）"))
        if q_len < k_len and torch.allclose(got, _with_slopes(slopes, q_len, k_len, first=True)):
            span = f"m = {k_len - q_len} .. {k_len - 1}"
            return verdict(False, setting + sep + say(
                lang, en=f"the queries are the LAST q_len positions ({span}), not the first",
                zh=f"查询是最后 q_len 个位置（{span}），不是最前面的"))
        return verdict(False, setting + sep + str(compare(got, want, what=what, lang=lang)))
    return verdict(True, say(
        lang, en="your bias equals posenc.alibi_bias, for 8, 4, 12 and 1 heads",
        zh="你的偏置与 posenc.alibi_bias 相等，8、4、12 和 1 个头都一样"))


def math_floor_log2(n: int) -> int:
    """``floor(log2(n))`` for ``n >= 1``."""
    return n.bit_length() - 1
