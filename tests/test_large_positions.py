"""Large positions (issue 26): RoPE's rotation depends on the offset alone at any position below
2**31, and ALiBi / T5 take position differences exactly.

The measure: the same queries and keys rotated at positions ``p + 0 .. p + 63`` and at
``0 .. 63``; the largest difference of the scores ``q . k`` over the largest score. With angles
formed as float32 products (transformers, Meta's code, torchtune; posenc before issue 26, and
``exact_angles=False`` now) it grows with ``p``: 1.1-1.3e-3 at ``10**5``, 9e-3 at ``10**6``,
3.3-3.5e-2 at ``4 * 10**6``, 0.43 at ``2**24`` and 0.83 at ``2**31 - 64`` (head_dim 128, both
layouts; a test below asserts the order of magnitude). With the angles reduced mod 2 pi before
rounding it stays at float32 rounding (5-6e-7 measured; asserted below 1e-5) at every ``p``,
through every path: the
``RotaryEmbedding`` tables and its per-call path (past ``TABLE_MAX``, and compiled),
``rope_cos_sin`` + ``apply_rope``, scaled frequencies (yarn, llama3), xPos, M-RoPE.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import RotaryEmbedding, apply_rope, mrope_cos_sin, rope_cos_sin, rope_inv_freq
from posenc import rope_angles as angles_mod
from posenc.rope_angles import FLOAT32_PRODUCT_BELOW, rope_angles
from posenc.rope_tables import WINDOW

D, L = 128, 64
OFFSETS = [0, 10**5, 10**6, 4 * 10**6, 2**24, 2**31 - L]
RTOL = 1e-5  # of the largest score
SCALINGS = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}  # fmt: skip


def qk(heads: int = 2, layout: str = "bhld") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, heads, L, D, generator=g).unbind(0)  # [1, H, L, D]
    return (q, k) if layout == "bhld" else (q.transpose(1, 2), k.transpose(1, 2))


def drift(rotate, p: int, layout: str = "bhld") -> float:
    """max |scores at p + i, p + j - scores at i, j| / max |scores at i, j|."""
    q, k = qk(layout=layout)

    def scores(start: int) -> torch.Tensor:
        qr, kr = rotate(q, k, torch.arange(start, start + L))
        if layout == "blhd":
            qr, kr = qr.transpose(1, 2), kr.transpose(1, 2)
        return qr @ kr.transpose(-1, -2)  # [1, H, L, L]

    s0, s = scores(0), scores(p)
    return ((s - s0).abs().max() / s0.abs().max()).item()


def module_positions(rot):
    return lambda q, k, pos: rot(q, k, positions=pos)


def module_offset(rot):
    return lambda q, k, pos: rot(q, k, offset=int(pos[0]))


def functional(interleaved: bool, scaling=None):
    inv, factor = rope_inv_freq(D, scaling=scaling)

    def rotate(q, k, pos):
        cos, sin = rope_cos_sin(pos, inv, interleaved=interleaved, attention_factor=factor)
        return tuple(apply_rope(x, cos, sin, interleaved=interleaved) for x in (q, k))

    return rotate


@pytest.mark.parametrize("p", OFFSETS)
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half"])
def test_rotary_embedding_scores_depend_on_the_offset_alone(p, interleaved):
    rot = RotaryEmbedding(D, interleaved=interleaved)
    assert drift(module_positions(rot), p) < RTOL
    assert drift(module_offset(rot), p) < RTOL


@pytest.mark.parametrize("p", OFFSETS)
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half"])
def test_rope_cos_sin_and_apply_rope(p, interleaved):
    assert drift(functional(interleaved), p) < RTOL


@pytest.mark.parametrize("p", OFFSETS)
@pytest.mark.parametrize("name", list(SCALINGS))
def test_scaled_frequencies(p, name):
    rot = RotaryEmbedding(D, interleaved=False, scaling=SCALINGS[name])
    assert drift(module_positions(rot), p) < RTOL
    assert drift(functional(False, SCALINGS[name]), p) < RTOL


@pytest.mark.parametrize("p", [10**6, 2**31 - L])
def test_seq_dim_minus_3_layout(p):
    rot = RotaryEmbedding(D, seq_dim=-3)
    assert drift(module_positions(rot), p, layout="blhd") < RTOL


@pytest.mark.parametrize("p", [10**6, 2**31 - L])
def test_xpos_with_its_centre_moved_along(p):
    """xPos scales by zeta ** ((n - c) / scale_base): with the centre moved by p too, the scores
    at p + i are those at i (the difference n - c is taken in int64)."""
    rot = RotaryEmbedding(D, xpos_scale_base=512.0)
    moved = drift(lambda q, k, pos: rot(q, k, positions=pos, xpos_centre=int(pos[0]) + L // 2), p)
    assert moved < RTOL


def test_float32_products_drift_as_measured():
    """The old angles, kept as ``exact_angles=False`` (transformers' own): the error this fixes."""
    rot = RotaryEmbedding(D, exact_angles=False)
    old = {p: drift(module_positions(rot), p) for p in (10**5, 10**6, 4 * 10**6)}
    assert 2e-4 < old[10**5] < 1e-2 and 2e-3 < old[10**6] < 5e-2 and 1e-2 < old[4 * 10**6] < 0.2, old


def test_from_hf_config_keeps_transformers_angles_unless_asked():
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2,
           "max_position_embeddings": 4096, "rope_theta": 10000.0}  # fmt: skip
    hf_like = RotaryEmbedding.from_hf_config(cfg)
    assert not hf_like.exact_angles and RotaryEmbedding.from_hf_config(cfg, exact_angles=True).exact_angles
    pos = torch.tensor([10**6, 10**6 + 1])
    plain = (pos.float()[:, None] * hf_like.inv_freq).repeat(1, 2)  # transformers' float32 angles
    assert torch.equal(hf_like.cos_sin(pos)[0], plain.cos())
    with pytest.raises(TypeError, match="exact_angles must be a bool"):
        RotaryEmbedding.from_hf_config(cfg, exact_angles="yes")


