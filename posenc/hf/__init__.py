"""posenc and Hugging Face transformers.

The config reader (:mod:`posenc.hf.config`, an encoding like ``posenc.rope``):
:func:`rotary_kwargs_from_hf_config` finds a model's RoPE numbers in its config, for
``RotaryEmbedding.from_hf_config``. It never imports transformers.
"""

from __future__ import annotations

from .config import INTERLEAVED_MODEL_TYPES, rotary_kwargs_from_hf_config

__all__ = ["INTERLEAVED_MODEL_TYPES", "rotary_kwargs_from_hf_config"]
