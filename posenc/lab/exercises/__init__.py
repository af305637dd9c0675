"""Checkers for the book's exercises: ``check(my_fn)`` prints a friendly verdict, never a traceback.

One module per chapter (``ch03.py`` ...) defines the checkers a chapter's exercises call; this
module holds what they share. A checker runs the learner's function on random inputs, compares
the result with posenc's, and prints ``✓ ...`` or ``✗ ...`` with a hint that names what is off
(an exception, the shape, the dtype, a constant factor, a sign, a permutation of channels). It
returns ``True`` or ``False`` so a solution cell can ``assert check(solution)``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["verdict", "attempt", "compare"]


def verdict(ok: bool, message: str) -> bool:
    """Print ``✓ message`` or ``✗ message`` and return ``ok``."""
    print(("✓ " if ok else "✗ ") + message)
    return ok


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """Call ``fn``; return ``(result, None)`` or ``(None, a one-line description of the error)``."""
    if not callable(fn):
        return None, f"expected a function, got {type(fn).__name__}"
    try:
        return fn(*args, **kwargs), None
    except NotImplementedError:
        return None, "not implemented yet: replace the `raise NotImplementedError` with your code"
    except Exception as e:  # the learner's bug: report it in one line, no traceback
        where = traceback.extract_tb(e.__traceback__)[-1]
        return None, f"your function raised {type(e).__name__}: {e} (line {where.lineno})"


def compare(got: Any, want: Tensor, *, what: str = "the result", atol: float = 1e-5,
            rtol: float = 1e-5) -> str | None:
    """``None`` if ``got`` equals ``want``, else a hint that names what differs."""
    if not isinstance(got, Tensor):
        return f"{what} should be a torch.Tensor, got {type(got).__name__}"
    if got.shape != want.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if not got.is_floating_point() and want.is_floating_point():
        return f"{what} has dtype {got.dtype}, expected a float tensor"
    got = got.detach().to(torch.float64).cpu()
    want = want.detach().to(torch.float64).cpu()
    if torch.allclose(got, want, atol=atol, rtol=rtol):
        return None
    if not torch.isfinite(got).all():
        return f"{what} contains NaN or inf"
    if torch.allclose(got, -want, atol=atol, rtol=rtol):
        return f"{what} has the wrong sign everywhere"
    for factor in (2.0, 0.5):
        if torch.allclose(got, factor * want, atol=atol, rtol=rtol):
            return f"{what} is {factor:g} times the expected values (a factor of 2 somewhere?)"
    if got.dim() >= 1 and got.shape[-1] % 2 == 0 and got.shape[-1] >= 4:
        d = got.shape[-1]
        to_half = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
        to_inter = torch.argsort(to_half)
        if torch.allclose(got[..., to_half], want, atol=atol, rtol=rtol) or torch.allclose(
            got[..., to_inter], want, atol=atol, rtol=rtol
        ):
            return f"{what} has the right numbers in the wrong channel order (interleaved vs half layout?)"
    err = (got - want).abs()
    idx = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
    return (f"{what} differs at index {idx}: got {got[idx].item():.6g}, expected "
            f"{want[idx].item():.6g} (max abs error {err.max().item():.3g})")
