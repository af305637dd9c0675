"""The KV cache: keys (stored already rotated), values, and the positions they were seen at.

Keys are cached after the ``rotate`` hook, so a decode step rotates only its new key. The
cache also keeps each key's position (and document id, for packed rows), so a bias scheme
reads positions, never indices: after ``evict`` drops entries (a sliding window, attention
sinks; Xiao et al., 2024, StreamingLLM) ALiBi and T5 still see the true distances.

``KVCache()`` grows by concatenation (simple, eager). ``KVCache(max_len=N)`` preallocates
``[B, H_kv, N, D_h]`` on the first update and writes each step in place at a write pointer kept
as a tensor, so every decode step has the same shapes and ``torch.compile`` compiles the step
once (the unwritten slots are masked out), as transformers' ``StaticCache`` does.

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


class CacheView(NamedTuple):
    """What attention needs after an update: every key and value, and where they sit."""

    k: Tensor  # [B, H_kv, T, D_h]
    v: Tensor  # [B, H_kv, T, D_v] (D_v = D_h but in multi-head latent attention)
    positions: Tensor  # [B, T] int64, the keys' positions
    document_ids: Tensor | None  # [B, T] or None
    valid: Tensor | None  # [T] bool, the written slots of a static cache; None: all
    q_slot: Tensor | int  # the slot of the first new token (a 0-dim tensor for a static cache)


class KVCache:
    """Keys and values of the tokens seen so far, ``[B, H_kv, T, D_h]``; keys are stored rotated.

    ``max_len=None``: the cache grows by concatenation. ``max_len=N``: preallocated for ``N``
    tokens at the first update and written in place (for ``torch.compile``); more than ``N``
    tokens is an error. One cache per layer (:class:`LayerCaches` holds one per layer of a
    model); :class:`~posenc.attention.MultiHeadAttention` refuses a cache another layer wrote.
    """

    def __init__(self, max_len: int | None = None) -> None:
        self.max_len = None if max_len is None else check_int("max_len", max_len, minimum=1)
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.positions: Tensor | None = None  # [B, T] int64
        self.document_ids: Tensor | None = None  # [B, T]
        self.filled: Tensor | None = None  # static: 0-dim int64, slots written so far
        self.seen = 0  # dynamic: tokens appended so far (evict does not change it)
        self.evicted = False
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

    def __len__(self) -> int:
        """Keys held (a host sync for a static cache; not for compiled code)."""
        if self.k is None:
            return 0
        if self.filled is not None:
            return int(self.filled)
        return self.k.shape[-2]

    def next_positions(self, length: int, device: torch.device) -> Tensor:
        """Default positions of ``length`` new tokens: they follow every token seen so far."""
        length = check_int("length", length, minimum=0)
        start = self.filled if self.filled is not None else self.seen
        return start + torch.arange(length, device=device)  # [L]

    def _check_new(self, k: Tensor, v: Tensor) -> None:
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
            if k.shape[:-2] != self.k.shape[:-2] or k.shape[-1] != self.k.shape[-1]:
                raise ValueError(
                    f"new k {tuple(k.shape)} does not match the cached keys {tuple(self.k.shape)} "
                    "(batch, heads and head_dim must agree)"
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
        (integers in ``[0, 2**24)``), ``document_ids`` are integer labels."""
        check_tensor("k", k, floating=True, min_dim=1)
        B, L = k.shape[0], k.shape[-2] if k.dim() > 1 else 0
        if positions is not None:
            positions = check_rows("positions", positions, B, L, labels=False)
        if document_ids is not None:
            document_ids = check_rows("document_ids", document_ids, B, L, labels=True)
        return self._update(k, v, positions, document_ids)

    def _update(
        self, k: Tensor, v: Tensor, positions: Tensor | None, document_ids: Tensor | None
    ) -> CacheView:
        """``update`` with positions and document ids :func:`~posenc.attention.attend` has
        already checked (``k`` and ``v`` are checked against the cache here)."""
        self._check_new(k, v)
        B, L = k.shape[0], k.shape[-2]
        if positions is None:
            positions = self.next_positions(L, k.device)
        pos = positions.to(k.device, torch.long).expand(B, L)  # [B, L]
        if document_ids is not None:
            document_ids = document_ids.to(k.device).expand(B, L)  # [B, L]
        if (document_ids is None) != (self.document_ids is None) and self.k is not None:
            raise ValueError(
                "document_ids must be given on every call with this cache or on none "
                f"(the cache {'has' if self.document_ids is not None else 'has no'} document ids)"
            )
        if self.static:
            return self._update_static(k, v, pos, document_ids)
        if self.k is None or self.v is None or self.positions is None:
            self.k, self.v, self.positions = k, v, pos
            self.document_ids = document_ids
        else:
            self.k, self.v = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
            self.positions = torch.cat([self.positions, pos], dim=-1)
            if document_ids is not None and self.document_ids is not None:
                self.document_ids = torch.cat([self.document_ids, document_ids], dim=-1)
        self.seen += L
        T = self.k.shape[-2]
        return CacheView(self.k, self.v, self.positions, self.document_ids, None, T - L)

    def _update_static(
        self, k: Tensor, v: Tensor, pos: Tensor, document_ids: Tensor | None
    ) -> CacheView:
        assert self.max_len is not None
        B, H, L, D = k.shape
        N = self.max_len
        if not is_compiling() and L > N:  # before the first update allocates anything
            raise ValueError(
                f"KVCache(max_len={N}) holds {len(self)} tokens and cannot take {L} more; "
                "make max_len larger"
            )
        if self.k is None:
            self.k = k.new_zeros(B, H, N, D)  # [B, H_kv, N, D_h]
            self.v = v.new_zeros(B, H, N, v.shape[-1])  # [B, H_kv, N, D_v]
            self.positions = torch.zeros(B, N, dtype=torch.long, device=k.device)  # [B, N]
            self.filled = torch.zeros((), dtype=torch.long, device=k.device)
            if document_ids is not None:
                self.document_ids = torch.full((B, N), -1, dtype=document_ids.dtype, device=k.device)
        assert self.v is not None and self.positions is not None and self.filled is not None
        if not is_compiling() and int(self.filled) + L > N:
            raise ValueError(
                f"KVCache(max_len={N}) holds {int(self.filled)} tokens and cannot take {L} more; "
                "make max_len larger"
            )
        start = self.filled.clone()
        slots = start + torch.arange(L, device=k.device)  # [L]
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        self.positions.index_copy_(1, slots, pos)
        if document_ids is not None and self.document_ids is not None:
            self.document_ids.index_copy_(1, slots, document_ids.to(self.document_ids.dtype))
        self.filled.add_(L)
        valid = torch.arange(N, device=k.device) < self.filled  # [N]
        return CacheView(self.k, self.v, self.positions, self.document_ids, valid, start)

    def evict(self, keep: Tensor) -> None:
        """Keep only the cached slots ``keep`` (a 1-D index or bool tensor over the ``T`` slots),
        e.g. a few sink tokens plus the last ``W``. Positions are kept with their keys, so
        later tokens still get their true distances. Growing caches only.

        Each index names one slot in ``[-T, T)`` (negative counts from the end, as Python's)
        and appears once: a slot kept twice would count twice in every later softmax."""
        if self.static:
            raise ValueError("evict works on a growing KVCache (max_len=None), not a static one")
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
        self.positions = self.positions[:, keep]
        if self.document_ids is not None:
            self.document_ids = self.document_ids[:, keep]
        self.evicted = True


class LayerCaches(Sequence[KVCache]):
    """One :class:`KVCache` per layer of a model, as transformers' ``Cache`` holds one per layer.

    ``LayerCaches(num_layers, *, max_len=None)`` (``max_len`` is keyword-only; an int gives
    every layer a static cache of that many slots); ``caches[i]`` is layer ``i``'s cache. Pass it
    where a model takes its caches (``TransformerLM(...)(tokens, caches=caches)``) and give
    ``caches[i]`` to layer ``i``: a cache holds one layer's keys.
    """

    def __init__(self, num_layers: int, *, max_len: int | None = None) -> None:
        num_layers = check_int("num_layers", num_layers, minimum=1)
        self.layers = tuple(KVCache(max_len) for _ in range(num_layers))

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

    def __iter__(self) -> Iterator[KVCache]:
        return iter(self.layers)

    def __repr__(self) -> str:
        return f"LayerCaches({len(self.layers)} layers, {len(self.layers[0])} tokens held)"
