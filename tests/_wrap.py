"""Checker output as one line per message, for tests that look for a hint in it.

:func:`posenc.lab.exercises.wrap_message` breaks a long verdict into lines of a page's width; a
break at a space drops the space, a break between two Chinese characters drops nothing, and each
continuation line starts with two spaces. :func:`flat` undoes that.
"""

from __future__ import annotations

import re
import unicodedata

_BREAK = re.compile(r"(.?)\n  (?=(\S))")


def _wide(c: str) -> bool:
    return bool(c) and unicodedata.east_asian_width(c) in "WF"


def flat(text: str) -> str:
    """``text`` with every continuation break joined back: with a space unless both sides are
    wide (Chinese) characters."""
    return _BREAK.sub(lambda m: m[1] + ("" if _wide(m[1]) and _wide(m[2]) else " "), text)
