"""Streaming inside transformers: :class:`SinkCache`, a transformers ``Cache`` built on posenc's
rolling :class:`~posenc.cache.KVCache` (StreamingLLM's sinks plus a window; Xiao et al., 2024).

transformers 5 dropped its own ``SinkCache``. This one keeps, per layer, the first ``sinks``
keys and the last ``window`` in a fixed ``[B, H_kv, sinks + window + 1, D]`` buffer written in
place, so ``model.generate(..., past_key_values=SinkCache(sinks=4, window=1020))`` runs for any
number of tokens in fixed memory. It works with posenc's attention only (a model switched by
:func:`~posenc.hf.use`): a layer's ``update`` hands posenc's attention the new keys and the
layer's rolling cache, and :func:`~posenc.attention.attend` writes and reads it with the cache's
own rule (query ``m`` sees keys ``n`` with ``m - window < n <= m``, plus the first ``sinks``).

Key layout: every key keeps its **true position** (the one the model gave it; chapter 11's
"sinks at their true positions"): the model's own RoPE rotated it there, posenc's schemes
(``use(model, "alibi" | "t5" | "rope")``) rotate or bias by it. StreamingLLM's positions
inside the cache (each step renumbers the kept keys ``0 .. sinks + window - 1``) are the other
layout chapter 11 measures; this cache does not offer it (see the book's chapter 11 and
``posenc.lab.production`` for it).
"""

from __future__ import annotations

import functools
from typing import Any

from torch import Tensor

from .._checks import check_int
from ..cache import KVCache

ROLLING_KWARG = "posenc_rolling_cache"
"""The attention kwarg a :class:`SinkCache` layer puts the layer's rolling cache under."""


def _cache_base() -> tuple[type, type]:
    """transformers' ``Cache`` and ``CacheLayerMixin`` (imported here, never by ``import
    posenc``)."""
    try:
        from transformers.cache_utils import Cache, CacheLayerMixin
    except ImportError as err:
        raise ImportError(
            "posenc.hf.SinkCache needs Hugging Face transformers >= 5.0 "
            "(pip install 'transformers>=5.24')"
        ) from err
    return Cache, CacheLayerMixin


@functools.cache
def _layer_class() -> type:
    _, mixin = _cache_base()

    class SinkLayer(mixin):  # type: ignore[misc, valid-type]
        """One layer's rolling cache: posenc's ``KVCache(max_len=sinks + window, sinks=sinks,
        window=window)``, written by posenc's attention."""

        is_compileable = False
        is_croppable = False
        is_sliding = False

        def __init__(self, sinks: int, window: int) -> None:
            super().__init__()
            self.kv = KVCache(max_len=sinks + window, sinks=sinks, window=window)
            self.seen = 0  # tokens given since the last reset (their count, not the ones kept)

        def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
            self.is_initialized = True

        def update(self, key_states: Tensor, value_states: Tensor, *args: Any,
                   **kwargs: Any) -> tuple[Tensor, Tensor]:
            """Hand posenc's attention this layer's rolling cache (through the attention's
            kwargs, which transformers passes here as ``kwargs=``); the new keys and values go
            back unchanged, and :func:`~posenc.attention.attend` writes them."""
            attn_kwargs = kwargs.get("kwargs")
            if not isinstance(attn_kwargs, dict):
                raise ValueError(
                    "posenc.hf.SinkCache is written by posenc's attention, but this model's "
                    "attention layer passed it no kwargs (transformers' attention calls "
                    "cache.update(k, v, layer_idx, kwargs=kwargs)); switch the model with "
                    "posenc.hf.use(model)"
                )
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            attn_kwargs[ROLLING_KWARG] = self.kv
            self.seen += key_states.shape[-2]
            return key_states, value_states

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            """``(kv_length, kv_offset)``: the mask describes the new tokens only (the cache
            knows its stored keys' positions and padding itself)."""
            return query_length, self.seen

        def get_seq_length(self) -> int:
            return self.seen

        def get_max_length(self) -> int:
            return -1  # any number of tokens: the oldest beyond the window are dropped

        def reset(self) -> None:
            self.kv.reset()
            self.seen = 0

        def reorder_cache(self, beam_idx: Tensor) -> None:
            if self.seen:
                self.kv.select(beam_idx)

        def batch_select_indices(self, indices: Tensor) -> None:
            self.reorder_cache(indices)

    return SinkLayer


def SinkCache(sinks: int = 4, window: int = 1020, *, num_layers: int | None = None,
              config: Any = None) -> Any:
    """A transformers ``Cache`` that keeps the first ``sinks`` keys and the last ``window`` of
    every layer (StreamingLLM), for ``model.generate(..., past_key_values=cache)`` on a model
    switched by :func:`~posenc.hf.use`; fixed memory for any number of generated tokens.

    The attention rule is the cache's: query ``m`` sees keys ``n`` with ``m - window < n <= m``
    (:func:`~posenc.attention.attend`'s ``window``, counted in positions) and the first
    ``sinks`` keys; keys keep their true positions (the model's RoPE or posenc's scheme sees
    true distances). Outputs equal posenc's own rolling ``KVCache(max_len=sinks + window,
    sinks=sinks, window=window)`` decode, and a full pass under the same visibility.

    ``num_layers`` (or ``config``, whose ``num_hidden_layers`` it reads): how many layers to
    build up front; without either the layers are added as the model first writes them. A
    left-padded row keeps pads as its sinks (a warning says so): pad on the right or prefill
    such rows alone. ``crop`` (assisted decoding) is not supported; ``reset()`` empties it for
    the next batch. The layers hold posenc ``KVCache`` objects (``cache.layers[i].kv``).

    Raises:
        TypeError / ValueError: ``sinks`` not an int ``>= 0``, ``window`` not an int ``>= 1``,
            ``num_layers`` not an int ``>= 1``.
        ImportError: transformers is missing.
        ValueError (at the first forward): the model's attention is not posenc's.
    """
    sinks = check_int("sinks", sinks, minimum=0)
    window = check_int("window", window, minimum=1)
    if num_layers is None and config is not None:
        text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) \
            else config
        num_layers = getattr(text, "num_hidden_layers", None)
    cache_cls, _ = _cache_base()
    layer = _layer_class()
    if num_layers is None:
        return cache_cls(layer_class_to_replicate=lambda: layer(sinks, window))
    num_layers = check_int("num_layers", num_layers, minimum=1)
    return cache_cls(layers=[layer(sinks, window) for _ in range(num_layers)])
