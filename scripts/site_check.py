#!/usr/bin/env python
"""Check the built site and the book's sources for the problems a reader would meet.

Run after ``jupyter-book build .`` (``.ci/run`` does)::

    python scripts/site_check.py                      # _build/html, book/, book/references.bib
    python scripts/site_check.py --strict-density     # long markdown cells fail too

One line per problem, ``<file>: <what>``; exit 1 when any error is found. Errors:

* a paragraph that starts with ``|`` (a Markdown table rendered as text; CommonMark has no tables);
* a notebook code line longer than 88 columns (clipped in the code block);
* a figure image without a caption (``<figcaption>``), or whose alt text is empty or a file name;
* the Colab bootstrap in the HTML (it is tagged ``remove-cell``);
* an exercise with no solution, or a solution that is not collapsed (sphinx-exercise's
  ``dropdown`` class);
* a ``{cite}`` key that is not in the bibliography, a role left unrendered on a page, or a
  bibliography entry that no page cites;
* a build timing printed into a page (``trained in 12 s``, ``ran in 234 s``, ``cache hit``).

Warnings (printed, fatal only with ``--strict-density``): a markdown cell over 300 words
(CJK text counts two characters as a word).
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bs4 import BeautifulSoup, Tag

ROOT = Path(__file__).resolve().parents[1]
MAX_COLUMNS = 88
MAX_WORDS = 300

# directories of a Sphinx build that are not pages a reader reads
_SKIP_DIRS = {"_static", "_sources", "_images", "_modules", "_downloads", ".doctrees", ".jupyter_cache"}
_BOOTSTRAP = re.compile(r"google\.colab|REPO, REF")
_IMAGE_FILE = re.compile(r"\.(?:png|jpe?g|gif|svg|webp|pdf)$", re.IGNORECASE)
_TIMING = re.compile(
    r"\b(?:trained|ran|run|took|finished|executed|completed|built|elapsed)\b(?: in)?(?: about| ~)?"
    r" ?\d+(?:\.\d+)? ?(?:ms|s|sec|secs|seconds|min|mins|minutes)\b"
    r"|\b\d+(?:\.\d+)? ?(?:s|seconds) elapsed\b"
    r"|\bcache (?:hit|miss)\b",
    re.IGNORECASE,
)
# {cite}`a,b`, {cite:p}`a`, {cite:t}`a`, ... and the reST form :cite:p:`a`
CITE = re.compile(r"(?:\{cite(?::[a-z]+)?\}|:cite(?::[a-z]+)?:)`([^`]+)`")
BIB_KEY = re.compile(r"^@\s*([A-Za-z]+)\s*\{\s*([^,\s]+)\s*,", re.MULTILINE)
_FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
_WORD = re.compile(r"[A-Za-z0-9][\w'’-]*")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True)
class Problem:
    path: str
    what: str
    warning: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {'warning: ' if self.warning else ''}{self.what}"


def _pathlike(alt: str) -> bool:
    """Alt text that is a file name or path (myst-nb's default), not a description."""
    one_token = not any(ch.isspace() for ch in alt)
    return bool(_IMAGE_FILE.search(alt)) or (one_token and ("/" in alt or "\\" in alt))


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _rel(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


# --- the built HTML --------------------------------------------------------------------------


_INDEX_PAGES = {"genindex.html", "py-modindex.html", "search.html"}  # generated, icons only


def html_pages(html_dir: Path) -> list[Path]:
    """The reader's pages of one site: not the generated index pages, not the files of another
    site nested inside it (the Chinese edition under ``zh/`` has its own ``searchindex.js``)."""
    nested = {p.parent for p in html_dir.rglob("searchindex.js") if p.parent != html_dir}
    return sorted(
        p for p in html_dir.rglob("*.html")
        if not _SKIP_DIRS & set(p.relative_to(html_dir).parts[:-1])
        and p.name not in _INDEX_PAGES
        and not any(n in p.parents for n in nested)
    )


def _content(soup: BeautifulSoup) -> Tag:
    """The page's article (sphinx-book-theme), else <main>, else <body>."""
    for found in (soup.find("article"), soup.find("main"), soup.body):
        if isinstance(found, Tag):
            return found
    return soup


def check_html_page(path: Path, name: str) -> tuple[list[Problem], list[tuple[str, str]], set[str]]:
    """Problems on one page, plus its exercises ``(page, id)`` and the exercise links its
    solutions carry (``page#id``), matched across pages by :func:`check_html`."""
    raw = path.read_text(encoding="utf-8")
    soup = BeautifulSoup(raw, "html.parser")
    article = _content(soup)
    problems: list[Problem] = []

    def add(what: str) -> None:
        problems.append(Problem(name, what))

    for p in article.find_all("p"):
        text = p.get_text().strip()
        if text.startswith("|"):
            add(f"paragraph starts with '|' (a Markdown table rendered as text): {_short(text)!r}")

    for img in article.find_all("img"):
        src = str(img.get("src", ""))
        alt = str(img.get("alt", "")).strip()
        figure = img.find_parent("figure")
        if figure is None or figure.find("figcaption") is None:
            add(f"image {Path(src).name} has no caption (figcaption)")
        if not alt:
            add(f"image {Path(src).name} has no alt text")
        elif _pathlike(alt) or alt == src:
            add(f"image {Path(src).name} has a file name as alt text: {_short(alt)!r}")

    match = _BOOTSTRAP.search(raw)
    if match:
        add(f"the Colab bootstrap is in the HTML ({match.group(0)!r}); tag its cell remove-cell")

    for text in article.find_all(string=re.compile(r"\{cite")):
        if text.find_parent(["pre", "code"]) is None:
            add(f"unrendered citation role: {_short(str(text))!r}")

    for output in article.find_all("div", class_="cell_output"):
        for m in _TIMING.finditer(output.get_text(" ")):
            add(f"build timing printed into the page: {m.group(0)!r}")

    exercises = [(name, str(div.get("id", ""))) for div in article.find_all("div", class_="exercise")]
    linked: set[str] = set()
    for div in article.find_all("div", class_="solution"):
        title = div.find(class_="admonition-title")
        link = title.find("a", href=True) if isinstance(title, Tag) else None
        target = str(link["href"]) if isinstance(link, Tag) else ""
        if target.startswith("#"):
            target = name + target
        else:  # relative to this page's folder
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        linked.add(target)
        label = _short(title.get_text(), 40) if isinstance(title, Tag) else div.get("id")
        if "dropdown" not in (div.get("class") or []):
            add(f"solution is not collapsed (add ':class: dropdown'): {label!r}")
    return problems, exercises, linked


def check_html(html_dir: Path) -> list[Problem]:
    problems: list[Problem] = []
    exercises: list[tuple[str, str]] = []
    linked: set[str] = set()
    for path in html_pages(html_dir):
        name = path.relative_to(html_dir).as_posix()
        found, ex, links = check_html_page(path, name)
        problems += found
        exercises += ex
        linked |= links
    for page, ex_id in exercises:
        if f"{page}#{ex_id}" not in linked:
            problems.append(Problem(page, f"exercise {ex_id!r} has no solution"))
    return problems


# --- the sources: notebooks, Markdown pages, the bibliography ---------------------------------


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _nested_books(book_dir: Path) -> set[Path]:
    """Folders below ``book_dir`` that are books of their own (``book/zh``: its own _config.yml)."""
    return {p.parent for p in book_dir.rglob("_config.yml") if p.parent != book_dir}


def _own(path: Path, book_dir: Path) -> bool:
    skip = {".ipynb_checkpoints", "_build"}
    return not skip & set(path.parts) and not any(n in path.parents for n in _nested_books(book_dir))


def notebooks(book_dir: Path) -> list[Path]:
    return sorted(p for p in book_dir.rglob("*.ipynb") if _own(p, book_dir))


def _cells(path: Path) -> Iterator[tuple[int, dict]]:
    yield from enumerate(json.loads(path.read_text(encoding="utf-8")).get("cells", []))


def words(markdown: str) -> int:
    """Words of prose in a markdown cell: code fences and display math left out; CJK text
    counts one word per two characters."""
    kept: list[str] = []
    fence: str | None = None
    for line in markdown.splitlines():
        m = _FENCE.match(line.strip())
        if fence is not None:
            if m and line.strip().startswith(fence):
                fence = None
            continue
        if m:
            info = m.group(2).strip()
            directive = info.startswith("{") and not info.startswith(("{code", "{math"))
            if not directive:
                fence = m.group(1)
            continue
        if line.strip().startswith(":") and re.match(r"^\s*:[\w-]+:", line):  # directive options
            continue
        kept.append(line)
    text = re.sub(r"\$\$.*?\$\$", " ", "\n".join(kept), flags=re.S)
    cjk = len(_CJK.findall(text))
    return len(_WORD.findall(_CJK.sub(" ", text))) + (cjk + 1) // 2


def check_notebooks(book_dir: Path, base: Path, max_words: int = MAX_WORDS) -> list[Problem]:
    problems: list[Problem] = []
    for path in notebooks(book_dir):
        name = _rel(path, base)
        for index, cell in _cells(path):
            text = _source(cell)
            if cell.get("cell_type") == "code":
                for number, line in enumerate(text.splitlines(), 1):
                    if len(line) > MAX_COLUMNS:
                        problems.append(
                            Problem(name, f"cell {index} line {number}: {len(line)} > {MAX_COLUMNS} columns")
                        )
            elif cell.get("cell_type") == "markdown":
                n = words(text)
                if n > max_words:
                    problems.append(
                        Problem(name, f"cell {index}: markdown cell of {n} words (> {max_words})", True)
                    )
    return problems


def cited_keys(book_dir: Path) -> dict[str, set[Path]]:
    """Every key cited in the book's Markdown pages and notebooks' markdown cells."""
    used: dict[str, set[Path]] = {}
    texts: list[tuple[Path, str]] = []
    for path in sorted(p for p in book_dir.rglob("*.md") if _own(p, book_dir)):
        texts.append((path, path.read_text(encoding="utf-8")))
    for path in notebooks(book_dir):
        texts += [(path, _source(c)) for _, c in _cells(path) if c.get("cell_type") == "markdown"]
    for path, text in texts:
        for group in CITE.findall(text):
            for key in group.split(","):
                if key.strip():
                    used.setdefault(key.strip(), set()).add(path)
    return used


def check_citations(book_dir: Path, bib: Path, base: Path) -> list[Problem]:
    keys = [m.group(2) for m in BIB_KEY.finditer(bib.read_text(encoding="utf-8"))]
    used = cited_keys(book_dir)
    problems: list[Problem] = []
    for key, paths in sorted(used.items()):
        if key not in keys:
            for path in sorted(paths):
                problems.append(Problem(_rel(path, base), f"cites {key!r}, which is not in {bib.name}"))
    for key in keys:
        if key not in used:
            problems.append(Problem(_rel(bib, base), f"entry {key!r} is cited nowhere in the book"))
    return problems


# --- the command ----------------------------------------------------------------------------


def run(
    html_dir: Path | None,
    book_dir: Path | None,
    bib: Path | None,
    *,
    base: Path | None = None,
    max_words: int = MAX_WORDS,
) -> list[Problem]:
    """All problems; paths in the messages are relative to ``base`` (default: the working dir)."""
    base = Path.cwd() if base is None else base
    problems: list[Problem] = []
    if html_dir is not None:
        problems += [
            Problem(_rel(html_dir, base) + "/" + p.path, p.what, p.warning) for p in check_html(html_dir)
        ]
    if book_dir is not None:
        problems += check_notebooks(book_dir, base, max_words)
        if bib is not None:
            problems += check_citations(book_dir, bib, base)
    return problems


def report(problems: Iterable[Problem], strict_density: bool = False) -> int:
    """Print the problems; return the exit status (1 if any counts as an error)."""
    problems = list(problems)
    for problem in problems:
        print(problem)
    errors = [p for p in problems if strict_density or not p.warning]
    warnings = len(problems) - len(errors)
    summary = f"site check: {len(errors)} error(s), {warnings} warning(s)"
    print(summary, file=sys.stderr)
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html", help="the built site")
    parser.add_argument("--book", type=Path, default=ROOT / "book", help="notebooks and pages")
    parser.add_argument("--bib", type=Path, default=ROOT / "book" / "references.bib")
    parser.add_argument("--no-html", action="store_true", help="check the sources only")
    parser.add_argument("--max-words", type=int, default=MAX_WORDS, help="per markdown cell")
    parser.add_argument("--strict-density", action="store_true", help="long markdown cells fail")
    args = parser.parse_args(argv)
    html = None if args.no_html else args.html
    for label, path in (("--html", html), ("--book", args.book), ("--bib", args.bib)):
        if path is not None and not path.exists():
            parser.error(f"{label} {path} does not exist (build the site first?)")
    return report(run(html, args.book, args.bib, max_words=args.max_words), args.strict_density)


if __name__ == "__main__":
    sys.exit(main())
