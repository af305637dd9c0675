"""The KV cache: keys (stored already rotated), values, and the positions they were seen at.

Keys are cached after the ``rotate`` hook, so a decode step rotates only its new key. The
cache also keeps each key's position (and document id, for packed rows), so a bias scheme
reads positions, never indices: after ``evict`` drops entries (a sliding window, attention
sinks; Xiao et al., 2024, StreamingLLM) ALiBi and T5 still see the true distances.

``KVCache()`` grows by concatenation (simple, eager). ``KVCache(max_len=N)`` preallocates
``[B, H_kv, N, D_h]`` on the first update and writes each step in place at a write pointer kept
as a tensor, so every decode step has the same shapes and ``torch.compile`` compiles the step
once (the unwritten slots are masked out), as transformers' ``StaticCache`` does.
``KVCache(max_len=S + W, sinks=S, window=W)`` is a rolling static cache: it keeps the first
``S`` keys and the last ``W`` (StreamingLLM), writing around in place
(``posenc.rolling_cache``).

A cache serves one attention layer: :class:`~posenc.attention.MultiHeadAttention` claims the
cache it first writes and refuses one another layer wrote. A model holds one cache per layer
in a :class:`LayerCaches` (as transformers' ``Cache`` holds one per layer).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ._checks import check_int, check_rows, check_tensor, is_compiling
from .rolling_cache import check_rolling, flush, rolling_update, written


class CacheView(NamedTuple):
    """What attention needs after an update: every key and value, and where they sit."""

    k: Tensor  # [B, H_kv, T, D_h]
    v: Tensor  # [B, H_kv, T, D_v] (D_v = D_h but in multi-head latent attention)
    positions: Tensor  # [B, T] int64, the keys' positions
    document_ids: Tensor | None  # [B, T] or None
    valid: Tensor | None  # [T] bool, the written slots of a static cache ([B, T] with the
    # padding for a rolling one); None: all
    q_slot: Tensor | int  # the slot of the first new token (a 0-dim tensor for a static cache)


class KVCache:
    """Keys and values of the tokens seen so far, ``[B, H_kv, T, D_h]``; keys are stored rotated.

    ``max_len=None``: the cache grows by concatenation. ``max_len=N``: preallocated for ``N``
    tokens at the first update and written in place (for ``torch.compile``); more than ``N``
    tokens is an error. ``max_len=S + W, sinks=S, window=W``: a rolling static cache that keeps
    the first ``S`` keys and the last ``W`` (StreamingLLM; Xiao et al., 2024), writes around in
    place and imposes ``window=W, sinks=S`` on attention (see ``posenc.rolling_cache``). Its
    sinks are the first ``S`` slots: a left-padded row keeps pads there (a warning says so).
    One cache per layer (:class:`LayerCaches` holds one per layer of a
    model); :class:`~posenc.attention.MultiHeadAttention` refuses a cache another layer wrote.
    """

    def __init__(
        self, max_len: int | None = None, *, sinks: int | None = None, window: int | None = None
    ) -> None:
        self.max_len = None if max_len is None else check_int("max_len", max_len, minimum=1)
        self.sinks, self.window = check_rolling(self.max_len, sinks, window)
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.positions: Tensor | None = None  # [B, T] int64
        self.document_ids: Tensor | None = None  # [B, T]
        self.filled: Tensor | None = None  # static: 0-dim int64, slots written so far
        self.seen = 0  # growing: tokens appended (kept for compatibility; positions do not use it)
        self.next_start: Tensor | None = None  # [B] int64: each row's highest stored position + 1
        self.valid: Tensor | None = None  # [B, T] bool: False = a padding key (None: none seen)
        self.evicted = False
        self.rows_agree = True  # no row was given positions of its own since the last reset
        self.owner: str | None = None  # the layer that wrote it (MultiHeadAttention.layer_name)

    def claim(self, layer: str) -> None:
        """Record that ``layer`` (a name) writes this cache, or raise if another layer did:
        a cache holds one layer's keys, and a second layer would attend to them."""
        if not isinstance(layer, str):
            raise TypeError(f"layer must be a str (the layer's name), got {type(layer).__name__}")
        if self.owner is None:
            self.owner = layer
        elif self.owner != layer:
            raise ValueError(
                f"cache: this KVCache holds the keys of layer {self.owner!r}, and layer {layer!r} "
                "was given it too; a cache serves one layer: give each layer its own "
                "(posenc.LayerCaches(num_layers) holds one per layer)"
            )

    @property
    def static(self) -> bool:
        return self.max_len is not None

    @property
    def rolling(self) -> bool:
        """A rolling static cache (``window`` given): writes wrap around in place."""
        return self.window is not None

    def __len__(self) -> int:
        """Keys held (a host sync for a static cache; not for compiled code)."""
        if self.k is None:
            return 0
        if self.filled is not None:
            return min(int(self.filled), self.max_len or 0)
        return self.k.shape[-2]

    def next_positions(self, length: int, device: torch.device) -> Tensor:
        """Default positions of ``length`` new tokens: each row's highest stored position + 1
        onwards (so they follow a left-padded prefill and a rollback by :meth:`crop` or
        :meth:`evict`); ``arange(L)`` while empty. ``[L]`` while every row has the same next
        position (no row was given positions of its own since :meth:`reset`), else ``[B, L]``."""
        length = check_int("length", length, minimum=0)
        steps = torch.arange(length, device=device)
        if self.next_start is None:
            return steps  # [L]
        if self.rows_agree:  # every row has the same next position: [L], as a batch of any size
            return self.next_start[0].to(device) + steps  # [L]
        return self.next_start.to(device)[:, None] + steps  # [B, L]

    def _written(self) -> Tensor | None:
        """``[T]`` bool, the written slots of a static cache (None for a growing one)."""
        if self.filled is None or self.k is None:
            return None
        if self.rolling:  # every slot but the trash one, once written
            return written(self.filled, self.k.shape[-2]) & (
                torch.arange(self.k.shape[-2], device=self.k.device) < (self.max_len or 0))
        return written(self.filled, self.k.shape[-2])

    def _recompute_next(self) -> None:
        """Each row's next position from the keys it holds (after evict, crop, select)."""
        if self.positions is None:
            self.next_start = None
            return
        written = self._written()
        pos = self.positions + 1 if written is None else torch.where(written, self.positions + 1, 0)
        if self.valid is not None:  # padding keys do not count
            pos = torch.where(self.valid, pos, 0)
        nxt = pos.amax(-1) if pos.shape[-1] else pos.new_zeros(pos.shape[0])  # [B]
        if self.static and self.next_start is not None and self.next_start.shape == nxt.shape:
            self.next_start.copy_(nxt)  # in place: a compiled step keeps reading this tensor
        else:
            self.next_start = nxt

    def _refill_after_reset(self) -> bool:
        """A static cache that holds no keys (after :meth:`reset`) may take another batch
        shape: drop its buffers so the next update allocates new ones. True if dropped."""
        if not self.static or self.filled is None or is_compiling() or int(self.filled):
            return False
        self.k = self.v = self.positions = self.document_ids = self.valid = None
        self.filled = self.next_start = None
        return True

    def _check_new(self, k: Tensor, v: Tensor) -> None:
        ck, cv = self.k, self.v
        if (ck is not None and cv is not None and isinstance(k, Tensor) and isinstance(v, Tensor)
                and k.dim() == 4 and k.shape[:-2] == ck.shape[:-2] and k.shape[-1] == ck.shape[-1]
                and v.shape[:-1] == k.shape[:-1] and v.shape[-1] == cv.shape[-1]
                and k.dtype == ck.dtype and v.dtype == ck.dtype and k.device == ck.device
                and v.device == ck.device):
            return  # the quick test of a decode step: what the cache holds, so floating too
        for name, t in (("k", k), ("v", v)):
            check_tensor(name, t, floating=True)
            if t.dim() != 4:
                raise ValueError(f"{name} must have shape [B, H, L, Dh], got {tuple(t.shape)}")
        if k.shape[:-1] != v.shape[:-1] or k.dtype != v.dtype or k.device != v.device:
            raise ValueError(
                f"k and v must have the same shape, dtype and device (v's head size may differ "
                f"from k's), got {tuple(k.shape)} "
                f"{k.dtype} {k.device} and {tuple(v.shape)} {v.dtype} {v.device}"
            )
        if self.k is not None and self.v is not None:
            mismatch = (k.shape[:-2] != self.k.shape[:-2] or k.shape[-1] != self.k.shape[-1]
                        or v.shape[-1] != self.v.shape[-1] or k.dtype != self.k.dtype
                        or k.device != self.k.device)
            if mismatch and self._refill_after_reset():
                return
        if self.k is not None and self.v is not None:
            if k.shape[:-2] != self.k.shape[:-2] or k.shape[-1] != self.k.shape[-1]:
                held = len(self)
                raise ValueError(
                    f"new k {tuple(k.shape)} does not match the cached keys {tuple(self.k.shape)} "
                    f"(batch, heads and head_dim must agree): the cache holds {held} keys from "
                    "earlier calls; cache.reset() empties it to start a new batch"
                )
            if v.shape[-1] != self.v.shape[-1]:
                raise ValueError(
                    f"new v {tuple(v.shape)} does not match the cached values "
                    f"{tuple(self.v.shape)} (the head size of v must agree)"
                )
            if k.dtype != self.k.dtype or k.device != self.k.device:
                raise ValueError(
                    f"new k is {k.dtype} on {k.device}, the cache holds {self.k.dtype} on {self.k.device}"
                )

    def update(
        self, k: Tensor, v: Tensor, positions: Tensor | None = None, document_ids: Tensor | None = None
    ) -> CacheView:
        """Add the new ``k [B, H_kv, L, D_h]``, ``v [B, H_kv, L, D_v]`` at ``positions [L]``
        or ``[B, L]`` (default: after the tokens seen) with their ``document_ids [L]`` or
        ``[B, L]``; return everything
        cached. ``positions`` are checked as :func:`~posenc.attention.attend` checks them
        (integers in ``[0, 2**31)``), ``document_ids`` are integer labels. A rolling cache
        returns its ``S + W`` stored slots followed by the new keys (the keys the new queries
        attend over, before they overwrite any), with ``valid [B, S + W + L]``, and takes no
        ``document_ids``."""
        check_tensor("k", k, floating=True, min_dim=1)
        B, L = k.shape[0], k.shape[-2] if k.dim() > 1 else 0
        if positions is not None:
            positions = check_rows("positions", positions, B, L, labels=False)
        if document_ids is not None:
            document_ids = check_rows("document_ids", document_ids, B, L, labels=True)
        return self._update(k, v, positions, document_ids)

    def _update(
        self, k: Tensor, v: Tensor, positions: Tensor | None, document_ids: Tensor | None,
        new_valid: Tensor | None = None, defaulted: bool = False,
    ) -> CacheView:
        """``update`` with positions and document ids :func:`~posenc.attention.attend` has
        already checked (``k`` and ``v`` are checked against the cache here). ``new_valid``
        ``[B, L]`` bool: which new keys are real tokens (False = padding); the cache remembers
        it, so a later call without a mask still hides the padding (:attr:`valid`).
        ``defaulted``: ``positions`` are :meth:`next_positions`' (each row's next ones)."""
        self._check_new(k, v)
        B, L = k.shape[0], k.shape[-2]
        defaulted = (defaulted or positions is None) and self.next_start is not None
        if positions is None:
            positions = self.next_positions(L, k.device)
        elif positions.dim() > 1 and positions.shape[0] > 1 and self.rows_agree:
            self.rows_agree = False  # positions of each row's own: [B, L] defaults from now on
        pos = positions.to(k.device, torch.long).expand(B, L)  # [B, L]
        if document_ids is not None:
            document_ids = document_ids.to(k.device).expand(B, L)  # [B, L]
        if ((document_ids is None) != (self.document_ids is None) and self.k is not None
                and not self._refill_after_reset()):
            raise ValueError(
                "document_ids must be given on every call with this cache or on none "
                f"(the cache {'has' if self.document_ids is not None else 'has no'} document ids)"
            )
        if new_valid is not None:
            new_valid = new_valid.to(k.device, torch.bool).expand(B, L)  # [B, L]
        if self.rolling:
            if document_ids is not None:
                raise ValueError(
                    "document_ids with a rolling KVCache(sinks=..., window=...) is not "
                    "supported: it keeps the first keys of each row, not of each document"
                )
            return self._update_rolling(k, v, pos, new_valid)
        if self.static:
            return self._update_static(k, v, pos, document_ids, new_valid)
        if new_valid is not None or self.valid is not None:  # remember the padding
            T_old = 0 if self.k is None else self.k.shape[-2]
            old = self.valid if self.valid is not None else torch.ones(
                B, T_old, dtype=torch.bool, device=k.device)
            new = new_valid if new_valid is not None else torch.ones(
                B, L, dtype=torch.bool, device=k.device)
            self.valid = torch.cat([old, new], dim=-1)  # [B, T]
        if self.k is None or self.v is None or self.positions is None:
            self.k, self.v, self.positions = k, v, pos
            self.document_ids = document_ids
        else:
            self.k, self.v = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
            self.positions = torch.cat([self.positions, pos], dim=-1)
            if document_ids is not None and self.document_ids is not None:
                self.document_ids = torch.cat([self.document_ids, document_ids], dim=-1)
        self.seen += L
        if L and defaulted and new_valid is None and self.next_start is not None:
            # default positions start at each row's top (or row 0's, while the rows agree)
            self.next_start = (torch.maximum(self.next_start, self.next_start[:1] + L)
                               if self.rows_agree else self.next_start + L)
        elif L:
            top = self._top(pos, new_valid)  # [B]
            self.next_start = top if self.next_start is None else torch.maximum(self.next_start, top)
        elif self.next_start is None:
            self.next_start = pos.new_zeros(B)
        T = self.k.shape[-2]
        return CacheView(self.k, self.v, self.positions, self.document_ids, None, T - L)

    @staticmethod
    def _top(pos: Tensor, new_valid: Tensor | None) -> Tensor:
        """``[B]``: each row's highest position among its real new keys, plus 1 (0 if none)."""
        if new_valid is None:
            return pos.amax(-1) + 1
        return (torch.where(new_valid, pos, -1).amax(-1) + 1).clamp(min=0)

    def _update_static(
        self, k: Tensor, v: Tensor, pos: Tensor, document_ids: Tensor | None,
        new_valid: Tensor | None = None,
    ) -> CacheView:
        assert self.max_len is not None
        B, H, L, D = k.shape
        N = self.max_len
        if not is_compiling() and L > N:  # before the first update allocates anything
            raise ValueError(
                f"KVCache(max_len={N}) holds {len(self)} tokens and cannot take {L} more; "
                "make max_len larger (a sliding-window layer's cache needs only the last W "
                "keys: KVCache(max_len=S + W, sinks=S, window=W) is a rolling cache that keeps "
                "the first S and the last W)"
            )
        if self.k is None:
            self.k = k.new_zeros(B, H, N, D)  # [B, H_kv, N, D_h]
            self.v = v.new_zeros(B, H, N, v.shape[-1])  # [B, H_kv, N, D_v]
            self.positions = torch.zeros(B, N, dtype=torch.long, device=k.device)  # [B, N]
            self.filled = torch.zeros((), dtype=torch.long, device=k.device)
            self.next_start = torch.zeros(B, dtype=torch.long, device=k.device)  # [B]
            self.valid = torch.ones(B, N, dtype=torch.bool, device=k.device)  # [B, N]
            if document_ids is not None:
                self.document_ids = torch.full((B, N), -1, dtype=document_ids.dtype, device=k.device)
        assert self.v is not None and self.positions is not None and self.filled is not None
        if not is_compiling() and int(self.filled) + L > N:
            raise ValueError(
                f"KVCache(max_len={N}) holds {int(self.filled)} tokens and cannot take {L} more; "
                "make max_len larger (a sliding-window layer's cache needs only the last W "
                "keys: KVCache(max_len=S + W, sinks=S, window=W) is a rolling cache that keeps "
                "the first S and the last W)"
            )
        start = self.filled.clone()
        slots = start + torch.arange(L, device=k.device)  # [L]
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        self.positions.index_copy_(1, slots, pos)
        if self.valid is not None:
            real = new_valid if new_valid is not None else torch.ones(
                B, L, dtype=torch.bool, device=k.device)
            self.valid.index_copy_(1, slots, real)
        if document_ids is not None and self.document_ids is not None:
            self.document_ids.index_copy_(1, slots, document_ids.to(self.document_ids.dtype))
        self.filled.add_(L)
        assert self.next_start is not None
        if L:
            self.next_start.copy_(torch.maximum(self.next_start, self._top(pos, new_valid)))
        valid = torch.arange(N, device=k.device) < self.filled  # [N]
        return CacheView(self.k, self.v, self.positions, self.document_ids, valid, start)

    def _update_rolling(
        self, k: Tensor, v: Tensor, pos: Tensor, new_valid: Tensor | None
    ) -> CacheView:
        """The keys the queries attend over, then the new keys written in place
        (:func:`~posenc.rolling_cache.rolling_update`)."""
        keys, values, positions, valid, q_slot = rolling_update(self, k, v, pos, new_valid)
        assert self.next_start is not None
        if k.shape[-2]:
            self.next_start.copy_(torch.maximum(self.next_start, self._top(pos, new_valid)))
        return CacheView(keys, values, positions, None, valid, q_slot)

    def _flush(self) -> None:
        """A rolling cache: put its latest key in its own slot (see ``posenc.rolling_cache``)."""
        if self.rolling and self.k is not None:
            flush(self)

    def evict(self, keep: Tensor) -> None:
        """Keep only the cached slots ``keep`` (a 1-D index or bool tensor over the ``T`` slots),
        e.g. a few sink tokens plus the last ``W``. Positions are kept with their keys, so
        later tokens still get their true distances. Growing caches only.

        Each index names one slot in ``[-T, T)`` (negative counts from the end, as Python's)
        and appears once: a slot kept twice would count twice in every later softmax."""
        if self.static:
            raise ValueError(
                "evict works on a growing KVCache (max_len=None), not a static one (a rolling "
                "KVCache(max_len=S + W, sinks=S, window=W) evicts by itself)"
            )
        check_tensor("keep", keep, min_dim=1)
        if self.k is None or self.v is None or self.positions is None:
            raise ValueError("evict: the cache is empty")
        T = self.k.shape[-2]
        if keep.dtype == torch.bool:
            if keep.shape != (T,):
                raise ValueError(
                    f"keep: a bool keep must have shape [{T}] (one flag per slot the cache "
                    f"holds), got {tuple(keep.shape)}"
                )
            keep = keep.to(self.k.device).nonzero().squeeze(-1)
        elif keep.is_floating_point() or keep.is_complex() or keep.dim() != 1:
            raise TypeError(
                f"keep must be a 1-D integer or bool tensor, got {keep.dtype} {tuple(keep.shape)}"
            )
        elif keep.numel():
            lo, hi = int(keep.min()), int(keep.max())
            if lo < -T or hi >= T:
                raise ValueError(
                    f"keep must index the {T} slots the cache holds (in [{-T}, {T})), got "
                    f"values from {lo} to {hi}"
                )
            keep = keep.to(self.k.device, torch.long) % T
            if keep.unique().numel() != keep.numel():
                raise ValueError(
                    f"keep must name each of the {T} slots the cache holds at most once, got "
                    f"{keep.tolist()} (a slot kept twice counts twice in every later softmax)"
                )
        keep = keep.to(self.k.device)
        self.k, self.v = self.k[:, :, keep], self.v[:, :, keep]
        if self.valid is not None:
            self.valid = self.valid[:, keep]
        self.positions = self.positions[:, keep]
        if self.document_ids is not None:
            self.document_ids = self.document_ids[:, keep]
        self.evicted = True
        self._recompute_next()

    def reset(self) -> None:
        """Empty the cache for a new batch. A static cache keeps its buffers and zeroes its
        write pointer in place (a compiled step stays valid; a new batch shape reallocates on
        the next update). The owning layer is kept."""
        self.seen = 0
        self.evicted = False
        self.rows_agree = True
        if self.static and self.filled is not None:
            self.filled.zero_()
            if self.next_start is not None:
                self.next_start.zero_()
            if self.valid is not None:  # a rolling cache's valid also says "written"
                self.valid.fill_(not self.rolling)
            return
        self.k = self.v = self.positions = self.document_ids = self.valid = None
        self.filled = self.next_start = None

    def _check_crop(self, n: object) -> int:
        """``n`` as the number of slots to keep, checked against what the cache holds."""
        if self.rolling:
            raise ValueError(
                f"crop: a rolling KVCache(max_len={self.max_len}, sinks={self.sinks}, "
                f"window={self.window}) overwrites its oldest window keys in place, so keys "
                "cropped away cannot come back; roll back on a growing KVCache() (crop, evict) "
                "or start anew with reset()"
            )
        n = check_int("n", n)
        held = len(self)
        if not -held <= n <= held:
            raise ValueError(
                f"crop: n must be in [{-held}, {held}] (the cache holds {held} keys; a negative n "
                f"drops the last -n), got {n}"
            )
        return n + held if n < 0 else n

    def crop(self, n: int) -> None:
        """Keep the first ``n`` slots (speculative rollback); a negative ``n`` drops the last
        ``-n``, as transformers' ``DynamicCache.crop``. A static cache crops in place (its write
        pointer moves back; a compiled step stays valid). Later default positions follow the
        kept keys."""
        n = self._check_crop(n)
        self.rows_agree = self.rows_agree or n == 0
        if self.k is None or self.v is None or self.positions is None:
            return  # empty: only n = 0 passes the check
        if self.filled is not None:
            self.filled.fill_(n)
        else:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]
            if self.valid is not None:
                self.valid = self.valid[:, :n]
            self.positions = self.positions[:, :n]
            if self.document_ids is not None:
                self.document_ids = self.document_ids[:, :n]
        self._recompute_next()

    def _check_select(self, batch_index: object) -> Tensor:
        """``batch_index`` as a 1-D int64 tensor of rows in ``[0, B)``, checked."""
        if isinstance(batch_index, (list, tuple)):
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in batch_index):
                raise TypeError(f"batch_index must hold ints (rows), got {list(batch_index)!r}")
            batch_index = torch.tensor(list(batch_index), dtype=torch.long)
        if not isinstance(batch_index, Tensor):
            raise TypeError(
                f"batch_index must be a 1-D integer tensor or a list of ints, got "
                f"{type(batch_index).__name__}"
            )
        if batch_index.dtype == torch.bool or batch_index.is_floating_point() or batch_index.is_complex():
            raise TypeError(f"batch_index must be an integer tensor, got {batch_index.dtype}")
        if batch_index.dim() != 1 or batch_index.numel() == 0:
            raise ValueError(
                f"batch_index must be 1-D with at least one row, got shape {tuple(batch_index.shape)}"
            )
        if self.k is None:
            raise ValueError("select: the cache is empty (no rows to select)")
        B = self.k.shape[0]
        lo, hi = int(batch_index.min()), int(batch_index.max())
        if lo < -B or hi >= B:
            raise ValueError(
                f"batch_index must name rows of the {B} the cache holds (in [{-B}, {B})), got "
                f"values from {lo} to {hi}"
            )
        return batch_index.to(self.k.device, torch.long) % B

    def select(self, batch_index: Tensor | Sequence[int]) -> None:
        """Keep or reorder the cached rows: row ``i`` becomes the old row ``batch_index[i]``
        (beam search, dropping finished rows). A static cache with the same batch size is
        rewritten in place (a compiled step stays valid); otherwise new tensors."""
        idx = self._check_select(batch_index)
        assert self.k is not None and self.v is not None and self.positions is not None
        names = ("k", "v", "positions", "document_ids", "next_start", "valid")
        if self.static and idx.numel() == self.k.shape[0]:
            for name in names:
                t = getattr(self, name)
                if t is not None:
                    t.copy_(t[idx])
            return
        for name in names:
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t[idx])


