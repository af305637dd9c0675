"""RotaryEmbedding.from_hf_config against transformers' own rotary classes, on model configs as
published (config.json of each model; the Qwen2 YaRN block is the one its model card says to add;
`auto_map` and `_name_or_path` left out). cos/sin and rotated q/k at positions inside and past
the original length. The parity tests skip when transformers is missing."""

from __future__ import annotations

import importlib

import pytest
import torch

from posenc import RotaryEmbedding
from posenc.hf import rotary_kwargs_from_hf_config
from posenc.rope_families import family

# meta-llama/Llama-3.1-8B
LLAMA31 = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}  # fmt: skip

# Qwen/Qwen2-7B-Instruct, with the model card's rope_scaling for 131072 tokens
QWEN2_YARN = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.41.2", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 152064,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}  # fmt: skip

# microsoft/Phi-3.5-mini-instruct (model_type phi3): LongRoPE, 4k -> 128k; its 48 + 48 factors as
# posenc ships them in its family data (one copy of the 96 numbers, with its source)
_PHI35_SCALING = family("phi3.5-mini")["config"]["rope_scaling"]
PHI35_LONG, PHI35_SHORT = _PHI35_SCALING["long_factor"], _PHI35_SCALING["short_factor"]
PHI35 = {
    "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_factor": PHI35_LONG, "short_factor": PHI35_SHORT, "type": "longrope"},
    "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True,
    "vocab_size": 32064,
}  # fmt: skip

# EleutherAI/gpt-neox-20b: partial rotary (rotary_pct), base under its own name
GPT_NEOX_20B = {
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
    "hidden_act": "gelu_fast", "hidden_size": 6144, "initializer_range": 0.02,
    "intermediate_size": 24576, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "gpt_neox", "num_attention_heads": 64, "num_hidden_layers": 44,
    "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
    "torch_dtype": "float16", "transformers_version": "4.21.0.dev0", "use_cache": True,
    "use_parallel_residual": True, "vocab_size": 50432,
}  # fmt: skip

