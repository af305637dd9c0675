"""The laboratory of chapter 11 (positions at serving time): how inference engines store, reuse,
verify and split the keys that positions rotate, written small enough to read, each equal to
``posenc``'s contiguous :class:`~posenc.cache.KVCache` and :func:`~posenc.attention.attend`
(the tests assert it).

- :class:`PagedKVCache` and :func:`paged_attend`: the paged KV cache of vLLM (Kwon et al.,
  2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention")
  and SGLang: fixed-size blocks handed out from a free list, a block table per row and a slot
  mapping per token, none of which is the position RoPE rotates by;
- :func:`shift_rotated_keys`: prefix caching reuses rotated keys only at the positions they
  were rotated for; a chunk moved by ``shift`` positions needs one more rotation by ``shift``;
- :func:`kvcache_step_reference`: flash-attn's ``flash_attn_with_kvcache`` (rotate the new
  query and key at each row's offset ``cache_seqlens[b]``, write them into the cache there,
  attend over the row's filled prefix) on the CPU, from its documented semantics;
- :func:`partial_attention`, :func:`merge_partials` and :func:`attend_sharded`: context
  parallelism as torch runs it (ring attention, Liu et al., 2023; torch's ``_SDPAMerger`` in
  ``torch/distributed/tensor/experimental/_context_parallel/_attention.py``): per-block
  outputs and log-sum-exps merged by log-sum-exp, causal blocks skipped by position;
- :func:`rebase_cache`: llama.cpp's context shift, a bulk rebase of every cached key by one
  rotation, so positions stay small on an endless stream;
- :func:`tree_positions_and_mask`: a speculative-decoding draft tree's positions (by depth)
  and its who-sees-whom mask, the boolean mask :func:`~posenc.attention.attend` takes.

Layouts: posenc's ``[B, H, L, Dh]`` unless a docstring says otherwise (flash-attn's
``[B, L, H, Dh]`` in :func:`kvcache_step_reference`, vLLM's pages ``[N, block, H, Dh]``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

import posenc
from posenc._checks import check_bool, check_int, check_positions, check_tensor
from posenc.cache import KVCache
from posenc.rope import RotaryEmbedding
from posenc.rope_layout import LAYOUTS
from posenc.schemes import PositionScheme, RoPE, _a_class, _check_scheme

__all__ = [
    "PagedKVCache", "paged_attend", "shift_rotated_keys", "kvcache_step_reference",
    "partial_attention", "merge_partials", "attend_sharded", "ShardedAttention",
    "rebase_cache", "tree_positions_and_mask",
]


# ------------------------------------------------------------------ helpers


LAYOUT = (f"posenc's layout is {LAYOUTS[-2]}; flash-attn's {LAYOUTS[-3]} converts with "
          ".transpose(1, 2)")
"""The end of a shape error where ``[B, H, L, Dh]`` is expected (a ``[B, L, H, Dh]`` tensor
usually fails on a length or head count)."""


def _rotary(rope: object, argument: str = "rope") -> RotaryEmbedding:
    """The :class:`~posenc.rope.RotaryEmbedding` of ``rope`` (the module, or a ``RoPE``
    scheme), refusing what a further rotation cannot move (xPos's per-position scale)."""
    if isinstance(rope, RoPE):
        rope = rope.rotary
    if not isinstance(rope, RotaryEmbedding):
        what = _a_class(rope) if isinstance(rope, type) else f"got {type(rope).__name__}"
        raise TypeError(
            f"{argument} must be a posenc.RotaryEmbedding or a posenc.RoPE scheme, {what}")
    if rope.xpos_scale_base is not None:
        raise ValueError(
            f"{argument}: xPos scales keys by their position, which a rotation cannot move; "
            "shift keys of a plain (or scaled) RoPE"
        )
    return rope


def _check_head_dim(name: str, x: Tensor, rotary: RotaryEmbedding, argument: str) -> None:
    """``x [..., head_dim]`` must end in the head_dim ``rotary`` was built for: its
    frequencies (``inv_freq``) are those of that head_dim, and would turn other channels."""
    if x.shape[-1] != rotary.head_dim:
        raise ValueError(
            f"{name} must end in {argument}'s head_dim={rotary.head_dim} (rotary_dim="
            f"{rotary.rotary_dim}), got shape {tuple(x.shape)}: build the RoPE with the keys' "
            "head_dim"
        )


def _rotate_q(scheme: PositionScheme, q: Tensor, positions: Tensor) -> Tensor:
    """``q [B, H, L, Dh]`` through ``scheme``'s ``rotate`` hook at ``positions`` (the hook
    takes a key too: one head of ``q`` stands in and is dropped)."""
    return scheme.rotate(q, q[:, :1], positions)[0]


def _bias_scheme(scheme: PositionScheme) -> PositionScheme | None:
    """What :func:`~posenc.attention.attend` still needs once queries and keys are rotated:
    the bias schemes (ALiBi, T5) themselves, nothing for a rotation or NoPE."""
    return scheme if scheme.has_bias else None


# ------------------------------------------------------------------ 1. a paged KV cache


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


# ------------------------------------------------------------------ 2. prefix caching


def shift_rotated_keys(k: Tensor, shift: int | Tensor, rope: RotaryEmbedding | RoPE) -> Tensor:
    """Keys ``k [..., T, Dh]`` rotated at positions ``p`` -> the same keys rotated at
    ``p + shift`` (``shift`` an int or ``[T]``, any sign), by one more rotation: RoPE's
    rotations compose, ``R(s) R(p) = R(p + s)``.

    Prefix caching (vLLM's automatic prefix caching, SGLang's RadixAttention) reuses cached keys
    of a chunk only where it sits at the same absolute positions; the same chunk at another
    offset (a document moved in a prompt) needs this rotation, or its scores with later
    queries are wrong. The angle is ``|shift| * theta`` from posenc's exact angles, without
    the attention factor (it is in the keys already); partial rotary turns only the rotary
    channels. xPos (a per-position scale) is refused; for ``dynamic`` / ``longrope`` scaling
    the frequencies must be those the keys were rotated with, and ``k`` must end in ``rope``'s
    ``head_dim`` (another head_dim, odd included, is refused: its frequencies would turn the
    wrong channels).
    """
    rotary = _rotary(rope)
    check_tensor("k", k, floating=True, min_dim=2)
    _check_head_dim("k", k, rotary, "rope")
    T = k.shape[-2]
    if isinstance(shift, Tensor):
        if shift.is_floating_point() or shift.is_complex() or shift.dtype == torch.bool:
            raise TypeError(f"shift must be an int or an integer tensor, got {shift.dtype}")
        if shift.dim() != 1 or shift.shape[0] != T:
            raise ValueError(f"shift must be an int or have shape [T={T}] (T is dim -2 of k "
                             f"[..., T, head_dim], shape {tuple(k.shape)}), got "
                             f"{tuple(shift.shape)}")
        delta = shift.to(k.device, torch.long)
    else:
        n = check_int("shift", shift)
        if abs(n) >= 2**31:  # posenc's positions stay below 2**31 (a tensor shift is checked so)
            raise ValueError(f"shift must be between -(2**31 - 1) and 2**31 - 1, got {n}")
        delta = torch.full((T,), n, dtype=torch.long, device=k.device)
    inv = rotary.inv_freq.to(k.device)
    cos, sin = posenc.rope_cos_sin(delta.abs(), inv, interleaved=rotary.interleaved)  # [T, rd]
    sin = sin * delta.sign()[:, None].to(sin.dtype)  # a backward turn: sin negated
    return posenc.apply_rope(k, cos, sin, interleaved=rotary.interleaved)


# ------------------------------------------------------------------ 3. flash_attn_with_kvcache


def _rotate_half_table(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """``x [..., L, H, D]`` turned by ``cos``/``sin`` ``[..., L, rd/2]`` (flash-attn's tables:
    one angle per channel pair) on its first ``rd`` channels, written out in float32."""
    rd = 2 * cos.shape[-1]
    xr = x[..., :rd].float()
    c, s = cos.float()[..., None, :], sin.float()[..., None, :]  # [..., L, 1, rd/2]
    if interleaved:  # pairs (0, 1), (2, 3), ...
        a, b = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2)
    else:  # GPT-NeoX: pairs (i, i + rd/2)
        a, b = xr[..., : rd // 2], xr[..., rd // 2:]
        out = torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    return torch.cat([out.to(x.dtype), x[..., rd:]], dim=-1)


def _contiguous_slots(rows: int, S: int):
    """Row ``b``'s slots ``t`` in a contiguous cache ``[B, S, ...]``: the index ``(b, t)``."""
    def slot_of(b: int, t: Tensor) -> tuple[Tensor, Tensor]:
        return torch.full_like(t, b), t
    return slot_of


def _paged_slots(block_table: Tensor, block_size: int):
    """Row ``b``'s slots ``t`` in a paged cache ``[num_blocks, block_size, ...]``: the index
    ``(block_table[b, t // block_size], t % block_size)``."""
    def slot_of(b: int, t: Tensor) -> tuple[Tensor, Tensor]:
        return block_table[b, t // block_size], t % block_size
    return slot_of


def kvcache_step_reference(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor | None = None,
    v: Tensor | None = None,
    rotary_cos: Tensor | None = None,
    rotary_sin: Tensor | None = None,
    cache_seqlens: int | Tensor | None = None,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    rotary_interleaved: bool = True,
    alibi_slopes: Tensor | None = None,
    block_table: Tensor | None = None,
    return_softmax_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """flash-attn's ``flash_attn_with_kvcache`` on the CPU, written from its documented
    semantics (flash_attn/flash_attn_interface.py): layouts ``q [B, Lq, H, D]``,
    ``k_cache``, ``v_cache [B, S, H_kv, D]``, new ``k``, ``v [B, Lnew, H_kv, D]``,
    ``rotary_cos``/``rotary_sin [seqlen_ro, rotary_dim / 2]`` (one angle per pair),
    ``cache_seqlens`` an int or ``[B]``. With ``block_table [B, max_blocks]`` (a paged cache,
    as :class:`PagedKVCache` keeps it) the caches are ``[num_blocks, block_size, H_kv, D]``
    and row ``b``'s slot ``t`` is block ``block_table[b, t // block_size]``, offset
    ``t % block_size``: rotation, writing and attention follow the slot ``t``, wherever its
    block lies.

    - With ``rotary_cos``/``rotary_sin``, the new key of row ``b`` is rotated at positions
      ``cache_seqlens[b], cache_seqlens[b] + 1, ...``; the query likewise when ``causal``, and
      every query at ``cache_seqlens[b]`` when not: the **slot is the position**, per row.
    - ``k``, ``v`` are written into the caches **in place** at those slots.
    - Row ``b`` attends over its first ``seqlen_k = cache_seqlens[b] + Lnew`` slots; ``causal``
      aligns the mask to the bottom right (query ``i`` sees key ``j <= i + seqlen_k - Lq``);
      ``alibi_slopes [H]`` or ``[B, H]`` (one set per row, as flash-attn takes them) add
      ``-slope * |i + seqlen_k - Lq - j|``. A query that sees no key gives 0.
    - ``q``, the caches and ``k``, ``v`` share one dtype (flash-attn's rule; the reference
      computes in float32 and returns ``out`` in that dtype).

    Returns ``out [B, Lq, H, D]`` (and the log-sum-exp ``[B, H, Lq]`` of the scaled scores with
    ``return_softmax_lse``). Not the kernel: no ``cache_batch_idx``, no ``cache_leftpad``, no
    window or softcap, any block size.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, floating=True)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (flash-attn's [B, L, H, D]), got "
                             f"{tuple(t.shape)}")
    given = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    given += [(n, t) for n, t in (("k", k), ("v", v)) if t is not None]
    for name, t in given[3:]:
        check_tensor(name, t, floating=True)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (flash-attn's [B, Lnew, H_kv, D]), got "
                             f"{tuple(t.shape)}")
    if len({t.dtype for _, t in given}) > 1:  # flash-attn's rule, and posenc.attend's
        raise TypeError(f"{', '.join(n for n, _ in given)} must share one dtype, got "
                        f"{', '.join(f'{n} {t.dtype}' for n, t in given)}")
    B, Lq, H, D = q.shape
    H_kv = k_cache.shape[2]
    if block_table is None:
        S = k_cache.shape[1]
        slot_of = _contiguous_slots(k_cache.shape[0], S)
    else:
        check_tensor("block_table", block_table)
        if block_table.is_floating_point() or block_table.dim() != 2 or block_table.shape[0] != B:
            raise ValueError(f"block_table must be an integer tensor [B={B}, max_blocks], got "
                             f"{block_table.dtype} {tuple(block_table.shape)}")
        S = block_table.shape[1] * k_cache.shape[1]  # slots a row can address
        slot_of = _paged_slots(block_table.long().cpu(), k_cache.shape[1])
    rows_ok = block_table is not None or k_cache.shape[0] == B
    if k_cache.shape != v_cache.shape or not rows_ok or k_cache.shape[3] != D or H % H_kv:
        raise ValueError(f"k_cache, v_cache must be [B={B}, S, H_kv, D={D}] (paged: "
                         f"[num_blocks, block_size, H_kv, D]) with H % H_kv == 0, got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if (k is None) != (v is None):
        raise ValueError("give k and v together (the new keys and values), or neither")
    Lnew = 0 if k is None else k.shape[1]
    if k is not None and v is not None and (k.shape != v.shape or k.shape[0] != B
                                            or k.shape[2:] != k_cache.shape[2:]):
        raise ValueError(f"k, v must be [B={B}, Lnew, H_kv={H_kv}, D={D}], got {tuple(k.shape)}"
                         f" and {tuple(v.shape)}")
    if cache_seqlens is None:
        seqlens = torch.zeros(B, dtype=torch.long)
    elif isinstance(cache_seqlens, Tensor):
        if cache_seqlens.is_floating_point() or cache_seqlens.shape != (B,):
            raise ValueError(f"cache_seqlens must be an int or an integer tensor [B={B}], got "
                             f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
        seqlens = cache_seqlens.long().cpu()
    else:
        seqlens = torch.full((B,), check_int("cache_seqlens", cache_seqlens, minimum=0))
    if int(seqlens.min()) < 0:
        raise ValueError(f"cache_seqlens must be >= 0 (tokens already cached per row), got "
                         f"{seqlens.tolist()}")
    if int(seqlens.max()) + Lnew > S:
        raise ValueError(f"cache_seqlens + Lnew must fit the cache's {S} slots, got "
                         f"cache_seqlens {seqlens.tolist()} and Lnew={Lnew}")
    if block_table is not None:
        bs, nb = k_cache.shape[1], k_cache.shape[0]
        for b in range(B):
            used = block_table[b, : -(-(int(seqlens[b]) + Lnew) // bs)]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= nb):
                raise ValueError(f"block_table[{b}] must name blocks in [0, {nb}) for the row's "
                                 f"{int(seqlens[b]) + Lnew} slots, got {used.tolist()}")
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary:
        if rotary_cos is None or rotary_sin is None or rotary_cos.shape != rotary_sin.shape \
                or rotary_cos.dim() != 2 or 2 * rotary_cos.shape[1] > D:
            raise ValueError("rotary_cos and rotary_sin must both be [seqlen_ro, rotary_dim / 2] "
                             f"with rotary_dim <= D={D}")
        if k is None:
            raise ValueError("rotary_cos/rotary_sin rotate the new k: give k and v")
        if int(seqlens.max()) + max(Lnew, 1) > rotary_cos.shape[0]:
            raise ValueError(f"rotary tables cover {rotary_cos.shape[0]} positions, fewer than "
                             f"cache_seqlens + Lnew")
    slopes = None
    if alibi_slopes is not None:
        check_tensor("alibi_slopes", alibi_slopes, floating=True)
        if alibi_slopes.shape not in ((H,), (B, H)):
            raise ValueError(f"alibi_slopes must have shape [H={H}] or [B={B}, H={H}] (one slope "
                             f"per query head, per row or for all), got "
                             f"{tuple(alibi_slopes.shape)} (q is flash-attn's [B, L, H, D], "
                             f"got {tuple(q.shape)})")
        slopes = alibi_slopes.to(q.device, torch.float32).expand(B, H)  # [B, H]
    causal = check_bool("causal", causal)
    rotary_interleaved = check_bool("rotary_interleaved", rotary_interleaved)
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    out = q.new_zeros(B, Lq, H, D)
    lse = torch.full((B, H, Lq), float("-inf"), device=q.device)
    for b in range(B):
        n = int(seqlens[b])
        qb = q[b]  # [Lq, H, D]
        if k is not None and v is not None:
            kb = k[b]  # [Lnew, H_kv, D]
            if rotary:
                assert rotary_cos is not None and rotary_sin is not None
                idx = torch.arange(n, n + Lnew)
                kb = _rotate_half_table(kb, rotary_cos[idx], rotary_sin[idx], rotary_interleaved)
                q_idx = torch.arange(n, n + Lq) if causal else torch.full((Lq,), n)
                qb = _rotate_half_table(qb, rotary_cos[q_idx], rotary_sin[q_idx],
                                        rotary_interleaved)
            where = slot_of(b, torch.arange(n, n + Lnew))  # (block or row, offset) of each
            k_cache[where] = kb.to(k_cache.dtype)  # in place, as the kernel
            v_cache[where] = v[b].to(v_cache.dtype)
        seqlen_k = n + Lnew
        held = slot_of(b, torch.arange(seqlen_k))
        keys = k_cache[held].float().repeat_interleave(H // H_kv, dim=1)  # [Tk, H, D]
        vals = v_cache[held].float().repeat_interleave(H // H_kv, dim=1)
        s = torch.einsum("qhd,khd->hqk", qb.float(), keys) * scale  # [H, Lq, Tk]
        i = torch.arange(Lq, device=q.device)[:, None] + seqlen_k - Lq  # [Lq, 1]: aligned index
        j = torch.arange(seqlen_k, device=q.device)[None, :]  # [1, Tk]
        if slopes is not None:
            s = s - slopes[b].view(H, 1, 1) * (i - j).abs()
        if causal:
            s = s.masked_fill(j > i, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [H, Lq]
        p = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)  # an empty row: 0
        out[b] = torch.einsum("hqk,khd->qhd", p, vals).to(q.dtype)
        lse[b] = row_lse
    return (out, lse) if return_softmax_lse else out


# ------------------------------------------------------------------ 4. context parallelism


def partial_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    scheme: PositionScheme | None = None,
    *,
    causal: bool = True,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention of one block of queries over one block of keys, with its log-sum-exp, as a
    ring-attention step computes it: ``q [B, H, Lq, Dh]`` and ``k``, ``v [B, H_kv, Lk, Dh]``
    **already rotated** (at their global positions), ``q_pos [Lq]``, ``k_pos [Lk]`` (global
    positions: causal means ``k_pos <= q_pos``; a bias scheme reads them).

    Returns ``(out [B, H, Lq, Dv], lse [B, H, Lq])`` float32: the block's softmax-weighted
    values and ``logsumexp`` of its scores (``-inf`` and 0 output where a query sees no key
    of the block), which :func:`merge_partials` combines.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
        if t.dim() != 4:
            raise ValueError(f"{name} must be [B, H, L, Dh], got {tuple(t.shape)} ({LAYOUT})")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1] \
            or q.shape[3] != k.shape[3]:
        raise ValueError(f"k, v must be [B, H_kv, Lk, *] with q's B and Dh and H % H_kv == 0, "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} ({LAYOUT})")
    q_pos, k_pos = check_positions("q_pos", q_pos), check_positions("k_pos", k_pos)
    if q_pos.shape != (q.shape[2],) or k_pos.shape != (k.shape[2],):
        raise ValueError(f"q_pos must be [Lq={q.shape[2]}] and k_pos [Lk={k.shape[2]}] (dim 2 of "
                         f"q and k), got {tuple(q_pos.shape)} and {tuple(k_pos.shape)} ({LAYOUT})")
    scheme = _check_scheme(scheme, q.shape[1], f" ({LAYOUT})")
    q_pos, k_pos = q_pos.to(q.device), k_pos.to(q.device)
    groups = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(groups, dim=1)
    vf = v.float().repeat_interleave(groups, dim=1)
    s = q.float() @ kf.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    B = q.shape[0]
    bias = scheme.position_bias(q_pos.expand(B, -1), k_pos.expand(B, -1), causal=causal)
    if bias is not None:
        s = s + bias  # [B, H, Lq, Lk]
    if check_bool("causal", causal):
        s = s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B, H, Lq]
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return p @ vf, lse


def merge_partials(outputs: Sequence[Tensor], lses: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Merge partial attention results over disjoint key blocks into attention over all of them:
    ``lse = log sum_i exp(lse_i)``, ``out = sum_i exp(lse_i - lse) out_i`` (each ``out_i``
    ``[..., Lq, Dv]`` with ``lse_i [..., Lq]``). A softmax over the union of the blocks is
    each block's softmax reweighted by its share of the total mass; torch's ``_SDPAMerger``
    does the same merge two at a time (``out - sigmoid(lse_i - lse) (out - out_i)``). Rows no
    block saw stay 0 with ``lse = -inf``."""
    if isinstance(outputs, Tensor) or isinstance(lses, Tensor):
        raise TypeError("outputs and lses must be lists of tensors (one per block), not a tensor")
    if len(outputs) != len(lses) or not outputs:
        raise ValueError(f"outputs and lses must hold one tensor per block, and the same number, "
                         f"got {len(outputs)} and {len(lses)}")
    for i, (o, s) in enumerate(zip(outputs, lses, strict=True)):
        check_tensor(f"outputs[{i}]", o, floating=True, min_dim=2)
        check_tensor(f"lses[{i}]", s, floating=True, min_dim=1)
        if o.shape[:-1] != s.shape or o.shape != outputs[0].shape:
            raise ValueError(f"outputs[{i}] {tuple(o.shape)} and lses[{i}] {tuple(s.shape)} do "
                             f"not fit: out [..., Lq, Dv], lse [..., Lq], all blocks alike")
    stacked = torch.stack([s.float() for s in lses])  # [n, ..., Lq]
    lse = torch.logsumexp(stacked, dim=0)  # [..., Lq]
    weight = torch.exp(stacked - lse).nan_to_num(0.0)  # [n, ..., Lq]: 0 where lse = -inf
    out = (weight[..., None] * torch.stack([o.float() for o in outputs])).sum(0)
    return out, lse


class ShardedAttention(NamedTuple):
    """What :func:`attend_sharded` returns."""

    output: Tensor  # [B, H, L, Dv] float32, in sequence order
    lse: Tensor  # [B, H, L] float32
    computed: int  # (query chunk, key chunk) blocks computed
    skipped: int  # blocks skipped: every key after every query (causal)


def attend_sharded(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: PositionScheme | None = None,
    *,
    shards: int,
    causal: bool = True,
    load_balance: bool = False,
    scale: float | None = None,
) -> ShardedAttention:
    """Attention over a sequence split into ``shards`` ranks, as torch's context parallelism
    runs it (ring attention, Liu et al., 2023): ``q [B, H, L, Dh]``, ``k``, ``v [B, H_kv, L, Dh]``
    in sequence order, positions ``0 .. L - 1``.

    Each rank holds the tokens of :func:`~posenc.positions.shard_positions` (contiguous chunks,
    or with ``load_balance=True`` the head-tail layout of torch's ``_HeadTailLoadBalancer``:
    chunks ``r`` and ``2P - 1 - r`` of ``2P``), rotates its queries and keys at their global
    positions, and in a ring step attends its queries to one rank's keys: one
    :func:`partial_attention` per (query chunk, key chunk) block, merged by log-sum-exp
    (:func:`merge_partials`, torch's ``_SDPAMerger``). Under ``causal`` a block whose every key
    comes after every query (by position) is skipped, as torch's ring skips the masked half
    of a load-balanced step. Equal to :func:`~posenc.attention.attend` over the whole sequence
    (the tests assert it for 1 to 4 shards, RoPE, ALiBi, T5).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
        if t.dim() != 4:
            raise ValueError(f"{name} must be [B, H, L, Dh], got {tuple(t.shape)} ({LAYOUT})")
    L = q.shape[2]
    if k.shape[2] != L or v.shape[2] != L:
        raise ValueError(f"q, k, v must cover the same {L} tokens (dim 2), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)} ({LAYOUT})")
    shards = check_int("shards", shards, minimum=1)
    load_balance = check_bool("load_balance", load_balance)
    causal = check_bool("causal", causal)
    scheme = _check_scheme(scheme, q.shape[1], f" ({LAYOUT})")
    ranks = [posenc.shard_positions(L, r, shards, load_balance=load_balance)
             for r in range(shards)]  # the L / P global positions each rank holds
    qs, ks, vs = [], [], []
    for pos in ranks:  # every rank rotates its own tokens at their global positions
        q_r, k_r = scheme.rotate(q[:, :, pos], k[:, :, pos], pos.to(q.device))
        qs.append(q_r)
        ks.append(k_r)
        vs.append(v[:, :, pos])
    per = 2 if load_balance else 1  # contiguous chunks per rank
    c = L // (shards * per)
    out = q.new_zeros(q.shape[:3] + v.shape[3:], dtype=torch.float32)  # [B, H, L, Dv]
    lse = torch.full(q.shape[:3], float("-inf"), device=q.device)
    computed = skipped = 0
    for r in range(shards):
        for qc in range(per):  # each query chunk of rank r
            qsl = slice(qc * c, (qc + 1) * c)
            q_pos = ranks[r][qsl]
            parts: list[Tensor] = []
            part_lses: list[Tensor] = []
            for step in range(shards):  # the ring: rank r sees rank (r - step) mod P's keys
                s = (r - step) % shards
                for kc in range(per):
                    ksl = slice(kc * c, (kc + 1) * c)
                    k_pos = ranks[s][ksl]
                    if causal and int(k_pos.min()) > int(q_pos.max()):
                        skipped += 1  # every key is in every query's future
                        continue
                    computed += 1
                    o, m = partial_attention(qs[r][:, :, qsl], ks[s][:, :, ksl], vs[s][:, :, ksl],
                                             q_pos, k_pos, scheme, causal=causal, scale=scale)
                    parts.append(o)
                    part_lses.append(m)
            merged, merged_lse = merge_partials(parts, part_lses)
            out[:, :, q_pos] = merged
            lse[:, :, q_pos] = merged_lse
    return ShardedAttention(out, lse, computed, skipped)


# ------------------------------------------------------------------ 5. bulk rebase


def rebase_cache(cache: KVCache, rope: RotaryEmbedding | RoPE | None, *, keep: int = 0) -> int:
    """llama.cpp's context shift: move the cached keys down to small positions, each by one
    rotation (``rope`` None: a bias scheme, only the stored positions move). The first ``keep``
    keys (the sinks, llama.cpp's ``n_keep``) go to positions ``0 .. keep - 1``; the rest (the
    window) move as a whole by ``d``, so that they follow the sinks without a gap. Returns
    ``d``, the distance the window (and the next query) moves down.

    ``keep`` at or past the cache's length (a stream that has not filled its sinks yet): every
    cached key is a sink and goes to ``0 .. T - 1``, and ``d`` is the next query's move, so it
    still follows them without a gap (``d = 0`` on a stream that started at 0: nothing moves),
    as llama.cpp clamps ``n_keep`` to the tokens it holds. An empty cache returns 0.

    Done once every ``R`` tokens after eviction, it keeps every position below
    ``keep + window + R`` on an endless stream, so RoPE's angles stay small; each key takes one
    rounding per rebase (a drift that grows with the number of rebases, not with the position).
    The window's relative offsets, and so its scores with the next query, are unchanged. A
    rebase cannot undo rounding a key already carries (a key rotated at position ``10**6`` with
    float32-product angles keeps that error); it keeps positions small from the start. Only a
    growing cache whose rows agree on their positions (one stream) is rebased, and its keys
    must end in ``rope``'s ``head_dim``.
    """
    if not isinstance(cache, KVCache) or cache.static:
        raise TypeError(f"cache must be a growing posenc.KVCache, got "
                        f"{'a static KVCache' if isinstance(cache, KVCache) else type(cache).__name__}")
    keep = check_int("keep", keep, minimum=0)
    rotary = None if rope is None else _rotary(rope)
    if cache.k is None or cache.positions is None or not len(cache):
        return 0
    if rotary is not None:
        _check_head_dim("the cached keys", cache.k, rotary, "rope")
    pos = cache.positions  # [B, T]
    if not bool((pos == pos[:1]).all()):
        raise ValueError("rebase_cache: the rows hold different positions; rebase one stream "
                         "(rows that agree) at a time")
    T = pos.shape[1]
    keep = min(keep, T)  # past the length: every key a sink
    nxt = int(pos[0, keep]) if keep < T else int(pos[0, -1]) + 1  # the window's (or query's) start
    d = nxt - keep  # the window's move
    shift = torch.cat([torch.arange(keep, device=pos.device) - pos[0, :keep],
                       torch.full((T - keep,), -d, device=pos.device)])  # [T]
    if bool(shift.any()):
        if rotary is not None:
            cache.k = shift_rotated_keys(cache.k, shift, rotary)
        cache.positions = pos + shift
        cache._recompute_next()
    return d


# ------------------------------------------------------------------ speculative trees


def tree_positions_and_mask(parents: Sequence[int], *, prefix: int = 0) -> tuple[Tensor, Tensor]:
    """A speculative-decoding draft tree (SpecInfer, Medusa, EAGLE): node ``i`` continues node
    ``parents[i]`` (``-1``: the last token of the prefix; parents come before children).

    Returns ``positions [N]`` int64, ``prefix + depth`` (siblings share a position: they are
    alternatives for the same place), and ``mask [N, prefix + N]`` bool, who sees whom: every
    node sees the whole prefix, its ancestors and itself, never a sibling's branch. Passed to
    :func:`~posenc.attention.attend` as ``attention_mask=mask[None]`` with
    ``positions=positions``, verifying the tree in one call equals decoding each root-to-leaf
    path alone after the prefix.
    """
    if isinstance(parents, Tensor):
        parents = parents.tolist()
    if isinstance(parents, (str, bytes)) or not isinstance(parents, Sequence):
        raise TypeError(f"parents must be a list of ints (one parent per node), got "
                        f"{type(parents).__name__}")
    prefix = check_int("prefix", prefix, minimum=0)
    N = len(parents)
    depth = torch.zeros(N, dtype=torch.long)
    mask = torch.zeros(N, prefix + N, dtype=torch.bool)
    mask[:, :prefix] = True
    for i, p in enumerate(parents):
        p = check_int(f"parents[{i}]", p, minimum=-1)
        if p >= i:
            raise ValueError(f"parents[{i}] must be -1 or an earlier node (< {i}), got {p}: a "
                             "parent comes before its children")
        mask[i, prefix + i] = True
        if p >= 0:
            depth[i] = depth[p] + 1
            mask[i, prefix:] |= mask[p, prefix:]
    return prefix + depth, mask
