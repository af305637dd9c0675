"""Every chapter keeps to the budget of DESIGN.md: at most 3,700 words of markdown.

Words are counted as the English reading counts them: whitespace-separated tokens of the
markdown cells (code, outputs and the Chinese edition are not counted)."""

import json
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
BUDGET = 3700
CHAPTERS = sorted(p for p in BOOK.glob("[0-9][0-9]_*.ipynb"))


def markdown_words(path: Path) -> int:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")


def test_the_chapters_are_found():
    assert len(CHAPTERS) >= 11, [p.name for p in CHAPTERS]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_keeps_to_the_word_budget(path):
    words = markdown_words(path)
    assert words <= BUDGET, f"{path.name}: {words} words of markdown, budget {BUDGET}"
