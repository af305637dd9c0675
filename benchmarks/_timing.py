"""Shared timing helper: medians of interleaved repeats, so every ratio comes from one run."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

# POSENC_BENCH_CLOCK=thread times each call with the calling thread's CPU time
# (``time.thread_time``) instead of the wall clock: on a shared machine the other jobs' time
# then does not count. Valid with one torch thread (``--threads 1``), where every op runs on the
# calling thread; with more, the pool's threads would go uncounted.
_CLOCK = {"wall": time.perf_counter, "thread": time.thread_time}[
    os.environ.get("POSENC_BENCH_CLOCK", "wall")]


def _wall(fn: Callable[[], object]) -> float:
    t0 = _CLOCK()
    fn()
    return _CLOCK() - t0


def medians(
    fns: dict[str, Callable[[], object]], repeats: int = 30, warmup: int = 3,
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> dict[str, float]:
    """Median seconds per call for each function, timed round-robin to share the machine's noise.
    ``timer(fn)`` returns one call's seconds (default: ``time.perf_counter`` around the call,
    or ``time.thread_time`` with ``POSENC_BENCH_CLOCK=thread``; ``benchmarks/gpu.py`` passes
    one built on CUDA events)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_wall(fn) if timer is None else timer(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}
