"""posenc: positional encodings for Transformers, tested against their papers and references.

Sinusoidal (Vaswani et al., 2017), learned absolute, RoPE (Su et al., 2024) and its scaled
variants, ALiBi (Press et al., 2022), T5 relative bias (Raffel et al., 2020) and NoPE, behind
one attention module that calls each scheme's hooks (embed / rotate / bias).

The book's laboratory (tiny model, corpus, training, experiments) is :mod:`posenc.lab`; this
package never imports it.
"""

import sys
import types

from .alibi import alibi_bias, alibi_bias_padded, alibi_score_mod, alibi_slopes
from .attention import MultiHeadAttention, attend
from .axial import axial_rope_cos_sin
from .cache import KVCache, LayerCaches, streaming_keep
from .device import default_device
from .explain import RopeIssue, RopeReport, explain
from .learned import LearnedPositionalEmbedding
from .masks import causal_block_mask, causal_mask
from .mla import mla_rope
from .mrope import mrope_cos_sin, mrope_position_ids
from .positions import (
    cu_seqlens,
    document_ids_from_lengths,
    document_ids_from_positions,
    packed_positions,
    positions_from_mask,
    shard_positions,
)
from .rope import (
    RotaryEmbedding,
    apply_rope,
    convert_rope_weight,
    rope_cos_sin,
    rope_permutation,
    rotate_every_two,
    rotate_half,
)
from .rope_scaling import ROPE_TYPES, RopeWavelengths, rope_inv_freq, rope_wavelengths
from .schemes import (
    SCHEMES,
    ALiBi,
    LearnedPE,
    NoPE,
    PositionScheme,
    RoPE,
    SinusoidalPE,
    T5Bias,
    make_scheme,
)
from .sinusoidal import SinusoidalPositionalEmbedding, sinusoidal_table
from .t5 import T5RelativeBias, t5_relative_bucket
from .temperature import llama4_attn_scale

_SETTINGS = {"MASK_CACHE_BYTES": "posenc.schemes"}
"""Module-level settings, by the module that reads them: the package keeps no copy."""


class _NotASetting(AttributeError, ValueError):
    """``posenc.NAME = value`` for a setting that lives in a submodule (an AttributeError, as
    Python raises for an attribute that cannot be set, and a ValueError, as posenc raises)."""


class _Package(types.ModuleType):
    """The package's module type: assigning a submodule's setting here raises, since Python
    would otherwise make a new name that nothing reads."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _SETTINGS:
            raise _NotASetting(
                f"posenc.{name} is not read by anything: the setting is "
                f"{_SETTINGS[name]}.{name}; set it there ({_SETTINGS[name]}.{name} = {value!r})"
            )
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def _version() -> str:
    """The installed distribution's version: it is written in pyproject.toml only."""
    from importlib import metadata

    try:
        return metadata.version("posenc")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


__version__: str = _version()

__all__ = [
    "ROPE_TYPES",
    "SCHEMES",
    "RopeIssue",
    "RopeReport",
    "RopeWavelengths",
    "ALiBi",
    "KVCache",
    "LayerCaches",
    "LearnedPE",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "NoPE",
    "PositionScheme",
    "RoPE",
    "RotaryEmbedding",
    "SinusoidalPE",
    "SinusoidalPositionalEmbedding",
    "T5Bias",
    "T5RelativeBias",
    "alibi_bias",
    "alibi_bias_padded",
    "alibi_score_mod",
    "alibi_slopes",
    "apply_rope",
    "attend",
    "axial_rope_cos_sin",
    "llama4_attn_scale",
    "mla_rope",
    "mrope_cos_sin",
    "mrope_position_ids",
    "causal_block_mask",
    "causal_mask",
    "convert_rope_weight",
    "cu_seqlens",
    "default_device",
    "document_ids_from_lengths",
    "document_ids_from_positions",
    "explain",
    "make_scheme",
    "packed_positions",
    "positions_from_mask",
    "shard_positions",
    "rope_cos_sin",
    "rope_inv_freq",
    "rope_permutation",
    "rope_wavelengths",
    "rotate_every_two",
    "rotate_half",
    "sinusoidal_table",
    "streaming_keep",
    "t5_relative_bucket",
]
