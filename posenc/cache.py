"""The KV cache: keys (stored already rotated), values, and the positions they were seen at.

Keys are cached after the ``rotate`` hook, so a decode step rotates only its new key. The
cache also keeps each key's position (and document id, for packed rows), so a bias scheme
reads positions, never indices: after ``evict`` drops entries (a sliding window, attention
sinks; Xiao et al., 2024, StreamingLLM) ALiBi and T5 still see the true distances.

``KVCache()`` grows (simple, eager). ``KVCache(max_len=N)`` preallocates ``[B, H_kv, N, D_h]``
and writes in place at a write pointer kept as a tensor, so ``torch.compile`` compiles a decode
step once (the unwritten slots are masked out), as transformers' ``StaticCache``.
``KVCache(max_len=S + W, sinks=S, window=W)`` keeps the first ``S`` keys and the last ``W``
(StreamingLLM), writing around in place. The storage kinds (``Growing``, ``Static``,
``Rolling``: ``posenc.cache_slots``, ``posenc.rolling_cache``) sit behind ``KVCache``, which
answers attention through methods only, never a field (:meth:`KVCache.append`,
``mask_columns``, ``imposed_rule``, ``next_positions``, ``held_document_ids``, ``reached``...).

A cache serves one attention layer: :class:`~posenc.attention.MultiHeadAttention` claims the
cache it first writes and refuses one another layer wrote. A model holds one cache per layer
in a :class:`LayerCaches` (as transformers' ``Cache`` holds one per layer).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from ._checks import cache_mismatch, check_int, check_rows, check_tensor
from .cache_slots import CacheView, Growing, MaskColumns, Static
from .rolling_cache import Rolling, check_rolling

_T = TypeVar("_T")


class _Slot(Generic[_T]):
    """A field of the cache's ``Slots`` (``posenc.cache_slots``), read and written through
    :class:`KVCache` (the lab and a few tests set ``k`` and ``positions`` directly)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, cache: Any, owner: Any = None) -> _T:
        if cache is None:  # the class's attribute: the descriptor (for the docs)
            return self  # type: ignore[return-value]
        return getattr(cache._s, self.name)

    def __set__(self, cache: Any, value: _T) -> None:
        setattr(cache._s, self.name, value)


