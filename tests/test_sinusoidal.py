import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding, sinusoidal_table


def naive_table(n: int, d: int, base: float = 10000.0, offset: int = 0) -> torch.Tensor:
    """The paper's formula, one entry at a time, in float64."""
    pe = torch.zeros(n, d, dtype=torch.float64)
    for pos in range(n):
        for c in range(d):
            i = c // 2
            angle = (pos + offset) / base ** (2 * i / d)
            pe[pos, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe


@pytest.mark.parametrize("d", [1, 2, 7, 16, 33])
@pytest.mark.parametrize("offset", [0, 5])
def test_table_matches_formula(d, offset):
    got = sinusoidal_table(20, d, offset=offset, dtype=torch.float64)
    torch.testing.assert_close(got, naive_table(20, d, offset=offset))


@pytest.mark.parametrize("d", [6, 7])
def test_half_layout_is_a_permutation_of_interleaved(d):
    inter = sinusoidal_table(30, d)
    half = sinusoidal_table(30, d, interleaved=False)
    perm = list(range(0, d, 2)) + list(range(1, d, 2))
    torch.testing.assert_close(half, inter[:, perm])


def test_offset_equals_slice():
    torch.testing.assert_close(
        sinusoidal_table(10, 16, offset=7), sinusoidal_table(17, 16)[7:], rtol=0, atol=1e-6
    )


def test_dtype_cast_at_end():
    t = sinusoidal_table(60001, 64, dtype=torch.bfloat16)
    assert t.dtype == torch.bfloat16
    torch.testing.assert_close(t.float(), sinusoidal_table(60001, 64).bfloat16().float())


@given(k=st.integers(0, 300), d=st.sampled_from([4, 16, 64]))
def test_shift_is_a_fixed_rotation(k, d):
    """PE(pos + k) = M_k PE(pos), with M_k block-diagonal rotations independent of pos."""
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    m = torch.zeros(d, d, dtype=torch.float64)
    for i, w in enumerate(inv_freq):
        c, s = math.cos(k * w), math.sin(k * w)
        # [sin(a + b), cos(a + b)] = [[c, s], [-s, c]] @ [sin a, cos a]
        m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    pe = sinusoidal_table(400, d, dtype=torch.float64)
    torch.testing.assert_close(pe[k:], pe[: 400 - k] @ m.T)
    torch.testing.assert_close(m @ m.T, torch.eye(d, dtype=torch.float64))


@given(k=st.integers(-50, 50))
def test_dot_product_depends_on_offset_only(k):
    pe = sinusoidal_table(300, 32, dtype=torch.float64)
    pos = torch.arange(60, 240)
    dots = (pe[pos] * pe[pos + k]).sum(-1)
    torch.testing.assert_close(dots, dots[:1].expand_as(dots))


def test_module_adds_scaled_table_and_grows():
    pe = SinusoidalPositionalEmbedding(8, scale=True)
    x = torch.randn(2, 600, 8)  # longer than the initial table
    torch.testing.assert_close(pe(x), x * math.sqrt(8) + sinusoidal_table(600, 8))
    want = x[:, :3] * math.sqrt(8) + sinusoidal_table(600, 8)[597:]
    torch.testing.assert_close(pe(x[:, :3], offset=597), want)


def test_module_per_batch_positions():
    pe = SinusoidalPositionalEmbedding(6)
    x = torch.zeros(2, 3, 6)
    positions = torch.tensor([[0, 1, 2], [4, 5, 6]])
    torch.testing.assert_close(pe(x, positions=positions), sinusoidal_table(7, 6)[positions])


def test_module_fixed_max_len_raises_clearly():
    pe = SinusoidalPositionalEmbedding(8, max_len=16)
    pe(torch.zeros(1, 16, 8))
    with pytest.raises(ValueError, match="position 16 is past max_len=16"):
        pe(torch.zeros(1, 17, 8))
    with pytest.raises(ValueError, match="past max_len=16"):
        pe(torch.zeros(1, 1, 8), offset=16)


def test_learned_past_max_len_raises_clearly():
    pe = LearnedPositionalEmbedding(10, 4)
    x = torch.zeros(1, 10, 4)
    torch.testing.assert_close(pe(x), pe.weight[None])
    torch.testing.assert_close(pe(x[:, :2], offset=8), pe.weight[None, 8:])
    with pytest.raises(ValueError, match="position 10 is past max_len=10"):
        pe(torch.zeros(1, 11, 4))
