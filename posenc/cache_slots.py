"""A KV cache's storage: the tensors and counters (:class:`Slots`) and two ways to fill them.

:class:`Growing` appends by concatenation (``KVCache()``); :class:`Static` preallocates
``max_len`` slots on the first append and writes in place at a write pointer kept as a 0-dim
tensor (``KVCache(max_len=N)``), so every decode step has the same shapes and
``torch.compile`` compiles one graph for any number of steps. The rolling kind lives in
``posenc.rolling_cache`` (``Rolling(Static)``); :class:`~posenc.cache.KVCache` is the public
face that picks one at construction and checks what it is given.

Values that change every step (``filled``, ``next_start``, a view's ``q_slot``) stay tensors
for a static cache: dynamo guards on Python ints and would compile a graph per step.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._checks import is_compiling

_FIELDS = ("k", "v", "positions", "document_ids", "next_start", "valid")  # the [B, ...] tensors


class CacheView(NamedTuple):
    """What attention needs after an update: every key and value, and where they sit."""

    k: Tensor  # [B, H_kv, T, D_h]
    v: Tensor  # [B, H_kv, T, D_v] (D_v = D_h but in multi-head latent attention)
    positions: Tensor  # [B, T] int64, the keys' positions
    document_ids: Tensor | None  # [B, T] or None
    valid: Tensor | None  # [T] bool, the written slots of a static cache ([B, T] with the
    # padding for a rolling one); None: all. KVCache.append's view: [B, T] or [1, T], written
    # and not padding, merged (None: every key is real)
    q_slot: Tensor | int  # the slot of the first new token (a 0-dim tensor for a static cache)


class MaskColumns(NamedTuple):
    """The columns a ``[B, T]`` padding or ``[B, Lq, T]`` who-sees-whom mask may have with a
    cache, and where the ``new`` keys sit among them (:meth:`~posenc.cache.KVCache.mask_columns`).
    """

    held: int  # keys held before this call (0 for a static cache while compiling: unknown)
    new: int  # keys this call adds
    width: int  # the columns of the key mask attention builds (a padding mask padded or cut)
    least: int  # fewest columns of a mask: the cached plus new keys (rolling: the new keys)
    most: int | None  # most columns (a static cache's slots; None: any, rolling)
    start: Tensor | int  # the column of the first new key within ``width``
    cut: bool  # rolling: only the last ``new`` columns are read; the view's valid says the rest
    remember_all: bool  # False: a growing cache that saw no padding forgets an all-real mask

    @property
    def slotted(self) -> bool:
        """The mask spans a static cache's slots: a narrower one is padded with False."""
        return isinstance(self.start, Tensor)

    def padding_fits(self, T: int) -> bool:
        """A ``[B, T]`` padding mask has a width the cache can take."""
        if self.most is None:
            return T >= self.least
        return T == self.most or self.least <= T <= self.most

    def pairs_fit(self, T: int) -> bool:
        """A ``[B, Lq, T]`` who-sees-whom mask has a width the cache can take (never rolling)."""
        return T == self.least or (self.most is not None and self.least <= T <= self.most)

    def widen(self, key_valid: Tensor) -> Tensor:
        """A checked ``[1 | B, T]`` padding mask as ``[1 | B, width]``: cut to the new keys'
        columns (rolling) or padded with False (a static cache's unwritten slots)."""
        T = key_valid.shape[-1]
        if self.cut:
            return key_valid[:, T - self.new:]
        if T < self.width:
            return torch.nn.functional.pad(key_valid, (0, self.width - T), value=False)
        return key_valid

    def new_columns(self, key_valid: Tensor, B: int) -> Tensor | None:
        """``[B, new]`` bool: which new keys a widened mask calls real, for the cache to
        remember; None when there is nothing to remember (eagerly: a growing cache that saw no
        padding, given an all-real mask)."""
        if self.cut:
            return key_valid.expand(B, self.new)
        if isinstance(self.start, Tensor):
            slots = self.start.to(key_valid.device) + torch.arange(
                self.new, device=key_valid.device)
            return key_valid.index_select(1, slots).expand(B, self.new)
        new = key_valid[:, key_valid.shape[-1] - self.new:].expand(B, self.new)  # [B, new]
        if not self.remember_all and not is_compiling() and bool(new.all()):
            return None  # nothing to remember: the fast path stays open
        return new


def top(pos: Tensor, new_valid: Tensor | None) -> Tensor:
    """``[B]``: each row's highest position among its real new keys, plus 1 (0 if none)."""
    if new_valid is None:
        return pos.amax(-1) + 1
    return (torch.where(new_valid, pos, -1).amax(-1) + 1).clamp(min=0)


