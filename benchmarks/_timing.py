"""Shared timing helper: medians of interleaved repeats, so every ratio comes from one run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def medians(fns: dict[str, Callable[[], object]], repeats: int = 30, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call for each function, timed round-robin to share the machine's noise."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}
