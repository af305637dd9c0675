"""Every public function names the argument, the value and what is allowed."""

import pytest
import torch

import posenc as pe

x4 = torch.randn(1, 2, 4, 8)
cos8, sin8 = pe.rope_cos_sin(torch.arange(4), pe.rope_inv_freq(8)[0])

CASES = [
    # (callable, exception, regex the message must match)
    (lambda: pe.sinusoidal_table(-1, 8), ValueError, "num_positions must be an int >= 0, got -1"),
    (lambda: pe.sinusoidal_table(4, 0), ValueError, "dim must be an int >= 1, got 0"),
    (lambda: pe.sinusoidal_table(4.0, 8), TypeError, "num_positions must be an int, got 4.0"),
    (lambda: pe.sinusoidal_table(4, 8, offset=-2), ValueError, "offset must be an int >= 0, got -2"),
    (lambda: pe.sinusoidal_table(4, 8, dtype=torch.int64), TypeError, "dtype must be None or a floating"),
    (lambda: pe.sinusoidal_table(4, 8, base=0), ValueError, "base must be > 1, got 0"),
    (lambda: pe.SinusoidalPositionalEmbedding(8)(torch.zeros(1, 3, 4)), ValueError, r"x must have shape \[B, L, 8\]"),
    (lambda: pe.SinusoidalPositionalEmbedding(8)(torch.zeros(1, 3, 8, dtype=torch.long)), TypeError, "x must be a floating-point tensor"),
    (lambda: pe.SinusoidalPositionalEmbedding(8, dropout=1.5), ValueError, r"dropout must be in \[0, 1\), got 1.5"),
    (lambda: pe.LearnedPositionalEmbedding(0, 8), ValueError, "max_len must be an int >= 1, got 0"),
    (lambda: pe.rope_inv_freq(7), ValueError, "even int >= 2.*head_dim=7"),
    (lambda: pe.rope_inv_freq(True), TypeError, "head_dim must be an int"),
    (lambda: pe.rope_inv_freq(8, scaling={"rope_type": "magic"}), ValueError, "magic"),
    (lambda: pe.rope_cos_sin(torch.arange(4.0), torch.ones(4)), TypeError, "positions must be an integer tensor"),
    (lambda: pe.rope_cos_sin(torch.tensor([-1, 0]), torch.ones(4)), ValueError, "positions must be >= 0"),
    (lambda: pe.rope_cos_sin(torch.arange(4), torch.ones(2, 2)), ValueError, "inv_freq must be 1-D"),
    (lambda: pe.apply_rope(x4.long(), cos8, sin8), TypeError, "x must be a floating-point tensor.*int64"),
    (lambda: pe.apply_rope(x4, cos8, sin8[..., :4]), ValueError, "cos and sin must have the same shape"),
    (lambda: pe.apply_rope(x4[..., :3, :], cos8, sin8), ValueError, "cover 4 positions but x has seq length 3"),
    (lambda: pe.apply_rope(torch.randn(1, 4, 6), cos8, sin8), ValueError, r"rotary_dim\) must be even and <= x.shape\[-1\]=6, got 8"),
    (lambda: pe.apply_rope(torch.randn(3, 4, 8), cos8.expand(2, 4, 8), sin8.expand(2, 4, 8)), ValueError, "do not broadcast"),
    (lambda: pe.RotaryEmbedding(8)(x4, x4[..., :2, :]), ValueError, "same seq length"),
    (lambda: pe.RotaryEmbedding(8)(x4[..., :6], x4[..., :6]), ValueError, "head_dim=8"),
    (lambda: pe.RotaryEmbedding(8)(x4, x4, positions=torch.arange(3)), ValueError, "positions must have 4 entries"),
    (lambda: pe.RotaryEmbedding(8, scaling="linear"), TypeError, "scaling must be None or a dict"),
    (lambda: pe.convert_rope_weight(torch.zeros(10, 4), 3), ValueError, "not divisible by num_heads=3"),
    (lambda: pe.rope_permutation(8, to="sideways"), ValueError, "to must be 'half' or 'interleaved'"),
    (lambda: pe.alibi_slopes(0), ValueError, "num_heads must be an int >= 1, got 0"),
    (lambda: pe.alibi_slopes(2.0), TypeError, "num_heads must be an int, got 2.0"),
    (lambda: pe.alibi_bias(4, 8, 4), ValueError, "k_len must be >= q_len=8"),
    (lambda: pe.alibi_bias(4, -1), ValueError, "q_len must be an int >= 0, got -1"),
    (lambda: pe.alibi_score_mod(torch.ones(2, 2)), ValueError, r"slopes must be 1-D \[num_heads\]"),
    (lambda: pe.t5_relative_bucket(torch.zeros(3)), TypeError, "relative_position must be an integer tensor"),
    (lambda: pe.t5_relative_bucket(torch.zeros(3, dtype=torch.long), num_buckets=7), ValueError, "num_buckets must be even"),
    (lambda: pe.t5_relative_bucket(torch.zeros(3, dtype=torch.long), max_distance=8), ValueError, "max_distance must be >"),
    (lambda: pe.make_scheme("bogus"), ValueError, "unknown scheme 'bogus'; allowed: sinusoidal, learned"),
    (lambda: pe.make_scheme("learned", dim=8), ValueError, "scheme 'learned' needs max_len"),
    (lambda: pe.make_scheme("rope", dim=10, num_heads=4), ValueError, "dim=10 must be divisible by num_heads=4"),
    (lambda: pe.make_scheme(3), TypeError, "scheme must be a name or a PositionScheme"),
    (lambda: pe.MultiHeadAttention(32, 4, backend="cuda"), ValueError, "backend must be one of"),
    (lambda: pe.MultiHeadAttention(30, 4), ValueError, "dim=30 must be divisible by num_heads=4"),
    (lambda: pe.attend(x4, x4[..., :4], x4[..., :4]), ValueError, "q, k, v must agree"),
    (lambda: pe.attend(x4, x4[:, :, :2], x4[:, :, :2]), ValueError, "same new tokens"),
    (lambda: pe.attend(x4[0], x4[0], x4[0]), ValueError, r"q must have shape \[B, H, L, Dh\]"),
    (lambda: pe.attend(x4, x4, x4, pe.ALiBi(3)), ValueError, "bias for 3 heads but q has 2 heads"),
    (lambda: pe.attend(x4, x4, x4, backend="flash"), ValueError, "backend must be one of"),
]


@pytest.mark.parametrize("fn,exc,msg", CASES, ids=[str(i) for i in range(len(CASES))])
def test_bad_input_raises_clear_error(fn, exc, msg):
    with pytest.raises(exc, match=msg):
        fn()
