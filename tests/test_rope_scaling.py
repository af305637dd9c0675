"""rope_inv_freq / rope_wavelengths: paper formulas, Hugging Face parity, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.rope_scaling import ROPE_KEYS, ROPE_TYPES, rope_inv_freq, rope_wavelengths

TWO_PI = 2 * math.pi


def theta(d: int, base: float) -> torch.Tensor:
    """RoFormer's theta_i = base^(-2i/d), in float64, i = 0 .. d/2 - 1."""
    return base ** (-torch.arange(d // 2, dtype=torch.float64) * 2 / d)


def close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-6) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=0)


# Phi-3-style LongRoPE lists (head_dim 96 -> 48 pairs): near 1 for fast pairs, large for slow ones
PHI3_SHORT = [1.0 + 0.05 * (i / 47) ** 2 for i in range(48)]
PHI3_LONG = [1.0 + 1.5 * i + 0.02 * i**2 for i in range(48)]
LLAMA31 = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}  # fmt: skip


# ---------------------------------------------------------------- formulas from the papers


@pytest.mark.parametrize("rope_type", ROPE_TYPES)
def test_float32_and_shape(rope_type):
    scaling = {
        "rope_type": rope_type, "factor": 4.0, "original_max_position_embeddings": 512,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "short_factor": [1.0] * 32,
        "long_factor": [2.0] * 32,
    }  # fmt: skip
    scaling = {k: v for k, v in scaling.items() if k == "rope_type" or k in ROPE_KEYS[rope_type]}
    inv_freq, attn = rope_inv_freq(64, scaling=scaling, seq_len=4096)
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (32,)
    assert isinstance(attn, float) and attn >= 1.0


def test_default_is_roformer():
    inv_freq, attn = rope_inv_freq(64, base=10000.0)
    close(inv_freq, theta(64, 10000.0))
    assert attn == 1.0
    same, _ = rope_inv_freq(64, scaling={"rope_type": "default", "rope_theta": 10000.0})
    assert torch.equal(same, inv_freq)
    with pytest.warns(UserWarning, match=r"\['factor'\] are not used by rope_type 'default'"):
        ignored, _ = rope_inv_freq(64, scaling={"rope_type": "default", "factor": 3.0})  # as HF
    assert torch.equal(ignored, inv_freq)
    with pytest.raises(ValueError, match=r"'factr' \(did you mean 'factor'\?\)"):
        rope_inv_freq(64, scaling={"rope_type": "default", "factr": 3.0})