# ---- the angles themselves --------------------------------------------------------------------


def test_below_512_the_angles_are_transformers_float32_products():
    """Bit for bit LlamaRotaryEmbedding's ``inv_freq @ position_ids`` in float32, then cos/sin."""
    inv = rope_inv_freq(D)[0]
    pos = torch.arange(FLOAT32_PRODUCT_BELOW)[None]  # [1, 512]
    freqs = (inv[None, :, None].float() @ pos[:, None, :].float()).transpose(1, 2)  # [1, L, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = rope_cos_sin(pos, inv, interleaved=False)
    assert torch.equal(cos, emb.cos()) and torch.equal(sin, emb.sin())
    cos, sin = RotaryEmbedding(D, interleaved=False).cos_sin(pos)
    assert torch.equal(cos, emb.cos()) and torch.equal(sin, emb.sin())


def reference_angles(positions: list[int], inv: torch.Tensor) -> torch.Tensor:
    """``p * theta`` mod 2 pi in [-pi, pi], in 200-bit arithmetic (float64 result)."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workprec(200):
        two_pi = 2 * mpmath.pi
        rows = []
        for p in positions:
            row = []
            for t in inv.tolist():  # the float32 frequencies, exactly
                a = mpmath.mpf(p) * mpmath.mpf(t)
                row.append(float(a - two_pi * mpmath.nint(a / two_pi)))
            rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


def angle_error(got: torch.Tensor, want: torch.Tensor) -> float:
    d = got.double() - want
    return ((d + math.pi) % (2 * math.pi) - math.pi).abs().max().item()  # modulo a turn


FREQS = torch.cat([rope_inv_freq(D)[0], torch.tensor([3.7, 1.0, 0.999, 1e-9, 2.0**-30])])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(FLOAT32_PRODUCT_BELOW, 2**31 - 1), min_size=1, max_size=8))
def test_reduced_angles_are_within_float32_rounding(positions):
    """float64 path: within half a float32 ulp of pi (1.2e-7); the int64 split (the path for
    devices without float64, Apple's MPS) within 3.5e-7."""
    pos = torch.tensor(positions + [2**31 - 1, 2**29 + 3, 2**24 + 1, 512])
    want = reference_angles(pos.tolist(), FREQS)
    assert angle_error(angles_mod._reduced_float64(pos, FREQS), want) <= 1.25e-7
    assert angle_error(angles_mod._reduced_split(pos, FREQS), want) <= 3.5e-7
    assert angle_error(rope_angles(pos, FREQS), want) <= 1.25e-7
    assert angle_error(rope_angles(pos.to(torch.int32), FREQS), want) <= 1.25e-7
    below = pos < 2**29  # there the plain float64 product is exact: no split needed
    assert angle_error(angles_mod._reduced_float64(pos[below], FREQS, split=False), want[below]) <= 1.25e-7
    hinted = rope_angles(pos[below], FREQS, max_position=int(pos[below].max()), min_position=512)
    assert angle_error(hinted, want[below]) <= 1.25e-7


def test_devices_without_float64_take_the_int64_split(monkeypatch):
    pos = torch.tensor([0, 5, 511, 512, 10**6, 2**31 - 1])
    want = rope_angles(pos, FREQS)
    monkeypatch.setattr(angles_mod, "_NO_FLOAT64", ("cpu",))
    split = rope_angles(pos, FREQS)
    assert torch.equal(split[:3], want[:3])  # below 512: the float32 products on both paths
    assert angle_error(split, want.double()) < 4e-7
    assert drift(functional(True), 2**31 - L) < RTOL  # the whole rotation on that path


def test_turn_constants_are_the_fractional_turns():
    mpmath = pytest.importorskip("mpmath")
    turns = angles_mod.turn_constants(FREQS)  # [2, n] int64, 46-bit fractions of a turn
    assert turns.dtype == torch.int64 and turns.shape == (2, FREQS.numel())
    with mpmath.workprec(200):
        for row, shift in zip(turns.tolist(), (16, 0), strict=True):
            for got, t in zip(row, FREQS.tolist(), strict=True):
                x = mpmath.mpf(t) * 2**shift / (2 * mpmath.pi)
                want = (x - mpmath.floor(x)) * 2**46
                diff = abs(got - want)
                assert min(diff, 2**46 - diff) <= 0.5 + 1e-6


# ---- the limit, the per-call path, the compiler ---------------------------------------------


def test_positions_from_2_to_the_31_are_refused_naming_the_argument():
    rot, q = RotaryEmbedding(8), torch.randn(1, 1, 2, 8)
    inv = rope_inv_freq(8)[0]
    too_big = torch.tensor([2**31 - 1, 2**31])
    for call, name in [
        (lambda: rot(q, q, positions=too_big), "positions"),
        (lambda: rot(q, q, key_positions=too_big), "key_positions"),
        (lambda: rot.cos_sin(too_big), "positions"),
        (lambda: rope_cos_sin(too_big, inv), "positions"),
        (lambda: mrope_cos_sin(too_big.expand(3, 1, 2), inv, [2, 1, 1]), "positions"),
        (lambda: posenc.alibi_score_mod(posenc.alibi_slopes(2), q_offset=2**31), "q_offset"),
    ]:
        with pytest.raises(ValueError, match=rf"^{name} must be < 2\*\*31 = 2147483648"):
            call()
    # the largest position is fine, as int64 or int32
    last = torch.tensor([2**31 - 2, 2**31 - 1], dtype=torch.int32)
    torch.testing.assert_close(rot(q, q, positions=last), rot(q, q, positions=last.long()))


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half"])
def test_the_per_call_angles_equal_the_table_ones(interleaved):
    """Past TABLE_MAX (and while compiling) cos/sin are computed per call, with the ops that
    fill the table: the same values where both exist."""
    rot = RotaryEmbedding(D, interleaved=interleaved)
    near = torch.arange(posenc.rope.TABLE_MAX - L, posenc.rope.TABLE_MAX)  # the table's end
    cos_t, sin_t = rot.cos_sin(near)
    cos_d, sin_d, _ = rot._direct(near)
    assert torch.equal(cos_t, cos_d) and torch.equal(sin_t, sin_d)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half"])
def test_decoding_past_the_table_slices_a_window(interleaved):
    """Past TABLE_MAX a window of WINDOW positions from where the call starts is built once and
    sliced by the following steps (the decode fast path), rebuilt when a step leaves it."""
    rot = RotaryEmbedding(D, interleaved=interleaved)
    inv = rope_inv_freq(D)[0]
    start = 10**6
    q, k = qk()  # prefill of L tokens, then one token at a time
    rot(q, k, offset=start)
    window = rot._window
    assert window is not None and window.start == start and window.cos.shape[0] == WINDOW
    for step in (L, L + 1, WINDOW - 1, WINDOW, WINDOW + 5):
        q1, k1 = q[:, :, :1], k[:, :, :1]
        got = rot(q1, k1, offset=start + step)
        cos, sin = rope_cos_sin(torch.tensor([start + step]), inv, interleaved=interleaved)
        want = tuple(apply_rope(x, cos, sin, interleaved=interleaved) for x in (q1, k1))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(rot(q1, k1, positions=torch.tensor([start + step])), got, rtol=0, atol=0)
        assert (rot._window is window) == (step < WINDOW)  # the same tables until a step leaves them
    # a call spanning more than TABLE_MAX positions past it: angles per call, the same numbers
    far = torch.tensor([start, start + 2 * posenc.rope.TABLE_MAX])
    cos, sin = rot.cos_sin(far)
    want = rope_cos_sin(far, inv, interleaved=interleaved)
    torch.testing.assert_close((cos, sin), want, rtol=0, atol=0)
    # dynamic frequencies switch past the trained length: the window is rebuilt
    dyn = RotaryEmbedding(D, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096})
    dyn(q, k, offset=start)
    before = dyn._window
    dyn(q, k, offset=start + L)  # longer: new frequencies
    assert dyn._window is not before and dyn._window is not None
    cos, _ = dyn.cos_sin(torch.arange(start + L, start + 2 * L))
    want, _ = rope_cos_sin(torch.arange(start + L, start + 2 * L), dyn.inv_freq, interleaved=True)
    torch.testing.assert_close(cos, want, rtol=1e-6, atol=1e-6)


