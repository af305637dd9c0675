"""The laboratory of chapter 11 (positions at serving time): how inference engines store, reuse,
verify and split the keys that positions rotate, written small enough to read, each equal to
``posenc``'s contiguous :class:`~posenc.cache.KVCache` and :func:`~posenc.attention.attend`
(the tests assert it).

- :class:`~posenc.lab.serving_paged.PagedKVCache` and
  :func:`~posenc.lab.serving_paged.paged_attend`: the paged KV cache of vLLM (Kwon et al.,
  2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention")
  and SGLang: fixed-size blocks handed out from a free list, a block table per row and a slot
  mapping per token, none of which is the position RoPE rotates by;
- :func:`~posenc.lab.serving_positions.shift_rotated_keys`: prefix caching reuses rotated keys
  only at the positions they were rotated for; a chunk moved by ``shift`` positions needs one
  more rotation by ``shift``;
- :func:`~posenc.lab.serving_flash.kvcache_step_reference`: flash-attn's
  ``flash_attn_with_kvcache`` (rotate the new query and key at each row's offset
  ``cache_seqlens[b]``, write them into the cache there, attend over the row's filled prefix)
  on the CPU, from its documented semantics;
- :func:`~posenc.lab.serving_ring.partial_attention`,
  :func:`~posenc.lab.serving_ring.merge_partials` and
  :func:`~posenc.lab.serving_ring.attend_sharded`: context parallelism as torch runs it (ring
  attention, Liu et al., 2023; torch's ``_SDPAMerger`` in
  ``torch/distributed/tensor/experimental/_context_parallel/_attention.py``): per-block
  outputs and log-sum-exps merged by log-sum-exp, causal blocks skipped by position;
- :func:`~posenc.lab.serving_positions.rebase_cache`: llama.cpp's context shift, a bulk rebase
  of every cached key by one rotation, so positions stay small on an endless stream;
- :func:`~posenc.lab.serving_positions.tree_positions_and_mask`: a speculative-decoding draft
  tree's positions (by depth) and its who-sees-whom mask, the boolean mask
  :func:`~posenc.attention.attend` takes.

Layouts: posenc's ``[B, H, L, Dh]`` unless a docstring says otherwise (flash-attn's
``[B, L, H, Dh]`` in :func:`~posenc.lab.serving_flash.kvcache_step_reference`, vLLM's pages
``[N, block, H, Dh]``).

The code lives in one module per concern, whose public names this module re-exports (import
them from here): :mod:`~posenc.lab.serving_paged` (the paged cache),
:mod:`~posenc.lab.serving_flash` (flash-attn's decode step), :mod:`~posenc.lab.serving_ring`
(context parallelism), :mod:`~posenc.lab.serving_positions` (positions moved: shifted keys,
the context shift, draft trees); ``serving_checks.py`` holds what they share.
"""

from __future__ import annotations

from .serving_checks import LAYOUT as LAYOUT
from .serving_flash import kvcache_step_reference
from .serving_paged import PagedKVCache, paged_attend
from .serving_positions import rebase_cache, shift_rotated_keys, tree_positions_and_mask
from .serving_ring import ShardedAttention, attend_sharded, merge_partials, partial_attention

__all__ = [
    "PagedKVCache", "paged_attend", "shift_rotated_keys", "kvcache_step_reference",
    "partial_attention", "merge_partials", "attend_sharded", "ShardedAttention",
    "rebase_cache", "tree_positions_and_mask",
]