def test_keys_of_other_rope_types_are_accepted_as_transformers_does():
    # generic code copies one config into another: HF accepts and ignores these keys
    import warnings

    base, _ = rope_inv_freq(64)
    lin, _ = rope_inv_freq(64, scaling={"rope_type": "linear", "factor": 2.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the lengths are quiet
        a, _ = rope_inv_freq(64, scaling={"rope_type": "default", "max_position_embeddings": 4096})
        b, _ = rope_inv_freq(64, scaling={"rope_type": "linear", "factor": 2.0,
                                          "max_position_embeddings": 4096,
                                          "original_max_position_embeddings": 2048})
    assert torch.equal(a, base) and torch.equal(b, lin)


def test_linear_is_position_interpolation():
    # Chen et al.: f(x, m) -> f(x, m / s), i.e. every angle m * theta_i divided by s
    inv_freq, attn = rope_inv_freq(128, scaling={"rope_type": "linear", "factor": 4.0})
    close(inv_freq, theta(128, 10000.0) / 4)
    assert attn == 1.0


def test_legacy_type_key():
    new, _ = rope_inv_freq(64, scaling={"rope_type": "linear", "factor": 2.0})
    old, _ = rope_inv_freq(64, scaling={"type": "linear", "factor": 2.0})
    both, _ = rope_inv_freq(64, scaling={"type": "linear", "rope_type": "linear", "factor": 2.0})
    assert torch.equal(new, old) and torch.equal(new, both)


def test_ntk_interpolates_slowest_pair_by_factor_and_keeps_fastest():
    # bloc97: base' = base * s^(d / (d - 2)); the slowest pair i = d/2 - 1 then turns exactly
    # s times slower, the fastest (i = 0) not at all
    d, s = 64, 8.0
    inv_freq, attn = rope_inv_freq(d, scaling={"rope_type": "ntk", "factor": s})
    plain = theta(d, 10000.0)
    close(inv_freq, theta(d, 10000.0 * s ** (d / (d - 2))))
    assert inv_freq[0] == 1.0 and attn == 1.0
    close(inv_freq[-1:], plain[-1:] / s, rtol=1e-5)
    ratio = plain / inv_freq.double()  # 1 .. s, rising with the pair index
    assert (ratio[1:] > ratio[:-1]).all()


def test_dynamic_unchanged_up_to_trained_length_then_grows():
    d, L, s = 64, 2048, 4.0
    scaling = {"rope_type": "dynamic", "factor": s, "max_position_embeddings": L}
    plain, _ = rope_inv_freq(d)
    for seq_len in (None, 1, 100, L):
        assert torch.equal(rope_inv_freq(d, scaling=scaling, seq_len=seq_len)[0], plain)
    prev = plain
    for seq_len in (L + 1, 2 * L, 4 * L, 16 * L):
        inv_freq, attn = rope_inv_freq(d, scaling=scaling, seq_len=seq_len)
        # NTK with the factor grown from the length: alpha = s * n / L - (s - 1)
        alpha = s * seq_len / L - (s - 1)
        close(inv_freq, theta(d, 10000.0 * alpha ** (d / (d - 2))), rtol=1e-5)
        assert (inv_freq[1:] < prev[1:]).all() and inv_freq[0] == 1.0 and attn == 1.0
        prev = inv_freq


def test_dynamic_accepts_original_max_position_embeddings_alone():
    a = rope_inv_freq(64, scaling={"type": "dynamic", "factor": 2.0,
                                   "max_position_embeddings": 1024}, seq_len=5000)[0]  # fmt: skip
    b = rope_inv_freq(64, scaling={"type": "dynamic", "factor": 2.0,
                                   "original_max_position_embeddings": 1024}, seq_len=5000)[0]  # fmt: skip
    assert torch.equal(a, b)


def test_llama3_band_edges():
    d, base, L, s = 128, 500000.0, 8192, 8.0
    inv_freq, attn = rope_inv_freq(d, base=base, scaling=LLAMA31)
    plain = theta(d, base)
    wavelen = TWO_PI / plain
    short, long = wavelen < L / 4, wavelen > L / 1
    mid = ~short & ~long
    assert short.any() and long.any() and mid.any()
    close(inv_freq[short], plain[short])  # high frequencies untouched
    close(inv_freq[long], plain[long] / s)  # low frequencies interpolated
    # in between: blend of the two, weight (L / wavelen - low) / (high - low) on "untouched"
    w = (L / wavelen[mid] - 1.0) / (4.0 - 1.0)
    close(inv_freq[mid], (w + (1 - w) / s) * plain[mid], rtol=1e-5)
    ratio = plain / inv_freq.double()
    assert ((ratio[mid] > 1) & (ratio[mid] < s)).all() and (ratio.diff() > -1e-5).all()
    assert attn == 1.0


def test_yarn_by_parts_ramp_and_temperature():
    d, base, L, s = 128, 10000.0, 4096, 16.0
    scaling = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L,
               "truncate": False}  # fmt: skip
    inv_freq, attn = rope_inv_freq(d, base=base, scaling=scaling)
    plain = theta(d, base)
    r = L * plain / TWO_PI  # turns within the original context (the paper's r = L / lambda)
    close(inv_freq[r > 32], plain[r > 32])  # beta = 32: extrapolate, keep
    close(inv_freq[r < 1], plain[r < 1] / s)  # alpha = 1: interpolate
    # ramp gamma_i = (1 - theta'_i / theta_i) / (1 - 1/s) linear in i between the pairs where
    # r = 32 and r = 1: i(r) = d ln(L / (2 pi r)) / (2 ln base)
    i_fast, i_slow = (d * math.log(L / (TWO_PI * x)) / (2 * math.log(base)) for x in (32, 1))
    i = torch.arange(d // 2, dtype=torch.float64)
    gamma = ((i - i_fast) / (i_slow - i_fast)).clamp(0, 1)
    close(inv_freq, plain * (1 - gamma) + plain / s * gamma, rtol=1e-5)
    # sqrt(1/t) = 0.1 ln(s) + 1 multiplies both q and k
    assert attn == pytest.approx(0.1 * math.log(s) + 1)


def test_yarn_truncate_rounds_the_ramp_edges_outwards():
    d, L, s = 64, 2048, 4.0
    base_cfg = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L}
    rounded = rope_inv_freq(d, scaling=base_cfg)[0].double()
    exact = rope_inv_freq(d, scaling={**base_cfg, "truncate": False})[0].double()
    plain = theta(d, 10000.0)
    # truncation widens the ramp: each pair is at least as close to "keep" as without it
    # on the fast side and at least as close to "interpolate" on the slow side; both agree
    # outside the ramp
    r = L * plain / TWO_PI
    close(rounded[(r > 32) | (r < 1)], exact[(r > 32) | (r < 1)])
    assert not torch.equal(rounded, exact)


def test_yarn_deepseek_mscale():
    s = 40.0
    scaling = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": 4096,
               "mscale": 0.707, "mscale_all_dim": 1.0}  # fmt: skip
    _, attn = rope_inv_freq(64, scaling=scaling)
    assert attn == pytest.approx((0.1 * 0.707 * math.log(s) + 1) / (0.1 * math.log(s) + 1))
    _, attn = rope_inv_freq(64, scaling={**scaling, "mscale": 1.0})
    assert attn == pytest.approx(1.0)
    _, attn = rope_inv_freq(64, scaling={**scaling, "attention_factor": 0.5})
    assert attn == 0.5


