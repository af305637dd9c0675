"""The rolling static cache's bookkeeping: StreamingLLM's sinks plus a window, written in place.

``KVCache(max_len=S + W, sinks=S, window=W)`` keeps the first ``S`` keys a row was given (the
attention sinks) and the latest ``W`` (Xiao et al., 2024, *Efficient Streaming Language Models
with Attention Sinks*). Its buffers hold ``N = S + W`` slots plus one *scratch* slot ``N``: key
number ``t`` (counted over every update since :meth:`~posenc.cache.KVCache.reset`) goes to slot
``t`` while ``t < S``, then wraps around the window's slots, ``S + (t - S) % W``; a key an
update both writes and supersedes (a prefill longer than the window) goes to the scratch slot.
Every key keeps its true position, so ALiBi and T5 see true distances and RoPE keys stay rotated
at the positions they were seen at.

The queries of an update attend over the ``N`` stored slots plus the new keys under
``window=W`` and ``sinks=S`` before any stored key is overwritten (the key a step replaces may
still be visible to it, e.g. as a sink by position in a left-padded row). A one-token decode
step writes its key into the scratch slot and attends over the ``N + 1`` slots in place (no
copy of the cache); the next update first moves that key to its own slot (:func:`flush`). A
longer update attends over ``cat(stored, new)`` and leaves a copy of its last key in the
scratch slot, so the move is the same. Every decode step has the same shapes (one compiled
graph for any number of steps), and the outputs equal a growing
:class:`~posenc.cache.KVCache` whose :meth:`~posenc.cache.KVCache.evict` is given
:func:`~posenc.cache.streaming_keep` after every update.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ._checks import check_int, is_compiling

if TYPE_CHECKING:
    from .cache import KVCache


def check_rolling(max_len: object, sinks: object, window: object) -> tuple[int | None, int | None]:
    """``(sinks, window)`` of a rolling cache, checked against ``max_len`` (``(None, None)``
    for a growing or plain static cache)."""
    if window is None:
        if sinks is not None:
            raise ValueError(
                f"KVCache: sinks={sinks!r} needs window=W too (a rolling cache keeps the first "
                "sinks keys plus the last W: KVCache(max_len=S + W, sinks=S, window=W))"
            )
        return None, None
    window = check_int("window", window, minimum=1)
    sinks = 0 if sinks is None else check_int("sinks", sinks, minimum=0)
    if max_len is None:
        raise ValueError(
            f"KVCache: window={window} makes a rolling static cache and needs "
            f"max_len=sinks + window = {sinks + window} (KVCache(max_len=S + W, sinks=S, "
            "window=W)); for a growing cache leave window out and evict"
        )
    if max_len != sinks + window:
        raise ValueError(
            f"KVCache: a rolling cache holds sinks + window keys, so max_len must be "
            f"{sinks} + {window} = {sinks + window}, got max_len={max_len}"
        )
    return sinks, window


def write_slots(start: Tensor, L: int, sinks: int, window: int) -> Tensor:
    """``[L]`` int64: the slot of each of ``L`` new keys numbered ``start, start + 1, ...``
    (``start`` a 0-dim tensor): a sink slot, a window slot, or the scratch slot ``S + W`` for a
    key a later key of the same update overwrites."""
    if L == 1:  # a decode step: the key is the latest, always kept
        t = start.reshape(1)  # [1]
        return torch.where(t < sinks, t, sinks + (t - sinks) % window)  # [1]
    t = start + torch.arange(L, device=start.device)  # [L] the keys' numbers
    ring = sinks + (t - sinks) % window  # [L] (% of a negative int64 is >= 0: t < S is not used)
    kept = t >= start + L - window  # the last W of this update survive it
    trash = torch.full_like(t, sinks + window)
    return torch.where(t < sinks, t, torch.where(kept, ring, trash))  # [L]


def written(filled: Tensor, slots: int) -> Tensor:
    """``[slots]`` bool: the slots written so far, ``filled`` keys after a reset (sink ``j`` and
    window slot ``j`` are first written by key ``j``, so this is ``arange < filled``)."""
    return torch.arange(slots, device=filled.device) < filled


def check_rule(window: object, sinks: object, cache_window: int, cache_sinks: int) -> None:
    """A rolling cache imposes its own rule: ``window`` and ``sinks`` given to
    :func:`~posenc.attention.attend` must be None or the cache's."""
    if window is not None and window != cache_window:
        raise ValueError(
            f"window={window!r} with a rolling KVCache(window={cache_window}, "
            f"sinks={cache_sinks}): the cache holds the last {cache_window} keys, so the rule is "
            f"its own: pass window={cache_window} or None"
        )
    if sinks is not None and sinks != cache_sinks:
        raise ValueError(
            f"sinks={sinks!r} with a rolling KVCache(window={cache_window}, "
            f"sinks={cache_sinks}): the cache keeps the first {cache_sinks} keys, so the rule is "
            f"its own: pass sinks={cache_sinks} or None"
        )


