"""Keep the Chinese notebooks (book/zh/NN_x.ipynb) in step with the English ones (book/NN_x.ipynb).

The two editions share their code: a Chinese notebook has the English notebook's code cells,
verbatim and in the same order, except the one declared line of the setup cell (the second code
cell), ``LANG = "en"`` -> ``LANG = "zh"``. Only markdown cells, and the caption and alt text of
figure cells (``mystnb`` metadata), are Chinese.

    python scripts/zh_sync.py                  # every English chapter
    python scripts/zh_sync.py 01_why_order     # one chapter (name or path)
    python scripts/zh_sync.py --check          # change nothing; exit 1 if anything is out of step
    python scripts/zh_sync.py 01_why_order --export /tmp/ch01.md   # the Chinese text, to edit
    python scripts/zh_sync.py 01_why_order --import /tmp/ch01.md   # ... and back into the notebook

What a sync does, cell by cell, matching the cells of the two notebooks by cell ``id``:

- gives the English notebook's cells ids where they have none (nbformat 4.5; ids are kept by
  Jupyter and by ``nbstripout --keep-id``; plain ``nbstripout`` renumbers them, so use --keep-id);
- code cells: copied from English (source, tags); figure caption and alt text are kept from the
  Chinese cell with the same id, or copied in English prefixed ``TODO translate:``;
- markdown cells: kept from the Chinese cell with the same id; a new English cell is copied with
  ``<!-- TODO translate -->`` on its first line; a Chinese cell whose English original changed
  since it was translated gets ``<!-- TODO translate: the English cell changed ... -->`` holding
  the new English text. Each Chinese cell records the SHA-1 of the English text it translates in
  its metadata (``zh_sync.en_sha``);
- Chinese cells whose id no longer exists in English are dropped (and listed);
- the lines of each Chinese paragraph are joined (a line break renders as a space, wrong between
  Chinese characters), in the notebooks and in book/zh/*.md.

``--check`` fails (exit 1) when a Chinese notebook is missing, when a sync would change it (a code
cell differs, cells moved, an English text changed), or when a TODO marker is left.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
ZH = BOOK / "zh"
CHAPTER = re.compile(r"\d\d_\w+\.ipynb")
LANG_EN = re.compile(r'^LANG = "en"', re.MULTILINE)
TODO = "TODO translate"
NEW_MARK = "<!-- TODO translate -->\n"
CAPTION_MARK = "TODO translate: "


CJK_CHAR = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef\u201c\u201d\u2018\u2019\u2026\u2014]")
IDEOGRAPH = re.compile(r"[\u2e80-\u2fff\u3400-\u9fff\uf900-\ufaff]")
BLOCK_START = re.compile(r"^\s*([-*+>|:#]|\d+[.)]\s|\$\$|```|\(\S+\)=|\{|<!--)")


def unwrap_cjk(markdown: str) -> str:
    """Join the lines of each paragraph where the break falls next to a Chinese character.

    A line break inside a paragraph renders as a space, which is right between English words and
    wrong in Chinese ("位置 编码"). Code blocks, math blocks, tables, list items, headings and
    directive options keep their lines; inside ``{glossary}`` only the indented definitions join.
    """
    out: list[str] = []
    fence: str | None = None  # the directive name of the open ``` block, "" for plain code
    math = False
    for line in markdown.split("\n"):
        stripped = line.strip()
        if stripped.startswith("```"):
            if fence is None:
                match = re.match(r"```\{([\w-]+)\}", stripped)
                fence = match.group(1) if match else ""
            elif stripped == "```":
                fence = None
            out.append(line)
            continue
        if stripped == "$$":
            math = not math
            out.append(line)
            continue
        prose = fence in (None, "exercise", "solution", "glossary") and not math
        previous = out[-1] if out else ""
        joinable = (
            prose
            and stripped
            and previous.strip()
            and not previous.strip().startswith(("```", "$$", "|", "#", ":", "<!--"))
            and not BLOCK_START.match(line)
            and (fence != "glossary" or (line.startswith("  ") and previous.startswith("  ")))
            and (CJK_CHAR.match(previous.rstrip()[-1]) or CJK_CHAR.match(stripped[0]))
        )
        if joinable:
            a, b = previous.rstrip()[-1], stripped[0]
            # house typography: a space between a Chinese character and Latin text, code or math
            latin = re.compile(r"[A-Za-z0-9`$*_)\]]"), re.compile(r"[A-Za-z0-9`$*_(\[{]")
            spaced = (IDEOGRAPH.match(a) and latin[1].match(b)) or (latin[0].match(a) and IDEOGRAPH.match(b))
            out[-1] = previous.rstrip() + (" " if spaced else "") + stripped
        else:
            out.append(line)
    return "\n".join(out)


def chapters() -> list[Path]:
    """The English chapter notebooks, in order."""
    return sorted(p for p in BOOK.glob("*.ipynb") if CHAPTER.fullmatch(p.name))


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def dump(nb: dict) -> str:
    """The notebook as nbformat writes it (sorted keys, indent 1, UTF-8)."""
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def normal(nb: dict) -> list:
    """What matters of a notebook: per cell its id, type, text and metadata."""
    return [(c.get("id"), c["cell_type"], text(c), c.get("metadata", {})) for c in nb["cells"]]


def text(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def lines(source: str) -> list[str]:
    """A notebook source as the line list Jupyter writes."""
    parts = source.split("\n")
    return [line + "\n" for line in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def sha(value: str) -> str:
    return hashlib.sha1(value.encode("utf-8")).hexdigest()


def figure_text(cell: dict) -> tuple[str, str]:
    """(caption, alt) of a figure cell; empty strings when absent."""
    meta = cell.get("metadata", {})
    caption = meta.get("mystnb", {}).get("figure", {}).get("caption", "")
    alt = meta.get("mystnb", {}).get("image", {}).get("alt", "")
    return caption, alt


def set_figure_text(cell: dict, caption: str, alt: str) -> None:
    mystnb = cell["metadata"].setdefault("mystnb", {})
    if caption:
        mystnb.setdefault("figure", {})["caption"] = caption
    if alt:
        mystnb.setdefault("image", {})["alt"] = alt


def ensure_ids(nb: dict) -> bool:
    """Give every cell a stable id (nbformat 4.5); True if the notebook changed."""
    changed = nb.get("nbformat_minor", 0) < 5
    nb["nbformat"], nb["nbformat_minor"] = 4, max(5, nb.get("nbformat_minor", 0))
    # ids "0", "1", ... are what plain nbstripout writes: they move when a cell is inserted
    positional = [cell.get("id") for cell in nb["cells"]] == [str(i) for i in range(len(nb["cells"]))]
    seen: set[str] = set()
    for cell in nb["cells"]:
        if positional or not cell.get("id") or cell["id"] in seen:
            cell["id"] = uuid.uuid4().hex[:8]
            changed = True
        seen.add(cell["id"])
    return changed


def zh_code(source: str, index: int, name: str) -> str:
    """The Chinese version of a code cell: the setup cell's LANG line swapped, else verbatim."""
    if index != 1:
        return source
    if len(LANG_EN.findall(source)) != 1:
        raise ValueError(
            f"{name}: the setup cell (the second code cell) must contain exactly one line "
            'starting with LANG = "en" (see the README, 中文版)'
        )
    return LANG_EN.sub('LANG = "zh"', source)


