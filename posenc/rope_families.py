"""The RoPE fields of released model families, as data, each with where its numbers were read.

``FAMILIES`` maps a short name to ``{"name", "config", "source", "hf_class", "agrees"}``:

* ``config``: a ``config.json``-style dict holding the fields RoPE reads (head size, lengths,
  ``rope_theta``, ``rope_scaling`` / ``rope_parameters``, per layer type where the model has
  several). Pass it to ``posenc.explain`` or ``posenc.hf.extend_context`` as it is;
* ``source``: exactly where each number was read (a file of transformers 5.24 as installed, a
  paper's table, a model card, or a published ``config.json`` as quoted in public code);
* ``hf_class`` / ``agrees``: the transformers config class of the model type, and the keys whose
  class default equals the released model's value (``tests/test_explain.py`` checks them).

No number here is invented; families whose numbers could not be read from a source are left
out. Plain dicts, no torch: an encoding-layer module of data.
"""

from __future__ import annotations

import copy
from typing import Any

_TF = "transformers 5.24 (as installed), transformers/models"

# Phi-3.5-mini-instruct's config.json (model_type "phi3", LongRoPE); its 48 + 48 factors.
_PHI35_LONG = [
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601,
    1.5899999141693115, 1.600000023841858, 1.6200000047683716, 2.620000123977661,
    3.2300000190734863, 3.2300000190734863, 4.789999961853027, 7.400000095367432,
    7.700000286102295, 9.09000015258789, 12.199999809265137, 17.670000076293945,
    24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992,
    50.340003967285156, 50.45000457763672, 57.55000305175781, 57.93000411987305,
    58.21000289916992, 60.1400032043457, 62.61000442504883, 62.62000274658203,
    62.71000289916992, 63.1400032043457, 63.1400032043457, 63.77000427246094,
    63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938,
    64.4800033569336, 64.51000213623047, 64.52999877929688, 64.83999633789062,
]  # fmt: skip
_PHI35_SHORT = [
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842,
    1.0499999523162842, 1.0699999332427979, 1.0999999046325684, 1.1099998950958252,
    1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378,
    1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
    1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903,
    1.9899996519088745, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713,
    2.5899994373321533, 2.729999542236328, 2.749999523162842, 2.8399994373321533,
]  # fmt: skip

