"""Proof that nothing changed on FlexAttention (issue 33): the flex battery, bit for bit.

``tests/golden/cases_flex.py`` holds 162 named calls on ``backend="flex"`` (``attend`` with
every scheme in every layout of ``cases.layout`` -- causal and not, GQA / MQA, key positions,
padding, who-sees-whom masks, documents, window, window + sinks --, scale and softcap,
bfloat16, the sdpa fallbacks for gradients, dropout and sink logits, decode steps over a
growing, static and rolling cache, ``attend_varlen``, and ``MultiHeadAttention``);
``tests/golden/golden_flex.pt`` holds their results recorded at the base commit 830e6e5.
This test reruns the battery and compares every tensor with ``torch.equal`` (same dtype and
shape too) and every string exactly, as ``tests/test_golden.py`` does for the main battery.

The whole battery compiles ~100 FlexAttention graphs: ~30-60 s with inductor's on-disk cache
warm (one CPU thread), 10-15 minutes cold (a fresh CI machine). So the test suite runs a quick
slice of 47 cases (~30 graphs: every scheme plain, every layout with ALiBi, the softmax
options, bfloat16, the fallbacks, each cache kind, varlen and MultiHeadAttention), and
``POSENC_GOLDEN_FLEX=all`` (or ``record.py --flex --check``, before landing a change to
attention) runs all 162. Re-record (at the base, see ``tests/golden/record.py``) or check
with::

    PYTHONPATH=/path/to/base python tests/golden/record.py --flex          # golden_flex.pt
    PYTHONPATH=$PWD python tests/golden/record.py --flex --check           # differences only

The same rule as the main battery: re-record only for an intended, listed change, named in
the commit that re-records; a restructuring commit never re-records.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from record import FLEX_CASES, FLEX_FIXTURE, unchanged  # noqa: E402

QUICK = re.compile(
    r"attend/[^/]+/plain/flex/f32$|attend/alibi/[^/]+/flex/f32$|/sink_logits$|^grad/|^dropout/"
    r"|^attend/alibi/.*/(scale|softcap|scale_softcap|bf16)$|^attend/alibi/plain/flex/bf16$"
    r"|^cache/[^/]+/alibi/|^varlen/alibi/|^mha/(rope|alibi|t5)/flex"
)


def _cases() -> dict:
    if os.environ.get("POSENC_GOLDEN_FLEX") == "all":
        return FLEX_CASES
    return {name: run for name, run in FLEX_CASES.items() if QUICK.search(name)}


def test_the_quick_slice_covers_every_kind_of_case():
    names = set(_cases())
    assert 40 <= len(names) <= 80, len(names)
    kinds = {n.split("/")[0] for n in FLEX_CASES}
    assert kinds == {n.split("/")[0] for n in names}, kinds
    schemes = {n.split("/")[1] for n in FLEX_CASES if n.startswith("attend/")}
    assert schemes <= {n.split("/")[1] for n in names if n.startswith("attend/")}


def test_flex_battery_is_bit_for_bit_unchanged():
    report = unchanged(FLEX_FIXTURE, _cases(), "flex golden")
    assert not report, report