def sync(en: dict, zh: dict | None, name: str) -> tuple[dict, list[str]]:
    """The Chinese notebook for ``en`` (ids already ensured), and notes on what changed."""
    zh_cells = (zh or {"cells": []})["cells"]
    old = {cell["id"]: cell for cell in zh_cells if cell.get("id")}
    # second way to find a translation: the SHA-1 of the English text it was made from (survives
    # ids renumbered by a plain nbstripout)
    by_sha = {cell["metadata"]["zh_sync"]["en_sha"]: cell for cell in zh_cells
              if cell.get("metadata", {}).get("zh_sync", {}).get("en_sha")}
    notes: list[str] = []
    cells = []
    matched: set[str] = set()
    code_index = 0
    for cell in en["cells"]:
        source, previous = text(cell), old.get(cell["id"])
        caption, alt = figure_text(cell)
        key = sha(caption + "\0" + alt) if cell["cell_type"] == "code" else sha(source)
        if previous is None or previous["metadata"].get("zh_sync", {}).get("en_sha") != key:
            previous = by_sha.get(key, previous)
        if previous is not None and previous["cell_type"] != cell["cell_type"]:
            previous = None
        if previous is not None:
            matched.add(previous["id"])
        if cell["cell_type"] == "code":
            new = {
                "id": cell["id"],
                "cell_type": "code",
                "execution_count": None,
                "metadata": copy.deepcopy(cell.get("metadata", {})),
                "outputs": [],
                "source": lines(zh_code(source, code_index, name)),
            }
            code_index += 1
            if caption or alt:
                en_sha = key
                translated = previous is not None and previous["metadata"].get("zh_sync", {})
                if translated and translated.get("en_sha") == en_sha:
                    set_figure_text(new, *figure_text(previous))
                else:
                    notes.append(f"figure {cell['id']}: caption and alt to translate")
                    set_figure_text(new, *(CAPTION_MARK + t if t else t for t in (caption, alt)))
                new["metadata"]["zh_sync"] = {"en_sha": en_sha}
        else:
            en_sha = key
            new = {
                "id": cell["id"],
                "cell_type": cell["cell_type"],
                "metadata": copy.deepcopy(cell.get("metadata", {})),
                "source": lines(NEW_MARK + source),
            }
            if previous is None:
                notes.append(f"markdown {cell['id']}: new, to translate")
            elif previous["metadata"].get("zh_sync", {}).get("en_sha") == en_sha:
                new["source"] = lines(unwrap_cjk(text(previous)))
            else:
                notes.append(f"markdown {cell['id']}: the English changed, to update")
                body = text(previous)
                if not body.startswith("<!-- TODO translate: the English cell changed"):
                    english = source.replace("--", "- -")  # keep the HTML comment well formed
                    mark = f"<!-- TODO translate: the English cell changed; it now reads:\n{english}\n-->\n"
                    body = mark + body
                new["source"] = lines(body)
            new["metadata"]["zh_sync"] = {"en_sha": en_sha}
        cells.append(new)
    kept = {cell["metadata"].get("zh_sync", {}).get("en_sha") for cell in cells}
    dropped = []  # translations that no English cell uses any more
    for cell_id, cell in old.items():
        en_sha = cell.get("metadata", {}).get("zh_sync", {}).get("en_sha")
        if en_sha is not None and cell_id not in matched and en_sha not in kept:
            dropped.append(cell_id)
    notes += [f"cell {cell_id}: its English original is gone, translation dropped" for cell_id in dropped]
    result = {
        "cells": cells,
        "metadata": copy.deepcopy(en.get("metadata", {})),
        "nbformat": 4,
        "nbformat_minor": en["nbformat_minor"],
    }
    return result, notes


