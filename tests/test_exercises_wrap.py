"""The checkers' verdicts fit a page's output block and never break inside a formula.

:func:`posenc.lab.exercises.wrap_message` wraps every verdict by display width (a Chinese
character takes two columns). Here every Chinese message template of the chapter 1-9 checkers
(read from their source) is wrapped at many offsets, and each break is checked against the
formulas and code spans of the message, found independently of the wrapper.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from pathlib import Path

import pytest
import torch
from _wrap import flat

import posenc.lab.exercises as ex
from posenc.lab.exercises import WIDTH, display_width, wrap_message
from posenc.lab.exercises.ch04 import check_rope

CHECKERS = Path(ex.__file__).parent
MODULES = [CHECKERS / "__init__.py"] + [CHECKERS / f"ch{n:02d}.py" for n in range(1, 10)]
CJK = re.compile(r"[\u4e00-\u9fff]")
SAMPLE = "(2, 3)"  # what a placeholder of an f-string prints (an index, a shape)


def chinese_templates(path: Path) -> list[str]:
    """Every string literal of ``path`` that holds Chinese, f-string fields shown as SAMPLE."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in parts:
            continue
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else SAMPLE for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if CJK.search(text):
            found.extend(line.strip() for line in text.split("\n") if CJK.search(line))
    return found


TEMPLATES = sorted({t for path in MODULES for t in chinese_templates(path)})
OPERAND = r"[^\s，。；：、（）`]+"
FORMULA = re.compile(rf"{OPERAND}(?: +[=*/^<>+×-]+ +{OPERAND})+")


def formula_spans(text: str) -> list[tuple[int, int]]:
    """Code spans, bracket groups and ``a = b * c`` chains: where no line may break."""
    spans = [m.span() for m in re.finditer(r"`[^`]*`", text)]
    spans += [m.span() for m in FORMULA.finditer(text)]
    stack: list[int] = []
    for i, c in enumerate(text):
        if c in "([{":
            stack.append(i)
        elif c in ")]}" and stack:
            spans.append((stack.pop(), i + 1))
    return spans


def breaks(original: str, wrapped: str) -> list[tuple[int, int]]:
    """Where the wrapper broke ``original`` (one line): ``(end of a line, start of the next)``."""
    lines = wrapped.split("\n")
    assert original.startswith(lines[0])
    found, p = [], len(lines[0])
    for line in lines[1:]:
        assert line.startswith("  ") and not line.startswith("   "), line
        start = p
        while original[p] == " ":
            p += 1
        assert original.startswith(line[2:], p), (original, line)
        found.append((start, p))
        p += len(line) - 2
    assert p == len(original)
    return found


def test_the_templates_are_found():
    assert len(TEMPLATES) > 60
    assert any("theta_i = base^(-2i/d)" in t for t in TEMPLATES)


@pytest.mark.parametrize("template", TEMPLATES)
def test_chinese_hints_fit_and_keep_formulas_whole(template):
    for shift in range(0, 40, 3):  # move the breaks through the template
        message = "✗ " + "设" * shift + "：" + template
        wrapped = wrap_message(message)
        assert all(display_width(line) <= WIDTH for line in wrapped.split("\n")), wrapped
        assert flat(wrapped) == message
        spans = formula_spans(message)
        for end, start in breaks(message, wrapped):
            inside = [message[a:b] for a, b in spans if a < end and start < b]
            assert not inside, f"broken inside {inside}:\n{wrapped}"


def test_display_width():
    assert display_width("RoPE") == 4
    assert display_width("旋转位置编码") == 12
    assert display_width("（输入：L=5）") == 13
    assert unicodedata.east_asian_width("✗") == "N" and display_width("✗ ") == 2


def test_chinese_breaks_between_characters_not_in_formulas():
    message = ("✗ 角度大了一倍：" + "这是一段很长的说明" * 4
               + "，角度 = 位置 * theta_i，其中 theta_i = base^(-2i/d)")
    wrapped = wrap_message(message, width=40)
    assert flat(wrapped) == message
    assert all(display_width(line) <= 40 for line in wrapped.split("\n")), wrapped
    assert "角度 = 位置 * theta_i" in wrapped and "theta_i = base^(-2i/d)" in wrapped, wrapped


def test_a_formula_longer_than_a_line_stays_whole():
    formula = "R(a) = [[cos a, -sin a], [sin a, cos a]]"
    wrapped = wrap_message(f"✗ 旋转矩阵是 {formula}，它把 (1, 0) 转向 (0, 1)", width=30)
    assert formula in wrapped.split("\n")[1], wrapped


def test_english_wraps_at_spaces_outside_formulas():
    message = ("✗ the angles are twice too large: theta_i = base^(-2i/d), angle = position * "
               "theta_i, and this sentence goes on long enough to need a second line")
    wrapped = wrap_message(message)
    assert flat(wrapped) == message and "\n" in wrapped
    assert "theta_i = base^(-2i/d)" in wrapped and "angle = position * theta_i" in wrapped


def test_short_lines_and_explicit_breaks_are_kept():
    assert wrap_message("✓ 你的斜率相等") == "✓ 你的斜率相等"
    assert wrap_message("✓ a\n  b") == "✓ a\n  b"
    with pytest.raises(ValueError, match="width"):
        wrap_message("x", width=5)


def test_a_real_chinese_verdict_fits(capsys):
    def half_layout(x, positions, base):
        d = x.shape[-1]
        inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = positions[:, None].double() * inv  # [L, d/2]
        x1, x2 = x[..., : d // 2].double(), x[..., d // 2 :].double()
        out = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1)
        return out.to(x.dtype)

    assert check_rope(half_layout, lang="zh") is False
    out = capsys.readouterr().out
    assert "对半布局" in flat(out) and "（输入：" in out, out
    assert all(display_width(line) <= WIDTH for line in out.splitlines()), out
