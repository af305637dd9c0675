"""The encodings layer: read a Hugging Face model config into ``RotaryEmbedding`` arguments.

``RotaryEmbedding.from_hf_config(config)`` calls :func:`rotary_kwargs_from_hf_config`. The config
is a ``transformers.PretrainedConfig`` (anything with ``to_dict()``) or its dict, e.g. a model's
``config.json``; transformers is never imported, nor is ``posenc.hf`` (which re-exports these
names). The rope math itself is RoFormer's (Su et al., 2021) with the scalings of
``posenc.rope_scaling``; this module only finds the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._checks import check_bool, check_float, check_int

INTERLEAVED_MODEL_TYPES = frozenset({
    "gptj", "codegen", "cohere", "cohere2", "glm", "glm4", "helium", "ernie4_5",
    "ernie4_5_moe", "llama4", "llama4_text",
})  # fmt: skip
"""Hugging Face model types whose attention rotates interleaved pairs (0, 1), (2, 3), ... (GPT-J's
``rotate_every_two``, Cohere/GLM/Helium/ERNIE's own ``rotate_half``, Llama 4's complex product).
Every other HF model rotates pairs (i, i + d/2) (Llama's ``rotate_half``)."""
_NEEDS_ORIGINAL = ("yarn", "llama3", "longrope")


def rotary_kwargs_from_hf_config(
    config: Any, *, layer_type: str | None = None, interleaved: bool | None = None
) -> dict[str, Any]:
    """``RotaryEmbedding`` keyword arguments for an HF config, as HF's own rotary class uses it.

    Keys read (first found wins, in HF's order of priority):

    * ``rope_parameters`` (transformers 5.x) or ``rope_scaling`` (4.x ``config.json``): the rope
      type and its options, passed on as ``scaling``. When it is nested per layer type
      (Gemma 3: ``{"full_attention": {...}, "sliding_attention": {...}}``), ``layer_type``
      picks one. ``mrope_section`` (Qwen2-VL) is an error: use ``mrope_cos_sin``.
    * ``base``: ``rope_parameters["rope_theta"]``, else ``rope_theta`` (4.x), else
      ``rotary_emb_base`` (GPT-NeoX), else 10000.
    * ``partial_rotary_factor``: ``rope_parameters["partial_rotary_factor"]``, else
      ``partial_rotary_factor``, else ``rotary_pct`` (GPT-NeoX, which defaults to 0.25), else
      ``rotary_dim / head_dim`` (GPT-J, CodeGen), else 1.
    * ``head_dim``: ``head_dim`` when set (Gemma: 256, not hidden / heads), else
      ``hidden_size // num_attention_heads`` (also ``n_embd`` / ``n_head``).
    * lengths, as HF's rope functions read them: ``max_position_embeddings`` (``n_positions``)
      for ``dynamic`` (the trained length it scales from), ``yarn``, ``llama3``, ``longrope``;
      ``original_max_position_embeddings`` for ``yarn``/``llama3``/``longrope``, the top-level
      value first (Phi-3 keeps it there), then ``rope_parameters``, then
      ``max_position_embeddings``.
    * layout: ``interleaved`` if given, else ``True`` for ``rope_interleave=True`` (DeepSeek-V3's
      interleaved q/k weights) and the ``model_type`` s in ``INTERLEAVED_MODEL_TYPES``, else
      ``False``: most HF models (Llama, Qwen2, Phi-3, GPT-NeoX, Gemma) use the half layout.

    Returns ``{"head_dim", "base", "interleaved", "scaling", "partial_rotary_factor"}``;
    ``scaling`` is checked by ``RotaryEmbedding`` (keys a rope type does not use are errors).
    """
    cfg = _as_dict(config)
    params = _rope_params(cfg, layer_type)
    if "mrope_section" in params:
        raise ValueError(
            "config['rope_parameters'] has 'mrope_section' (multimodal RoPE, Qwen2-VL): "
            "RotaryEmbedding rotates by one position per token; use posenc.mrope_cos_sin"
        )
    head_dim = _head_dim(cfg)
    base = _first(params, cfg, "rope_theta", ("rope_theta", "rotary_emb_base"), 10000.0)
    base = check_float("config['rope_theta']", base, positive=True)
    partial = _partial(cfg, params, head_dim)

    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "dynamic":
        params["max_position_embeddings"] = _length(cfg, rope_type)
    elif rope_type in _NEEDS_ORIGINAL:
        max_len = _length(cfg, rope_type)
        params["max_position_embeddings"] = max_len
        top = cfg.get("original_max_position_embeddings")
        params["original_max_position_embeddings"] = (
            top if top is not None else params.get("original_max_position_embeddings") or max_len
        )
    scaling = params if set(params) - {"rope_type", "type"} or rope_type != "default" else None

    if interleaved is None:
        model_type = cfg.get("model_type")
        interleaved = cfg.get("rope_interleave") is True or model_type in INTERLEAVED_MODEL_TYPES
    return {
        "head_dim": head_dim,
        "base": base,
        "interleaved": check_bool("interleaved", interleaved),
        "scaling": scaling,
        "partial_rotary_factor": partial,
    }


def _as_dict(config: Any) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        to_dict = getattr(config, "to_dict", None)
        if not callable(to_dict):
            raise TypeError(
                f"config must be a transformers PretrainedConfig (with to_dict()) or a dict, "
                f"got {type(config).__name__}"
            )
        config = to_dict()
        if not isinstance(config, Mapping):
            raise TypeError(f"config.to_dict() must return a dict, got {type(config).__name__}")
    bad = [k for k in config if not isinstance(k, str)]
    if bad:
        raise TypeError(f"config keys must be str, got {bad[:3]!r}")
    return dict(config)


def _rope_params(cfg: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    new, old = cfg.get("rope_parameters"), cfg.get("rope_scaling")
    if new and old and new != old:
        raise ValueError(
            f"config has both rope_parameters={new!r} and rope_scaling={old!r}; give one "
            f"(rope_scaling is the transformers 4.x name)"
        )
    params = new or old or {}
    if not isinstance(params, Mapping):
        key = "rope_parameters" if new else "rope_scaling"
        raise TypeError(f"config[{key!r}] must be a dict or None, got {type(params).__name__}")
    nested = sorted(k for k, v in params.items() if isinstance(v, Mapping) or v is None)
    if nested and all(isinstance(v, Mapping) or v is None for v in params.values()):
        if layer_type is None or layer_type not in nested:
            raise ValueError(
                f"config['rope_parameters'] is nested per layer type {nested}; pass "
                f"layer_type= one of them, got {layer_type!r}"
            )
        params = params[layer_type]
        if params is None:
            raise ValueError(f"layer_type={layer_type!r} has no RoPE (a NoPE layer)")
    elif layer_type is not None:
        raise ValueError(
            f"layer_type={layer_type!r} given but config['rope_parameters'] is not nested per "
            f"layer type"
        )
    return dict(params)


def _first(params: dict, cfg: dict, key: str, cfg_keys: tuple[str, ...], default: Any) -> Any:
    """``params[key]``, else the first of ``cfg_keys`` in ``cfg``, else ``default``."""
    if params.get(key) is not None:
        return params.pop(key)
    params.pop(key, None)
    for k in cfg_keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _head_dim(cfg: dict[str, Any]) -> int:
    if cfg.get("head_dim") is not None:
        return check_int("config['head_dim']", cfg["head_dim"], minimum=2)
    hidden = cfg.get("hidden_size", cfg.get("n_embd"))
    heads = cfg.get("num_attention_heads", cfg.get("n_head"))
    if hidden is None or heads is None:
        raise ValueError(
            "config must give head_dim, or hidden_size and num_attention_heads (GPT-J: n_embd, "
            f"n_head); got head_dim=None, hidden_size={hidden!r}, num_attention_heads={heads!r}"
        )
    hidden = check_int("config['hidden_size']", hidden, minimum=1)
    heads = check_int("config['num_attention_heads']", heads, minimum=1)
    return check_int("config head_dim (hidden_size // num_attention_heads)", hidden // heads,
                     minimum=2)  # fmt: skip


def _partial(cfg: dict[str, Any], params: dict[str, Any], head_dim: int) -> float:
    p = _first(params, cfg, "partial_rotary_factor", ("partial_rotary_factor", "rotary_pct"), None)
    if p is None and cfg.get("rotary_dim") is not None:  # GPT-J, CodeGen: rotating channels
        p = check_int("config['rotary_dim']", cfg["rotary_dim"], minimum=2) / head_dim
    if p is None:
        p = 0.25 if cfg.get("model_type") == "gpt_neox" else 1.0  # HF GPTNeoXConfig default
    p = check_float("config['partial_rotary_factor']", p, positive=True)
    if p > 1.0:
        raise ValueError(f"config['partial_rotary_factor'] must be in (0, 1], got {p}")
    return p


def _length(cfg: dict[str, Any], rope_type: str) -> int:
    n = cfg.get("max_position_embeddings", cfg.get("n_positions"))
    if n is None:
        raise ValueError(
            f"config['max_position_embeddings'] is required for rope_type {rope_type!r}"
        )
    return check_int("config['max_position_embeddings']", n, minimum=1)
