# ruff: noqa: E501  (one wrong call per line reads best as a table, as in test_bad_input.py)
"""Wrong calls to ``posenc.explain`` (issue 35): each raises the right exception, naming the
argument, the value and what is allowed. ``RopeReport`` and ``RopeIssue`` are what it returns,
never built by a caller (listed with the other result types in test_bad_input_coverage)."""

from __future__ import annotations

import pytest

import posenc as pe

LLAMA = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128,
         "rope_theta": 10000.0}  # fmt: skip

CASES = [
    # (public name, wrong call, exception, substring naming the argument)
    ("explain", lambda: pe.explain(3), TypeError, "config must be a transformers config"),
    ("explain", lambda: pe.explain("/nonexistent/config.json"), ValueError, "config path '/nonexistent/config.json' is not a file"),
    ("explain", lambda: pe.explain(LLAMA, context=-1), ValueError, "context must be an int >= 1, got -1"),
    ("explain", lambda: pe.explain(LLAMA, context="x"), TypeError, "context must be an int, got 'x'"),
]


@pytest.mark.parametrize(
    "name, call, exc, text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_wrong_call_raises_naming_the_argument(name, call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)


def test_the_right_call_still_works():
    report = pe.explain(LLAMA, context=512)
    assert report.target_length == 512 and report.training_length == 128
