"""The bibliography list labelled the way the text cites: ``[Press et al., 2022]``.

The pages cite with sphinxcontrib-bibtex's ``author_year`` referencing style ("Press et al.,
2022"); pybtex's list styles label entries ``[1]`` or ``[PSL22]``, which a reader cannot match
to the text. This Sphinx extension registers the pybtex formatting style ``author_year``:
``unsrt``'s entry format, sorted as the labels read, labelled with the same author-year
text as the citations (one author: ``Su``; two: ``Press and Lewis``; more: ``Press et al.``;
``a``/``b`` after the year when two labels would be equal). ``_config.yml`` loads it through
``sphinx.local_extensions`` and sets ``bibtex_default_style: author_year``.
"""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting import BaseSortingStyle


def _last(person: Any) -> str:
    return Text.from_latex(" ".join(person.last_names)).render_as("text")


def author_year(entry: Any) -> str:
    """``Vaswani et al., 2017`` for one bibliography entry (authors, else editors, else title)."""
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_last(p) for p in persons]
    if not names:
        who = Text.from_latex(entry.fields.get("title", entry.key)).render_as("text")
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabelStyle(BaseLabelStyle):
    def format_labels(self, sorted_entries: Iterable[Any]) -> Iterator[str]:
        entries = list(sorted_entries)
        labels = [author_year(e) for e in entries]
        count = Counter(labels)
        seen: Counter[str] = Counter()
        for label in labels:
            if count[label] > 1:  # Smith, 2020a / Smith, 2020b
                yield label + string.ascii_lowercase[seen[label]]
                seen[label] += 1
            else:
                yield label


class AuthorYearSortingStyle(BaseSortingStyle):
    """Sorted as the labels read (``BigScience Workshop`` under B, not after ``Yang``)."""

    def sorting_key(self, entry: Any) -> tuple[str, str]:
        title = Text.from_latex(entry.fields.get("title", "")).render_as("text")
        return author_year(entry).casefold(), title.casefold()


class AuthorYearStyle(UnsrtStyle):
    default_label_style = "author_year"
    default_sorting_style = "author_year"


def setup(app: Any) -> dict[str, Any]:
    register_plugin("pybtex.style.labels", "author_year", AuthorYearLabelStyle)
    register_plugin("pybtex.style.sorting", "author_year", AuthorYearSortingStyle)
    register_plugin("pybtex.style.formatting", "author_year", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