def test_yarn_factor_from_lengths():
    cfg = {"rope_type": "yarn", "original_max_position_embeddings": 4096}
    a = rope_inv_freq(64, scaling={**cfg, "max_position_embeddings": 4096 * 8})
    b = rope_inv_freq(64, scaling={**cfg, "factor": 8.0})
    assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_longrope_switches_on_seq_len():
    d, L = 96, 4096
    scaling = {"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG,
               "original_max_position_embeddings": L, "max_position_embeddings": 32 * L}  # fmt: skip
    plain = theta(d, 10000.0)
    short = torch.tensor(PHI3_SHORT, dtype=torch.float64)
    long = torch.tensor(PHI3_LONG, dtype=torch.float64)
    for seq_len, lam in ((None, short), (1, short), (L, short), (L + 1, long), (32 * L, long)):
        inv_freq, attn = rope_inv_freq(d, scaling=scaling, seq_len=seq_len)
        close(inv_freq, plain / lam)
        # the attention factor does not depend on seq_len: sqrt(1 + ln s / ln L), s = 32
        assert attn == pytest.approx(math.sqrt(1 + math.log(32) / math.log(L)))
    _, attn = rope_inv_freq(d, scaling={**scaling, "factor": 1.0})
    assert attn == 1.0


def test_partial_rotary_with_scaling():
    # head_dim 80, a quarter rotates: 20 rotary channels -> 10 pairs with d = 20 in the formula
    inv_freq, _ = rope_inv_freq(
        80, scaling={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.25}
    )
    close(inv_freq, theta(20, 10000.0) / 2)
    inv_freq, _ = rope_inv_freq(80, scaling={"rope_type": "ntk", "factor": 2.0,
                                             "partial_rotary_factor": 0.25})  # fmt: skip
    close(inv_freq, theta(20, 10000.0 * 2 ** (20 / 18)))


def test_rope_wavelengths_hand_checked():
    # head_dim 4, base 10000: theta = [1, 1/100]; wavelengths 2 pi and 200 pi tokens
    w, turns = rope_wavelengths(4, base=10000.0, context_len=100)
    assert w.dtype == turns.dtype == torch.float32
    close(w, torch.tensor([TWO_PI, 100 * TWO_PI]))
    close(turns, torch.tensor([100 / TWO_PI, 1 / TWO_PI]))
    # linear x4 stretches every wavelength 4x
    w4 = rope_wavelengths(4, scaling={"type": "linear", "factor": 4}, context_len=100).wavelength
    close(w4, 4 * w)
    # dynamic uses the frequencies of a context_len-long sequence
    dyn = {"type": "dynamic", "factor": 2.0, "max_position_embeddings": 50}
    assert torch.equal(
        rope_wavelengths(64, scaling=dyn, context_len=400).turns,
        400 * rope_inv_freq(64, scaling=dyn, seq_len=400)[0] / TWO_PI,
    )


# ---------------------------------------------------------------- parity with transformers


def hf_inv_freq(head_dim, base, scaling, *, seq_len=None, config_cls="LlamaConfig", **config):
    """transformers' own init function on a config holding the same parameters."""
    transformers = pytest.importorskip("transformers", minversion="5.0")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {k: v for k, v in scaling.items() if k != "max_position_embeddings"}
    params["rope_theta"] = base
    # a consistent trained length, so HF's config validation has nothing to warn about
    original, factor = scaling.get("original_max_position_embeddings"), scaling.get("factor")
    implied = int(original * factor) if original and factor else 4096
    config.setdefault("max_position_embeddings", scaling.get("max_position_embeddings", implied))
    cfg = getattr(transformers, config_cls)(
        hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
        rope_parameters=params, **config,
    )  # fmt: skip
    if config_cls == "Phi3Config":
        del cfg.head_dim  # Phi-3 derives it from hidden_size / num_attention_heads
    return ROPE_INIT_FUNCTIONS[cfg.rope_parameters["rope_type"]](cfg, None, seq_len=seq_len)


