"""The rolling static cache's bookkeeping: StreamingLLM's sinks plus a window, written in place.

``KVCache(max_len=S + W, sinks=S, window=W)`` keeps the first ``S`` keys a row was given (the
attention sinks) and the latest ``W`` (Xiao et al., 2024, *Efficient Streaming Language Models
with Attention Sinks*). Its buffers hold ``S + W`` slots plus one *trash* slot: key number ``t``
(counted over every update since :meth:`~posenc.cache.KVCache.reset`) goes to slot ``t`` while
``t < S``, then wraps around the window's slots, ``S + (t - S) % W``; a key an update both
writes and supersedes (a prefill longer than the window) goes to the trash slot, which is
never attended. Every key keeps its true position, so ALiBi and T5 see true distances and
RoPE keys stay rotated at the positions they were seen at.

During an update the queries attend over ``cat(stored slots, new keys)`` with ``window=W`` and
``sinks=S``, and only then are the new keys written: a decode step of ``L`` tokens always has
``S + W + L`` keys (one compiled graph for any number of steps), and its output equals a
growing :class:`~posenc.cache.KVCache` whose :meth:`~posenc.cache.KVCache.evict` is given
:func:`~posenc.cache.streaming_keep` after every update.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_int


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
    (``start`` a 0-dim tensor): a sink slot, a window slot, or the trash slot ``S + W`` for a
    key a later key of the same update overwrites."""
    t = start + torch.arange(L, device=start.device)  # [L] the keys' numbers
    ring = sinks + (t - sinks).clamp(min=0) % window  # [L]
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