class KVCache:
    """Keys and values of the tokens seen so far, ``[B, H_kv, T, D_h]``; keys are stored rotated.

    ``max_len=None``: the cache grows by concatenation. ``max_len=N``: preallocated for ``N``
    tokens at the first update and written in place (for ``torch.compile``); more than ``N``
    tokens is an error. ``max_len=S + W, sinks=S, window=W``: a rolling static cache that keeps
    the first ``S`` keys and the last ``W`` (StreamingLLM; Xiao et al., 2024), writes around in
    place and imposes ``window=W, sinks=S`` on attention (see ``posenc.rolling_cache``). Its
    sinks are the first ``S`` slots: a left-padded row keeps pads there (a warning says so).
    One cache per layer (:class:`LayerCaches` holds one per layer of a model);
    :class:`~posenc.attention.MultiHeadAttention` refuses a cache another layer wrote."""

    k: _Slot[Tensor | None] = _Slot()  # [B, H_kv, T, D_h], stored rotated
    v: _Slot[Tensor | None] = _Slot()  # [B, H_kv, T, D_v]
    positions: _Slot[Tensor | None] = _Slot()  # [B, T] int64
    document_ids: _Slot[Tensor | None] = _Slot()  # [B, T]
    valid: _Slot[Tensor | None] = _Slot()  # [B, T] bool: False = a padding key (None: none seen)
    filled: _Slot[Tensor | None] = _Slot()  # static: 0-dim int64, slots written so far
    next_start: _Slot[Tensor | None] = _Slot()  # [B] int64: each row's highest position + 1
    seen: _Slot[int] = _Slot()  # growing: tokens appended (positions do not use it)
    evicted: _Slot[bool] = _Slot()  # evict() dropped slots: keys are not at their indices
    rows_agree: _Slot[bool] = _Slot()  # no row was given positions of its own since reset

    def __init__(
        self, max_len: int | None = None, *, sinks: int | None = None, window: int | None = None
    ) -> None:
        max_len = None if max_len is None else check_int("max_len", max_len, minimum=1)
        sinks, window = check_rolling(max_len, sinks, window)
        self._s: Growing | Static | Rolling
        if max_len is None:
            self._s = Growing()
        elif sinks is None or window is None:
            self._s = Static(max_len)
        else:
            self._s = Rolling(max_len, sinks, window)
        self.owner: str | None = None  # the layer that wrote it (MultiHeadAttention.layer_name)

    def claim(self, layer: str) -> None:
        """Record that ``layer`` (a name) writes this cache, or raise if another layer did:
        a cache holds one layer's keys, and a second layer would attend to them."""
        self.check_claim(layer)
        self.owner = layer

    def check_claim(self, layer: str) -> None:
        """Raise as :meth:`claim` would, and claim nothing."""
        if not isinstance(layer, str):
            raise TypeError(f"layer must be a str (the layer's name), got {type(layer).__name__}")
        if self.owner is not None and self.owner != layer:
            raise ValueError(
                f"cache: this KVCache holds the keys of layer {self.owner!r}, and layer {layer!r} "
                "was given it too; a cache serves one layer: give each layer its own "
                "(posenc.LayerCaches(num_layers) holds one per layer)"
            )

    @property
    def max_len(self) -> int | None:
        """The number of slots of a static cache, or None for a growing one."""
        return self._s.max_len

    @property
    def sinks(self) -> int | None:
        """A rolling cache's sinks (None otherwise)."""
        return self._s.sinks

    @property
    def window(self) -> int | None:
        """A rolling cache's window (None otherwise)."""
        return self._s.window

    @property
    def static(self) -> bool:
        return self._s.static

    @property
    def rolling(self) -> bool:
        """A rolling static cache (``window`` given): writes wrap around in place."""
        return self._s.rolling

    def __len__(self) -> int:
        """Keys held (a host sync for a static cache; not for compiled code)."""
        return self._s.held()

    def next_positions(self, length: int, device: torch.device) -> Tensor:
        """Default positions of ``length`` new tokens: each row's highest stored position + 1
        onwards (so they follow a left-padded prefill and a rollback by :meth:`crop` or
        :meth:`evict`); ``arange(L)`` while empty. ``[L]`` while every row has the same next
        position (no row was given positions of its own since :meth:`reset`), else ``[B, L]``."""
        return self._s.next_positions(check_int("length", length, minimum=0), device)

    # The protocol attention uses (the cache's fields stay its own).

    def imposed_rule(self) -> tuple[int, int] | None:
        """``(window, sinks)`` a rolling cache imposes on attention; None for the others."""
        s = self._s
        return s.imposed_rule() if isinstance(s, Rolling) else None

    def mask_columns(self, new: int) -> MaskColumns:
        """The widths a ``[B, T]`` padding or ``[B, Lq, T]`` who-sees-whom mask may take with
        ``new`` new keys, and where the new keys sit (a ``MaskColumns``)."""
        return self._s.mask_columns(new)

    def held_document_ids(self) -> Tensor | None:
        """``[B, T]``: the document ids of the written slots (a host sync for a static cache);
        None when the cache has none."""
        return self._s.held_document_ids()

    def holds_storage(self) -> bool:  # written since made (a static cache's, also reset)
        return self._s.k is not None

    def reached(self) -> Tensor | None:
        """``[B]`` int64: each row's highest position + 1 (None while nothing is stored)."""
        return None if self._s.k is None else self._s.next_start

    def holds_evicted(self) -> bool:  # evict() dropped slots: keys are not at their indices
        return self._s.evicted

    @property
    def positions_are_slots(self) -> bool:
        """Key slot ``j`` of a view holds the ``j``-th key appended (growing, never evicted):
        a bias by index is a bias by position for default positions."""
        return not self._s.static and not self._s.evicted

    def append(
        self, k: Tensor, v: Tensor, positions: Tensor | None, document_ids: Tensor | None,
        new_valid: Tensor | None = None, defaulted: bool = False,
    ) -> CacheView:
        """Add checked new keys (as ``_update``) and return every key the queries attend
        over; the view's ``valid`` (``[B | 1, T]``) merges the padding the cache remembers
        with its written slots (None: every key is real)."""
        view = self._update(k, v, positions, document_ids, new_valid, defaulted)
        if self._s.rolling:
            return view
        held, written = self._s.valid, view.valid
        if held is None:
            return view if written is None else view._replace(valid=written[None])
        return view._replace(valid=held if written is None else held & written)

    def _check_new(self, k: Tensor, v: Tensor) -> None:
        ck, cv = self._s.k, self._s.v
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
        ck, cv = self._s.k, self._s.v
        if ck is not None and cv is not None:
            mismatch = (k.shape[:-2] != ck.shape[:-2] or k.shape[-1] != ck.shape[-1]
                        or v.shape[-1] != cv.shape[-1] or k.dtype != ck.dtype
                        or k.device != ck.device)
            if mismatch and self._s.refill_after_reset():
                return
        if self.k is not None and self.v is not None:
            if k.shape[:-2] != self.k.shape[:-2] or k.shape[-1] != self.k.shape[-1]:
                raise ValueError(cache_mismatch(k, self.k, len(self)))
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
        ``[B, L]``; return everything cached. ``positions`` are checked as
        :func:`~posenc.attention.attend` checks them (integers in ``[0, 2**31)``),
        ``document_ids`` are integer labels. A rolling cache returns its ``S + W`` stored slots
        and the new keys (what the new queries attend over, before they overwrite any), with
        ``valid [B, S + W + L]``, and takes no ``document_ids``."""
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
        s = self._s
        B, L = k.shape[0], k.shape[-2]
        defaulted = (defaulted or positions is None) and s.next_start is not None
        if positions is None:
            positions = s.next_positions(L, k.device)
        elif positions.dim() > 1 and positions.shape[0] > 1 and s.rows_agree:
            s.rows_agree = False  # positions of each row's own: [B, L] defaults from now on
        pos = positions.to(k.device, torch.long).expand(B, L)  # [B, L]
        if document_ids is not None:
            document_ids = document_ids.to(k.device).expand(B, L)  # [B, L]
        if ((document_ids is None) != (s.document_ids is None) and s.k is not None
                and not s.refill_after_reset()):
            raise ValueError(
                "document_ids must be given on every call with this cache or on none "
                f"(the cache {'has' if s.document_ids is not None else 'has no'} document ids)"
            )
        if new_valid is not None:
            new_valid = new_valid.to(k.device, torch.bool).expand(B, L)  # [B, L]
        if s.rolling and document_ids is not None:
            raise ValueError(
                "document_ids with a rolling KVCache(sinks=..., window=...) is not "
                "supported: it keeps the first keys of each row, not of each document"
            )
        return s.append(k, v, pos, document_ids, new_valid, defaulted)

    def _written(self) -> Tensor | None:
        """``[T]`` bool, the written slots of a static cache (None for a growing one)."""
        return self._s.written()

    def _recompute_next(self) -> None:
        """Each row's next position from the keys it holds (after evict, crop, select)."""
        self._s.recompute_next()

    def _flush(self) -> None:
        """A rolling cache: put its latest key in its own slot (see ``posenc.rolling_cache``)."""
        if isinstance(self._s, Rolling):
            self._s.flush()

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
        assert isinstance(self._s, Growing)
        self._s.evict(keep.to(self.k.device))

    def reset(self) -> None:
        """Empty the cache for a new batch. A static cache keeps its buffers and zeroes its
        write pointer in place (a compiled decode step stays valid; the first prefill after a
        reset compiles one more graph, since the buffers now exist, and later batches reuse it;
        a new batch shape reallocates on the next update). The owning layer is kept."""
        self._s.reset()

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
        self._s.rows_agree = self._s.rows_agree or n == 0
        self._s.crop(n)

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
        self._s.select(self._check_select(batch_index))


