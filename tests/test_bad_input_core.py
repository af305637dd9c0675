# ruff: noqa: E501  (one wrong call per line reads best as a table, as in test_bad_input.py)
"""Wrong calls to the small library modules: each raises the right exception, naming the argument
(issue 9 section 2). One row per wrong call, at least three per public name."""

from __future__ import annotations

import math

import pytest
import torch

import posenc as pe
from posenc.hf import rotary_kwargs_from_hf_config

x = torch.zeros(2, 3, 8)  # [B, L, D]
rel = torch.arange(-4, 5)
LLAMA = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128,
         "rope_theta": 10000.0}  # fmt: skip
from_hf = pe.RotaryEmbedding.from_hf_config

CASES = [
    # (public name, wrong call, exception, substring naming the argument)
    ("sinusoidal_table", lambda: pe.sinusoidal_table(4, 8, base=1.0), ValueError, "base must be > 1"),
    ("sinusoidal_table", lambda: pe.sinusoidal_table(4, 8, base=math.nan), ValueError, "base must be finite"),
    ("sinusoidal_table", lambda: pe.sinusoidal_table(4, 8, base=math.inf), ValueError, "base must be finite"),
    ("sinusoidal_table", lambda: pe.sinusoidal_table(4, 8, interleaved="false"), TypeError, "interleaved must be a bool"),
    ("sinusoidal_table", lambda: pe.sinusoidal_table(4, 8, device="gpu"), ValueError, "device must be a device"),
    ("sinusoidal_table", lambda: pe.sinusoidal_table([4], 8), TypeError, "num_positions must be an int"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8)(x, positions=torch.tensor([-1, 0, 1])), ValueError, "positions must be >= 0"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8)(x, positions=torch.arange(3.0)), TypeError, "positions must be an integer tensor"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8)(x, positions=torch.arange(4)), ValueError, "positions must have shape [3] or [2, 3]"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8)(x, positions=torch.zeros(3, 3, dtype=torch.long)), ValueError, "positions must have shape"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8)(x, positions=[0, 1, 2]), TypeError, "positions must be a torch.Tensor"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8)(x, offset=2, positions=torch.arange(3)), ValueError, "positions or offset, not both"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8, interleaved="false"), TypeError, "interleaved must be a bool"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8, scale="yes"), TypeError, "scale must be a bool"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8, dropout=math.nan), ValueError, "dropout must be finite"),
    ("SinusoidalPositionalEmbedding", lambda: pe.SinusoidalPositionalEmbedding(8, base=0.5), ValueError, "base must be > 1"),
    ("LearnedPositionalEmbedding", lambda: pe.LearnedPositionalEmbedding(16, 8)(x, positions=torch.tensor([-1, 0, 1])), ValueError, "positions must be >= 0"),
    ("LearnedPositionalEmbedding", lambda: pe.LearnedPositionalEmbedding(16, 8)(x, positions=torch.arange(3.0)), TypeError, "positions must be an integer tensor"),
    ("LearnedPositionalEmbedding", lambda: pe.LearnedPositionalEmbedding(16, 8)(x, positions=torch.arange(2)), ValueError, "positions must have shape [3] or [2, 3]"),
    ("LearnedPositionalEmbedding", lambda: pe.LearnedPositionalEmbedding(16, 8)(x, positions=[0, 1, 2]), TypeError, "positions must be a torch.Tensor"),
    ("LearnedPositionalEmbedding", lambda: pe.LearnedPositionalEmbedding(16, 8)(x, offset=1, positions=torch.arange(3)), ValueError, "positions or offset, not both"),
    ("LearnedPositionalEmbedding", lambda: pe.LearnedPositionalEmbedding(16, 8, init_std=math.inf), ValueError, "init_std must be finite"),
    ("LearnedPositionalEmbedding", lambda: pe.LearnedPositionalEmbedding(16, 8)(x, offset=14), ValueError, "past max_len=16"),
    ("t5_relative_bucket", lambda: pe.t5_relative_bucket(rel, bidirectional="false"), TypeError, "bidirectional must be a bool"),
    ("t5_relative_bucket", lambda: pe.t5_relative_bucket(rel.tolist()), TypeError, "relative_position must be a torch.Tensor"),
    ("t5_relative_bucket", lambda: pe.t5_relative_bucket(rel.float()), TypeError, "relative_position must be an integer tensor"),
    ("t5_relative_bucket", lambda: pe.t5_relative_bucket(rel, num_buckets=2.0), TypeError, "num_buckets must be an int"),
    ("t5_relative_bucket", lambda: pe.t5_relative_bucket(rel, max_distance=0), ValueError, "max_distance must be an int >= 1"),
    ("T5RelativeBias", lambda: pe.T5RelativeBias(4, bidirectional="no"), TypeError, "bidirectional must be a bool"),
    ("T5RelativeBias", lambda: pe.T5RelativeBias(0), ValueError, "num_heads must be an int >= 1"),
    ("T5RelativeBias", lambda: pe.T5RelativeBias(4, num_buckets=7), ValueError, "num_buckets must be even"),
    ("T5RelativeBias", lambda: pe.T5RelativeBias(4)(3.0), TypeError, "q_len must be an int"),
    ("T5RelativeBias", lambda: pe.T5RelativeBias(4)(5, 3), ValueError, "k_len must be >= q_len=5"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, scaling={"rope_type": "default", "factr": 4}), ValueError, "unknown key(s) 'factr' (did you mean 'factor'?); keys rope_type 'default' uses"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, scaling={"rope_type": "linear", "factr": 4}), ValueError, "'factr' (did you mean 'factor'?); keys rope_type 'linear' uses: rope_type, type, rope_theta, partial_rotary_factor, factor"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, scaling={"rope_type": "linear", "factor": 4, "beta_fats": 32}), ValueError, "'beta_fats' (did you mean 'beta_fast'?)"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, scaling={"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "low_freq": 1.0}), ValueError, "'low_freq' (did you mean 'low_freq_factor'?)"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, base=1.0), ValueError, "base must be > 1"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, base=math.nan), ValueError, "base must be finite"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, scaling={"rope_type": "linear", "factor": math.inf}), ValueError, "scaling['factor'] must be finite"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, scaling=[("rope_type", "linear")]), TypeError, "scaling must be None or a dict"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, seq_len=2.5), TypeError, "seq_len must be an int"),
    ("rope_inv_freq", lambda: pe.rope_inv_freq(8, scaling={"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "truncate": "false"}), TypeError, "scaling['truncate'] must be a bool"),
    ("rope_wavelengths", lambda: pe.rope_wavelengths(8, context_len=0), ValueError, "context_len must be an int >= 1"),
    ("rope_wavelengths", lambda: pe.rope_wavelengths(8, context_len=64.0), TypeError, "context_len must be an int"),
    ("rope_wavelengths", lambda: pe.rope_wavelengths(8, base=1.0, context_len=64), ValueError, "base must be > 1"),
    ("rope_wavelengths", lambda: pe.rope_wavelengths(8, scaling={"rope_type": "ntk", "factor": 2, "mscal": 1}, context_len=64), ValueError, "'mscal' (did you mean 'mscale'?)"),
    ("default_device", lambda: pe.default_device("gpu"), ValueError, "device must be a device such as 'cpu'"),
    ("default_device", lambda: pe.default_device("cuda:x"), ValueError, "device must be a device"),
    ("default_device", lambda: pe.default_device(0), TypeError, "device must be None, a str or a torch.device"),
    ("default_device", lambda: pe.default_device(f"cuda:{torch.cuda.device_count()}"), ValueError, "is not available on this machine"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf(3), TypeError, "config must be a transformers PretrainedConfig"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf({"max_position_embeddings": 128}), ValueError, "config must give head_dim"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf({**LLAMA, "rope_scaling": {"rope_type": "linear", "factr": 2.0}}), ValueError, "'factr' (did you mean 'factor'?); keys rope_type 'linear' uses"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf({**LLAMA, "rope_scaling": {"rope_type": "default", "fator": 2.0}}), ValueError, "'fator' (did you mean 'factor'?)"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf(LLAMA, interleaved="false"), TypeError, "interleaved must be a bool"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf({**LLAMA, "rope_theta": math.nan}), ValueError, "config['rope_theta'] must be finite"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf({**LLAMA, "max_position_embeddings": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}}), ValueError, "config['max_position_embeddings'] is required for rope_type 'dynamic'"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf({**LLAMA, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}}), ValueError, "mrope_section"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf({**LLAMA, "rope_scaling": "linear"}), TypeError, "config['rope_scaling'] must be a dict"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf({**LLAMA, "partial_rotary_factor": 1.5}), ValueError, "config['partial_rotary_factor'] must be in (0, 1]"),
    ("RotaryEmbedding.from_hf_config", lambda: from_hf(LLAMA, layer_type="full_attention"), ValueError, "layer_type='full_attention' given but"),
    ("RotaryEmbedding.from_hf_config", lambda: rotary_kwargs_from_hf_config({**LLAMA, "head_dim": 7.0}), TypeError, "config['head_dim'] must be an int"),
    ("explain", lambda: pe.explain(3), TypeError, "config must be a transformers config"),
    ("explain", lambda: pe.explain("/nonexistent/config.json"), ValueError, "config path '/nonexistent/config.json' is not a file"),
    ("explain", lambda: pe.explain(LLAMA, context=-1), ValueError, "context must be an int >= 1, got -1"),
    ("explain", lambda: pe.explain(LLAMA, context="x"), TypeError, "context must be an int, got 'x'"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, call, exc, text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_wrong_call_raises_naming_the_argument(name, call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)


def test_at_least_three_cases_per_public_name():
    names = [c[0] for c in CASES]
    for name in ("sinusoidal_table", "SinusoidalPositionalEmbedding", "LearnedPositionalEmbedding",
                 "t5_relative_bucket", "T5RelativeBias", "rope_inv_freq", "rope_wavelengths",
                 "default_device", "RotaryEmbedding.from_hf_config", "explain"):  # fmt: skip
        assert names.count(name) >= 3, name


def test_right_calls_still_work():
    emb = pe.SinusoidalPositionalEmbedding(8)
    torch.testing.assert_close(emb(x, offset=2), emb(x, positions=torch.arange(2, 5)))
    torch.testing.assert_close(emb(x, positions=torch.arange(3)[None]), emb(x))  # [1, L]
    lpe = pe.LearnedPositionalEmbedding(16, 8)
    assert lpe(x, positions=torch.tensor([[0, 1, 2], [5, 6, 7]])).shape == (2, 3, 8)
    assert pe.default_device("cpu") == torch.device("cpu")
    assert pe.default_device(torch.device("cpu")) == torch.device("cpu")
    assert pe.sinusoidal_table(2, 4, base=1.5, device="cpu").shape == (2, 4)
