"""Every public name of posenc and posenc.lab is tried with at least three wrong calls.

The tables live in ``tests/test_bad_input_*.py`` (one per area): each holds a module-level
``CASES = [(public_name, call, exception_type, substring), ...]`` and runs them. This test only
checks coverage, so a new public name without its wrong calls fails CI.
"""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path

import posenc
import posenc.lab

HERE = Path(__file__).parent
MIN_CASES = 3
# Names that take no arguments a caller could get wrong, or that are constants / namespaces.
NOT_CALLABLE_WITH_INPUT = {
    "ROPE_TYPES", "SCHEMES", "RopeWavelengths", "EvalResult", "Extrapolation", "TrainedModel",
    "plot", "Corpus", "RopeReport", "RopeIssue",  # explain's results, never built by a caller
}


def _all_cases() -> Counter:
    counts: Counter = Counter()
    for path in sorted(HERE.glob("test_bad_input_*.py")):
        if path.stem == "test_bad_input_coverage":
            continue
        module = importlib.import_module(path.stem)  # tests/ is on sys.path under pytest
        for case in getattr(module, "CASES", []):
            if isinstance(case[0], str):
                counts[case[0]] += 1
    return counts


def _public_names() -> list[str]:
    names = [n for n in posenc.__all__ if n not in NOT_CALLABLE_WITH_INPUT]
    names += [n for n in posenc.lab.__all__ if n not in NOT_CALLABLE_WITH_INPUT]
    return sorted(set(names))


def test_every_public_name_has_three_wrong_calls():
    counts = _all_cases()
    missing = {n: counts.get(n, 0) for n in _public_names() if counts.get(n, 0) < MIN_CASES}
    assert not missing, f"public names with fewer than {MIN_CASES} bad-input cases: {missing}"