class Slots:
    """The tensors and counters of one layer's cache (all None until the first append)."""

    static = False
    rolling = False
    max_len: int | None = None
    sinks: int | None = None
    window: int | None = None

    def __init__(self) -> None:
        self.k: Tensor | None = None  # [B, H_kv, T, D_h], stored rotated
        self.v: Tensor | None = None  # [B, H_kv, T, D_v]
        self.positions: Tensor | None = None  # [B, T] int64
        self.document_ids: Tensor | None = None  # [B, T]
        self.valid: Tensor | None = None  # [B, T] bool: False = a padding key (None: none seen)
        self.filled: Tensor | None = None  # static: 0-dim int64, slots written so far
        self.next_start: Tensor | None = None  # [B] int64: each row's highest position + 1
        self.seen = 0  # growing: tokens appended (kept for compatibility)
        self.evicted = False
        self.rows_agree = True  # no row was given positions of its own since the last reset

    def clear(self) -> None:
        """Drop every tensor (the counters stay)."""
        self.k = self.v = self.positions = self.document_ids = self.valid = None
        self.filled = self.next_start = None

    def held(self) -> int:
        """Keys held (a host sync for a static cache)."""
        if self.k is None:
            return 0
        if self.filled is not None:
            return min(int(self.filled), self.max_len or 0)
        return self.k.shape[-2]

    def written(self) -> Tensor | None:
        """``[T]`` bool, the written slots of a static cache (None for a growing one)."""
        return None

    def refill_after_reset(self) -> bool:
        """Drop the buffers of an emptied static cache (False: nothing dropped)."""
        return False

    def next_positions(self, length: int, device: torch.device) -> Tensor:
        """``[L]`` or ``[B, L]``: the default positions of ``length`` new tokens."""
        steps = torch.arange(length, device=device)
        if self.next_start is None:
            return steps  # [L]
        if self.rows_agree:  # every row has the same next position: [L], as a batch of any size
            return self.next_start[0].to(device) + steps  # [L]
        return self.next_start.to(device)[:, None] + steps  # [B, L]

    def recompute_next(self) -> None:
        """Each row's next position from the keys it holds (after evict, crop, select)."""
        if self.positions is None:
            self.next_start = None
            return
        written = self.written()
        pos = self.positions + 1 if written is None else torch.where(written, self.positions + 1, 0)
        if self.valid is not None:  # padding keys do not count
            pos = torch.where(self.valid, pos, 0)
        nxt = pos.amax(-1) if pos.shape[-1] else pos.new_zeros(pos.shape[0])  # [B]
        if self.static and self.next_start is not None and self.next_start.shape == nxt.shape:
            self.next_start.copy_(nxt)  # in place: a compiled step keeps reading this tensor
        else:
            self.next_start = nxt

    def held_document_ids(self) -> Tensor | None:
        """``[B, T]``: the document ids of the written slots (None: the cache has none)."""
        held = self.document_ids
        if held is not None and self.filled is not None:
            held = held[:, : int(self.filled)]  # the written slots of a static cache
        return held

    def select(self, idx: Tensor) -> None:
        """Row ``i`` becomes the old row ``idx[i]`` (``idx`` checked, on the cache's device)."""
        for name in _FIELDS:
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t[idx])

    def reset(self) -> None:
        """Empty for a new batch."""
        self.seen = 0
        self.evicted = False
        self.rows_agree = True
        self.clear()


