"""xPos (Sun et al. 2023, arXiv 2212.10554) in RotaryEmbedding: parity with rotary-embedding-torch's
``use_xpos=True``, the decay it adds, the centre of the current call (never a stale one), KV-cache
decoding with a fixed centre, both layouts, partial rotary, bad input.

The written-out reference below transcribes lucidrains/rotary-embedding-torch,
``rotary_embedding_torch/rotary_embedding_torch.py`` at commit
8bb4643d1c29f944c47d2e807452ac437689af18 (v0.9.1): ``scale = (arange(0, dim, 2) + 0.4 dim) /
(1.4 dim)``, ``get_scale(t) = scale ** ((t - len(t) // 2) / scale_base)`` repeated per pair, and
``apply_rotary_emb(freqs, t, scale) = t cos scale + rotate_half(t) sin scale`` (its
``rotate_half`` turns interleaved pairs); queries get ``scale``, keys ``scale ** -1``.
"""

from __future__ import annotations

import math

import pytest
import torch

from posenc import RotaryEmbedding
from posenc.rope import rope_permutation, rotate_every_two

D, SB = 16, 32.0


def ref_xpos(q, k, positions, scale_base=SB, theta=10000.0):
    """The reference's rotate_queries_and_keys for given positions, interleaved, float64."""
    dim = q.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # [d/2]
    t = positions.to(torch.float64)
    freqs = (t[:, None] * inv).repeat_interleave(2, -1)  # [L, d]
    zeta = (torch.arange(0, dim, 2, dtype=torch.float64) + 0.4 * dim) / (1.4 * dim)
    power = (t - len(t) // 2) / scale_base  # [L]
    scale = (zeta ** power[:, None]).repeat_interleave(2, -1)  # [L, d]

    def rot(x, s):
        x = x.double()
        return x * freqs.cos() * s + rotate_every_two(x) * freqs.sin() * s

    return rot(q, scale).float(), rot(k, 1 / scale).float()


def qk(L, B=2, H=3, d=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, B, H, L, d, generator=g).unbind(0)


@pytest.mark.parametrize("L", [1, 7, 40])
def test_matches_written_out_reference(L):
    q, k = qk(L)
    rot = RotaryEmbedding(D, xpos_scale_base=SB)
    torch.testing.assert_close(rot(q, k), ref_xpos(q, k, torch.arange(L)))


def test_offset_and_positions_centre_on_the_call_length():
    """Positions taken as given, centre L // 2 of this call: the reference's get_scale(t)."""
    q, k = qk(5)
    rot = RotaryEmbedding(D, xpos_scale_base=SB)
    pos = torch.arange(100, 105)
    tol = {"rtol": 2e-4, "atol": 2e-4}  # float32 angles and scales vs float64; keys grow to ~40
    torch.testing.assert_close(rot(q, k, offset=100), ref_xpos(q, k, pos), **tol)
    torch.testing.assert_close(rot(q, k, positions=pos), ref_xpos(q, k, pos), **tol)
    rows = torch.stack([torch.arange(5), torch.arange(50, 55)])  # [B, L]
    q2, k2 = rot(q, k, positions=rows)
    for b in range(2):
        torch.testing.assert_close((q2[b], k2[b]), ref_xpos(q[b], k[b], rows[b]), **tol)


def test_matches_rotary_embedding_torch():
    ret = pytest.importorskip("rotary_embedding_torch")
    q, k = qk(24)
    ref = ret.RotaryEmbedding(dim=D, use_xpos=True, xpos_scale_base=SB)
    ours = RotaryEmbedding(D, xpos_scale_base=SB)
    torch.testing.assert_close(ours(q, k), ref.rotate_queries_and_keys(q, k))
    t = torch.arange(30.0, 36.0)  # get_scale on arbitrary positions, no cache involved
    torch.testing.assert_close(ours._xpos(t, len(t) // 2), ref.get_scale(t))


def test_short_call_after_long_call_equals_fresh_module():
    q, k = qk(40)
    used = RotaryEmbedding(D, xpos_scale_base=SB)
    used(q, k)  # a long call first
    short = used(q[..., :6, :], k[..., :6, :])
    torch.testing.assert_close(short, RotaryEmbedding(D, xpos_scale_base=SB)(q[..., :6, :], k[..., :6, :]))
    torch.testing.assert_close(short, ref_xpos(q[..., :6, :], k[..., :6, :], torch.arange(6)))


def test_rotary_embedding_torch_reuses_a_stale_centre():
    """Why posenc does not copy the reference's scale cache (documents the reference's behaviour)."""
    ret = pytest.importorskip("rotary_embedding_torch")
    q, k = qk(40)
    used = ret.RotaryEmbedding(dim=D, use_xpos=True, xpos_scale_base=SB)
    used.rotate_queries_and_keys(q, k)
    stale = used.rotate_queries_and_keys(q[..., :6, :], k[..., :6, :])[0]
    fresh = ret.RotaryEmbedding(dim=D, use_xpos=True, xpos_scale_base=SB)
    assert not torch.allclose(stale, fresh.rotate_queries_and_keys(q[..., :6, :], k[..., :6, :])[0])


@pytest.mark.parametrize("interleaved", [True, False])
def test_kv_cache_with_a_fixed_centre_equals_full_pass(interleaved):
    """Scores depend on the centre only through q's centre minus k's: keep one for the cache."""
    q, k = qk(20)
    rot = RotaryEmbedding(D, interleaved=interleaved, xpos_scale_base=SB)
    qf, kf = rot(q, k)
    full = qf @ kf.mT  # [B, H, 20, 20], centre 10 for all
    n0 = 12
    qs, ks = rot(q[..., :n0, :], k[..., :n0, :], xpos_centre=0)
    rows, keys = [qs @ ks.mT], ks
    for t in range(n0, 20):
        qt, kt = rot(q[..., t : t + 1, :], k[..., t : t + 1, :], offset=t, xpos_centre=0)
        keys = torch.cat([keys, kt], dim=-2)
        rows.append(qt @ keys.mT)
    for t in range(n0, 20):
        torch.testing.assert_close(rows[t - n0 + 1][..., 0, :], full[..., t, : t + 1])
    torch.testing.assert_close(rows[0], full[..., :n0, :n0])
    # without a common centre each decode step centres on its own length (0): keys from the
    # prefill (centre 6) then carry zeta ** (6 / SB), and the scores differ
    q1, _ = rot(q[..., 19:, :], k[..., 19:, :], offset=19)
    _, kp = rot(q[..., :n0, :], k[..., :n0, :])
    assert not torch.allclose(q1 @ kp.mT, full[..., 19:, :n0], atol=1e-4)


def test_half_layout_is_the_permuted_interleaved_one():
    q, k = qk(9)
    perm = rope_permutation(D)
    inter = RotaryEmbedding(D, xpos_scale_base=SB)(q, k)
    half = RotaryEmbedding(D, interleaved=False, xpos_scale_base=SB)(q[..., perm], k[..., perm])
    torch.testing.assert_close(half, (inter[0][..., perm], inter[1][..., perm]))


@pytest.mark.parametrize("interleaved", [True, False])
def test_partial_rotary_scales_rotating_channels_only(interleaved):
    q, k = qk(9, d=24)
    rot = RotaryEmbedding(24, interleaved=interleaved, partial_rotary_factor=2 / 3, xpos_scale_base=SB)
    assert rot.rotary_dim == 16
    q1, k1 = rot(q, k)
    torch.testing.assert_close((q1[..., 16:], k1[..., 16:]), (q[..., 16:], k[..., 16:]))
    full = RotaryEmbedding(16, interleaved=interleaved, xpos_scale_base=SB)(q[..., :16], k[..., :16])
    torch.testing.assert_close((q1[..., :16], k1[..., :16]), full)


def test_scores_decay_faster_than_plain_rope():
    """RoFormer's decay setting (q = k = all ones): |score| by distance, max over windows."""
    d, sb, n, w = 64, 64.0, 2048, 128
    q = torch.ones(1, 1, n, d)

    def score_by_distance(rot):
        qr, kr = rot(q, q)
        return (qr[0, 0, -1] * kr[0, 0]).sum(-1).flip(0)  # [n]: distance m - n = 0 .. n-1

    plain = score_by_distance(RotaryEmbedding(d))
    xpos = score_by_distance(RotaryEmbedding(d, xpos_scale_base=sb))
    zeta = (torch.arange(0, d, 2) + 0.4 * d) / (1.4 * d)
    dist = torch.arange(n, dtype=torch.float32)
    factor = zeta ** (dist[:, None] / sb)  # [n, d/2]: what xPos multiplies pair i's term by
    turn = torch.outer(dist, 1.0 / 10000 ** (torch.arange(0, d, 2) / d))
    torch.testing.assert_close(xpos, (2 * factor * turn.cos()).sum(-1), rtol=1e-4, atol=1e-3)
    assert (xpos.abs() <= 2 * factor.sum(-1) + 1e-3).all()  # the envelope: decays to 0
    env_p = plain.abs().unflatten(0, (-1, w)).amax(-1) / plain.abs()[0]
    env_x = xpos.abs().unflatten(0, (-1, w)).amax(-1) / xpos.abs()[0]
    assert (env_x[1:] < env_p[1:]).all()
    assert (env_x[1:] < env_x[:-1]).all()  # strictly decreasing; plain RoPE's is not
    assert not (env_p[1:] < env_p[:-1]).all()
    assert env_x[-1] < 0.2 * env_p[-1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_keeps_dtype_and_uses_float32_scales(dtype):
    q, k = qk(30)
    rot = RotaryEmbedding(D, xpos_scale_base=SB)
    q1, k1 = rot(q.to(dtype), k.to(dtype))
    assert q1.dtype == k1.dtype == dtype
    q2, k2 = rot(q, k)
    torch.testing.assert_close((q1.float(), k1.float()), (q2, k2), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"xpos_scale_base": 0.0}, ValueError, r"xpos_scale_base must be > 0, got 0.0"),
        ({"xpos_scale_base": -512}, ValueError, r"xpos_scale_base must be > 0"),
        ({"xpos_scale_base": math.nan}, ValueError, r"xpos_scale_base must be finite"),
        ({"xpos_scale_base": math.inf}, ValueError, r"xpos_scale_base must be finite"),
        ({"xpos_scale_base": True}, TypeError, r"xpos_scale_base must be a real number"),
        ({"xpos_scale_base": "512"}, TypeError, r"xpos_scale_base must be a real number"),
    ],
)
def test_bad_xpos_scale_base(kwargs, error, match):
    with pytest.raises(error, match=match):
        RotaryEmbedding(D, **kwargs)


def test_bad_xpos_centre():
    q, k = qk(3)
    with pytest.raises(ValueError, match="xpos_centre is given but xpos_scale_base is None"):
        RotaryEmbedding(D)(q, k, xpos_centre=0)
    with pytest.raises(TypeError, match="xpos_centre must be an int"):
        RotaryEmbedding(D, xpos_scale_base=SB)(q, k, xpos_centre=1.5)