def test_offset_past_the_limit_is_refused_naming_it():
    rot, q = RotaryEmbedding(8), torch.randn(1, 1, 2, 8)
    rot(q, q, offset=2**31 - 2)  # positions 2**31 - 2 and 2**31 - 1: fine
    with pytest.raises(ValueError, match=r"offset \+ L must be <= 2\*\*31 = 2147483648 .*2147483647 \+ 2"):
        rot(q, q, offset=2**31 - 1)


def test_compiled_rotation_is_exact_at_the_largest_positions():
    """torch.compile(fullgraph=True) through Inductor: one graph, the eager result, no drift."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    rot = RotaryEmbedding(32, interleaved=False)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 1, 2, 8, 32, generator=g).unbind(0)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(rot, backend=counter, fullgraph=True, dynamic=False)
    at = torch.arange(2**31 - 8, 2**31)
    got = compiled(q, k, positions=at)
    torch.testing.assert_close(got, rot(q, k, positions=at), rtol=1e-6, atol=1e-6)
    small = rot(q, k, positions=torch.arange(8))
    s, s0 = got[0] @ got[1].transpose(-1, -2), small[0] @ small[1].transpose(-1, -2)
    assert ((s - s0).abs().max() / s0.abs().max()).item() < RTOL
    assert counter.frame_count == 1
    torch._dynamo.reset()


# ---- M-RoPE, ALiBi, T5 ---------------------------------------------------------------------------


def test_mrope_text_ids_equal_rope_at_large_positions():
    inv = rope_inv_freq(32)[0]
    pos = torch.arange(2**31 - 16, 2**31)[None]  # [1, 16]
    cos, sin = mrope_cos_sin(pos.expand(3, 1, 16), inv, [6, 5, 5])
    want = rope_cos_sin(pos, inv, interleaved=False)
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_bias_from_positions_is_exact_at_large_positions(name, dtype):
    torch.manual_seed(0)
    scheme = posenc.make_scheme(name, num_heads=4, dim=32)
    pos = torch.tensor([[0, 1, 2, 5, 9, 30]])
    for p in (2**24 + 1, 2**31 - 64):
        far = (pos + p).to(dtype)
        assert torch.equal(scheme.position_bias(far, far), scheme.position_bias(pos, pos))
        assert torch.equal(scheme.position_bias(far, far, causal=False),
                           scheme.position_bias(pos, pos, causal=False))  # fmt: skip
        mod_far, mod = scheme.position_score_mod(far, far), scheme.position_score_mod(pos, pos)
        b, h = torch.tensor(0), torch.tensor(1)
        for i, j in ((5, 0), (3, 3), (0, 4)):
            i_, j_ = torch.tensor(i), torch.tensor(j)
            assert torch.equal(mod_far(torch.tensor(0.0), b, h, i_, j_), mod(torch.tensor(0.0), b, h, i_, j_))


def test_bias_differences_are_taken_before_any_narrow_or_float_type():
    """uint8 positions would wrap if subtracted as they are (3 - 5 = 254)."""
    alibi = posenc.make_scheme("alibi", num_heads=2)
    pos = torch.tensor([[3, 5]])
    assert torch.equal(alibi.position_bias(pos.to(torch.uint8), pos.to(torch.uint8)),
                       alibi.position_bias(pos, pos))  # fmt: skip


def test_alibi_padded_and_score_mod_at_large_positions():
    mask = torch.ones(1, 6, dtype=torch.long)
    ids = torch.arange(6)[None]
    for p in (2**24 + 1, 2**31 - 8):
        far = posenc.alibi.alibi_bias_padded(4, mask, position_ids=ids + p)
        assert torch.equal(far, posenc.alibi.alibi_bias_padded(4, mask, position_ids=ids))
    slopes = posenc.alibi_slopes(4)
    near, far = posenc.alibi_score_mod(slopes, q_offset=3), posenc.alibi_score_mod(slopes, q_offset=2**31 - 1)
    h, zero = torch.tensor(2), torch.tensor(0.0)
    q_idx = torch.tensor(1, dtype=torch.int32)  # FlexAttention's index dtype
    # query at 3 + 1 against key 2, and at 2**31 - 1 + 1 against key 2**31 - 2: both 2 apart
    assert torch.equal(near(zero, 0, h, q_idx, torch.tensor(2, dtype=torch.int32)),
                       far(zero, 0, h, q_idx, torch.tensor(2**31 - 2, dtype=torch.int32)))  # fmt: skip
