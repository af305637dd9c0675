"""Checker for chapter 5 (ALiBi): the paper's head slopes.

For ``n`` heads, ``n`` a power of two, head ``h = 1..n`` gets ``2^(-8h/n)``; otherwise the
``c`` slopes of the largest power of two ``c < n`` come first, followed by every other slope of
the ``2c``-head sequence (Press et al., 2022, "Train Short, Test Long: Attention with Linear
Biases Enables Input Length Extrapolation", sec. 3 and their reference code).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from . import attempt, check_lang, compare, fail, say, verdict

__all__ = ["check_slopes"]


def _slips(n: int, lang: str = "en") -> dict[str, Tensor]:
    """Slopes with one slip each, keyed by the hint (in ``lang``) that names it."""
    want = posenc.alibi_slopes(n).double()
    geometric = torch.tensor([2.0 ** (-8 * h / n) for h in range(1, n + 1)], dtype=torch.float64)
    return {
        say(lang, en="head 0 has slope 1: that is the shortcut 1 / 2**i for i in range(n); the "
            "paper's first slope is 2^(-8/n), not 2^0",
            zh="头 0 的斜率是 1：这是简化写法 1 / 2**i for i in range(n)；论文的第一个斜率是 "
            "2^(-8/n)，不是 2^0"): torch.tensor([2.0 ** -i for i in range(n)],
                                                          dtype=torch.float64),
        say(lang, en="the slopes 1/2^h, h = 1..n, are the paper's only for 8 heads: the ratio "
            "between neighbouring heads is 2^(-8/n)",
            zh="斜率 1/2^h（h = 1..n）只在 8 个头时与论文相同：相邻两个头的斜率之比是 "
            "2^(-8/n)"): torch.tensor([2.0 ** -h for h in range(1, n + 1)],
                                                        dtype=torch.float64),
        say(lang, en="the slopes are in reverse order: head 0 is the steepest, 2^(-8/n), and the "
            "slopes shrink towards 1/256",
            zh="斜率的顺序反了：头 0 最陡，为 2^(-8/n)，之后逐渐减小到 1/256"): want.flip(0),
        say(lang, en=f"{n} is not a power of two, so 2^(-8h/n) is not the paper's rule: take "
            "the slopes for the largest power of two c below n, then append every other slope "
            "of the 2c-head sequence",
            zh=f"{n} 不是 2 的幂，所以 2^(-8h/n) 不是论文的规则：先取小于 n 的最大 2 的幂 c "
            "对应的斜率，再从 2c 个头的数列里隔一个取一个接在后面"): geometric,
        say(lang, en="the right slopes in the wrong order: the heads beyond the power of two c "
            "are appended after the first c heads, not sorted in",
            zh="斜率对了，顺序不对：超出 2 的幂 c 的那些头接在前 c 个头之后，不要按大小排进去"):
            want.sort(descending=True).values,
    }


def check_slopes(fn: Callable[[int], Tensor], *, lang: str = "en") -> bool:
    """Check ``fn(num_heads) -> Tensor[num_heads]``: the ALiBi paper's slopes in head order,
    first for 12 heads, then for other head counts. Compared with ``posenc.alibi_slopes``;
    the verdict is in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    for n in (12, 8, 16, 6, 24, 1, 40):
        got, error = attempt(fn, n, lang=lang)
        setting = f"num_heads={n}"
        if error:
            return fail(error, setting, lang)
        if isinstance(got, (list, tuple)):
            try:
                got = torch.tensor(got, dtype=torch.float64)
            except (TypeError, ValueError):
                return fail(say(lang, en=f"return a tensor (or a list) of {n} numbers",
                                 zh=f"请返回一个含 {n} 个数的张量（或列表）"), setting, lang)
        want = posenc.alibi_slopes(n)
        problem = compare(got, want, what=say(lang, en="the slopes", zh="斜率"), atol=1e-6,
                          rtol=1e-5, lang=lang)
        if problem is None:
            continue
        if isinstance(got, Tensor) and got.shape == want.shape and got.is_floating_point():
            g = got.detach().double().cpu()
            for slip, wrong in _slips(n, lang).items():
                if not torch.allclose(wrong, want.double()) and torch.allclose(g, wrong,
                                                                               rtol=1e-5):
                    return fail(slip, setting, lang)
        return fail(str(problem), setting, lang)
    return verdict(True, say(
        lang, en="your slopes equal posenc.alibi_slopes for 12 heads\n"
        "  and for every other head count tried",
        zh="你的斜率与 posenc.alibi_slopes 相等：12 个头如此，\n"
        "  试过的其他头数也都如此"))