def streaming_keep(length: int, sinks: int, window: int) -> tuple[Tensor, Tensor]:
    """StreamingLLM's eviction for a cache of ``length`` keys at positions ``0 .. length - 1``
    inside the cache: keep the first ``sinks`` keys and the latest ``window``; the kept keys
    take positions ``0 .. len(keep) - 1``. Returns ``(keep, delta)``, both int64 ``[K]``: the
    slots kept (pass ``keep`` to :meth:`~posenc.cache.KVCache.evict`) and each kept key's change of position
    (new minus old, ``<= 0``). Nothing is evicted (``delta`` all 0) while
    ``length <= sinks + window``."""
    length = check_int("length", length, minimum=0)
    sinks = check_int("sinks", sinks, minimum=0)
    window = check_int("window", window, minimum=1)
    if length <= sinks + window:
        keep = torch.arange(length)
    else:
        keep = torch.cat([torch.arange(sinks), torch.arange(length - window, length)])
    return keep, torch.arange(len(keep)) - keep


class LayerCaches(Sequence[KVCache]):
    """One :class:`KVCache` per layer of a model, as transformers' ``Cache`` holds one per layer.

    ``LayerCaches(num_layers, *, max_len=None, sinks=None, window=None)`` (keyword-only; an int
    ``max_len`` gives every layer a static cache of that many slots, with ``sinks`` and
    ``window`` a rolling one, as :class:`~posenc.cache.KVCache` takes them); ``caches[i]`` is
    layer ``i``'s cache. Pass it where a model takes its caches
    (``TransformerLM(...)(tokens, caches=caches)``) and give ``caches[i]`` to layer ``i``: a
    cache holds one layer's keys.
    """

    def __init__(
        self, num_layers: int, *, max_len: int | None = None, sinks: int | None = None,
        window: int | None = None,
    ) -> None:
        num_layers = check_int("num_layers", num_layers, minimum=1)
        self.layers = tuple(
            KVCache(max_len, sinks=sinks, window=window) for _ in range(num_layers))

    def __getitem__(self, i: int) -> KVCache:  # type: ignore[override]  # no slices
        if isinstance(i, bool):
            raise TypeError(f"LayerCaches index must be an int (a layer), got {i!r} (bool)")
        try:
            i = operator.index(i)  # an int, a numpy integer, a 0-dim integer tensor
        except TypeError:
            raise TypeError(
                f"LayerCaches index must be an int (a layer), got {type(i).__name__}"
            ) from None
        if not -len(self.layers) <= i < len(self.layers):
            raise IndexError(f"LayerCaches holds {len(self.layers)} layers (one cache each), got index {i}")
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def reset(self) -> None:
        """Empty every layer's cache (see :meth:`KVCache.reset`)."""
        for cache in self.layers:
            cache.reset()

    def crop(self, n: int) -> None:
        """Keep the first ``n`` slots of every layer (see :meth:`KVCache.crop`); checked on
        every layer before any is cropped."""
        for cache in self.layers:
            cache._check_crop(n)
        for cache in self.layers:
            cache.crop(n)

    def select(self, batch_index: Tensor | Sequence[int]) -> None:
        """Keep or reorder the rows of every layer (see :meth:`KVCache.select`); checked on
        every layer before any is changed."""
        for cache in self.layers:
            cache._check_select(batch_index)
        for cache in self.layers:
            cache.select(batch_index)

    def evict(self, keep: Tensor) -> None:
        """Keep the slots ``keep`` in every layer (see :meth:`~posenc.cache.KVCache.evict`)."""
        for cache in self.layers:
            cache.evict(keep)

    def __iter__(self) -> Iterator[KVCache]:
        return iter(self.layers)

    def __repr__(self) -> str:
        return f"LayerCaches({len(self.layers)} layers, {len(self.layers[0])} tokens held)"
