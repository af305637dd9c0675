"""Checkers for the book's exercises: ``check(my_fn)`` prints a friendly verdict, never a traceback.

One module per chapter (``ch03.py`` ...) defines the checkers a chapter's exercises call; this
module holds what they share. A checker runs the learner's function on random inputs, compares
the result with posenc's, and prints ``✓ ...`` or ``✗ ...`` with a hint that names what is off
(an exception, the shape, the dtype, a constant factor, a sign, a permutation of channels). It
returns ``True`` or ``False`` so a solution cell can ``assert check(solution)``.

Every checker takes ``lang="en"`` or ``lang="zh"`` and answers in that language (the chapters
pass ``lang=LANG``, set in their setup cell); :func:`say` picks the message and refuses any
other language with a ``ValueError`` that names the argument.

Every verdict is wrapped to fit a page's output block by :func:`wrap_message`: it counts display
columns (a Chinese character takes two, :func:`display_width`), breaks English at spaces and
Chinese between characters, and never inside a formula or a code span (brackets, backticks,
the operands of ``=``, ``*``, ``/``, ...). :func:`fail` prints a hint and the input that showed it.
"""

from __future__ import annotations

import traceback
import unicodedata
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["LANGS", "WIDTH", "check_lang", "say", "display_width", "wrap_message", "verdict",
           "fail", "attempt", "compare"]

LANGS = ("en", "zh")
WIDTH = 78
"""The columns of a page's output block that a verdict fills, its ``✓ `` or ``✗ `` included."""

_INDENT = "  "  # continuation lines
_OPEN, _CLOSE = "([{", ")]}"
_OPERATORS = frozenset("=+-*/^<>×·≈≤≥≠→←|%~")
_CJK_PUNCT = frozenset("，。、；：！？")
_NO_BREAK_BEFORE = frozenset("，。、；：！？）》」』”’…—,.;:!?)]}")
_NO_BREAK_AFTER = frozenset("（《「『“‘([{")


def check_lang(lang: object) -> str:
    """``lang`` if it is one of :data:`LANGS`, else a ``ValueError`` naming the argument."""
    if not isinstance(lang, str) or lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    return lang


def say(lang: str, *, en: str, zh: str) -> str:
    """The message in the reader's language: ``en`` for ``lang="en"``, ``zh`` for ``"zh"``."""
    return zh if check_lang(lang) == "zh" else en


