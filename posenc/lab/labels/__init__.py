"""Figure text (titles, axis labels, legends, tick labels) per chapter and language.

The book has an English and a Chinese edition whose code cells are identical; the one line that
differs is ``LANG = "en"`` / ``LANG = "zh"`` in each chapter's setup cell. Every string a figure
draws comes from the chapter's table, chosen by ``LANG``::

    from posenc.lab.labels import labels
    text = labels("ch01", LANG)   # or labels(1, LANG)
    ax.set_xlabel(text["key_n"])

Each chapter's table is a module ``posenc.lab.labels.chNN`` (a reference page's is named after
the page: ``your_model``) holding ``LABELS = {"en": {...},
"zh": {...}}``; both languages have the same keys (values are strings, or dicts of strings, e.g.
tick labels per word), and the same ``{placeholders}`` in each string.
"""

from __future__ import annotations

import importlib
import re
import string
from typing import Any

LANGS = ("en", "zh")


class Labels(dict):
    """A chapter's strings in one language; a missing key names the chapter and language."""

    def __init__(self, chapter: str, lang: str, table: dict[str, Any]) -> None:
        super().__init__(table)
        self.chapter, self.lang = chapter, lang

    def __missing__(self, key: str) -> Any:
        raise KeyError(
            f"no figure label {key!r} for chapter {self.chapter} in language {self.lang!r}; "
            f"add it to posenc/lab/labels/{self.chapter}.py (known: {', '.join(sorted(self))})"
        )


def _chapter_name(chapter: str | int) -> str:
    if isinstance(chapter, bool) or not isinstance(chapter, (str, int)):
        raise TypeError(f"chapter must be an int or a str like 'ch01', got {chapter!r}")
    if isinstance(chapter, int):
        return f"ch{chapter:02d}"
    if not re.fullmatch(r"ch\d\d|[a-z][a-z0-9]*(?:_[a-z0-9]+)*", chapter):
        raise ValueError(f"chapter must look like 'ch01' (or be an int), or name a reference "
                         f"page like 'your_model', got {chapter!r}")
    return chapter


def _fields(value: Any) -> Any:
    """The shape of a label value: its format fields (strings) or its keys (dicts)."""
    if isinstance(value, dict):
        return {key: _fields(item) for key, item in value.items()}
    return sorted(name for _, name, _, _ in string.Formatter().parse(value) if name is not None)


def table(chapter: str | int) -> dict[str, dict[str, Any]]:
    """The chapter's ``LABELS`` for every language, checked: same keys and fields in each."""
    name = _chapter_name(chapter)
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise ValueError(f"no figure labels for chapter {name!r} (posenc/lab/labels/{name}.py)") from None
    tables: dict[str, dict[str, Any]] = module.LABELS
    if set(tables) != set(LANGS):
        raise ValueError(f"{name}.LABELS must have the languages {LANGS}, got {sorted(tables)}")
    reference = _fields(tables["en"])
    for lang in LANGS:
        if _fields(tables[lang]) != reference:
            raise ValueError(
                f"{name}.LABELS[{lang!r}] does not have the same keys and {{fields}} as 'en'"
            )
    return tables


def labels(chapter: str | int, lang: str) -> Labels:
    """The figure strings of ``chapter`` (``"ch01"`` or ``1``) in ``lang`` (``"en"`` or ``"zh"``)."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    name = _chapter_name(chapter)
    return Labels(name, lang, table(name)[lang])
