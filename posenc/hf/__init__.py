"""The integrations layer: posenc and Hugging Face transformers (read a model's config, run a
model's attention).

* the **config reader** (``posenc.rope_config``, an encoding beside ``posenc.rope``,
  re-exported here and as ``posenc.hf.config``): :func:`rotary_kwargs_from_hf_config` finds a
  model's RoPE numbers in its config, for ``RotaryEmbedding.from_hf_config``. It never imports
  transformers;
* the **adapter** (:mod:`posenc.hf.adapter`, above attention: it calls ``posenc.attend``):
  :func:`register` makes ``attn_implementation="posenc"`` a transformers attention, and
  :func:`use` puts it into a loaded model, keeping the model's RoPE or swapping in ALiBi, T5,
  NoPE or posenc's RoPE. ``posenc.hf.forward`` holds what transformers calls at every step,
  ``posenc.hf.install`` what puts it into a model. transformers is imported only when
  ``register`` or ``use`` is called: ``import posenc.hf`` needs torch alone;
* :func:`~posenc.hf.extend.extend_context`: a copy of a config whose RoPE reaches a
  longer context the way transformers reads it (YaRN, Llama 3, linear, dynamic), keeping the
  model's own scaling and every field under ``rope_parameters``.
* :class:`SinkCache` (``posenc.hf.sink_cache``): StreamingLLM's sinks plus a window as a
  transformers ``Cache`` for ``generate``, on posenc's rolling ``KVCache``.
"""

from __future__ import annotations

from ..rope_config import INTERLEAVED_MODEL_TYPES, rotary_kwargs_from_hf_config
from .extend import extend_context
from .install import register, use
from .sink_cache import SinkCache

__all__ = [
    "INTERLEAVED_MODEL_TYPES", "SinkCache", "extend_context", "register",
    "rotary_kwargs_from_hf_config", "use",
]
