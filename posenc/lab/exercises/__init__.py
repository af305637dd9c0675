"""Checkers for the book's exercises: ``check(my_fn)`` prints a friendly verdict, never a traceback.

One module per chapter (``ch03.py`` ...) defines the checkers a chapter's exercises call; this
module holds what they share. A checker runs the learner's function on random inputs, compares
the result with posenc's, and prints ``✓ ...`` or ``✗ ...`` with a hint that names what is off
(an exception, the shape, the dtype, a constant factor, a sign, a permutation of channels). It
returns ``True`` or ``False`` so a solution cell can ``assert check(solution)``.

Every checker takes ``lang="en"`` or ``lang="zh"`` and answers in that language (the chapters
pass ``lang=LANG``, set in their setup cell); :func:`say` picks the message and refuses any
other language with a ``ValueError`` that names the argument.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["LANGS", "check_lang", "say", "verdict", "attempt", "compare"]

LANGS = ("en", "zh")


def check_lang(lang: object) -> str:
    """``lang`` if it is one of :data:`LANGS`, else a ``ValueError`` naming the argument."""
    if not isinstance(lang, str) or lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    return lang


def say(lang: str, *, en: str, zh: str) -> str:
    """The message in the reader's language: ``en`` for ``lang="en"``, ``zh`` for ``"zh"``."""
    return zh if check_lang(lang) == "zh" else en


def verdict(ok: bool, message: str) -> bool:
    """Print ``✓ message`` or ``✗ message`` and return ``ok``."""
    print(("✓ " if ok else "✗ ") + message)
    return ok


def attempt(fn: Callable[..., Any], *args: Any, lang: str = "en",
            **kwargs: Any) -> tuple[Any, str | None]:
    """Call ``fn(*args, **kwargs)``; return ``(result, None)`` or ``(None, a one-line
    description of the error)`` in ``lang``."""
    check_lang(lang)
    if not callable(fn):
        name = type(fn).__name__
        return None, say(lang, en=f"expected a function, got {name}",
                         zh=f"这里需要一个函数，收到的是 {name}")
    try:
        return fn(*args, **kwargs), None
    except NotImplementedError:
        return None, say(
            lang,
            en="not implemented yet: replace the `raise NotImplementedError` with your code",
            zh="还没有实现：把 `raise NotImplementedError` 换成你的代码",
        )
    except Exception as e:  # the learner's bug: report it in one line, no traceback
        where = traceback.extract_tb(e.__traceback__)[-1]
        kind = type(e).__name__
        return None, say(
            lang,
            en=f"your function raised {kind}: {e} (line {where.lineno})",
            zh=f"你的函数抛出了 {kind}：{e}（第 {where.lineno} 行）",
        )


def compare(got: Any, want: Tensor, *, what: str = "the result", atol: float = 1e-5,
            rtol: float = 1e-5, lang: str = "en") -> str | None:
    """``None`` if ``got`` equals ``want``, else a hint in ``lang`` that names what differs.

    ``what`` names the result in the same language (``"the bias"``, ``"偏置"``)."""
    check_lang(lang)
    if not isinstance(got, Tensor):
        name = type(got).__name__
        return say(lang, en=f"{what} should be a torch.Tensor, got {name}",
                   zh=f"{what}应当是 torch.Tensor，得到的是 {name}")
    if got.shape != want.shape:
        gs, ws = tuple(got.shape), tuple(want.shape)
        return say(lang, en=f"{what} has shape {gs}, expected {ws}",
                   zh=f"{what}的形状是 {gs}，应为 {ws}")
    if not got.is_floating_point() and want.is_floating_point():
        return say(lang, en=f"{what} has dtype {got.dtype}, expected a float tensor",
                   zh=f"{what}的 dtype 是 {got.dtype}，应为浮点张量")
    got = got.detach().to(torch.float64).cpu()
    want = want.detach().to(torch.float64).cpu()
    if torch.allclose(got, want, atol=atol, rtol=rtol):
        return None
    if not torch.isfinite(got).all():
        return say(lang, en=f"{what} contains NaN or inf", zh=f"{what}中有 NaN 或 inf")
    if torch.allclose(got, -want, atol=atol, rtol=rtol):
        return say(lang, en=f"{what} has the wrong sign everywhere",
                   zh=f"{what}处处符号相反")
    for factor in (2.0, 0.5):
        if torch.allclose(got, factor * want, atol=atol, rtol=rtol):
            return say(
                lang,
                en=f"{what} is {factor:g} times the expected values (a factor of 2 somewhere?)",
                zh=f"{what}是应有值的 {factor:g} 倍（是不是哪里多了或少了一个因子 2？）",
            )
    if got.dim() >= 1 and got.shape[-1] % 2 == 0 and got.shape[-1] >= 4:
        d = got.shape[-1]
        to_half = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
        to_inter = torch.argsort(to_half)
        if torch.allclose(got[..., to_half], want, atol=atol, rtol=rtol) or torch.allclose(
            got[..., to_inter], want, atol=atol, rtol=rtol
        ):
            return say(
                lang,
                en=f"{what} has the right numbers in the wrong channel order "
                "(interleaved vs half layout?)",
                zh=f"{what}的数值对，但维度的顺序不对（交错布局与对半布局弄混了？）",
            )
    err = (got - want).abs()
    idx = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
    g, w, e = f"{got[idx].item():.6g}", f"{want[idx].item():.6g}", f"{err.max().item():.3g}"
    return say(
        lang,
        en=f"{what} differs at index {idx}: got {g}, expected {w} (max abs error {e})",
        zh=f"{what}在下标 {idx} 处不同：得到 {g}，应为 {w}（最大绝对误差 {e}）",
    )
