"""scripts/site_check.py finds every kind of problem on a small fixture, and passes a clean one.

The fixtures (tests/fixtures/site/) are trimmed from a real jupyter-book build (sphinx-book-theme,
myst-nb, sphinx-exercise): ``bad/`` holds one violation of each kind, ``clean/`` none.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _scripts import load_script

pytest.importorskip("bs4")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "site"


site_check = load_script("site_check")


def _args(which: str) -> list[str]:
    base = FIXTURES / which
    return [
        "--html",
        str(base / "html"),
        "--book",
        str(base / "book"),
        "--bib",
        str(base / "book" / "references.bib"),
    ]


def _lines(which: str, capsys, *extra: str) -> tuple[int, list[str]]:
    status = site_check.main([*_args(which), *extra])
    out = capsys.readouterr().out
    return status, out.splitlines()


def test_clean_site_passes(capsys):
    status, lines = _lines("clean", capsys, "--strict-density")
    assert lines == []
    assert status == 0


# (file the line names, words the line must contain): one per violation in bad/
EXPECTED = [
    ("html/book/ch.html", "paragraph starts with '|'"),
    ("html/book/ch.html", "cbd69c2d.png has no caption"),
    ("html/book/ch.html", "cbd69c2d.png has a file name as alt text"),
    ("html/book/ch.html", "0e1f.png has no alt text"),
    ("html/book/ch.html", "Colab bootstrap is in the HTML"),
    ("html/book/ch.html", "unrendered citation role"),
    ("html/book/ch.html", "build timing printed into the page: 'trained in 12 s'"),
    ("html/book/ch.html", "build timing printed into the page: 'ran in 234.5 s'"),
    ("html/book/ch.html", "solution is not collapsed"),
    ("html/book/ch.html", "exercise 'ex-lonely' has no solution"),
    ("book/ch.ipynb", "cell 1 line 1: 89 > 88 columns"),
    ("book/ch.ipynb", "cites 'nosuchkey2024', which is not in references.bib"),
    ("book/references.bib", "entry 'uncited2023' is cited nowhere"),
]


def test_bad_site_reports_each_violation(capsys):
    status, lines = _lines("bad", capsys)
    assert status == 1
    for path, words in EXPECTED:
        hits = [line for line in lines if path in line.split(": ")[0] and words in line]
        assert len(hits) == 1, f"expected one line for {path}: {words!r}; got:\n" + "\n".join(lines)
    density = [line for line in lines if "warning: cell 2: markdown cell of 301 words" in line]
    assert len(density) == 1
    assert len(lines) == len(EXPECTED) + 1, "\n".join(lines)
    assert not any("_sources" in line for line in lines), "only pages are checked"


def test_density_is_a_warning_unless_strict(tmp_path: Path, capsys):
    book = tmp_path / "book"
    book.mkdir()
    (book / "ch.ipynb").write_text(
        (FIXTURES / "bad" / "book" / "ch.ipynb").read_text(encoding="utf-8"), encoding="utf-8"
    )
    problems = [p for p in site_check.check_notebooks(book, tmp_path) if p.warning]
    assert len(problems) == 1
    assert site_check.report(problems) == 0
    assert site_check.report(problems, strict_density=True) == 1
    capsys.readouterr()


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("one two three", 3),
        ("don't stop-words here", 3),
        ("```python\nx = 1 2 3 4\n```\nprose here", 2),
        ("```{exercise}\n:label: ex-a\nDo this now\n```", 3),
        ("$$\na + b + c\n$$\nthen words", 2),
        ("位置编码", 2),
    ],
)
def test_words(text: str, count: int):
    assert site_check.words(text) == count


@pytest.mark.parametrize(
    ("alt", "pathlike"),
    [
        ("../_images/abc.png", True),
        ("_images/abc", True),
        ("figure.svg", True),
        ("Loss against length: RoPE rises past 1/2 of the window", False),
        ("Heatmap of the ALiBi bias for 8 heads", False),
    ],
)
def test_pathlike_alt(alt: str, pathlike: bool):
    assert site_check._pathlike(alt) is pathlike


def test_missing_build_is_a_usage_error(tmp_path: Path):
    with pytest.raises(SystemExit) as info:
        site_check.main(["--html", str(tmp_path / "nope")])
    assert info.value.code == 2


def test_nested_site_and_index_pages_are_left_to_their_own_check(tmp_path: Path):
    """The English check skips the Chinese site built inside it (``zh/``, a searchindex.js of its
    own) and the generated index pages; the nested site's own run still finds its problems."""
    import shutil

    html = tmp_path / "html"
    shutil.copytree(FIXTURES / "clean" / "html", html)
    bad = next(p for p in sorted((FIXTURES / "bad" / "html").rglob("*.html")))
    nested = html / "zh"
    nested.mkdir()
    shutil.copy(bad, nested / bad.name)
    (nested / "searchindex.js").write_text("Search.setIndex({})", encoding="utf-8")
    (html / "py-modindex.html").write_text('<html><body><main><img src="minus.png"></main></body></html>',
                                           encoding="utf-8")
    assert site_check.check_html(html) == []
    assert site_check.check_html(nested) != []
