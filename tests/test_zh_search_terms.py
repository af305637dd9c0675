"""The Chinese edition's search finds the glossary's terms whole, chapter 10's included.

Sphinx cuts Chinese text into words with jieba (``cut_for_search``) and looks a query up as one
word, so a term is found only when jieba, with the user dictionary ``scripts/site_meta.py`` writes
from ``book/zh/glossary.md``, yields it whole inside a sentence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "book" / "zh" / "glossary.md"
CHAPTER_10 = ("注意力汇聚点", "序列打包", "文档掩码", "位置重置", "滑动窗口", "淘汰", "上下文并行",
              "负载均衡", "图中断", "主机同步", "重新编译")  # fmt: skip


def test_chapter_10_terms_are_in_the_dictionary():
    terms = load_script("site_meta").glossary_terms(GLOSSARY)
    assert [t for t in CHAPTER_10 if t not in terms] == []


def test_every_glossary_term_is_found_whole(tmp_path: Path):
    jieba = pytest.importorskip("jieba")
    meta = load_script("site_meta")
    path = meta.write_search_dict(GLOSSARY.parent, tmp_path)
    tokenizer = jieba.Tokenizer()
    tokenizer.load_userdict(str(path))
    terms = meta.glossary_terms(GLOSSARY)
    cut = {t: tokenizer.lcut_for_search(f"本章讨论{t}的问题") for t in terms}
    assert [t for t in terms if t not in cut[t]] == []
    # 注意力汇聚点 (attention sink) is not d2l's 注意力汇聚 (attention pooling): indexed whole
    assert "注意力汇聚点" in tokenizer.lcut_for_search("比较有无注意力汇聚点的区别")
