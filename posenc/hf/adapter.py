"""posenc's attention inside a Hugging Face transformers model: ``register`` and ``use``.

transformers (5.x) looks a model's attention up by name in two tables: ``AttentionInterface``
(the function that attends) and ``AttentionMaskInterface`` (the function that turns the 2-D
padding mask into what the attention function is given). :func:`~posenc.hf.register` puts
posenc into both; registering only the first makes transformers hand the attention
``attention_mask=None``, and posenc's attention then refuses (``ValueError``) rather than
ignore the padding. :func:`~posenc.hf.use` switches
a loaded model to it, and may swap the model's RoPE for another posenc scheme (ALiBi, T5 bias,
NoPE, posenc's RoPE).

What the attention sees, and where it comes from:

* **positions** (the one rule every call follows): with a 2-D ``attention_mask``, a token's
  position is the number of real tokens before it (``cumsum(mask) - 1``, transformers'
  ``generate`` rule), for the queries and for every cached key alike, whatever the forward's
  ``position_ids`` say (the forward numbers a left-padded row from its first pad). Without a
  mask, the new tokens take ``position_ids`` (the forward's ``arange``, or a packing collator's
  restarting ids) and cached keys their index in the cache. An all-ones mask with nothing
  cached counts as no mask, as transformers' FlashAttention path drops it;
* **documents** (packed rows): with no padding (no mask or an all-ones one) and nothing cached,
  ``position_ids`` that restart mark documents by FlashAttention's rule
  (``prepare_fa_kwargs_from_position_ids``):
  every row starts a document, and another starts wherever a position equals the row's
  smallest, so ``[3, 4, 5, 0, 1, 2, 0, 1]`` is three documents (the first a chunk that started
  earlier) and ``[0, 1, 2, 3, 10, 11, 12, 13]`` one (PoSE's skipped positions). transformers'
  mask path would split the second row where it jumps (and apply no document mask at all once a
  cache is passed, e.g. ``use_cache=True``, the default). A packing collator's
  ``cu_seq_lens_q/k`` (``return_flash_attn_kwargs=True``) mark documents too, with or without
  ``position_ids``; they are refused with a padding mask or a cache, or where ``position_ids``
  restart inside one of their documents. A padding mask (with zeros) splits no row into
  documents, as in transformers: ``position_ids`` that restart under one warn at the caller's
  line; a 2-D mask holding values other than 0/1 (document ids, packing style) is refused
  (checked by ``use``'s forward pre-hook, ``posenc.hf.mask_checks``);
* **visibility**: causal, the layer's ``sliding_window``, the padding mask, the documents:
  :func:`~posenc.attention.attend`'s rule (a window counts positions: query ``m`` sees keys
  ``n`` with ``m - W < n <= m``, as transformers counts indices; a 2-D mask with zeros
  between real tokens makes the two counts differ, and a warning says so);
* **who sees whom**: a bool 4-D ``attention_mask [B, 1, Lq, Lk]`` passed to the model (True =
  sees; a speculative tree) is and-ed with causality; the new tokens sit at ``position_ids``
  (siblings share a depth), the cached keys at their indices ``0 .. Lk - Lq - 1`` (a padded
  prefix too: count the tree's ``position_ids`` from the index, ``Lk - Lq + depth``, not from
  the padding mask as the rules above do). Refused (``posenc.hf.mask_checks``): a 3-D
  ``[B, Lq, Lk]`` mask (``mask.unsqueeze(1)``), an integer 4-D one (``mask.bool()``) and one
  where no query sees its own key (inverted: True = masked);
* **the model's own settings**, from the attention module's call: ``scaling``, Gemma 2's
  ``softcap``, gpt-oss's learned sinks (``s_aux``), grouped-query heads, dropout.

transformers owns the cache (``DynamicCache``, ``StaticCache``, the sliding-window layers):
keys arrive from it in token order, and the mask function tells which token each cache slot
holds (``kv_offset``, ``kv_length``). With a swapped scheme the cache holds keys as projected
(the model's rotary is the identity) and posenc rotates or biases them by their positions at
every step. :class:`~posenc.hf.SinkCache` is posenc's own: StreamingLLM's sinks plus a window
on a rolling ``KVCache``, written by the attention.

:func:`~posenc.hf.use` records a swapped scheme in the config (``config.posenc``); a model
reloaded with posenc's attention refuses to run until ``use`` is called again (a reload with
an explicit ``attn_implementation="sdpa"`` never reaches posenc: the model's own RoPE runs).

Layer: integrations. The code is in ``posenc.hf.forward`` (what transformers calls at
every step) and ``posenc.hf.install`` (``register``, ``use``, the rotary swap); this
module re-exports their names, the same objects.
"""

from __future__ import annotations

# The adapter's two halves, re-exported here (the same objects): what transformers calls at
# every step (posenc.hf.forward), and what installs it in a model (posenc.hf.install).
from .forward import _DEFAULT as _DEFAULT
from .forward import _OPTIONS as _OPTIONS
from .forward import _fresh_rows as _fresh_rows
from .forward import _layout as _layout
from .forward import _Options as _Options
from .forward import _packed_rows as _packed_rows
from .forward import _Rows as _Rows
from .forward import attention_forward as attention_forward
from .forward import positions_mask as positions_mask
from .install import SWAPS as SWAPS
from .install import register as register
from .install import use as use

__all__ = ["SWAPS", "attention_forward", "positions_mask", "register", "use"]
