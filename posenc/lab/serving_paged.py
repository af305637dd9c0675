"""A paged KV cache as vLLM and SGLang keep one, and attention over it (chapter 11).

:class:`PagedKVCache` stores keys in fixed-size blocks handed out from a free list, found through
a block table and a slot mapping, none of which is the position RoPE rotates by;
:func:`paged_attend` is one step of attention over it, equal to
:func:`~posenc.attention.attend` over a contiguous :class:`~posenc.cache.KVCache`.
:mod:`posenc.lab.serving` re-exports both names.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

import posenc
from posenc._checks import check_int, check_positions, check_tensor
from posenc.schemes import PositionScheme, _check_scheme

from .serving_checks import LAYOUT, _bias_scheme

__all__ = ["PagedKVCache", "paged_attend"]


class PagedKVCache:
    """A paged KV cache as vLLM (PagedAttention, Kwon et al., 2023) and SGLang run it.

    Memory is ``num_blocks`` blocks of ``block_size`` slots: ``k_pages``, ``v_pages``
    ``[num_blocks, block_size, heads, head_dim]`` (flash-attn's paged layout), and
    ``pos_pages [num_blocks, block_size]``, the position each stored key was rotated by. A row
    (a request) owns the blocks its **block table** lists, in order: token ``t`` of row ``b``
    lives in block ``block_table[b, t // block_size]`` at offset ``t % block_size``, i.e. at
    the flat **slot** ``block * block_size + offset`` (vLLM's ``slot_mapping``). Blocks come
    from a free list in whatever order it holds them (``block_order``; vLLM's allocator hands
    out any free block), so a row's keys are scattered over memory.

    Slots are storage, positions are meaning: the block table and the slot mapping say where a
    key is, the stored position what RoPE rotated it by and what a bias reads. Gathering a
    row's blocks in table order gives back its keys, values and positions as a contiguous
    :class:`~posenc.cache.KVCache` holds them, and attention over them is the same
    (:func:`paged_attend`).

    Keys are stored as given (already rotated, as ``KVCache`` stores them), in the cache's
    floating ``dtype`` on its ``device``: a write of another dtype or device is refused, as
    ``KVCache`` refuses it (cast the keys, or build the cache in their dtype).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        heads: int,
        head_dim: int,
        *,
        block_order: Sequence[int] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, minimum=1)
        self.block_size = check_int("block_size", block_size, minimum=1)
        self.heads = check_int("heads", heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype (float32, float16, bfloat16, "
                            f"float64): the pages hold keys and values, got {dtype!r}")
        if block_order is None:
            order = list(range(num_blocks))
        else:
            if isinstance(block_order, (str, bytes)) or not isinstance(block_order, Sequence):
                raise TypeError(
                    f"block_order must be a list of block ids, got {type(block_order).__name__}")
            order = [check_int(f"block_order[{i}]", b, minimum=0) for i, b in enumerate(block_order)]
            if sorted(order) != list(range(num_blocks)):
                raise ValueError(
                    f"block_order must name each of the {num_blocks} blocks once (a permutation "
                    f"of 0..{num_blocks - 1}), got {order}"
                )
        shape = (num_blocks, block_size, heads, head_dim)
        self.k_pages = torch.zeros(shape, dtype=dtype, device=device)  # [N, bs, H_kv, Dh]
        self.v_pages = torch.zeros(shape, dtype=dtype, device=device)  # [N, bs, H_kv, Dh]
        self.pos_pages = torch.zeros(num_blocks, block_size, dtype=torch.long, device=device)
        self.free = order  # the free list: blocks handed out from the front
        self.tables: list[list[int]] = []  # per row: its blocks, in order
        self.lengths: list[int] = []  # per row: tokens stored

    def add_row(self) -> int:
        """A new, empty row (a request); returns its index."""
        self.tables.append([])
        self.lengths.append(0)
        return len(self.tables) - 1

    def _check_row(self, row: object) -> int:
        row = check_int("row", row, minimum=0)
        if row >= len(self.tables):
            raise ValueError(f"row must be one of the {len(self.tables)} rows (add_row() makes "
                             f"one), got {row}")
        return row

    def block_table(self) -> Tensor:
        """``[B, max_blocks]`` int64: each row's blocks in order, ``-1`` past its last (the
        tensor a paged kernel reads, flash-attn's ``block_table``)."""
        width = max((len(t) for t in self.tables), default=0)
        out = torch.full((len(self.tables), width), -1, dtype=torch.long)
        for b, table in enumerate(self.tables):
            out[b, : len(table)] = torch.tensor(table, dtype=torch.long)
        return out

    def slot_mapping(self, row: int, n: int) -> Tensor:
        """``[n]`` int64: the flat slots (``block * block_size + offset``) the next ``n``
        tokens of ``row`` go to, allocating blocks from the free list as needed."""
        row = self._check_row(row)
        n = check_int("n", n, minimum=0)
        start, bs = self.lengths[row], self.block_size
        need = -(-(start + n) // bs) - len(self.tables[row])
        if need > len(self.free):
            raise ValueError(
                f"PagedKVCache is out of blocks: row {row} needs {need} more and "
                f"{len(self.free)} are free (num_blocks={self.num_blocks}, block_size={bs})"
            )
        for _ in range(max(need, 0)):
            self.tables[row].append(self.free.pop(0))
        t = torch.arange(start, start + n)  # [n], the row's token indices
        blocks = torch.tensor(self.tables[row], dtype=torch.long)[t // bs] if n else t
        return blocks * bs + t % bs  # [n]

    def _check_kv(self, k: Tensor, v: Tensor) -> None:
        """``k``, ``v [heads, L, head_dim]`` in the pages' dtype, on their device."""
        for name, t in (("k", k), ("v", v)):
            check_tensor(name, t, floating=True)
            if t.dim() != 3 or t.shape[0] != self.heads or t.shape[2] != self.head_dim:
                raise ValueError(
                    f"{name} must have shape [heads={self.heads}, L, head_dim={self.head_dim}], "
                    f"got {tuple(t.shape)}"
                )
            pages = self.k_pages
            if t.dtype != pages.dtype or t.device != pages.device:
                raise ValueError(
                    f"{name} is {t.dtype} on {t.device}, the cache holds {pages.dtype} on "
                    f"{pages.device}: pass {name}.to({pages.dtype}) or build "
                    f"PagedKVCache(..., dtype={t.dtype}) (KVCache's rule: no silent cast)"
                )
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                             f"{tuple(v.shape)}")

    def append(self, row: int, k: Tensor, v: Tensor, positions: Tensor) -> Tensor:
        """Store ``k``, ``v`` ``[heads, L, head_dim]`` of ``row``'s next ``L`` tokens, rotated
        at ``positions [L]``; returns their slots ``[L]``."""
        row = self._check_row(row)
        self._check_kv(k, v)
        positions = check_positions("positions", positions)
        if positions.dim() != 1 or positions.shape[0] != k.shape[1]:
            raise ValueError(f"positions must have shape [L={k.shape[1]}], got "
                             f"{tuple(positions.shape)}")
        slots = self.slot_mapping(row, k.shape[1])  # [L]
        block, offset = slots // self.block_size, slots % self.block_size
        self.k_pages[block, offset] = k.transpose(0, 1)  # [L, H_kv, Dh]
        self.v_pages[block, offset] = v.transpose(0, 1)
        self.pos_pages[block, offset] = positions.to(self.pos_pages.device)
        self.lengths[row] += k.shape[1]
        return slots

    def gather(self, row: int) -> tuple[Tensor, Tensor, Tensor]:
        """``row``'s keys, values ``[heads, T, head_dim]`` and positions ``[T]``, read through
        its block table (what a paged kernel reads in place)."""
        row = self._check_row(row)
        T, bs = self.lengths[row], self.block_size
        t = torch.arange(T)
        blocks = torch.tensor(self.tables[row], dtype=torch.long)[t // bs] if T else t
        offset = t % bs
        k = self.k_pages[blocks, offset].transpose(0, 1)  # [H_kv, T, Dh]
        v = self.v_pages[blocks, offset].transpose(0, 1)
        return k, v, self.pos_pages[blocks, offset]

    def free_row(self, row: int) -> None:
        """Return ``row``'s blocks to the free list (a finished request); the row stays, empty."""
        row = self._check_row(row)
        self.free.extend(self.tables[row])
        self.tables[row], self.lengths[row] = [], 0


def paged_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cache: PagedKVCache,
    rows: Sequence[int] | Tensor,
    scheme: PositionScheme | None = None,
    *,
    positions: Tensor,
) -> Tensor:
    """One step of attention over a :class:`PagedKVCache`, as :func:`~posenc.attention.attend`
    does it over a ``KVCache``: ``q [B, H, L, Dh]``, the new ``k``, ``v [B, H_kv, L, Dh]`` of
    ``rows`` (one row of the cache per batch row, each at most once: a list of ints or a 1-D
    integer tensor, vLLM's request indices) at ``positions [B, L]``.

    The new queries and keys are rotated at their positions (``scheme``'s ``rotate`` hook),
    the keys written through each row's slot mapping; then every row's keys, values and
    positions are gathered through its block table, padded to the longest row, and attended
    with the key positions (causal by position, a bias from positions) and a padding mask.
    Returns ``[B, H, L, Dh]``. Everything is checked before the cache is written.
    """
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] \
            or q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"q must be [B, H, L, Dh] and k, v [B, H_kv, L, Dh] with the same B and "
                         f"L and H % H_kv == 0, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)} ({LAYOUT})")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, L, _ = q.shape
    scheme = _check_scheme(scheme, H, f" ({LAYOUT})")
    if isinstance(rows, Tensor):
        if rows.is_floating_point() or rows.is_complex() or rows.dtype == torch.bool \
                or rows.dim() != 1:
            raise TypeError(f"rows must be a list of ints or a 1-D integer tensor, got a "
                            f"{rows.dtype} tensor of shape {tuple(rows.shape)}")
        rows = rows.tolist()
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise TypeError(f"rows must be a list of ints or a 1-D integer tensor (one cache row per "
                        f"batch row), got {type(rows).__name__}")
    if len(rows) != B:
        raise ValueError(f"rows must list one cache row per batch row ({B}), got {rows!r}")
    rows = [cache._check_row(r) for r in rows]
    if len(set(rows)) != B:
        twice = sorted({r for r in rows if rows.count(r) > 1})
        raise ValueError(f"rows must name each cache row at most once, got {rows} (rows {twice} "
                         "twice): one batch row per request, or its tokens would be written "
                         "twice and each batch row see a different prefix")
    positions = check_positions("positions", positions)
    if positions.shape != (B, L):
        raise ValueError(f"positions must have shape [B={B}, L={L}], got {tuple(positions.shape)}"
                         f" (L is dim 2 of q; {LAYOUT})")
    if k.shape[1] != cache.heads or k.shape[3] != cache.head_dim:
        raise ValueError(f"k, v must be [B, H_kv={cache.heads}, L, head_dim={cache.head_dim}] "
                         f"(the cache's heads and head_dim), got {tuple(k.shape)} ({LAYOUT})")
    cache._check_kv(k[0], v[0])  # the cache's dtype and device
    bs = cache.block_size
    need = sum(max(-(-(cache.lengths[r] + L) // bs) - len(cache.tables[r]), 0) for r in rows)
    if need > len(cache.free):
        raise ValueError(f"PagedKVCache is out of blocks: rows {rows} need {need} more and "
                         f"{len(cache.free)} are free (num_blocks={cache.num_blocks}, "
                         f"block_size={bs})")
    q, k = scheme.rotate(q, k, positions)  # [B, H, L, Dh], [B, H_kv, L, Dh]
    for b, row in enumerate(rows):
        cache.append(row, k[b], v[b], positions[b])
    held = [cache.gather(row) for row in rows]  # per row: [H_kv, T_b, Dh] x2, [T_b]
    T = max(p.shape[0] for _, _, p in held)
    keys = q.new_zeros(B, k.shape[1], T, k.shape[3])  # [B, H_kv, T, Dh], padded
    values = torch.zeros_like(keys)
    key_pos = torch.zeros(B, T, dtype=torch.long, device=q.device)
    real = torch.zeros(B, T, dtype=torch.long, device=q.device)
    for b, (kb, vb, pb) in enumerate(held):
        n = pb.shape[0]
        keys[b, :, :n], values[b, :, :n], key_pos[b, :n], real[b, :n] = kb, vb, pb, 1
    return posenc.attend(q, keys, values, _bias_scheme(scheme), positions=positions,
                         key_positions=key_pos, attention_mask=real)
