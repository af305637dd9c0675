"""Argument checks shared by the public API.

Every public function validates what it is given and raises a ``ValueError`` (or ``TypeError``
for a wrong type) whose message names the argument, the value received and what is allowed.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor


def check_int(name: str, value: object, *, minimum: int | None = None, even: bool = False) -> int:
    """Return ``value`` as an ``int`` or raise: a bool or float is not an int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    if even and value % 2:
        raise ValueError(f"{name} must be even, got {value}")
    return value


def check_float(
    name: str, value: object, *, positive: bool = False, minimum: float | None = None
) -> float:
    """Return ``value`` as a finite ``float`` or raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_tensor(name: str, value: object, *, floating: bool = False, min_dim: int = 0) -> Tensor:
    """Raise unless ``value`` is a tensor (floating point if asked) with at least ``min_dim`` dims."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (float32, float16, bfloat16, float64), "
            f"got dtype {value.dtype}"
        )
    if value.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dims, got shape {tuple(value.shape)}"
        )
    return value


def check_positions(name: str, value: object) -> Tensor:
    """Raise unless ``value`` is an integer tensor of non-negative positions, shape [L] or [B, L]."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer positions, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.dim() not in (1, 2):
        raise ValueError(f"{name} must have shape [L] or [B, L], got shape {tuple(value.shape)}")
    if value.numel() and int(value.min()) < 0:
        raise ValueError(f"{name} must be >= 0, got a minimum of {int(value.min())}")
    return value


def check_dtype(name: str, value: object) -> torch.dtype | None:
    """Raise unless ``value`` is None or a floating ``torch.dtype``."""
    if value is None:
        return None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError(f"{name} must be None or a floating torch.dtype, got {value!r}")
    return value