_FAMILIES: dict[str, dict[str, Any]] = {
    "llama2": {
        "name": "Llama 2 7B",
        "config": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                   "max_position_embeddings": 4096, "rope_theta": 10000.0},
        "source": (
            f"{_TF}/llama/configuration_llama.py: LlamaConfig (documented checkpoint "
            "meta-llama/Llama-2-7b-hf) hidden_size=4096, num_attention_heads=32, rope_theta "
            "default 10000.0 (RotaryEmbeddingConfigMixin.default_theta); "
            "max_position_embeddings=4096 from Touvron et al. 2023, 'Llama 2', Table 1 "
            "(context length 4k; the class default 2048 is Llama 1's)"
        ),
        "hf_class": "LlamaConfig",
        "agrees": ("hidden_size", "num_attention_heads", "rope_theta"),
    },
    "llama3.1": {
        "name": "Llama 3.1 8B",
        "config": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                   "max_position_embeddings": 131072, "rope_theta": 500000.0,
                   "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}},
        "source": (
            "Llama Team 2024, 'The Llama 3 Herd of Models', Table 3 (8B: model dimension 4,096, "
            "32 attention heads, positional embeddings 'RoPE (θ = 500,000)'; the table gives no "
            "context length) and section 3.4.2 ('long sequences to support context windows of up "
            "to 128K tokens'); every number also as meta-llama/Meta-Llama-3.1-8B-Instruct's "
            "config.json, quoted in public code, writes it: hidden_size 4096, num_attention_heads "
            "32, max_position_embeddings 131072, rope_theta 500000.0, rope_scaling {factor 8.0, "
            "low_freq_factor 1.0, high_freq_factor 4.0, original_max_position_embeddings 8192, "
            f"rope_type llama3}}; the same four from {_TF}/../modeling_rope_utils.py "
            "_compute_llama3_parameters comments ('`8` / `1` / `4` / `8192` in the original "
            "implementation')"
        ),
        "hf_class": "LlamaConfig",
        "agrees": ("hidden_size", "num_attention_heads"),
    },
    "mistral7b": {
        "name": "Mistral 7B v0.1",
        "config": {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
                   "head_dim": 128, "max_position_embeddings": 8192, "rope_theta": 10000.0,
                   "sliding_window": 4096},
        "source": (
            "Jiang et al. 2023, 'Mistral 7B', Table 1 (dim 4096, n_heads 32, head_dim 128, "
            "window_size 4096, context_len 8192: max_position_embeddings here is the paper's "
            "context_len); rope_theta 10000.0, hidden_size 4096, 32 heads and sliding_window 4096 "
            "also in mistralai/Mistral-7B-v0.1's config.json as quoted in public code, which "
            "writes max_position_embeddings 32768 (not the paper's 8192); "
            f"{_TF}/mistral/configuration_mistral.py MistralConfig defaults agree on hidden_size, "
            "heads, head_dim (4096 / 32), default_theta and sliding_window (its "
            "max_position_embeddings default is 4096 * 32 = 131072)"
        ),
        "hf_class": "MistralConfig",
        "agrees": ("hidden_size", "num_attention_heads", "head_dim", "rope_theta", "sliding_window"),
    },
    "qwen2.5": {
        "name": "Qwen2.5-7B-Instruct (YaRN option on)",
        "config": {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
                   "max_position_embeddings": 32768, "rope_theta": 1000000.0,
                   "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                                    "type": "yarn"}},
        "source": (
            "Qwen/Qwen2.5-7B-Instruct's config.json as quoted in full in public code: "
            "hidden_size 3584, num_attention_heads 28, max_position_embeddings 32768, "
            "rope_theta 1000000.0 (no rope_scaling); rope_scaling as Qwen's docs "
            "(qwen.readthedocs.io, deployment/vllm, quoted in public code) tell users to add "
            "it: factor 4.0, original_max_position_embeddings 32768, type yarn; Qwen Team 2024, "
            "'Qwen2.5 Technical Report', section 3.3 (context extended from 4,096 to 32,768 "
            "tokens in the final pre-training stage, RoPE base raised from 10,000 to 1,000,000 "
            "with ABF); 'Qwen2 Technical Report', Table 1 (7B: hidden size 3,584, 28 query heads)"
        ),
        "hf_class": "Qwen2Config",
        "agrees": ("max_position_embeddings",),
    },
    "gemma3": {
        "name": "Gemma 3 12B",
        "config": {"model_type": "gemma3_text", "hidden_size": 3840, "num_attention_heads": 16,
                   "head_dim": 256, "max_position_embeddings": 131072,
                   "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                   "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                   "sliding_window": 1024, "sliding_window_pattern": 6},
        "source": (
            "a Gemma 3 12B text_config (48 layers; the Lightricks/LTX-2 text encoder) written "
            "in full in public code (SGLang's LTX-2.3 model overlay; the quoted code does not "
            "name the checkpoint): head_dim 256, hidden_size 3840, 16 heads, "
            "max_position_embeddings 131072, rope_theta 1000000, rope_local_base_freq 10000, "
            "rope_scaling linear factor 8.0, sliding_window 1024, sliding_window_pattern 6; "
            "Gemma Team 2025, 'Gemma 3 Technical Report', section 2 (global RoPE base 1M, local "
            "10k, 128K context except the 1B's 32K; local span of 1024 tokens) and section 5.3 "
            "(pre-trained with 32K sequences, then scaled to 128K with a RoPE scaling factor of "
            f"8); {_TF}/gemma3/configuration_gemma3.py Gemma3TextConfig defaults agree on "
            "head_dim, max_position_embeddings and default_theta (global 1M, local 10k). The "
            "config does not store the trained length: posenc.explain infers it as "
            "max_position_embeddings / factor = 16384, while section 5.3 says 32K"
        ),
        "hf_class": "Gemma3TextConfig",
        "agrees": ("head_dim", "max_position_embeddings", "rope_theta", "rope_local_base_freq"),
    },
    "deepseek-v3": {
        "name": "DeepSeek-V3",
        "config": {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
                   "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                   "max_position_embeddings": 163840, "rope_theta": 10000.0,
                   "rope_interleave": True,
                   "rope_scaling": {"type": "yarn", "factor": 40.0, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                    "original_max_position_embeddings": 4096}},
        "source": (
            "DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report', section 4.3 (YaRN on the "
            "decoupled shared key, s = 40, alpha = 1, beta = 32, sqrt(t) = 0.1 ln s + 1; "
            "context window expanded from 4K to 32K and then to 128K) and deepseek-ai/"
            "DeepSeek-V3's config.json as quoted in public code (qk_rope_head_dim 64, "
            "qk_nope_head_dim 128, rope_theta 10000, max_position_embeddings 163840, "
            "rope_scaling factor 40, mscale 1.0, mscale_all_dim 1.0, beta_fast 32, beta_slow 1, "
            f"original 4096, type yarn); {_TF}/deepseek_v3/configuration_deepseek_v3.py "
            "defaults hidden_size 7168, num_attention_heads 128, qk_rope_head_dim 64, "
            "qk_nope_head_dim 128, default_theta 10000, rope_interleave True (the config.json "
            "has no rope_interleave key)"
        ),
        "hf_class": "DeepseekV3Config",
        "agrees": ("hidden_size", "num_attention_heads", "qk_rope_head_dim",
                   "qk_nope_head_dim", "rope_theta", "rope_interleave"),
    },
    "phi3.5-mini": {
        "name": "Phi-3.5-mini-instruct (Phi-3, LongRoPE)",
        "config": {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
                   "max_position_embeddings": 131072,
                   "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
                   "rope_scaling": {"type": "longrope", "long_factor": _PHI35_LONG,
                                    "short_factor": _PHI35_SHORT}},
        "source": (
            "microsoft/Phi-3.5-mini-instruct config.json "
            "(https://huggingface.co/microsoft/Phi-3.5-mini-instruct/blob/main/config.json) "
            "as quoted in full in a public ONNX-export example (get_phi35): hidden_size 3072, "
            "32 heads, max_position_embeddings 131072, original 4096, rope_theta 10000, "
            "rope_scaling type longrope with its 48 long and 48 short factors; "
            f"{_TF}/phi3/configuration_phi3.py Phi3Config defaults agree on hidden_size, "
            "num_attention_heads, original_max_position_embeddings and default_theta 10000"
        ),
        "hf_class": "Phi3Config",
        "agrees": ("hidden_size", "num_attention_heads", "original_max_position_embeddings",
                   "rope_theta"),
    },
    "gpt-oss": {
        "name": "gpt-oss-20b",
        "config": {"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64,
                   "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 150000.0,
                   "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "truncate": False,
                                    "original_max_position_embeddings": 4096}},
        "source": (
            f"{_TF}/gpt_oss/configuration_gpt_oss.py GptOssConfig (documented checkpoint "
            "openai/gpt-oss-20b): hidden_size 2880, 64 heads, head_dim 64, "
            "max_position_embeddings 131072, default_theta 150000.0, default rope_parameters "
            "yarn factor 32.0, beta_fast 32.0, beta_slow 1.0, truncate False, "
            "original_max_position_embeddings 4096; a 24-layer gpt_oss config.json (the 20b's "
            "depth) quoted in public code writes the same num_attention_heads, "
            "max_position_embeddings, rope_theta 150000 and rope_scaling (and sliding_window 128 "
            "on alternate layers, which share one RoPE)"
        ),
        "hf_class": "GptOssConfig",
        "agrees": ("hidden_size", "num_attention_heads", "head_dim", "max_position_embeddings",
                   "rope_theta", "rope_scaling"),
    },
    "qwen2-vl": {
        "name": "Qwen2-VL-7B-Instruct (M-RoPE)",
        "config": {"model_type": "qwen2_vl_text", "hidden_size": 3584,
                   "num_attention_heads": 28, "max_position_embeddings": 32768,
                   "rope_theta": 1000000.0,
                   "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
        "source": (
            "Qwen2-VL-7B's config.json as quoted in full in public code (a MindSpore Qwen2-VL "
            "test that loads the Qwen2-VL-7B-Instruct processor): hidden_size 3584, "
            "num_attention_heads 28, max_position_embeddings 32768, rope_theta 1000000.0, "
            f"rope_scaling {{type mrope, mrope_section [16, 24, 24]}}; {_TF}/qwen2_vl/: "
            "configuration_qwen2_vl.py (documented checkpoint Qwen/Qwen2-VL-7B-Instruct) vision "
            "hidden_size 3584, max_position_embeddings 32768 and default_theta 1000000.0, "
            "modeling_qwen2_vl.py mrope_section fallback [16, 24, 24] (temporal, height, width); "
            "Wang et al. 2024, 'Qwen2-VL' (M-RoPE); 'Qwen2 Technical Report', Table 1 (7B: "
            "hidden size 3,584, 28 query heads)"
        ),
        "hf_class": "Qwen2VLTextConfig",
        "agrees": ("max_position_embeddings", "rope_theta"),
    },
}  # fmt: skip

FAMILY_NAMES: tuple[str, ...] = tuple(_FAMILIES)
"""The families shipped, in the order a menu lists them."""


def family(name: str) -> dict[str, Any]:
    """A deep copy of one family's entry (``name``, ``config``, ``source``, ``hf_class``,
    ``agrees``): edit it freely. ``name`` is one of ``FAMILY_NAMES``."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (one of {list(FAMILY_NAMES)}), got {name!r}")
    if name not in _FAMILIES:
        raise ValueError(f"name must be one of {list(FAMILY_NAMES)}, got {name!r}")
    return copy.deepcopy(_FAMILIES[name])