class Growing(Slots):
    """``KVCache()``: keys appended after the held ones (into spare room, or by
    concatenation); evict keeps the slots it is given."""

    _room: list[tuple[Tensor | None, Tensor | None]] | None = None  # (buffer, view handed out)

    def mask_columns(self, new: int) -> MaskColumns:
        held = 0 if self.k is None else self.k.shape[-2]
        return MaskColumns(held, new, held + new, held + new, held + new, held, False,
                           self.valid is not None)

    def append(
        self, k: Tensor, v: Tensor, pos: Tensor, document_ids: Tensor | None,
        new_valid: Tensor | None, defaulted: bool,
    ) -> CacheView:
        """Concatenate ``k``, ``v`` at ``pos [B, L]`` (checked); ``defaulted``: ``pos`` are
        :meth:`next_positions`' and follow every row's keys."""
        B, L = pos.shape
        valid = None
        if new_valid is not None or self.valid is not None:  # remember the padding
            T_old = 0 if self.k is None else self.k.shape[-2]
            old = self.valid if self.valid is not None else torch.ones(
                B, T_old, dtype=torch.bool, device=k.device)
            new = new_valid if new_valid is not None else torch.ones(
                B, L, dtype=torch.bool, device=k.device)
            valid = (old, new)
        if self.k is None or self.v is None or self.positions is None:
            self.k, self.v, self.positions = k, v, pos
            self.document_ids = document_ids
            if valid is not None:
                self.valid = torch.cat(valid, dim=-1)  # [B, T]
        else:
            self._extend(k, v, pos, document_ids, valid)
        self.seen += L
        if L and defaulted and new_valid is None and self.next_start is not None:
            # default positions start at each row's top (or row 0's, while the rows agree)
            self.next_start = (torch.maximum(self.next_start, self.next_start[:1] + L)
                               if self.rows_agree else self.next_start + L)
        elif L:
            t = top(pos, new_valid)  # [B]
            self.next_start = t if self.next_start is None else torch.maximum(self.next_start, t)
        elif self.next_start is None:
            self.next_start = pos.new_zeros(B)
        T = self.k.shape[-2]
        return CacheView(self.k, self.v, self.positions, self.document_ids, None, T - L)

    def _extend(
        self, k: Tensor, v: Tensor, pos: Tensor, document_ids: Tensor | None,
        valid: tuple[Tensor, Tensor] | None,
    ) -> None:
        """Append after the held keys: into spare room reserved by an earlier append when
        nothing replaced the held tensors since (eager, no gradient through ``k``, ``v``, keys
        of 128 KiB or more), else by concatenation. The held tensors are then views of buffers with room for
        about a quarter more keys: a decode step copies one key, not the whole cache, and
        frees nothing (a freed cache-sized block between small ones is not reused by glibc's
        allocator and is page-faulted in again). Slots a view handed out shows are never
        written again: crop, evict, select or a field set from outside start a new buffer."""
        assert self.k is not None and self.v is not None and self.positions is not None
        new = [k, v, pos, document_ids, None if valid is None else valid[1]]
        held = [self.k, self.v, self.positions, self.document_ids,
                None if valid is None else valid[0]]
        dims = (2, 2, 1, 1, 1)
        small = self.k.numel() * self.k.element_size() < 1 << 17  # under malloc's mmap size
        if (small or is_compiling()
                or (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad))
                or any((t is None) != (n is None) for t, n in zip(held, new, strict=True))):
            out = [None if t is None or n is None else torch.cat([t, n], dim=d)
                   for t, n, d in zip(held, new, dims, strict=True)]
            self._room = None
        else:
            out = self._into_room(held, new, dims)
        self.k, self.v, self.positions, self.document_ids = out[0], out[1], out[2], out[3]
        if valid is not None:
            self.valid = out[4]

    def _into_room(
        self, held: list[Tensor | None], new: list[Tensor | None], dims: tuple[int, ...]
    ) -> list[Tensor | None]:
        """``held`` extended by ``new`` along ``dims`` in buffers with spare room."""
        T, L = held[0].shape[2], new[0].shape[2]  # type: ignore[union-attr]
        room = self._room
        if (room is None or room[0][0] is None or room[0][0].shape[2] < T + L
                or any(r[1] is not t for r, t in zip(room, held, strict=True))):
            cap = T + L + max(64, (T + L) // 4)
            bufs: list[Tensor | None] = []
            for t, d in zip(held, dims, strict=True):
                if t is None:
                    bufs.append(None)
                    continue
                shape = list(t.shape)
                shape[d] = cap
                fresh = t.new_empty(shape)
                fresh.narrow(d, 0, T).copy_(t)
                bufs.append(fresh)
        else:
            bufs = [r[0] for r in room]
        out: list[Tensor | None] = []
        for b, n, d in zip(bufs, new, dims, strict=True):
            if b is None or n is None:
                out.append(None)
                continue
            b.narrow(d, T, L).copy_(n)
            out.append(b.narrow(d, 0, T + L))
        self._room = [(b, o) for b, o in zip(bufs, out, strict=True)]
        return out

    def evict(self, keep: Tensor) -> None:
        """Keep the slots ``keep`` (a checked 1-D int64 index on the cache's device)."""
        assert self.k is not None and self.v is not None and self.positions is not None
        self.k, self.v = self.k[:, :, keep], self.v[:, :, keep]
        if self.valid is not None:
            self.valid = self.valid[:, keep]
        self.positions = self.positions[:, keep]
        if self.document_ids is not None:
            self.document_ids = self.document_ids[:, keep]
        self.evicted = True
        self.recompute_next()

    def crop(self, n: int) -> None:
        """Keep the first ``n`` slots (``n`` checked)."""
        if self.k is None or self.v is None or self.positions is None:
            return
        self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]
        if self.valid is not None:
            self.valid = self.valid[:, :n]
        self.positions = self.positions[:, :n]
        if self.document_ids is not None:
            self.document_ids = self.document_ids[:, :n]
        self.recompute_next()


def overflow(N: int, held: int, L: int) -> ValueError:
    """The error of a static cache asked to hold more than its ``N`` slots."""
    reuse = "if this is a new batch, call cache.reset() first (it empties the cache); else "
    return ValueError(
        f"KVCache(max_len={N}) holds {held} tokens and cannot take {L} more; "
        f"{reuse if held else ''}make max_len larger (a sliding-window layer's cache needs "
        "only the last W keys: KVCache(max_len=S + W, sinks=S, window=W) is a rolling "
        "cache that keeps the first S and the last W)"
    )


