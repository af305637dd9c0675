"""Checker for chapter 5 (ALiBi): the paper's head slopes.

For ``n`` heads, ``n`` a power of two, head ``h = 1..n`` gets ``2^(-8h/n)``; otherwise the
``c`` slopes of the largest power of two ``c < n`` come first, followed by every other slope of
the ``2c``-head sequence (Press et al., 2022, "Train Short, Test Long: Attention with Linear
Biases Enables Input Length Extrapolation", sec. 3 and their reference code).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from . import attempt, compare, verdict

__all__ = ["check_slopes"]


def _fail(hint: str, setting: str) -> bool:
    """``✗ hint`` wrapped to fit a page's output block, then the input that showed it."""
    lines = textwrap.wrap(hint, 76, subsequent_indent="  ") + [f"  (input: {setting})"]
    return verdict(False, "\n".join(lines))


def _slips(n: int) -> dict[str, Tensor]:
    """Slopes with one slip each, keyed by the hint that names it."""
    want = posenc.alibi_slopes(n).double()
    geometric = torch.tensor([2.0 ** (-8 * h / n) for h in range(1, n + 1)], dtype=torch.float64)
    return {
        "head 0 has slope 1: that is the shortcut 1 / 2**i for i in range(n); the paper's "
        "first slope is 2^(-8/n), not 2^0": torch.tensor([2.0 ** -i for i in range(n)],
                                                          dtype=torch.float64),
        "the slopes 1/2^h, h = 1..n, are the paper's only for 8 heads: the ratio between "
        "neighbouring heads is 2^(-8/n)": torch.tensor([2.0 ** -h for h in range(1, n + 1)],
                                                        dtype=torch.float64),
        "the slopes are in reverse order: head 0 is the steepest, 2^(-8/n), and the slopes "
        "shrink towards 1/256": want.flip(0),
        f"{n} is not a power of two, so 2^(-8h/n) is not the paper's rule: take the slopes "
        "for the largest power of two c below n, then append every other slope of the "
        "2c-head sequence": geometric,
        "the right slopes in the wrong order: the heads beyond the power of two c are "
        "appended after the first c heads, not sorted in": want.sort(descending=True).values,
    }


def check_slopes(fn: Callable[[int], Tensor]) -> bool:
    """Check ``fn(num_heads) -> Tensor[num_heads]``: the ALiBi paper's slopes in head order,
    first for 12 heads, then for other head counts. Compared with ``posenc.alibi_slopes``."""
    for n in (12, 8, 16, 6, 24, 1, 40):
        got, error = attempt(fn, n)
        setting = f"num_heads={n}"
        if error:
            return _fail(error, setting)
        if isinstance(got, (list, tuple)):
            try:
                got = torch.tensor(got, dtype=torch.float64)
            except (TypeError, ValueError):
                return _fail(f"return a tensor (or a list) of {n} numbers", setting)
        want = posenc.alibi_slopes(n)
        problem = compare(got, want, what="the slopes", atol=1e-6, rtol=1e-5)
        if problem is None:
            continue
        if isinstance(got, Tensor) and got.shape == want.shape and got.is_floating_point():
            g = got.detach().double().cpu()
            for slip, wrong in _slips(n).items():
                if not torch.allclose(wrong, want.double()) and torch.allclose(g, wrong,
                                                                               rtol=1e-5):
                    return _fail(slip, setting)
        return _fail(problem, setting)
    return verdict(True, "your slopes equal posenc.alibi_slopes for 12 heads\n"
                   "  and for every other head count tried")