# google/gemma-7b: head_dim 256 is not hidden_size / num_attention_heads (192)
GEMMA_7B = {
    "architectures": ["GemmaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 24576,
    "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 16,
    "num_hidden_layers": 28, "num_key_value_heads": 16, "pad_token_id": 0, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
    "transformers_version": "4.38.0.dev0", "use_cache": True, "vocab_size": 256000,
}  # fmt: skip

# (config, HF module, rotary class, what from_hf_config must read, position sets: each is one
# forward, the later ones past the original length where the type cares)
MODELS = {
    "llama3.1": (LLAMA31, "llama", "LlamaRotaryEmbedding",
                 dict(head_dim=128, base=500000.0, partial_rotary_factor=1.0, rope_type="llama3"),
                 [[0, 1, 2, 100, 8191], [8192, 8193, 20000]]),
    "qwen2-yarn": (QWEN2_YARN, "qwen2", "Qwen2RotaryEmbedding",
                   dict(head_dim=128, base=1e6, partial_rotary_factor=1.0, rope_type="yarn"),
                   [[0, 5, 32767], [32768, 40000]]),
    "phi3.5-longrope": (PHI35, "phi3", "Phi3RotaryEmbedding",
                        dict(head_dim=96, base=10000.0, partial_rotary_factor=1.0,
                             rope_type="longrope"),
                        [[0, 7, 4095], [0, 4096, 9000], [3, 4000]]),
    "gpt-neox-20b": (GPT_NEOX_20B, "gpt_neox", "GPTNeoXRotaryEmbedding",
                     dict(head_dim=96, base=10000.0, partial_rotary_factor=0.25,
                          rope_type="default"),
                     [[0, 1, 2047], [2048, 9999]]),
    "gemma-7b": (GEMMA_7B, "gemma", "GemmaRotaryEmbedding",
                 dict(head_dim=256, base=10000.0, partial_rotary_factor=1.0, rope_type="default"),
                 [[0, 1, 8191], [8192, 30000]]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MODELS))
def test_reads_published_config(name):
    cfg, _, _, want, _ = MODELS[name]
    rot = RotaryEmbedding.from_hf_config(cfg)
    got = dict(head_dim=rot.head_dim, base=rot.base, rope_type=rot.rope_type,
               partial_rotary_factor=rot.rotary_dim / rot.head_dim)  # fmt: skip
    assert got == want
    assert rot.interleaved is False  # all five rotate half-layout pairs (i, i + d/2)
    assert cfg == MODELS[name][0]  # the config is not modified


def hf_model(name: str):
    """transformers' config object, rotary module and apply function for one published config."""
    transformers = pytest.importorskip("transformers", minversion="5.0")
    cfg, module, cls, _, _ = MODELS[name]
    config = transformers.AutoConfig.for_model(**cfg)
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    return config, getattr(mod, cls)(config), mod.apply_rotary_pos_emb


@pytest.mark.parametrize("source", ["dict", "config"])
@pytest.mark.parametrize("name", list(MODELS))
def test_parity_with_transformers(name, source):
    config, hf, hf_apply = hf_model(name)
    ours = RotaryEmbedding.from_hf_config(MODELS[name][0] if source == "dict" else config)
    g = torch.Generator().manual_seed(0)
    for pos in MODELS[name][4]:
        pos = torch.tensor([pos])  # [1, L]
        q, k = torch.randn(2, 1, 2, pos.shape[1], ours.head_dim, generator=g).unbind(0)
        hf_cos, hf_sin = hf(q, pos)  # [1, L, rd], attention factor applied
        torch.testing.assert_close(ours.cos_sin(pos), (hf_cos, hf_sin))
        torch.testing.assert_close(ours(q, k, positions=pos), hf_apply(q, k, hf_cos, hf_sin))
    assert ours.attention_factor == pytest.approx(hf.attention_scaling, rel=1e-7)


def test_object_and_dict_give_the_same_arguments():
    for name in MODELS:
        config, _, _ = hf_model(name)
        a = rotary_kwargs_from_hf_config(MODELS[name][0])
        b = rotary_kwargs_from_hf_config(config)
        assert a == b, name


def test_dynamic_scales_from_max_position_embeddings():
    # meta-llama/Llama-2-7b-hf with HF's documented dynamic NTK setting
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
           "max_position_embeddings": 4096, "rope_theta": 10000.0,
           "rope_scaling": {"type": "dynamic", "factor": 2.0}}  # fmt: skip
    transformers = pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    ours = RotaryEmbedding.from_hf_config(cfg)
    hf = LlamaRotaryEmbedding(transformers.AutoConfig.for_model(**cfg))
    x = torch.zeros(1)
    for pos in ([0, 4095], [0, 9000], [1, 5000], [0, 10]):  # grow, keep, reset
        pos = torch.tensor([pos])
        torch.testing.assert_close(ours.cos_sin(pos), hf(x, pos))


def test_layout_and_gptj_rotary_dim():
    gptj = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64,
            "n_positions": 2048}  # EleutherAI/gpt-j-6b  # fmt: skip
    kw = rotary_kwargs_from_hf_config(gptj)
    assert kw == {"head_dim": 256, "base": 10000.0, "interleaved": True, "scaling": None,
                  "partial_rotary_factor": 0.25}  # fmt: skip
    assert rotary_kwargs_from_hf_config({**LLAMA31, "rope_interleave": True})["interleaved"]
    assert not rotary_kwargs_from_hf_config(gptj, interleaved=False)["interleaved"]
    neox = {k: v for k, v in GPT_NEOX_20B.items() if k != "rotary_pct"}
    assert rotary_kwargs_from_hf_config(neox)["partial_rotary_factor"] == 0.25  # HF's default


def test_nested_rope_parameters_need_a_layer_type():
    cfg = {"model_type": "gemma3_text", "head_dim": 256, "max_position_embeddings": 131072,
           "rope_parameters": {
               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}  # fmt: skip
    full = RotaryEmbedding.from_hf_config(cfg, layer_type="full_attention")
    local = RotaryEmbedding.from_hf_config(cfg, layer_type="sliding_attention")
    assert (full.base, full.rope_type, local.base, local.rope_type) == (
        1e6, "linear", 10000.0, "default")
    with pytest.raises(ValueError, match="layer_type"):
        RotaryEmbedding.from_hf_config(cfg)
