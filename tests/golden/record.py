"""Record the golden battery (tests/golden/cases.py) into tests/golden/golden.pt, or with
``--flex`` the flex battery (tests/golden/cases_flex.py) into tests/golden/golden_flex.pt.

    PYTHONPATH=$PWD python tests/golden/record.py           # write the fixture
    PYTHONPATH=$PWD python tests/golden/record.py --check   # compare with it, list differences
    PYTHONPATH=$PWD python tests/golden/record.py --flex [--check]   # the same for flex

Both fixtures were recorded at the base commit 830e6e5 (before the redesign of issue 33): to
record a battery there, run this file from the current checkout with the base's posenc first
on the path, and check that it was imported from there (the line printed first)::

    git worktree add --detach /tmp/base 830e6e5
    PYTHONPATH=/tmp/base python tests/golden/record.py --flex

Re-recording is allowed only for an intended, listed change (for example a unified error
message), named in the commit that re-records; see tests/test_golden.py.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if not os.environ.get("PYTHONPATH"):  # else it decides which posenc runs (the base's, say)
    sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from cases import CASES, run  # noqa: E402
from cases_flex import CASES as FLEX_CASES  # noqa: E402

import posenc  # noqa: E402

FIXTURE = HERE / "golden.pt"
FLEX_FIXTURE = HERE / "golden_flex.pt"


def record(cases: dict | None = None) -> dict[str, dict[str, object]]:
    """Run a battery (default: ``cases.CASES``) on one thread. Dynamo's recompile limit is
    raised for the run: the flex battery compiles more graphs of ``flex_attention`` than the
    default 8, past which dynamo would run it eagerly, with other numbers."""
    torch.set_num_threads(1)
    with torch._dynamo.config.patch(recompile_limit=1024, accumulated_recompile_limit=4096):
        return {name: run(fn) for name, fn in (CASES if cases is None else cases).items()}


def differences(want: dict, got: dict) -> list[str]:
    """The names of the cases whose results differ (``case: key``, or the whole case)."""
    out = []
    for name in sorted(set(want) | set(got)):
        a, b = want.get(name), got.get(name)
        if a is None or b is None:
            out.append(f"{name}: {'new case' if a is None else 'missing'}")
            continue
        for key in sorted(set(a) | set(b)):
            x, y = a.get(key, "<absent>"), b.get(key, "<absent>")
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
            elif isinstance(x, str) and isinstance(y, str):
                same = _layer_names(x) == _layer_names(y)
            else:
                same = type(x) is type(y) and x == y
            if not same:
                out.append(f"{name}: {key}: {_short(x)} != {_short(y)}")
    return out


def unchanged(fixture: Path, cases: dict | None = None, label: str = "golden") -> str:
    """Run the battery again (``cases``, default ``cases.CASES``; the threads and the RNG put
    back after) and compare it with ``fixture``'s results for the same cases: ``""`` when bit
    for bit the same, else the report a test fails with."""
    want = torch.load(fixture)
    if cases is not None:
        want = {name: want[name] for name in cases}
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng():
            got = record(cases)
    finally:
        torch.set_num_threads(threads)
    diff = differences(want, got)
    if not diff:
        return ""
    names = sorted({line.split(": ", 1)[0] for line in diff})
    return (f"{len(names)} {label} case(s) differ: {names}\n" + "\n".join(diff[:60])
            + "\n(re-record only for an intended, listed change: see the test's docstring)")


def _layer_names(text: str) -> str:
    """A message with ``MultiHeadAttention#<n>`` counts the layers the process made before it:
    the number depends on which tests ran first in the same worker, so it is not compared."""
    return re.sub(r"MultiHeadAttention#\d+", "MultiHeadAttention#N", text)


def _short(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor{tuple(x.shape)} {x.dtype}"
    return repr(x)[:300]


if __name__ == "__main__":
    print(f"posenc from {posenc.__file__}", flush=True)
    t = time.perf_counter()
    flex = "--flex" in sys.argv
    fixture = FLEX_FIXTURE if flex else FIXTURE
    results = record(FLEX_CASES if flex else None)
    if "--check" in sys.argv:
        diff = differences(torch.load(fixture), results)
        print("\n".join(diff) or "no differences")
        sys.exit(1 if diff else 0)
    for r in results.values():
        for key, value in r.items():
            if isinstance(value, torch.Tensor):
                r[key] = value.detach().clone().contiguous()
    torch.save(results, fixture)
    print(f"{len(results)} cases, {fixture.stat().st_size / 1e6:.2f} MB, "
          f"{time.perf_counter() - t:.1f} s")
