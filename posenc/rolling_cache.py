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
copy of the cache); the next update first moves that key to its own slot
(:meth:`Rolling.flush`). A longer update attends over ``cat(stored, new)`` and leaves a copy
of its last key in the scratch slot, so the move is the same. Every decode step has the same
shapes (one compiled graph for any number of steps), and the outputs equal a growing
:class:`~posenc.cache.KVCache` whose :meth:`~posenc.cache.KVCache.evict` is given
:func:`~posenc.cache.streaming_keep` after every update.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_int, check_sinks, is_compiling, warn_caller
from .cache_slots import CacheView, MaskColumns, Static


def check_rolling(max_len: object, sinks: object, window: object) -> tuple[int | None, int | None]:
    """``(sinks, window)`` of a rolling cache, checked against ``max_len`` (``(None, None)``
    for a growing or plain static cache)."""
    if window is None:
        check_sinks(None, sinks, owner="KVCache: ")
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


class Rolling(Static):
    """``KVCache(max_len=S + W, sinks=S, window=W)``: the first ``S`` keys and the last ``W``,
    in ``S + W`` slots plus the scratch slot, written around in place."""

    rolling = True

    def __init__(self, max_len: int, sinks: int, window: int) -> None:
        super().__init__(max_len)
        self.sinks: int = sinks
        self.window: int = window

    def written(self) -> Tensor | None:
        """Every slot but the scratch one, once written."""
        if self.filled is None or self.k is None:
            return None
        slots = torch.arange(self.k.shape[-2], device=self.k.device)
        return written(self.filled, self.k.shape[-2]) & (slots < self.max_len)

    def imposed_rule(self) -> tuple[int, int]:
        """``(window, sinks)``: the rule attention must follow over these slots."""
        return self.window, self.sinks

    def mask_columns(self, new: int) -> MaskColumns:
        held = 0 if self.filled is None or is_compiling() else self.held()
        return MaskColumns(held, new, new, new, None, 0, True, True)

    def flush(self) -> None:
        """Copy the scratch slot (a copy of key ``filled - 1``) into that key's own slot: a
        no-op if it is there already or nothing was written. Idempotent."""
        if self.k is None:
            return
        assert self.v is not None and self.filled is not None
        assert self.positions is not None and self.valid is not None
        N = self.max_len
        last = write_slots(self.filled - 1, 1, self.sinks, self.window)  # [1]
        last = torch.where(self.filled > 0, last, N)  # nothing written: the scratch slot itself
        self.k.index_copy_(2, last, self.k[:, :, N:].clone())
        self.v.index_copy_(2, last, self.v[:, :, N:].clone())
        self.positions.index_copy_(1, last, self.positions[:, N:].clone())
        self.valid.index_copy_(1, last, self.valid[:, N:].clone())

    def _warn_padded_sinks(self, new_valid: Tensor | None) -> None:
        """A first update whose rows start with padding keeps pads as sinks: say so."""
        S = self.sinks
        if self.k is not None or new_valid is None or S == 0 or is_compiling():
            return
        padded = ~new_valid[:, :S].all(-1)  # [B]: a pad among the first S slots
        if bool(padded.any()):
            warn_caller(
                f"rows {padded.nonzero().flatten().tolist()} start with padding: a rolling "
                f"KVCache keeps the first sinks={S} slots, so those rows keep pads, not their "
                "first real tokens, as sinks (StreamingLLM's layout per slot); pad on the right "
                "or prefill such rows without padding to keep their real first tokens"
            )

    def append(
        self, k: Tensor, v: Tensor, pos: Tensor, document_ids: Tensor | None,
        new_valid: Tensor | None, defaulted: bool,
    ) -> CacheView:
        """The keys the queries attend over, ``[B, H_kv, N + L, D]`` (the ``N`` stored slots,
        then the new keys) with ``valid [B, N + L]`` (False: unwritten or padding) and the new
        keys' first slot ``N``; the new keys are then written in place."""
        self._warn_padded_sinks(new_valid)
        N, L = self.max_len, k.shape[-2]
        if self.k is None:  # N slots and the scratch slot; valid False until written
            self.allocate(k, v, N + 1, None)
            assert self.valid is not None
            self.valid.fill_(False)
        self.flush()  # the stored slots: the sinks and the last W keys
        assert self.k is not None and self.v is not None and self.filled is not None
        assert self.positions is not None and self.valid is not None
        real = new_valid if new_valid is not None else torch.ones(
            pos.shape, dtype=torch.bool, device=k.device)  # [B, L]
        if L == 1:  # a decode step: the new key in the scratch slot, attended in place
            self._write_scratch(k, v, pos, real)
            self.filled.add_(1)
            self.advance(pos, new_valid)
            return CacheView(self.k, self.v, self.positions, None, self.valid, N)
        view = CacheView(
            torch.cat([self.k[:, :, :N], k], dim=-2),  # [B, H_kv, N + L, D_h]
            torch.cat([self.v[:, :, :N], v], dim=-2),  # [B, H_kv, N + L, D_v]
            torch.cat([self.positions[:, :N], pos], dim=-1),  # [B, N + L]
            None,
            torch.cat([self.valid[:, :N], real], dim=-1),  # [B, N + L]: written, not padding
            N,
        )
        slots = write_slots(self.filled, L, self.sinks, self.window)  # [L]
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        self.positions.index_copy_(1, slots, pos)
        self.valid.index_copy_(1, slots, real)
        if L:  # the last key's copy in the scratch slot, as a decode step leaves it
            self._write_scratch(k[:, :, -1:], v[:, :, -1:], pos[:, -1:], real[:, -1:])
        self.filled.add_(L)
        self.advance(pos, new_valid)
        return view

    def _write_scratch(self, k: Tensor, v: Tensor, pos: Tensor, real: Tensor) -> None:
        """One key, its value, position and validity into the scratch slot ``N``."""
        assert self.k is not None and self.v is not None
        assert self.positions is not None and self.valid is not None
        N = self.max_len
        self.k[:, :, N:].copy_(k)
        self.v[:, :, N:].copy_(v)
        self.positions[:, N:].copy_(pos)
        self.valid[:, N:].copy_(real)
