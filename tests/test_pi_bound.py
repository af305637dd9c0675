"""posenc.lab.pi_bound: the score a(s) is RoPE's, the interpolation bound holds for any h, and
the ridge fit behaves as chapter 8 says."""

import pytest
import torch

import posenc
from posenc.lab.pi_bound import (
    fit_scores,
    interpolation_bounds,
    pi_bound_study,
    score_freqs,
    scores,
    truncated_fit,
)


def test_score_is_the_rope_dot_product():
    d, base = 16, 10_000.0
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    h = torch.complex(q[0::2], q[1::2]) * torch.complex(k[0::2], -k[1::2])
    inv, _ = posenc.rope_inv_freq(d, base=base)
    torch.testing.assert_close(score_freqs(d, base), inv.double(), rtol=1e-6, atol=0)
    m = torch.tensor([7, 40, 3, 100])
    n = torch.tensor([2, 40, 0, 37])
    cos, sin = posenc.rope_cos_sin(torch.cat([m, n]), inv, interleaved=True)  # [8, d]
    x = torch.cat([q.float().expand(4, d), k.float().expand(4, d)])  # q at m, k at n
    rot = posenc.apply_rope(x, cos, sin, interleaved=True)
    want = (rot[:4] * rot[4:]).sum(-1).double()
    torch.testing.assert_close(scores(h, (m - n).double(), base=base), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interpolation_bound_holds_for_any_h(seed):
    g = torch.Generator().manual_seed(seed)
    scale = 10 ** torch.linspace(-3, 3, 64)  # coefficients of very different sizes
    h = torch.complex(torch.randn(64, generator=g, dtype=torch.float64),
                      torch.randn(64, generator=g, dtype=torch.float64)) * scale
    ints = torch.arange(0, 300, dtype=torch.float64)
    a = scores(h, ints)
    miss = (scores(h, ints[:-1] + 0.5) - (a[:-1] + a[1:]) / 2).abs().max()
    b = interpolation_bounds(h)
    assert miss <= b["pairs"] <= b["max"]
    assert abs(b["paper"] / b["max"] - 1) < 0.2  # the paper's closed form is close to the sum


def test_smaller_ridge_fits_better_and_extrapolates_worse():
    res, far = [], []
    for ridge in (1e-2, 1e-5, 1e-8):
        h, s, y = fit_scores(ridge=ridge, seed=0)
        res.append(float(((scores(h, s) - y) ** 2).sum()))
        far.append(pi_bound_study(ridge=ridge, seed=0, grid=4)["extrapolated"])
    assert res[0] >= res[1] >= res[2]
    assert far[0] < far[1] < far[2] and far[2] > 1000


def test_study_measures_what_it_says():
    r = pi_bound_study(head_dim=32, train_len=256, num_points=50, ridge=1e-4, seed=1)
    h, _, _ = fit_scores(head_dim=32, train_len=256, num_points=50, ridge=1e-4, seed=1)
    ints = torch.arange(257, dtype=torch.float64)
    assert r["trained"] == pytest.approx(float(scores(h, ints).abs().max()))
    assert r["interp_error"] <= r["bound_pairs"]
    assert r["interpolated"] <= r["trained"] + r["interp_error"] + 1e-12
    assert fit_scores(seed=3)[0].equal(fit_scores(seed=3)[0])  # seeded


def test_truncated_fit_is_the_pseudo_inverse_at_the_cutoff():
    from posenc.lab.pi_bound import _basis

    h, rank = truncated_fit(rcond=1e-4, seed=1)
    _, s, y = fit_scores(seed=1)
    basis = _basis(s, score_freqs(128))
    u, sigma, vh = torch.linalg.svd(basis, full_matrices=False)
    keep = sigma > 1e-4 * sigma[0]
    w = vh[keep].T @ ((u[:, keep].T @ y) / sigma[keep])
    assert rank == int(keep.sum()) == 72
    torch.testing.assert_close(torch.cat([h.real, h.imag]), w, rtol=1e-9, atol=1e-9)


def test_truncated_fit_is_the_same_under_any_thread_count():
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            runs.append(truncated_fit(rcond=1e-8, seed=0)[0])
    finally:
        torch.set_num_threads(before)
    for h in runs[1:]:
        torch.testing.assert_close(h, runs[0], rtol=1e-9, atol=1e-9)


def test_truncated_fit_refuses_a_cutoff_next_to_a_singular_value():
    from posenc.lab.pi_bound import _basis

    _, s, _ = fit_scores(seed=0)
    sigma = torch.linalg.svdvals(_basis(s, score_freqs(128)))
    with pytest.raises(ValueError, match="rounding"):
        truncated_fit(rcond=float(sigma[75] / sigma[0]) * 1.05, seed=0)
    with pytest.raises(ValueError, match="rcond"):
        truncated_fit(rcond=0.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(head_dim=7), "head_dim"),
        (dict(base=1.0), "base"),
        (dict(ridge=0.0), "ridge"),
        (dict(num_points=0), "num_points"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_scores(**kwargs)


def test_scores_needs_complex_h():
    with pytest.raises(ValueError, match="complex"):
        scores(torch.randn(4), torch.arange(3.0))
