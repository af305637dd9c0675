"""Proof that nothing changed (issue 33): the golden battery, bit for bit.

``tests/golden/cases.py`` holds ~260 named calls into posenc's public API (``attend`` over the
schemes, backends, layouts, softmax options and dtypes, gradients, dropout under a fixed seed,
the caches' full public state after every step, ``attend_varlen``, ``MultiHeadAttention``,
``posenc.hf.use`` on tiny Llama / Mistral / Gemma 2 / gpt-oss models, and a grid of wrong calls
with their exception type and message); ``tests/golden/golden.pt`` holds their results recorded
at the base commit. This test reruns the battery and compares every tensor with
``torch.equal`` (same dtype and shape too) and every string exactly; the failure lists the
differing cases.

Re-record with::

    PYTHONPATH=$PWD python tests/golden/record.py          # rewrites tests/golden/golden.pt
    PYTHONPATH=$PWD python tests/golden/record.py --check  # lists the differences only

The rule: re-recording is allowed only for an intended, listed change (for example a unified
error message), and the commit that re-records names that change and the cases it touches.
A restructuring commit never re-records. Adding cases is fine (record at a commit where the
new cases' results are already trusted).

Left out at the base: flex cases that compile (20-40 s each on CPU, over this test's 30 s
budget); the one flex case kept falls back to sdpa while training.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from record import FIXTURE, unchanged  # noqa: E402


def test_golden_battery_is_bit_for_bit_unchanged():
    report = unchanged(FIXTURE)
    assert not report, report
