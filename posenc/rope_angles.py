"""RoPE angles from positions, exact at any position below ``2**31``.

RoPE turns channel pair ``i`` of a token at position ``p`` by ``p * theta_i``. Formed in float32,
as transformers, Meta's LLaMA code and torchtune do (``positions.float() * inv_freq``), the
angle carries a rounding error of up to ``p * 2**-25`` rad for a pair with ``theta_i = 1``,
an error that grows with the absolute position: ``(R_m q) . (R_n k)`` then depends on ``m``
and ``n``, not only on ``n - m``. Measured on the same queries and keys at positions
``p + 0 .. p + 63`` against ``0 .. 63`` (largest score difference over the largest score,
``head_dim`` 128), the float32 product drifts by 1.1-1.3e-3 at ``p = 10**5``, 9e-3 at
``10**6``, 3.3-3.5e-2 at ``4 * 10**6``, 0.43 at ``2**24`` (where float32 no longer holds every
integer) and 0.83 at ``2**31 - 64``; the angles below give 5-6e-7 at every one of these
offsets, float32's rounding of the scores (``tests/test_large_positions.py``).

Here the angle is ``p * theta_i`` reduced mod ``2 pi`` *before* it is rounded to float32,
so its error stays within ``1.2e-7`` rad (half a float32 ulp at ``pi``; ``3.5e-7`` on the int64
path) at every position below ``2**31``:

* float64 where the device has it: the position in two parts, ``p - p mod 256`` and
  ``p mod 256``, times the frequency is exact in float64, and the reduction
  ``a - n * C1 - n * C2`` with ``C1`` = ``2 pi`` to 20 bits (so ``n * C1`` is exact) and ``C2``
  the rest of ``2 pi`` loses nothing before the final rounding;
* Apple's MPS has no float64: there the position is split as ``p = hi * 2**16 + lo`` and each
  part multiplies a per-frequency constant, the turns of ``2**16 theta`` and of ``theta`` as
  46-bit fixed-point fractions (computed on the CPU), in int64 arithmetic, which is exact; the
  sum modulo one turn is converted to float32 once.

Below position ``FLOAT32_PRODUCT_BELOW`` (512) the angle *is* the float32 product: there it
is within ``512 * 2**-25 = 1.5e-5`` rad of the exact angle, and the cos/sin tables equal
transformers' (and Meta's, and torchtune's) bit for bit, which parity tests and checkpoints
ported from them rely on. From 512 on, those implementations drift and posenc does not.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

FLOAT32_PRODUCT_BELOW = 1 << 9
"""Positions below this get the float32 product ``float(p) * inv_freq`` (transformers' angles,
bit for bit); from here on the angle is reduced mod ``2 pi`` first (exact, no drift)."""

_INV_TWO_PI = 1.0 / (2.0 * math.pi)
_TWO_PI_HI = float.fromhex("0x1.921fc00000000p+2")  # 2 pi to 20 bits: n * it is exact, n < 2**33
_TWO_PI_LO = float.fromhex("-0x1.5777a5cf72cedp-19")  # 2 pi - _TWO_PI_HI
# 1 / (2 pi) as three float64 pieces of <= 26 significant bits: a 24-bit frequency times either
# of the first two is exact in float64 (error of the sum: 5e-34)
_INV_TWO_PI_PARTS = (
    float.fromhex("0x1.45f3070000000p-3"),
    float.fromhex("-0x1.1b1bbe8000000p-30"),
    float.fromhex("-0x1.6b01ec5417056p-57"),
)
_SPLIT = 16  # p = hi * 2**16 + lo: hi < 2**15, lo < 2**16 for p < 2**31
_TURN_BITS = 46  # hi * T + lo * T < 1.5 * 2**62 for T < 2**46: no int64 overflow
_RAD_PER_UNIT = 2.0 * math.pi / 2.0**_TURN_BITS
_NO_FLOAT64 = ("mps",)


def rope_angles(
    positions: Tensor,
    inv_freq: Tensor,
    *,
    exact: bool = True,
    max_position: int | None = None,
    min_position: int | None = None,
) -> Tensor:
    """The angles ``positions[..., None] * inv_freq`` in float32, ``[..., n]`` for positions
    ``[...]`` (any shape, non-negative integers below ``2**31``; not checked here).

    Below ``FLOAT32_PRODUCT_BELOW`` the float32 product (transformers' value); from there on
    the product reduced to ``[-pi, pi]`` before rounding, so ``cos``/``sin`` depend on the
    offset alone to float32 precision. ``exact=False``: the float32 product at every position,
    as transformers, Meta's code and torchtune form it (their tables bit for bit, their drift
    included). ``max_position`` / ``min_position`` (the largest and smallest position, when
    the caller knows them without a host synchronisation) let short or distant sequences skip
    work whose result is known; the angles are the same.
    """
    inv = inv_freq.to(positions.device, torch.float32)
    if not exact or (max_position is not None and max_position < FLOAT32_PRODUCT_BELOW):
        return positions.to(torch.float32)[..., None] * inv  # [..., n]: transformers' angles
    if positions.device.type in _NO_FLOAT64:
        reduced = _reduced_split(positions, inv)
    else:  # below 2**29 the product of a position and a 24-bit frequency is exact in float64
        reduced = _reduced_float64(positions, inv, split=max_position is None or max_position >= 1 << 29)
    if min_position is not None and min_position >= FLOAT32_PRODUCT_BELOW:
        return reduced
    plain = positions.to(torch.float32)[..., None] * inv
    return torch.where(positions[..., None] < FLOAT32_PRODUCT_BELOW, plain, reduced)


def _reduced_float64(positions: Tensor, inv_freq: Tensor, *, split: bool = True) -> Tensor:
    """``positions * inv_freq`` mod ``2 pi`` in ``[-pi, pi]``, float64 math, float32 result.

    ``split``: ``p = (p - lo) + lo`` with ``lo = p mod 256``, both parts times a 24-bit
    frequency exact in float64 (47 and 32 bits) at any position, and so is every step before
    the last subtraction; without it (positions below ``2**29``) ``p * inv_freq`` is exact."""
    inv = inv_freq.to(torch.float64)
    if not split:
        a = positions.to(torch.float64)[..., None] * inv  # [..., n], exact
        n = (a * _INV_TWO_PI).round_()  # whole turns
        return a.sub_(n, alpha=_TWO_PI_HI).sub_(n, alpha=_TWO_PI_LO).to(torch.float32)
    p = positions.to(torch.int64)[..., None]  # [..., 1]
    lo = p & 255
    a_hi, a_lo = (p - lo).to(torch.float64) * inv, lo.to(torch.float64) * inv  # [..., n]
    n = (a_hi + a_lo).mul_(_INV_TWO_PI).round_()  # whole turns
    r = a_hi.sub_(n, alpha=_TWO_PI_HI).add_(a_lo).sub_(n, alpha=_TWO_PI_LO)  # a - n * 2 pi
    return r.to(torch.float32)


def turn_constants(inv_freq: Tensor) -> Tensor:
    """``[2, n]`` int64: the fractional turns of ``2**16 * inv_freq`` and of ``inv_freq``, as
    46-bit fixed-point numbers (``round(frac(x / 2 pi) * 2**46)``), on ``inv_freq``'s device.
    Computed on the CPU in float64 with ``1 / (2 pi)`` in three pieces, so every product but
    the last, tiny one is exact: the error is half a unit (``2**-47`` turns)."""
    t = inv_freq.detach().to("cpu", torch.float64)  # [n], float32 values: 24 bits
    i1, i2, i3 = _INV_TWO_PI_PARTS
    rows = []
    for shift in (_SPLIT, 0):
        x = t * 2.0**shift  # exact
        f = torch.frac(x * i1) + torch.frac(x * i2) + x * i3  # turns mod 1, in (-3, 3)
        f = f - torch.floor(f)  # [0, 1)
        rows.append(torch.round(f * 2.0**_TURN_BITS).to(torch.int64) % (1 << _TURN_BITS))
    return torch.stack(rows).to(inv_freq.device)  # [2, n]


def _reduced_split(positions: Tensor, inv_freq: Tensor, turns: Tensor | None = None) -> Tensor:
    """The same angles without float64: ``p = hi * 2**16 + lo`` times the fixed-point turns of
    ``turn_constants`` in int64 (exact), modulo one turn, then one conversion to float32."""
    turns = turn_constants(inv_freq) if turns is None else turns.to(positions.device)
    p = positions.to(torch.int64)[..., None]  # [..., 1]
    s = (p >> _SPLIT) * turns[0] + (p & ((1 << _SPLIT) - 1)) * turns[1]  # [..., n] < 2**63
    half = 1 << (_TURN_BITS - 1)
    u = ((s + half) & ((1 << _TURN_BITS) - 1)) - half  # turns in [-1/2, 1/2), fixed point
    return u.to(torch.float32) * _RAD_PER_UNIT


def cos_sin_unchecked(
    positions: Tensor,
    inv_freq: Tensor,
    *,
    interleaved: bool,
    attention_factor: float = 1.0,
    exact: bool = True,
    max_position: int | None = None,
    min_position: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``cos``/``sin`` ``[..., rotary_dim]`` of :func:`rope_angles`, each pair's angle repeated in
    the layout's order (interleaved ``t0 t0 t1 t1 ...``, half ``t0 t1 ... t0 t1 ...``), times
    ``attention_factor``, float32. No argument checks: ``rope_cos_sin`` and
    ``RotaryEmbedding`` check first."""
    angles = rope_angles(
        positions, inv_freq, exact=exact, max_position=max_position, min_position=min_position
    )  # [..., rd/2]
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)  # [..., rd]: t0 t0 t1 t1 ...
    else:
        angles = torch.cat([angles, angles], dim=-1)  # [..., rd]: t0 t1 ... t0 t1 ...
    if attention_factor == 1.0:  # times 1.0 changes no bit
        return angles.cos(), angles.sin()
    return angles.cos() * attention_factor, angles.sin() * attention_factor