def todo_cells(nb: dict) -> list[str]:
    """Ids of cells that still carry a TODO marker (in source, caption or alt)."""
    return [
        cell["id"]
        for cell in nb["cells"]
        if TODO in text(cell) and cell["cell_type"] == "markdown"
        or any(t.startswith(CAPTION_MARK) for t in figure_text(cell))
    ]


SECTION = re.compile(r"^<!-- zh_sync (\S+) (markdown|caption|alt) -->\n", re.MULTILINE)


def export_text(zh: dict) -> str:
    """The translatable text of a Chinese notebook as one Markdown file, a section per piece."""
    parts = []
    for cell in zh["cells"]:
        if cell["cell_type"] == "markdown":
            parts.append(f"<!-- zh_sync {cell['id']} markdown -->\n{text(cell)}\n")
        else:
            caption, alt = figure_text(cell)
            if caption or alt:
                parts.append(f"<!-- zh_sync {cell['id']} caption -->\n{caption}\n")
                parts.append(f"<!-- zh_sync {cell['id']} alt -->\n{alt}\n")
    return "\n".join(parts)


def import_text(zh: dict, exported: str) -> int:
    """Put the sections of an exported file back into ``zh``; the number of pieces changed."""
    cells = {cell["id"]: cell for cell in zh["cells"]}
    pieces = SECTION.split(exported)[1:]  # id, kind, body, id, kind, body, ...
    changed = 0
    for cell_id, kind, body in zip(pieces[0::3], pieces[1::3], pieces[2::3], strict=True):
        if cell_id not in cells:
            raise ValueError(f"cell {cell_id} is not in the notebook (was the file exported from it?)")
        cell, body = cells[cell_id], body.rstrip("\n")
        if kind == "markdown":
            if text(cell) != body:
                cell["source"], changed = lines(body), changed + 1
        else:
            caption, alt = figure_text(cell)
            new = (body, alt) if kind == "caption" else (caption, body)
            if new != (caption, alt):
                set_figure_text(cell, *new)
                changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="chapter names or paths (default: all)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if out of step")
    parser.add_argument("--export", metavar="FILE", help="write one chapter's Chinese text to FILE")
    parser.add_argument("--import", dest="import_", metavar="FILE",
                        help="read one chapter's Chinese text back from FILE, then sync")
    args = parser.parse_args(argv)
    if args.export or args.import_:
        if len(args.chapters) != 1:
            parser.error("--export and --import take exactly one chapter")
        zh_path = ZH / f"{Path(args.chapters[0]).stem}.ipynb"
        zh = load(zh_path)
        if args.export:
            Path(args.export).write_text(export_text(zh), encoding="utf-8")
            print(f"{zh_path.name}: text written to {args.export}")
            return 0
        changed = import_text(zh, Path(args.import_).read_text(encoding="utf-8"))
        zh_path.write_text(dump(zh), encoding="utf-8")
        print(f"{zh_path.name}: {changed} piece(s) of text taken from {args.import_}")

    paths = chapters()
    if args.chapters:
        wanted = {Path(c).stem for c in args.chapters}
        paths = [p for p in paths if p.stem in wanted]
        if missing := wanted - {p.stem for p in paths}:
            parser.error(f"no English chapter {sorted(missing)} in {BOOK}")
    problems = 0
    for en_path in paths:
        zh_path = ZH / en_path.name
        en = load(en_path)
        setup = [c for c in en["cells"] if c["cell_type"] == "code"][1:2]
        if not setup or len(LANG_EN.findall(text(setup[0]))) != 1:
            print(f'{en_path.name}: skipped, its setup cell does not declare LANG = "en" yet')
            problems += 1
            continue
        if ensure_ids(en):
            if args.check:
                print(f"{en_path.name}: English cells without ids (run scripts/zh_sync.py)")
                problems += 1
                continue
            en_path.write_text(dump(en), encoding="utf-8")
            print(f"{en_path.name}: gave the English cells ids")
        zh = load(zh_path) if zh_path.exists() else None
        if zh is None and args.check:
            print(f"{zh_path.relative_to(ROOT)}: missing")
            problems += 1
            continue
        new, notes = sync(en, zh, en_path.name)
        todo = todo_cells(new)
        for note in notes:
            print(f"{zh_path.name}: {note}")
        if args.check:
            if normal(new) != normal(zh):
                print(f"{zh_path.name}: out of step with {en_path.name} (run scripts/zh_sync.py)")
                problems += 1
            if todo:
                print(f"{zh_path.name}: TODO translate left in cells {', '.join(todo)}")
                problems += 1
        elif zh is None or normal(new) != normal(zh):
            ZH.mkdir(parents=True, exist_ok=True)
            zh_path.write_text(dump(new), encoding="utf-8")
            print(f"{zh_path.name}: written, {len(todo)} cell(s) to translate")
        else:
            print(f"{zh_path.name}: in step, {len(todo)} cell(s) to translate")
    if not args.chapters:  # the pages that are not chapters: paragraphs without CJK line breaks
        for page in sorted(ZH.glob("*.md")):
            body = page.read_text(encoding="utf-8")
            if unwrap_cjk(body) != body:
                if args.check:
                    print(f"{page.name}: line breaks inside Chinese paragraphs (run scripts/zh_sync.py)")
                    problems += 1
                else:
                    page.write_text(unwrap_cjk(body), encoding="utf-8")
                    print(f"{page.name}: joined the lines of its Chinese paragraphs")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