def display_width(text: str) -> int:
    """The columns ``text`` takes in a monospaced font: East Asian wide and fullwidth characters
    (``unicodedata.east_asian_width`` ``W`` or ``F``) count 2, combining marks 0, the rest 1."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF"
               else 1 for c in text)


def _wide(c: str) -> bool:
    return unicodedata.east_asian_width(c) in "WF"


def _neighbour(line: str, i: int, step: int) -> str:
    """The first character from ``i`` in direction ``step`` that is not a space ('' at an end)."""
    while 0 <= i < len(line) and line[i] == " ":
        i += step
    return line[i] if 0 <= i < len(line) else ""


def _in_formula(line: str, start: int, end: int) -> bool:
    """True when the run ``line[start:end]`` of wide characters is an operand (next to ``=``,
    ``*``, ... across spaces), as 位置 in ``角度 = 位置 * theta_i``."""
    return _neighbour(line, start - 1, -1) in _OPERATORS or _neighbour(line, end, 1) in _OPERATORS


def _break_points(line: str) -> list[tuple[int, int]]:
    """Where ``line`` may break, as ``(end of this line, start of the next)``: at a space (which
    is dropped) or between two wide characters, never inside brackets, backticks or a formula,
    never before closing or after opening punctuation."""
    points: list[tuple[int, int]] = []
    depth, code, i = 0, False, 0
    while i < len(line):
        c = line[i]
        if c == " ":
            j = i
            while j < len(line) and line[j] == " ":
                j += 1
            before, after = line[i - 1] if i else "", line[j] if j < len(line) else ""
            if (i and after and not code and depth == 0 and before not in _OPERATORS
                    and after not in _OPERATORS and before not in _NO_BREAK_AFTER
                    and after not in _NO_BREAK_BEFORE):
                points.append((i, j))
            i = j
            continue
        if (i and not code and depth == 0 and _wide(c) and _wide(line[i - 1])
                and c not in _NO_BREAK_BEFORE and line[i - 1] not in _NO_BREAK_AFTER):
            if line[i - 1] in _CJK_PUNCT:
                points.append((i, i))
            else:  # inside a run of wide characters: not when the run is a formula's operand
                a, b = i - 1, i
                while a > 0 and _wide(line[a - 1]) and line[a - 1] not in _CJK_PUNCT:
                    a -= 1
                while b < len(line) and _wide(line[b]) and line[b] not in _CJK_PUNCT:
                    b += 1
                if not _in_formula(line, a, b):
                    points.append((i, i))
        if c == "`":
            code = not code
        elif not code and c in _OPEN:
            depth += 1
        elif not code and c in _CLOSE:
            depth = max(depth - 1, 0)
        i += 1
    return points


def _wrap_line(line: str, width: int) -> list[str]:
    lines: list[str] = []
    start, indent = 0, 0  # the first line brings its own indent
    points = _break_points(line)
    while display_width(line[start:]) + indent > width:
        fitting = [(e, r) for e, r in points if e > start
                   and display_width(line[start:e]) + indent <= width]
        later = [(e, r) for e, r in points if e > start]
        if fitting:
            end, resume = fitting[-1]
        elif later:  # a formula longer than the line: it stays whole, the line overflows
            end, resume = later[0]
        else:
            break
        lines.append(" " * indent + line[start:end])
        start, indent = resume, len(_INDENT)
    lines.append(" " * indent + line[start:])
    return lines


def wrap_message(text: str, width: int = WIDTH) -> str:
    """``text`` with each of its lines wrapped to ``width`` display columns (continuation lines
    indented by two spaces). English breaks at spaces, Chinese also between two characters, and
    nothing breaks inside a formula or a code span; a formula longer than a line overflows it
    rather than break. Lines that fit are left as they are."""
    if width < 20:
        raise ValueError(f"width must be >= 20 columns, got {width!r}")
    return "\n".join(out for line in text.split("\n") for out in _wrap_line(line, width))


def verdict(ok: bool, message: str) -> bool:
    """Print ``✓ message`` or ``✗ message``, wrapped by :func:`wrap_message`, and return ``ok``."""
    print(wrap_message(("✓ " if ok else "✗ ") + message))
    return ok


def fail(hint: str, setting: str, lang: str = "en") -> bool:
    """Print ``✗ hint`` and, on its own line, the input that showed it; return ``False``."""
    tail = say(lang, en=f"  (input: {setting})", zh=f"  （输入：{setting}）")
    return verdict(False, f"{hint}\n{tail}")


def _name(what: str) -> str:
    """``what`` followed by a space when it ends in a Latin character and Chinese follows."""
    return what + " " if what and not _wide(what[-1]) else what


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
                   zh=f"{_name(what)}应当是 torch.Tensor，得到的是 {name}")
    if got.shape != want.shape:
        gs, ws = tuple(got.shape), tuple(want.shape)
        return say(lang, en=f"{what} has shape {gs}, expected {ws}",
                   zh=f"{_name(what)}的形状是 {gs}，应为 {ws}")
    if not got.is_floating_point() and want.is_floating_point():
        return say(lang, en=f"{what} has dtype {got.dtype}, expected a float tensor",
                   zh=f"{_name(what)}的 dtype 是 {got.dtype}，应为浮点张量")
    got = got.detach().to(torch.float64).cpu()
    want = want.detach().to(torch.float64).cpu()
    if torch.allclose(got, want, atol=atol, rtol=rtol):
        return None
    if not torch.isfinite(got).all():
        return say(lang, en=f"{what} contains NaN or inf", zh=f"{_name(what)}中有 NaN 或 inf")
    if torch.allclose(got, -want, atol=atol, rtol=rtol):
        return say(lang, en=f"{what} has the wrong sign everywhere",
                   zh=f"{_name(what)}处处符号相反")
    for factor in (2.0, 0.5):
        if torch.allclose(got, factor * want, atol=atol, rtol=rtol):
            return say(
                lang,
                en=f"{what} is {factor:g} times the expected values (a factor of 2 somewhere?)",
                zh=f"{_name(what)}是应有值的 {factor:g} 倍（是不是哪里多了或少了一个因子 2？）",
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
                zh=f"{_name(what)}的数值对，但维度的顺序不对（交错布局与对半布局弄混了？）",
            )
    err = (got - want).abs()
    idx = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
    g, w, e = f"{got[idx].item():.6g}", f"{want[idx].item():.6g}", f"{err.max().item():.3g}"
    return say(
        lang,
        en=f"{what} differs at index {idx}: got {g}, expected {w} (max abs error {e})",
        zh=f"{_name(what)}在下标 {idx} 处不同：得到 {g}，应为 {w}（最大绝对误差 {e}）",
    )
