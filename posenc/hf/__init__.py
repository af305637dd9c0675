"""posenc and Hugging Face transformers: read a model's config, run a model's attention.

Two layers live here, and the package keeps them apart:

* the **config reader** (:mod:`posenc.rope_config`, an encoding beside ``posenc.rope``,
  re-exported here and as ``posenc.hf.config``): :func:`rotary_kwargs_from_hf_config` finds a
  model's RoPE numbers in its config, for ``RotaryEmbedding.from_hf_config``. It never imports
  transformers;
* the **adapter** (:mod:`posenc.hf.adapter`, above attention: it calls ``posenc.attend``):
  :func:`register` makes ``attn_implementation="posenc"`` a transformers attention, and
  :func:`use` puts it into a loaded model, keeping the model's RoPE or swapping in ALiBi, T5,
  NoPE or posenc's RoPE. It is loaded on first use of either name, and imports transformers
  only when called: ``import posenc`` (and ``import posenc.hf``) need torch alone;
* :func:`~posenc.hf.extend.extend_context`: a copy of a config whose RoPE reaches a
  longer context the way transformers reads it (YaRN, Llama 3, linear, dynamic), keeping the
  model's own scaling and every field under ``rope_parameters``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..rope_config import INTERLEAVED_MODEL_TYPES, rotary_kwargs_from_hf_config
from .extend import extend_context

if TYPE_CHECKING:  # for the type checkers only: at run time __getattr__ loads them
    from .adapter import register, use

_ADAPTER = ("register", "use")

__all__ = [
    "INTERLEAVED_MODEL_TYPES", "extend_context", "register", "rotary_kwargs_from_hf_config", "use",
]


def __getattr__(name: str) -> Any:
    """``register`` and ``use`` from :mod:`posenc.hf.adapter`, imported on first access."""
    if name in _ADAPTER:
        from . import adapter

        value = getattr(adapter, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ADAPTER))