def flush(cache: KVCache) -> None:
    """Copy the scratch slot (a copy of key ``filled - 1``) into that key's own slot: a no-op
    if it is there already or nothing was written. Idempotent."""
    assert cache.k is not None and cache.v is not None and cache.filled is not None
    assert cache.positions is not None and cache.valid is not None
    assert cache.sinks is not None and cache.window is not None and cache.max_len is not None
    N = cache.max_len
    last = write_slots(cache.filled - 1, 1, cache.sinks, cache.window)  # [1]
    last = torch.where(cache.filled > 0, last, N)  # nothing written: the scratch slot itself
    cache.k.index_copy_(2, last, cache.k[:, :, N:].clone())
    cache.v.index_copy_(2, last, cache.v[:, :, N:].clone())
    cache.positions.index_copy_(1, last, cache.positions[:, N:].clone())
    cache.valid.index_copy_(1, last, cache.valid[:, N:].clone())


def rolling_update(
    cache: KVCache, k: Tensor, v: Tensor, pos: Tensor, new_valid: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """Add ``k [B, H_kv, L, D_h]``, ``v [B, H_kv, L, D_v]`` at ``pos [B, L]`` (``new_valid
    [B, L]``: False = padding) to a rolling ``cache``; returns ``(keys, values, positions,
    valid, q_slot)`` for the queries: ``[B, H_kv, N + L, D]``, ``[B, N + L]`` and the new keys'
    first slot ``N`` (``valid`` is False for unwritten slots and padding)."""
    assert cache.max_len is not None and cache.sinks is not None and cache.window is not None
    B, H, L, D = k.shape
    N = cache.max_len
    S = cache.sinks
    if cache.k is None and new_valid is not None and S > 0 and not is_compiling():
        padded = ~new_valid[:, :S].all(-1)  # [B]: a pad among the first S slots
        if bool(padded.any()):
            warnings.warn(
                f"rows {padded.nonzero().flatten().tolist()} start with padding: a rolling "
                f"KVCache keeps the first sinks={S} slots, so those rows keep pads, not their "
                "first real tokens, as sinks (StreamingLLM's layout per slot); pad on the right "
                "or prefill such rows without padding to keep their real first tokens",
                stacklevel=4,
            )
    if cache.k is None:  # N slots and the scratch slot
        cache.k = k.new_zeros(B, H, N + 1, D)  # [B, H_kv, N + 1, D_h]
        cache.v = v.new_zeros(B, H, N + 1, v.shape[-1])  # [B, H_kv, N + 1, D_v]
        cache.positions = torch.zeros(B, N + 1, dtype=torch.long, device=k.device)  # [B, N + 1]
        cache.filled = torch.zeros((), dtype=torch.long, device=k.device)
        cache.next_start = torch.zeros(B, dtype=torch.long, device=k.device)  # [B]
        # [B, N + 1]: False until written, then False for padding
        cache.valid = torch.zeros(B, N + 1, dtype=torch.bool, device=k.device)
    assert (cache.v is not None and cache.positions is not None and cache.filled is not None
            and cache.valid is not None)
    flush(cache)  # the stored slots: the sinks and the last W keys
    real = new_valid if new_valid is not None else torch.ones(
        B, L, dtype=torch.bool, device=k.device)  # [B, L]
    if L == 1:  # a decode step: the new key in the scratch slot, attended in place
        cache.k[:, :, N:].copy_(k)
        cache.v[:, :, N:].copy_(v)
        cache.positions[:, N:].copy_(pos)
        cache.valid[:, N:].copy_(real)
        cache.filled.add_(1)
        return cache.k, cache.v, cache.positions, cache.valid, N
    view = (
        torch.cat([cache.k[:, :, :N], k], dim=-2),  # [B, H_kv, N + L, D_h]
        torch.cat([cache.v[:, :, :N], v], dim=-2),  # [B, H_kv, N + L, D_v]
        torch.cat([cache.positions[:, :N], pos], dim=-1),  # [B, N + L]
        torch.cat([cache.valid[:, :N], real], dim=-1),  # [B, N + L]: written, not padding
        N,
    )
    slots = write_slots(cache.filled, L, cache.sinks, cache.window)  # [L]
    cache.k.index_copy_(2, slots, k)
    cache.v.index_copy_(2, slots, v)
    cache.positions.index_copy_(1, slots, pos)
    cache.valid.index_copy_(1, slots, real)
    if L:  # the last key's copy in the scratch slot, as a decode step leaves it
        cache.k[:, :, N:].copy_(k[:, :, -1:])
        cache.v[:, :, N:].copy_(v[:, :, -1:])
        cache.positions[:, N:].copy_(pos[:, -1:])
        cache.valid[:, N:].copy_(real[:, -1:])
    cache.filled.add_(L)
    return view