class Static(Slots):
    """``KVCache(max_len=N)``: ``N`` slots allocated on the first append, written in place."""

    static = True

    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.max_len: int = max_len

    def written(self) -> Tensor | None:
        if self.filled is None or self.k is None:
            return None
        return torch.arange(self.k.shape[-2], device=self.k.device) < self.filled

    def refill_after_reset(self) -> bool:
        """A static cache that holds no keys (after :meth:`reset`) may take another batch
        shape: drop its buffers so the next append allocates new ones. True if dropped."""
        if self.filled is None or is_compiling() or int(self.filled):
            return False
        self.clear()
        return True

    def mask_columns(self, new: int) -> MaskColumns:
        held = 0 if self.filled is None or is_compiling() else self.held()
        start = self.filled if self.filled is not None else torch.zeros((), dtype=torch.long)
        return MaskColumns(held, new, self.max_len, held + new, self.max_len, start, False, True)

    def allocate(self, k: Tensor, v: Tensor, slots: int, document_ids: Tensor | None) -> None:
        """Zeroed buffers of ``slots`` slots shaped as ``k`` and ``v``."""
        B, H, _, D = k.shape
        self.k = k.new_zeros(B, H, slots, D)  # [B, H_kv, N, D_h]
        self.v = v.new_zeros(B, H, slots, v.shape[-1])  # [B, H_kv, N, D_v]
        self.positions = torch.zeros(B, slots, dtype=torch.long, device=k.device)  # [B, N]
        self.filled = torch.zeros((), dtype=torch.long, device=k.device)
        self.next_start = torch.zeros(B, dtype=torch.long, device=k.device)  # [B]
        self.valid = torch.ones(B, slots, dtype=torch.bool, device=k.device)  # [B, N]
        if document_ids is not None:
            self.document_ids = torch.full(
                (B, slots), -1, dtype=document_ids.dtype, device=k.device)

    def advance(self, pos: Tensor, new_valid: Tensor | None) -> None:
        """Move ``next_start`` past the real new keys at ``pos [B, L]`` (in place)."""
        assert self.next_start is not None
        if pos.shape[-1]:
            self.next_start.copy_(torch.maximum(self.next_start, top(pos, new_valid)))

    def append(
        self, k: Tensor, v: Tensor, pos: Tensor, document_ids: Tensor | None,
        new_valid: Tensor | None, defaulted: bool,
    ) -> CacheView:
        """Write ``k``, ``v`` at ``pos [B, L]`` into the next ``L`` slots, in place."""
        N, L = self.max_len, k.shape[-2]
        if not is_compiling() and L > N:  # before the first append allocates anything
            raise overflow(N, self.held(), L)
        if self.k is None:
            self.allocate(k, v, N, document_ids)
        assert self.k is not None and self.v is not None and self.positions is not None
        assert self.filled is not None and self.valid is not None
        if not is_compiling() and int(self.filled) + L > N:
            raise overflow(N, int(self.filled), L)
        start = self.filled.clone()
        slots = start + torch.arange(L, device=k.device)  # [L]
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        self.positions.index_copy_(1, slots, pos)
        real = new_valid if new_valid is not None else torch.ones(
            pos.shape, dtype=torch.bool, device=k.device)
        self.valid.index_copy_(1, slots, real)
        if document_ids is not None and self.document_ids is not None:
            self.document_ids.index_copy_(1, slots, document_ids.to(self.document_ids.dtype))
        self.filled.add_(L)
        self.advance(pos, new_valid)
        valid = torch.arange(N, device=k.device) < self.filled  # [N]
        return CacheView(self.k, self.v, self.positions, self.document_ids, valid, start)

    def crop(self, n: int) -> None:
        """Move the write pointer back to ``n`` (in place; ``n`` checked)."""
        if self.k is None or self.filled is None:
            return
        self.filled.fill_(n)
        self.recompute_next()

    def select(self, idx: Tensor) -> None:
        """Rows in place when the batch size stays (a compiled step stays valid)."""
        if self.k is None or idx.numel() != self.k.shape[0]:
            super().select(idx)
            return
        for name in _FIELDS:
            t = getattr(self, name)
            if t is not None:
                t.copy_(t[idx])

    def reset(self) -> None:
        """Zero the write pointer in place, keeping the buffers."""
        if self.filled is None:
            super().reset()
            return
        self.seen = 0
        self.evicted = False
        self.rows_agree = True
        self.filled.zero_()
        if self.next_start is not None:
            self.next_start.zero_()
        if self.valid is not None:  # a rolling cache's valid also says "written"
            self.valid.fill_(not self.rolling)
