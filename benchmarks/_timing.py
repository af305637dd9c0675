"""Shared timing helper: medians of interleaved repeats, so every ratio comes from one run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def _wall(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def medians(
    fns: dict[str, Callable[[], object]], repeats: int = 30, warmup: int = 3,
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> dict[str, float]:
    """Median seconds per call for each function, timed round-robin to share the machine's noise.
    ``timer(fn)`` returns one call's seconds (default: ``time.perf_counter`` around the call;
    ``benchmarks/gpu.py`` passes one built on CUDA events)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_wall(fn) if timer is None else timer(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}