def assert_parity(head_dim, base, scaling, seq_len=None, **config):
    ours, ours_attn = rope_inv_freq(head_dim, base=base, scaling=scaling, seq_len=seq_len)
    theirs, theirs_attn = hf_inv_freq(head_dim, base, scaling, seq_len=seq_len, **config)
    # same float32 operations in the same order: bitwise equal today; allow float32 rounding
    torch.testing.assert_close(ours, theirs.float(), rtol=1.3e-6, atol=0)
    assert ours_attn == pytest.approx(float(theirs_attn), rel=1e-7)


PARITY = {
    "llama3.1-8b": (128, 500000.0, {**LLAMA31, "max_position_embeddings": 131072}),
    "llama3.2-partial": (128, 500000.0, {**LLAMA31, "factor": 32.0, "partial_rotary_factor": 0.5}),
    "linear-x4": (128, 10000.0, {"rope_type": "linear", "factor": 4.0}),
    "linear-legacy-type": (64, 10000.0, {"type": "linear", "factor": 2}),
    "linear-partial": (80, 10000.0, {"type": "linear", "factor": 2.0,
                                      "partial_rotary_factor": 0.4}),
    "yarn-qwen2.5-x4": (128, 1e6, {"rope_type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 32768,
                                   "max_position_embeddings": 131072}),
    "yarn-gpt-oss-no-truncate": (64, 150000.0, {"rope_type": "yarn", "factor": 32.0,
                                                "beta_fast": 32.0, "beta_slow": 1.0,
                                                "truncate": False,
                                                "original_max_position_embeddings": 4096}),
    "yarn-deepseek-v3": (64, 10000.0, {"type": "yarn", "factor": 40, "beta_fast": 32,
                                       "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
                                       "original_max_position_embeddings": 4096,
                                       "max_position_embeddings": 163840}),
    "yarn-mscale-ratio": (64, 10000.0, {"type": "yarn", "factor": 40, "mscale": 0.707,
                                        "mscale_all_dim": 1.0,
                                        "original_max_position_embeddings": 4096}),
    "yarn-attention-factor": (64, 10000.0, {"type": "yarn", "factor": 8.0,
                                            "attention_factor": 1.3, "beta_fast": 16.0,
                                            "original_max_position_embeddings": 2048}),
    "yarn-factor-from-lengths": (64, 10000.0, {"rope_type": "yarn", "factor": None,
                                               "original_max_position_embeddings": 4096,
                                               "max_position_embeddings": 65536}),
    "yarn-partial": (128, 10000.0, {"rope_type": "yarn", "factor": 4.0,
                                    "partial_rotary_factor": 0.5,
                                    "original_max_position_embeddings": 2048}),
    "longrope-attention-factor": (64, 10000.0, {"rope_type": "longrope", "factor": 16.0,
                                                "attention_factor": 1.1,
                                                "short_factor": [1.0] * 32,
                                                "long_factor": [1.0 + i for i in range(32)],
                                                "original_max_position_embeddings": 4096}),
    "longrope-partial": (64, 10000.0, {"rope_type": "longrope", "factor": 8.0,
                                       "partial_rotary_factor": 0.5,
                                       "short_factor": [1.1] * 16,
                                       "long_factor": [1.0 + i for i in range(16)],
                                       "original_max_position_embeddings": 4096}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PARITY))
def test_parity_with_transformers(name):
    head_dim, base, scaling = PARITY[name]
    assert_parity(head_dim, base, scaling)


@pytest.mark.parametrize("seq_len", [None, 1, 1000, 2048, 2049, 3000, 4096, 10000, 65536])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_parity_dynamic(seq_len, partial):
    scaling = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 2048,
               "partial_rotary_factor": partial}  # fmt: skip
    assert_parity(128, 10000.0, scaling, seq_len=seq_len)


