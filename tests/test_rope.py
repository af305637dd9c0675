import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import (
    RotaryEmbedding,
    apply_rope,
    convert_rope_weight,
    rope_cos_sin,
    rope_inv_freq,
    rope_permutation,
    rotate_every_two,
    rotate_half,
)


def naive_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0, interleaved=True):
    """Rotate each channel pair by an explicit 2x2 matrix, in float64."""
    d = x.shape[-1]
    out = torch.empty_like(x, dtype=torch.float64)
    for t, pos in enumerate(positions.tolist()):
        for i in range(d // 2):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
            theta = pos * base ** (-2 * i / d)
            rot = torch.tensor(
                [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]],
                dtype=torch.float64,
            )
            pair = torch.stack([x[..., t, a], x[..., t, b]], -1).double()  # [..., 2]
            new = pair @ rot.T
            out[..., t, a], out[..., t, b] = new[..., 0], new[..., 1]
    return out


def rope(x, positions, interleaved=True, base=10000.0):
    inv_freq, _ = rope_inv_freq(x.shape[-1], base=base)
    cos, sin = rope_cos_sin(positions, inv_freq, interleaved=interleaved)
    return apply_rope(x, cos, sin, interleaved=interleaved)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("d", [2, 8, 32])
def test_matches_explicit_rotation_matrices(interleaved, d):
    x = torch.randn(2, 3, 7, d)
    pos = torch.arange(5, 12)
    torch.testing.assert_close(rope(x, pos, interleaved), naive_rope(x, pos, interleaved=interleaved).float())


def test_interleaved_matches_meta_complex_form():
    """Meta's LLaMA: x as complex pairs times freqs_cis = polar(1, pos * theta)."""
    x = torch.randn(2, 4, 16, 64)
    pos = torch.arange(16)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 64, 2).float() / 64))
    freqs_cis = torch.polar(torch.ones(16, 32), torch.outer(pos.float(), inv_freq))
    ref = torch.view_as_real(torch.view_as_complex(x.reshape(2, 4, 16, 32, 2)) * freqs_cis).flatten(-2)
    torch.testing.assert_close(rope(x, pos, True), ref)


def test_half_matches_hf_rotate_half_form():
    x = torch.randn(1, 2, 10, 16)
    pos = torch.arange(10)
    inv_freq, _ = rope_inv_freq(16)
    emb = torch.cat([torch.outer(pos.float(), inv_freq)] * 2, -1)
    torch.testing.assert_close(rope(x, pos, False), x * emb.cos() + rotate_half(x) * emb.sin())


def test_rotations_of_the_two_layouts():
    x = torch.arange(1.0, 7.0)
    torch.testing.assert_close(rotate_every_two(x), torch.tensor([-2.0, 1, -4, 3, -6, 5]))
    torch.testing.assert_close(rotate_half(x), torch.tensor([-4.0, -5, -6, 1, 2, 3]))


@given(m=st.integers(0, 5000), n=st.integers(0, 5000), interleaved=st.booleans())
def test_score_depends_on_offset_only(m, n, interleaved):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 32, generator=g, dtype=torch.float64).unbind(0)
    s = (rope(q, torch.tensor([m]), interleaved) * rope(k, torch.tensor([n]), interleaved)).sum()
    s0 = (q * rope(k, torch.tensor([abs(n - m)]), interleaved)).sum() if n >= m else (
        rope(q, torch.tensor([m - n]), interleaved) * k
    ).sum()
    # float32 angles carry an error that grows with the position (about pos * 6e-8 rad)
    torch.testing.assert_close(s, s0, rtol=0, atol=1e-5 * (m + n + 10))


@given(pos=st.integers(0, 100_000), interleaved=st.booleans())
def test_rotation_keeps_norms(pos, interleaved):
    x = torch.randn(3, 1, 64)
    y = rope(x, torch.tensor([pos]), interleaved)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("interleaved", [True, False])
