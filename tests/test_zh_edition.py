"""The Chinese edition (book/zh) keeps the English code, cell by cell, and the English structure.

Only markdown cells, figure captions and alt text differ, plus one declared line in the setup
cell: ``LANG = "en"`` -> ``LANG = "zh"``. scripts/zh_sync.py makes the Chinese notebooks from the
English ones; this test fails CI when the two editions drift apart.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK, ZH = ROOT / "book", ROOT / "book" / "zh"
sys.path.insert(0, str(ROOT / "scripts"))
import zh_sync  # noqa: E402

CJK = re.compile(r"[\u4e00-\u9fff]")
# house typography: a space between a Chinese character and Latin letters, digits or code
UNSPACED = re.compile(r"[\u4e00-\u9fff][A-Za-z0-9`]|[A-Za-z0-9`][\u4e00-\u9fff]")
# a {term} link renders as its text alone: "在{term}`滑动窗口`缓存里" reads 在滑动窗口缓存里
TERM_LINK = re.compile(r"\{term\}`([^`<]*?)(?: <[^>`]*>)?`")
CHAPTERS = [p.name for p in zh_sync.chapters()]


def _chapter_params():
    for name in CHAPTERS:  # every English chapter has its Chinese counterpart
        yield pytest.param(name, id=name.removesuffix(".ipynb"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _cells(nb: dict, kind: str) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == kind]


def _markdown(nb: dict) -> str:
    return "\n".join(zh_sync.text(c) for c in _cells(nb, "markdown"))


def _structure(nb: dict) -> dict[str, object]:
    md = _markdown(nb)
    md = re.sub(r"^```.*?^```", lambda m: m.group(0) if "{" in m.group(0)[:20] else "", md,
                flags=re.MULTILINE | re.DOTALL)  # headings inside plain code blocks do not count
    figures = [c["metadata"]["mystnb"]["figure"].get("name") for c in _cells(nb, "code")
               if c.get("metadata", {}).get("mystnb", {}).get("figure")]
    return {
        "sections": len(re.findall(r"^## ", md, flags=re.MULTILINE)),
        "figures": figures,
        "exercises": re.findall(r"^```\{exercise\}.*\n:label: (\S+)", md, flags=re.MULTILINE),
        "solutions": re.findall(r"^```\{solution(?:-start)?\} (\S+)", md, flags=re.MULTILINE),
        "labels": re.findall(r"^\((\S+)\)=", md, flags=re.MULTILINE),
        "cites": sorted(set(re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", md))),
    }


def _toc_files(path: Path) -> list[str]:
    toc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [c["file"] for part in toc["parts"] for c in part["chapters"]]


@pytest.mark.parametrize("name", _chapter_params())
def test_code_cells_identical(name):
    en, zh = _load(BOOK / name), _load(ZH / name)
    en_code, zh_code = _cells(en, "code"), _cells(zh, "code")
    assert len(zh_code) == len(en_code), "the two editions have different numbers of code cells"
    for i, (a, b) in enumerate(zip(en_code, zh_code, strict=True)):
        source = zh_sync.text(a)
        if i == 1:
            assert len(re.findall(r'^LANG = "en"', source, flags=re.MULTILINE)) == 1, (
                'the English setup cell (second code cell) declares LANG = "en" once'
            )
            source = source.replace('LANG = "en"', 'LANG = "zh"')
        assert zh_sync.text(b) == source, f"code cell {i} (id {a.get('id')}) differs; run scripts/zh_sync.py"
        assert b.get("id") == a.get("id")
        assert b["metadata"].get("tags") == a["metadata"].get("tags")


@pytest.mark.parametrize("name", _chapter_params())
def test_same_structure(name):
    en, zh = _structure(_load(BOOK / name)), _structure(_load(ZH / name))
    assert zh == en


@pytest.mark.parametrize("name", _chapter_params())
def test_translated(name):
    zh = _load(ZH / name)
    assert not zh_sync.todo_cells(zh), "TODO translate markers left"
    assert "TODO translate" not in (ZH / name).read_text(encoding="utf-8")
    unspaced = UNSPACED.findall(TERM_LINK.sub(r"\1", _markdown(zh)))  # a {term} link reads as its text
    assert not unspaced, f"no space between Chinese and Latin text: {unspaced}"
    title = zh_sync.text(_cells(zh, "markdown")[0])
    assert title.startswith("# ") and CJK.search(title.splitlines()[0]), "a Chinese title"
    for cell in _cells(zh, "code"):
        caption, alt = zh_sync.figure_text(cell)
        if caption or alt:
            assert CJK.search(caption) and CJK.search(alt), f"figure {cell['id']}: Chinese caption and alt"
    assert zh_sync.main(["--check", name]) == 0


def test_toc_lists_the_same_chapters():
    en = [f.removeprefix("book/") for f in _toc_files(ROOT / "_toc.yml") if re.match(r"book/\d\d_", f)]
    zh = [f for f in _toc_files(ZH / "_toc.yml") if re.match(r"\d\d_", f)]
    translated = [f for f in en if (ZH / f"{f}.ipynb").exists()]
    assert zh == translated, "book/zh/_toc.yml lists the translated chapters in the English order"
    assert translated == en, f"not translated: {sorted(set(en) - set(translated))}"


def test_pages_that_are_not_chapters():
    zh_toc = yaml.safe_load((ZH / "_toc.yml").read_text(encoding="utf-8"))
    assert zh_toc["root"] == "intro"
    assert {"glossary", "api", "bibliography"} <= set(_toc_files(ZH / "_toc.yml"))
    for page in ("intro", "glossary", "api", "bibliography"):
        text = (ZH / f"{page}.md").read_text(encoding="utf-8")
        assert CJK.search(text.splitlines()[0]), f"book/zh/{page}.md has a Chinese title"
        assert zh_sync.unwrap_cjk(text) == text, f"book/zh/{page}.md: run scripts/zh_sync.py"
        prose = TERM_LINK.sub(r"\1", text)
        assert not UNSPACED.findall(prose), f"book/zh/{page}.md: space Chinese from Latin text"
    # the API page runs the same autodoc directives as the English one
    blocks = re.compile(r"^```\{eval-rst\}\n.*?^```", re.MULTILINE | re.DOTALL)
    en_api, zh_api = (p.read_text(encoding="utf-8") for p in (BOOK / "api.md", ZH / "api.md"))
    assert blocks.findall(zh_api) == blocks.findall(en_api)


def test_glossary_has_every_english_term():
    english = BOOK / "glossary.md"
    if not english.exists():
        pytest.skip("no English glossary on this branch")
    terms = re.findall(r"^([A-Z][^\n]*)\n(?=(?:[A-Z][^\n]*\n)*  )",
                       english.read_text(encoding="utf-8").split("```{glossary}")[1], flags=re.MULTILINE)
    zh = (ZH / "glossary.md").read_text(encoding="utf-8")
    missing = [t for t in terms if not re.search(rf"^{re.escape(t)}$", zh, flags=re.MULTILINE)]
    assert not missing, f"terms missing from book/zh/glossary.md: {missing}"


def test_configs_in_step():
    en = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    zh = yaml.safe_load((ZH / "_config.yml").read_text(encoding="utf-8"))
    assert "book/zh/**" in en["exclude_patterns"]
    assert zh["sphinx"]["config"]["language"] == "zh_CN"
    assert zh["repository"]["path_to_book"] == "book/zh"
    assert zh["repository"]["url"] == en["repository"]["url"]
    assert zh["sphinx"]["extra_extensions"] == en["sphinx"]["extra_extensions"]
    for key in ("execute", "parse", "launch_buttons"):
        assert zh[key] == en[key], key
    paths = {"language", "html_static_path", "intersphinx_mapping"}
    paths |= {"nb_code_prompt_show", "nb_code_prompt_hide"}  # the fold toggle's words
    paths |= {"togglebutton_hint", "togglebutton_hint_hide"}  # the dropdowns' words
    paths |= {"ogp_image_alt"}  # the social card's alt text, in each language
    en_config = {k: v for k, v in en["sphinx"]["config"].items() if k not in paths}
    zh_config = {k: v for k, v in zh["sphinx"]["config"].items() if k not in paths}
    assert zh_config == en_config
    assert en["sphinx"]["config"]["html_js_files"] == ["lang-switch.js"]
    assert (BOOK / "_static" / "lang-switch.js").exists()
    en_inventories = en["sphinx"]["config"]["intersphinx_mapping"]
    for name, (url, inv) in zh["sphinx"]["config"]["intersphinx_mapping"].items():
        assert url == en_inventories[name][0]
        assert (ZH / inv).resolve() == (ROOT / en_inventories[name][1]).resolve()


def test_figure_labels_tables():
    from posenc.lab.labels import LANGS, labels, table

    modules = sorted(p.stem for p in (ROOT / "posenc" / "lab" / "labels").glob("ch[0-9][0-9].py"))
    assert modules, "at least the pilot chapter has a table"
    for chapter in modules:
        tables = table(chapter)  # raises if the languages differ in keys or {fields}
        assert set(tables) == set(LANGS)
        zh = json.dumps(tables["zh"], ensure_ascii=False)
        assert CJK.search(zh), f"{chapter}: the zh table is in Chinese"
    text = labels(1, "zh")
    with pytest.raises(KeyError, match="ch01.*'zh'"):
        text["no such label"]
    with pytest.raises(ValueError, match="lang"):
        labels("ch01", "fr")
    with pytest.raises(ValueError, match="chapter"):
        labels("chapter one", "en")
    with pytest.raises(TypeError, match="chapter"):
        labels(1.0, "en")


def test_chinese_figure_draws_without_missing_glyphs(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.lab import plot
    from posenc.lab.labels import labels

    text = labels("ch01", "zh")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph ... missing from font(s)" would raise here
        plot.use_book_style(lang="zh")
        assert plt.rcParams["font.sans-serif"][0] in plot.CJK_FONTS
        fig, ax = plot.figure()
        ax.plot([-2, -1, 0, 1], [-0.5, 0.25, 1, 0.5], label=text["causal_curve"])
        ax.set_title(text["sentence_a"] + " " + text["sentence_b"])
        ax.set_xlabel(text["key_n"])
        ax.set_ylabel(text["attention_weight"])
        ax.legend()
        fig.savefig(tmp_path / "zh.png")
        plt.close(fig)
        plot.use_book_style(lang="en")
        assert plt.rcParams["font.sans-serif"][0] not in plot.CJK_FONTS
    with pytest.raises(ValueError, match="lang"):
        plot.use_book_style(lang="cn")


def test_sync_keeps_translations_and_flags_changes():
    en = {
        "cells": [
            {"id": "t", "cell_type": "markdown", "metadata": {}, "source": "# Title"},
            {"id": "b", "cell_type": "code", "metadata": {}, "source": "import os", "outputs": [],
             "execution_count": None},
            {"id": "s", "cell_type": "code", "metadata": {}, "source": 'LANG = "en"\nx = 1',
             "outputs": [], "execution_count": None},
            {"id": "f", "cell_type": "code", "outputs": [], "execution_count": None, "source": "plot()",
             "metadata": {"mystnb": {"figure": {"caption": "A curve.", "name": "fig-x"},
                                     "image": {"alt": "A rising curve."}}}},
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }
    zh, notes = zh_sync.sync(en, None, "x.ipynb")
    assert zh_sync.text(zh["cells"][2]) == 'LANG = "zh"\nx = 1'
    assert set(zh_sync.todo_cells(zh)) == {"t", "f"}
    zh["cells"][0]["source"] = "# 标题"
    zh_sync.set_figure_text(zh["cells"][3], "一条曲线。", "一条上升的曲线。")
    again, _ = zh_sync.sync(en, zh, "x.ipynb")
    assert zh_sync.todo_cells(again) == [] and zh_sync.text(again["cells"][0]) == "# 标题"
    # ids renumbered by a plain nbstripout: the translations are found by the English text
    renumbered = json.loads(json.dumps(en))
    for i, cell in enumerate(renumbered["cells"]):
        cell["id"] = str(i)
    moved, _ = zh_sync.sync(renumbered, again, "x.ipynb")
    assert zh_sync.todo_cells(moved) == [] and zh_sync.figure_text(moved["cells"][3])[0] == "一条曲线。"
    # the English text changes: the translation stays, marked for an update
    en["cells"][0]["source"] = "# A new title"
    changed, notes = zh_sync.sync(en, again, "x.ipynb")
    assert zh_sync.todo_cells(changed) == ["t"] and "# 标题" in zh_sync.text(changed["cells"][0])
    assert any("changed" in note for note in notes)


def test_export_import_round_trip():
    zh = _load(ZH / "01_why_order.ipynb")
    exported = zh_sync.export_text(zh)
    assert zh_sync.import_text(json.loads(json.dumps(zh)), exported) == 0  # nothing changed
    first = _cells(zh, "markdown")[0]["id"]
    edited = exported.replace("# 顺序为什么重要", "# 顺序为何重要", 1)
    copy = json.loads(json.dumps(zh))
    assert zh_sync.import_text(copy, edited) == 1
    assert zh_sync.text(next(c for c in copy["cells"] if c["id"] == first)).startswith("# 顺序为何重要")
    with pytest.raises(ValueError, match="not in the notebook"):
        zh_sync.import_text(copy, "<!-- zh_sync nosuchcell markdown -->\ntext\n")


def test_recipes_code_in_step():
    """The recipes page is not a chapter (zh_sync leaves it alone), so its editions are compared
    here: the same cells, the same code but for the setup's ``LANG`` line, the same structure."""
    en, zh = _load(BOOK / "recipes.ipynb"), _load(ZH / "recipes.ipynb")
    assert [c.get("id") for c in zh["cells"]] == [c.get("id") for c in en["cells"]]
    for a, b in zip(_cells(en, "code"), _cells(zh, "code"), strict=True):
        source = zh_sync.text(a).replace('LANG = "en"', 'LANG = "zh"')
        assert zh_sync.text(b) == source, f"recipes code cell {a.get('id')} differs between editions"
    assert _structure(zh) == _structure(en)