@pytest.mark.parametrize("seq_len", [None, 1, 4096, 4097, 131072])
def test_parity_phi3_longrope(seq_len):
    scaling = {"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG,
               "original_max_position_embeddings": 4096, "max_position_embeddings": 131072}  # fmt: skip
    # a real Phi3Config: original_max_position_embeddings lives on the config, as in Phi-3
    assert_parity(96, 10000.0, scaling, seq_len=seq_len, config_cls="Phi3Config",
                  original_max_position_embeddings=4096)  # fmt: skip


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "scaling, match",
    [
        ({"rope_type": "linear"}, r"scaling\['factor'\] is required for rope_type 'linear'"),
        ({"type": "dynamic", "max_position_embeddings": 8}, r"'factor'.*'dynamic'"),
        ({"rope_type": "ntk"}, r"scaling\['factor'\] is required for rope_type 'ntk'"),
        ({"rope_type": "linear", "factor": 0.5}, r"scaling\['factor'\] must be >= 1.*'linear'"),
        ({"rope_type": "dynamic", "factor": 2.0}, r"'max_position_embeddings'.*'dynamic'"),
        ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8,
          "original_max_position_embeddings": 4}, r"disagree"),
        ({"rope_type": "rope"}, r"scaling\['rope_type'\] must be one of \['default', 'linear'"),
        ({"rope_type": "linear", "type": "dynamic", "factor": 2.0}, r"'rope_type'.*'type'"),
        ({"rope_type": "linear", "factr": 2.0}, r"unknown key.*'factr'"),
        ({"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}, r"rope_theta.*base"),
        ({**LLAMA31, "low_freq_factor": 4.0}, r"low_freq_factor.*high_freq_factor"),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0},
         r"scaling\['high_freq_factor'\] is required for rope_type 'llama3'"),
        ({**{k: v for k, v in LLAMA31.items() if k != "original_max_position_embeddings"}},
         r"scaling\['original_max_position_embeddings'\] is required for rope_type 'llama3'"),
        ({"rope_type": "yarn", "original_max_position_embeddings": 64},
         r"scaling\['factor'\] is required for rope_type 'yarn'"),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
          "beta_fast": 1.0, "beta_slow": 32.0}, r"beta_fast.*beta_slow"),
        ({"rope_type": "yarn", "original_max_position_embeddings": 64,
          "max_position_embeddings": 32}, r"max_position_embeddings.*>=.*original"),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0},
         r"original_max_position_embeddings.*>= 1"),
        ({"rope_type": "longrope", "short_factor": [1.0] * 31, "long_factor": [1.0] * 32,
          "factor": 2.0, "original_max_position_embeddings": 64},
         r"scaling\['short_factor'\] must have length rotary_dim // 2 = 32.*got 31"),
        ({"rope_type": "longrope", "long_factor": [1.0] * 32, "factor": 2.0,
          "original_max_position_embeddings": 64}, r"scaling\['short_factor'\] is required"),
        ({"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [0.0] * 32,
          "factor": 2.0, "original_max_position_embeddings": 64}, r"long_factor.*> 0"),
        ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 1.5},
         r"partial_rotary_factor.*\(0, 1\]"),
        ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.3},
         r"rotary_dim=19"),
        ({"rope_type": "linear", "factor": float("nan")}, r"scaling\['factor'\] must be finite"),
    ],
)  # fmt: skip
def test_bad_config_raises_value_error(scaling, match):
    with pytest.raises(ValueError, match=match):
        rope_inv_freq(64, scaling=scaling)


@pytest.mark.parametrize(
    "scaling, match",
    [
        ([("rope_type", "linear")], r"scaling must be None or a dict"),
        ({"rope_type": 3}, r"scaling\['rope_type'\] must be a str"),
        ({"rope_type": "linear", "factor": "2"}, r"scaling\['factor'\] must be a real number"),
        ({"rope_type": "linear", "factor": True}, r"scaling\['factor'\]"),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
          "truncate": "yes"}, r"scaling\['truncate'\] must be a bool"),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64.0},
         r"original_max_position_embeddings.*must be an int"),
        ({"rope_type": "longrope", "short_factor": "1" * 32, "long_factor": [1.0] * 32,
          "factor": 2.0, "original_max_position_embeddings": 64},
         r"scaling\['short_factor'\] must be a list of numbers"),
    ],
)  # fmt: skip
def test_bad_type_raises_type_error(scaling, match):
    with pytest.raises(TypeError, match=match):
        rope_inv_freq(64, scaling=scaling)


def test_bad_seq_len_and_context_len():
    with pytest.raises(ValueError, match=r"seq_len must be an int >= 1, got 0"):
        rope_inv_freq(64, seq_len=0)
    with pytest.raises(TypeError, match=r"seq_len must be an int"):
        rope_inv_freq(64, seq_len=10.0)
    with pytest.raises(TypeError, match=r"seq_len must be an int"):
        rope_inv_freq(64, seq_len=True)
    with pytest.raises(ValueError, match=r"context_len must be an int >= 1"):
        rope_wavelengths(64, context_len=0)
    with pytest.raises(ValueError, match=r"rotary_dim >= 4"):
        rope_inv_freq(2, scaling={"rope_type": "ntk", "factor": 2.0})