def test_partial_rotary_rotates_first_channels_only(interleaved):
    x = torch.randn(2, 5, 16)
    inv_freq, _ = rope_inv_freq(16, scaling={"partial_rotary_factor": 0.5})
    assert inv_freq.shape == (4,)
    cos, sin = rope_cos_sin(torch.arange(5), inv_freq, interleaved=interleaved)
    y = apply_rope(x, cos, sin, interleaved=interleaved)
    torch.testing.assert_close(y[..., 8:], x[..., 8:])
    want = naive_rope(x[..., :8], torch.arange(5), interleaved=interleaved).float()
    torch.testing.assert_close(y[..., :8], want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_cos_sin_at_60000(dtype):
    """Angles are float32 whatever the activations; bf16 angles would be off by whole radians."""
    inv_freq, _ = rope_inv_freq(128)
    pos = torch.tensor([60_000])
    cos32, sin32 = rope_cos_sin(pos, inv_freq)
    cos, sin = rope_cos_sin(pos, inv_freq, dtype=dtype)
    assert cos.dtype == dtype
    exact = torch.outer(pos.double(), inv_freq.double()).repeat_interleave(2, -1)
    tol = {"atol": 8e-3, "rtol": 0}  # bf16 / fp16 rounding of values in [-1, 1]
    torch.testing.assert_close(cos.float(), exact.cos().float(), **tol)
    torch.testing.assert_close(sin.float(), exact.sin().float(), **tol)
    torch.testing.assert_close(cos.float(), cos32, **tol)
    wrong = (pos.to(dtype)[:, None] * inv_freq.to(dtype)).float().repeat_interleave(2, -1).cos()
    assert (wrong - exact.cos()).abs().max() > 0.1  # why angles must not be in low precision


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [True, False])
def test_low_precision_inputs_keep_dtype(dtype, interleaved):
    x = torch.randn(1, 2, 8, 32)
    y32 = rope(x, torch.arange(8), interleaved)
    y = rope(x.to(dtype), torch.arange(8), interleaved)
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), y32, atol=2e-2, rtol=2e-2)


def test_rotary_embedding_module_cache_offset_and_positions():
    rot = RotaryEmbedding(16)
    q, k = torch.randn(2, 2, 3, 10, 16).unbind(0)
    q1, k1 = rot(q, k)
    torch.testing.assert_close(q1, rope(q, torch.arange(10)))
    q2, k2 = rot(q[:, :, 4:], k[:, :, 4:], offset=4)
    torch.testing.assert_close(q2, q1[:, :, 4:])
    q3, _ = rot(q[:, :, :2], k[:, :, :2], offset=1000)  # grows the cache
    assert rot.cos_cached.shape[0] >= 1002
    torch.testing.assert_close(q3, rope(q[:, :, :2], torch.arange(1000, 1002)), atol=1e-5, rtol=1e-5)
    pos = torch.stack([torch.arange(10), torch.arange(3, 13)])  # per-sequence positions [B, L]
    q4, _ = rot(q, k, positions=pos)
    torch.testing.assert_close(q4[1], rope(q[1], pos[1]))
    torch.testing.assert_close(q4[0], q1[0])


def test_layouts_differ_and_weight_conversion_fixes_it():
    """Same weights, two layouts: different scores; permuted weights: the same scores."""
    torch.manual_seed(0)
    h, dh, dim, L = 2, 8, 16, 6
    wq, wk = torch.randn(h * dh, dim), torch.randn(h * dh, dim)
    x = torch.randn(L, dim)

    def scores(wq, wk, interleaved):
        q = (x @ wq.T).view(L, h, dh).transpose(0, 1)  # [H, L, Dh]
        k = (x @ wk.T).view(L, h, dh).transpose(0, 1)
        q, k = rope(q, torch.arange(L), interleaved), rope(k, torch.arange(L), interleaved)
        return q @ k.transpose(-1, -2)  # [H, L, L]

    s_inter = scores(wq, wk, True)
    assert not torch.allclose(s_inter, scores(wq, wk, False), atol=1e-3)
    wq_h, wk_h = convert_rope_weight(wq, h, to="half"), convert_rope_weight(wk, h, to="half")
    torch.testing.assert_close(scores(wq_h, wk_h, False), s_inter, atol=1e-4, rtol=1e-4)
    back = convert_rope_weight(wq_h, h, to="interleaved")
    torch.testing.assert_close(back, wq)
    torch.testing.assert_close(rope_permutation(6), torch.tensor([0, 2, 4, 1, 3, 5]))


def test_convert_rope_weight_partial_keeps_pass_through_channels():
    w = torch.arange(24.0)[:, None]  # 2 heads x 12 channels
    out = convert_rope_weight(w, 2, rotary_dim=4)
    assert out[:12, 0].tolist() == [0, 2, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11]


# --- the fast paths: autograd function, low precision, decode, strides -------------------------


def textbook(x, cos, sin, interleaved):
    """x cos + turn(x) sin with plain autograd, partial rotary by concatenation."""
    rd = cos.shape[-1]
    turn = rotate_every_two if interleaved else rotate_half
    y = x[..., :rd] * cos + turn(x[..., :rd]) * sin
    return torch.cat([y, x[..., rd:]], -1)


# (x shape, positions shape, rotary_dim): plain, broadcast [B, 1, L, rd], partial rotary, 3-D
GRAD_CASES = [((2, 3, 5, 8), (5,), 8), ((2, 3, 5, 8), (2, 5), 8), ((1, 2, 4, 12), (4,), 8),
              ((3, 4, 6), (3, 4), 6)]  # fmt: skip