def test_your_model_page_in_step():
    """"Your model's positions" is a reference page, not a chapter (zh_sync leaves it alone):
    the same cells and code but for ``LANG``, the same structure, Chinese prose spaced from
    Latin text, Chinese captions, listed in both tables of contents."""
    en, zh = _load(BOOK / "your_model.ipynb"), _load(ZH / "your_model.ipynb")
    assert [c.get("id") for c in zh["cells"]] == [c.get("id") for c in en["cells"]]
    for a, b in zip(_cells(en, "code"), _cells(zh, "code"), strict=True):
        source = zh_sync.text(a).replace('LANG = "en"', 'LANG = "zh"')
        assert zh_sync.text(b) == source, f"code cell {a.get('id')} differs between editions"
        assert b["metadata"].get("tags") == a["metadata"].get("tags")
    assert _structure(zh) == _structure(en)
    unspaced = UNSPACED.findall(TERM_LINK.sub(r"\1", _markdown(zh)))
    assert not unspaced, f"no space between Chinese and Latin text: {unspaced}"
    assert CJK.search(zh_sync.text(_cells(zh, "markdown")[0]).splitlines()[0])
    for cell in _cells(zh, "code"):
        caption, alt = zh_sync.figure_text(cell)
        if caption or alt:
            assert CJK.search(caption) and CJK.search(alt), f"figure {cell['id']}: Chinese text"
    assert "book/your_model" in _toc_files(ROOT / "_toc.yml")
    assert "your_model" in _toc_files(ZH / "_toc.yml")
