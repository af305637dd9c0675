"""Position interpolation's bound, computed (chapter 8): scores between integer offsets stay tame,
scores past the trained offsets need not.

Chen et al. (2023) write the RoPE attention score of a query at ``m`` and a key at ``n`` as a
function of the distance ``s = m - n`` alone (the book writes it Δ),

    a(s) = Re sum_j h_j exp(i s theta_j),   h_j = (q_2j + i q_2j+1)(k_2j - i k_2j+1),

with ``theta_j = base ** (-2 j / head_dim)`` (interleaved pairs). Training only ever evaluates
``a`` at the integer offsets ``0 ... L``. Their Figure 2 fits ``h`` by least squares to random
scores at random offsets in ``[0, L]`` and looks at the fitted curve in two places: between the
integers (what interpolation asks for) and past ``L`` (what extrapolation asks for). Their
Theorem 2.1 bounds the first: a linear interpolant between two integers misses ``a`` by at most
``max|a''| / 8``, and ``|a''| <= sum_j |h_j| theta_j ** 2 <= max_j |h_j| sum_j theta_j ** 2``.
Nothing bounds the second.

The fit is badly conditioned (the curves of neighbouring pairs look alike on ``[0, L]``), so what
the fitted curve does past ``L`` depends on how the fit is solved; :func:`fit_scores` solves it
with an explicit ridge penalty through the SVD, and :func:`truncated_fit` with a truncated SVD
at an explicit cutoff, so that dependence is one visible number. All of it runs in float64 on
the CPU: it is a few hundred by 128 least-squares problem.

Never leave the solver to choose: ``torch.linalg.lstsq``'s default CPU driver (``gelsy``)
estimates the rank from a pivoted QR factorisation, and on this problem, whose singular values
fall without a clear gap, the estimate changes with the process and the number of threads (the
same seed has given a largest ``|a|`` past ``L`` below 1 in one process and above ``10 ** 7`` in
the next). An SVD cutoff that no singular value comes near is decided the same way every time;
:func:`truncated_fit` refuses a cutoff that a singular value comes within 20 % of.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "score_freqs",
    "scores",
    "fit_scores",
    "truncated_fit",
    "interpolation_bounds",
    "pi_bound_study",
]


def _check(head_dim: int, base: float) -> None:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even int >= 2, got {head_dim!r}")
    if not base > 1:
        raise ValueError(f"base must be > 1, got {base!r}")


def score_freqs(head_dim: int = 128, base: float = 10_000.0) -> Tensor:
    """``theta_j = base ** (-2 j / head_dim)``, ``[head_dim // 2]``, float64."""
    _check(head_dim, base)
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def _basis(offsets: Tensor, theta: Tensor) -> Tensor:
    """``[n, d_h]``: the real columns ``cos(s theta_j)`` and ``-sin(s theta_j)`` of ``a(s)``."""
    angle = offsets.to(torch.float64)[:, None] * theta  # [n, d_h/2]
    return torch.cat([angle.cos(), -angle.sin()], dim=1)


def scores(h: Tensor, offsets: Tensor, *, base: float = 10_000.0) -> Tensor:
    """``a(s) = Re sum_j h_j exp(i s theta_j)`` at each offset; ``h`` complex ``[d_h / 2]``."""
    if not (isinstance(h, Tensor) and h.is_complex() and h.dim() == 1):
        raise ValueError(f"h must be a 1-D complex tensor, got {getattr(h, 'dtype', type(h))}")
    theta = score_freqs(2 * h.numel(), base)
    w = torch.cat([h.real, h.imag]).to(torch.float64)
    return _basis(torch.as_tensor(offsets), theta) @ w


def fit_scores(
    *,
    head_dim: int = 128,
    base: float = 10_000.0,
    train_len: int = 2048,
    num_points: int = 200,
    ridge: float = 1e-6,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """The paper's Figure 2 fit: ``h`` (complex ``[head_dim // 2]``) minimising
    ``sum (a(s_k) - y_k) ** 2 + ridge * |h| ** 2`` over ``num_points`` random offsets ``s_k`` in
    ``[0, train_len]`` with random targets ``y_k`` in ``[-1, 1]``; returns ``(h, s, y)``.

    Solved through the SVD (filter factors ``sigma / (sigma ** 2 + ridge)``), so a tiny ridge
    means what it says and is not lost to rounding in normal equations."""
    if not ridge > 0:
        raise ValueError(f"ridge must be > 0 (the plain fit is decided by rounding), got {ridge!r}")
    if num_points < 1 or train_len < 1:
        raise ValueError(f"num_points and train_len must be >= 1, got {num_points}, {train_len}")
    theta = score_freqs(head_dim, base)
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(num_points, generator=g, dtype=torch.float64) * train_len
    y = torch.rand(num_points, generator=g, dtype=torch.float64) * 2 - 1
    u, sigma, vh = torch.linalg.svd(_basis(s, theta), full_matrices=False)
    w = vh.T @ (sigma / (sigma**2 + ridge) * (u.T @ y))
    half = head_dim // 2
    return torch.complex(w[:half], w[half:]), s, y


def truncated_fit(
    *,
    rcond: float,
    head_dim: int = 128,
    base: float = 10_000.0,
    train_len: int = 2048,
    num_points: int = 200,
    seed: int = 0,
) -> tuple[Tensor, int]:
    """The same fit as :func:`fit_scores` (same offsets and targets for a seed), solved by a
    truncated SVD instead of a ridge: ``torch.linalg.lstsq`` with the ``gelsd`` driver in
    float64 and the explicit cutoff ``rcond``, which drops the directions whose singular value is
    below ``rcond`` times the largest. Returns ``(h, rank)``, the rank being how many directions
    were kept. Raises ``ValueError`` when a singular value lies within 20 % of the cutoff: there
    rounding, and so the process and the thread count, would decide the rank."""
    if not 0 < rcond < 1:
        raise ValueError(f"rcond must be in (0, 1) (a cutoff the solver does not choose), got {rcond!r}")
    _, s, y = fit_scores(head_dim=head_dim, base=base, train_len=train_len,
                         num_points=num_points, seed=seed)
    basis = _basis(s, score_freqs(head_dim, base))
    sigma = torch.linalg.svdvals(basis)
    ratio = sigma / (rcond * sigma[0])
    if ((ratio > 1 / 1.2) & (ratio < 1.2)).any():
        raise ValueError(f"rcond={rcond!r} lies within 20 % of a singular value of the fit "
                         f"(seed {seed}): the rank it keeps would be decided by rounding")
    sol = torch.linalg.lstsq(basis, y[:, None], rcond=rcond, driver="gelsd")
    w = sol.solution[:, 0]
    half = head_dim // 2
    return torch.complex(w[:half], w[half:]), int(sol.rank)


def interpolation_bounds(h: Tensor, *, base: float = 10_000.0) -> dict[str, float]:
    """Bounds on ``|a(n + 1/2) - (a(n) + a(n + 1)) / 2|``, the miss of linear interpolation
    half-way between two integers: ``"pairs"`` is ``sum_j |h_j| theta_j ** 2 / 8`` (the step of
    the paper's proof), ``"max"`` is ``max_j |h_j| sum_j theta_j ** 2 / 8`` (its Theorem 2.1),
    ``"paper"`` the closed form the paper writes for it, ``d_h max_j |h_j| / (32 ln base)``."""
    theta = score_freqs(2 * h.numel(), base)
    mag = h.abs().to(torch.float64)
    return {
        "pairs": float((mag * theta**2).sum() / 8),
        "max": float(mag.max() * (theta**2).sum() / 8),
        "paper": float(2 * h.numel() * mag.max() / (32 * math.log(base))),
    }


def pi_bound_study(
    *,
    head_dim: int = 128,
    base: float = 10_000.0,
    train_len: int = 2048,
    num_points: int = 200,
    ridge: float = 1e-6,
    seed: int = 0,
    grid: int = 20,
) -> dict[str, float]:
    """Fit as :func:`fit_scores`, then measure the fitted curve: the largest ``|a|`` on the
    integer offsets ``0 ... L`` (``"trained"``), on the half-integers between them
    (``"interpolated"``), the largest miss of linear interpolation there (``"interp_error"``),
    the largest ``|a|`` on ``[L, 2L]`` sampled ``grid`` times per offset (``"extrapolated"``),
    and the bounds of :func:`interpolation_bounds` (``"bound_pairs"``, ``"bound_max"``,
    ``"bound_paper"``)."""
    h, _, _ = fit_scores(head_dim=head_dim, base=base, train_len=train_len,
                         num_points=num_points, ridge=ridge, seed=seed)
    ints = torch.arange(train_len + 1, dtype=torch.float64)
    at_ints = scores(h, ints, base=base)
    at_half = scores(h, ints[:-1] + 0.5, base=base)
    linear = (at_ints[:-1] + at_ints[1:]) / 2
    past = torch.linspace(train_len, 2 * train_len, grid * train_len + 1, dtype=torch.float64)
    bounds = interpolation_bounds(h, base=base)
    return {
        "trained": float(at_ints.abs().max()),
        "interpolated": float(at_half.abs().max()),
        "interp_error": float((at_half - linear).abs().max()),
        "extrapolated": float(scores(h, past, base=base).abs().max()),
        **{f"bound_{k}": v for k, v in bounds.items()},
    }
