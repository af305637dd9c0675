"""Proof that nothing changed on FlexAttention (issue 33): the flex battery, bit for bit.

``tests/golden/cases_flex.py`` holds 162 named calls on ``backend="flex"`` (``attend`` with
every scheme in every layout of ``cases.layout`` -- causal and not, GQA / MQA, key positions,
padding, who-sees-whom masks, documents, window, window + sinks --, scale and softcap,
bfloat16, the sdpa fallbacks for gradients, dropout and sink logits, decode steps over a
growing, static and rolling cache, ``attend_varlen``, and ``MultiHeadAttention``);
``tests/golden/golden_flex.pt`` holds their results recorded at the base commit 830e6e5.
This test reruns the battery and compares every tensor with ``torch.equal`` (same dtype and
shape too) and every string exactly, as ``tests/test_golden.py`` does for the main battery.

It compiles ~100 FlexAttention graphs: ~30-60 s with inductor's on-disk cache warm (one CPU
thread), several minutes cold. Re-record (at the base, see ``tests/golden/record.py``) or
check with::

    PYTHONPATH=/path/to/base python tests/golden/record.py --flex          # golden_flex.pt
    PYTHONPATH=$PWD python tests/golden/record.py --flex --check           # differences only

The same rule as the main battery: re-record only for an intended, listed change, named in
the commit that re-records; a restructuring commit never re-records.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from record import FLEX_CASES, FLEX_FIXTURE, differences, record  # noqa: E402


def test_flex_battery_is_bit_for_bit_unchanged():
    want = torch.load(FLEX_FIXTURE)
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng():
            got = record(FLEX_CASES)
    finally:
        torch.set_num_threads(threads)
    diff = differences(want, got)
    cases = sorted({line.split(": ", 1)[0] for line in diff})
    assert not diff, (
        f"{len(cases)} flex golden case(s) differ: {cases}\n" + "\n".join(diff[:60])
        + "\n(re-record only for an intended, listed change: see this test's docstring)"
    )