def tables(pos_shape, rd, interleaved, dtype=torch.float64):
    pos = torch.arange(math.prod(pos_shape)).reshape(pos_shape) * 7
    inv_freq, _ = rope_inv_freq(rd)
    cos, sin = rope_cos_sin(pos, inv_freq, interleaved=interleaved, dtype=dtype)
    return (cos[:, None], sin[:, None]) if len(pos_shape) == 2 and rd == 8 else (cos, sin)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("shape, pos_shape, rd", GRAD_CASES)
def test_gradcheck_and_grads_equal_textbook_autograd(interleaved, shape, pos_shape, rd):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    cos, sin = tables(pos_shape, rd, interleaved)
    f = lambda x: apply_rope(x, cos, sin, interleaved=interleaved)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))
    g = torch.randn(shape, dtype=torch.float64)
    (gx,) = torch.autograd.grad(f(x), x, g)
    (want,) = torch.autograd.grad(textbook(x, cos, sin, interleaved), x, g)
    torch.testing.assert_close(gx, want)
    x32, g32 = x.detach().float().requires_grad_(), g.float()  # the float32 kernels too
    y32 = apply_rope(x32, cos.float(), sin.float(), interleaved=interleaved)
    (gx32,) = torch.autograd.grad(y32, x32, g32)
    torch.testing.assert_close(gx32, want.float())


@pytest.mark.parametrize("interleaved", [True, False])
def test_backward_saves_no_activation(interleaved):
    """The autograd node holds cos/sin only: nothing of x's size stays alive for backward."""
    x = torch.randn(2, 4, 16, 8, requires_grad=True)
    cos, sin = tables((16,), 8, interleaved, dtype=torch.float32)
    y = apply_rope(x, cos, sin, interleaved=interleaved)
    saved = [t for t in y.grad_fn.saved_tensors if t is not None]
    assert saved and all(t.numel() <= cos.numel() for t in saved)


def test_gradients_reach_cos_and_sin_when_they_require_grad():
    x = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = tables((6,), 8, False)
    cos, sin = cos.clone().requires_grad_(), sin.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, c, s: apply_rope(x, c, s, interleaved=False), (x, cos, sin))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_is_float32_math_rounded_once(dtype, interleaved):
    x = torch.randn(2, 3, 40, 16).to(dtype)
    cos, sin = tables((40,), 16, interleaved, dtype=torch.float32)
    y = apply_rope(x, cos, sin, interleaved=interleaved)
    once = textbook(x.double(), cos.double(), sin.double(), interleaved).to(dtype)
    eps = torch.finfo(dtype).eps
    # within one rounding of the exact result (fused float32 vs float64 math may differ by 1 ulp)
    assert ((y.double() - once.double()).abs() <= eps * once.double().abs() + 1e-30).all()
    if interleaved:  # bit for bit Meta's form: float32 complex multiply, then cast
        freqs = torch.complex(cos[:, 0::2], sin[:, 0::2])
        meta = torch.view_as_real(torch.view_as_complex(x.float().unflatten(-1, (-1, 2))) * freqs)
        assert torch.equal(y, meta.flatten(-2).to(dtype))


@pytest.mark.parametrize("interleaved", [True, False])
def test_decode_fast_path_equals_positions_path(interleaved):
    rot = RotaryEmbedding(32, interleaved=interleaved)
    q, k = torch.randn(2, 1, 4, 1, 32).unbind(0)
    a = rot(q, k, offset=1000)
    b = rot(q, k, positions=torch.tensor([1000]))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a[0], rope(q, torch.tensor([1000]), interleaved), atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(rot(q, k, offset=1000), a)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_inputs(interleaved, dtype):
    """q as projections produce it ([B, L, H, D] transposed), grouped-query k, odd head_dim."""
    rot = RotaryEmbedding(16, interleaved=interleaved)
    q = torch.randn(2, 7, 4, 16).to(dtype).transpose(1, 2)  # [B, H, L, D], not contiguous
    k = torch.randn(2, 7, 2, 16).to(dtype).transpose(1, 2)  # 2 kv heads
    q1, k1 = rot(q, k)
    q2, k2 = rot(q.contiguous(), k.contiguous())
    torch.testing.assert_close((q1, k1), (q2, k2), rtol=0, atol=0)
    x = torch.randn(2, 5, 13)  # odd head_dim, partial rotary on the first 8 channels
    cos, sin = tables((5,), 8, interleaved, dtype=torch.float32)
    torch.testing.assert_close(apply_rope(x, cos, sin, interleaved=interleaved),
                               textbook(x, cos, sin, interleaved))  # fmt: skip
