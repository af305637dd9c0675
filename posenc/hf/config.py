"""The integrations layer's old name for the config reader, kept for compatibility: it lives
in :mod:`posenc.rope_config` (the encodings layer).

``posenc.hf.config.rotary_kwargs_from_hf_config`` and ``posenc.hf.config.INTERLEAVED_MODEL_TYPES``
are the same objects as there.
"""

from __future__ import annotations

from ..rope_config import INTERLEAVED_MODEL_TYPES, rotary_kwargs_from_hf_config

__all__ = ["INTERLEAVED_MODEL_TYPES", "rotary_kwargs_from_hf_config"]