def streaming_keep(length: int, sinks: int, window: int) -> tuple[Tensor, Tensor]:
    """StreamingLLM's eviction for a cache of ``length`` keys at positions ``0 .. length - 1``
    inside the cache, before the next token: keep the first ``sinks`` keys and the latest
    ``window - 1``, so that the next token's query sees ``window`` keys counting itself plus
    the sinks, exactly :func:`~posenc.attention.attend`'s ``window=window, sinks=sinks`` (query
    ``m`` sees keys ``m - window < n <= m`` and ``n < sinks``), with or without that rule
    given to attention. ``window`` means the same in ``attend``, ``KVCache(window=)`` and here
    (before 0.4.0 this kept the latest ``window``: one key more than ``attend(window=window)``
    shows). The kept keys take positions ``0 .. len(keep) - 1``. Returns ``(keep, delta)``,
    both int64 ``[K]``: the slots kept (pass ``keep`` to :meth:`~posenc.cache.KVCache.evict`)
    and each kept key's change of position (new minus old, ``<= 0``). Nothing is evicted
    (``delta`` all 0) while ``length <= sinks + window - 1``."""
    length = check_int("length", length, minimum=0)
    sinks = check_int("sinks", sinks, minimum=0)
    window = check_int("window", window, minimum=1)
    recent = window - 1  # the next token is the window's last key
    if length <= sinks + recent:
        keep = torch.arange(length)
    else:
        keep = torch.cat([torch.arange(sinks), torch.arange(length - recent, length)])
    return keep, torch.arange(len(keep)) - keep


class LayerCaches(Sequence[KVCache]):
    """One :class:`KVCache` per layer of a model, as transformers' ``Cache`` holds one per layer.

    ``LayerCaches(num_layers, *, max_len=None, sinks=None, window=None)`` (keyword-only; an int
    ``max_len`` gives every layer a static cache of that many slots, with ``sinks`` and
    ``window`` a rolling one, as :class:`~posenc.cache.KVCache` takes them); ``caches[i]`` is
    layer ``i``'s cache. In a model of your own, give ``caches[i]`` to layer ``i``
    (``layer(x, cache=caches[i])``): a cache holds one layer's keys. The verbs (``reset``,
    ``crop``, ``select``, ``evict``) act on every layer at once.
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
