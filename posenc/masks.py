"""Who may see whom: the visibility rule of attention, as named terms on positions.

One rule, built from positions (and slots, for the causal order of a cache), serves every
layout: query ``m`` may see key ``n`` when every term of the rule allows it:

- :class:`CausalBySlot` / :class:`CausalByPosition` (``causal``): ``n`` comes no later than
  ``m`` (by slot, or by position when the keys carry their own positions, e.g. gathered from
  other shards);
- :class:`Window` (``window=W``): ``m - W < n`` (W keys including itself, transformers'
  sliding-window rule; Beltagy et al., 2020; with ``ahead``, i.e. without ``causal``, also
  ``n < m + W``); or-ed with :class:`Sinks` (``sinks=S``): every ``n < S`` (StreamingLLM's
  attention sinks; Xiao et al., 2024);
- :class:`Pairs`: a who-sees-whom matrix ``[B, Lq, Lk]`` (a speculative tree, a prefix-LM): its
  True pairs;
- :class:`Documents` (``document_ids``): both are in the same document (packed rows);
- :class:`Padding` (``attention_mask``): the key is a real token (not padding) and, in a static
  cache, written.

Terms compose with :func:`all_of` (and) and :func:`any_of` (or), as attention-gym's and
transformers' mask functions do, but every term renders twice: ``allowed`` elementwise (the
dense mask, FlexAttention's ``mask_mod``) and ``tiles`` per ``128 x 128`` tile (a lower and an
upper bound: may some pair of the tile see, must every pair), so a ``BlockMask`` never needs an
``[Lq, Lk]`` grid. :func:`visibility` builds ``attend``'s rule from its options.

A query that may see no key at all (a fully padded row, a query before every gathered key)
gets zeros from attention on every backend, as FlexAttention gives.

``dense_visibility`` gives the boolean ``[B, 1, Lq, Lk]`` SDPA takes; ``block_visibility``
gives FlexAttention's ``BlockMask`` (Dong et al., 2024) from ``[Lq / 128, Lk / 128]`` tables of
per-tile bounds. ``causal_mask`` and ``causal_block_mask`` are the plain causal rule's two
renderings for queries at the end of the keys (the fast paths). :class:`Visibility`, the
rule's data as one record, stays as a constructor of the composed rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_device, check_int, is_compiling

FLEX_BLOCK = 128  # FlexAttention's tile size


@dataclass(frozen=True)
class Frame:
    """Where every query and key sits, each tensor already broadcast to the batch ``B``."""

    q_pos: Tensor  # [B, Lq] int64
    k_pos: Tensor  # [B, Lk] int64
    q_slot: Tensor  # [Lq] int64, the queries' slots among the keys (causal order)


def _tiles(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Per-tile min and max of ``x [B, L]`` over tiles of ``n``: each ``[B, ceil(L / n)]``.
    A ragged last tile is padded with its last value, so the padding never widens a bound."""
    B, L = x.shape
    pad = (-L) % n
    if pad:
        x = torch.cat([x, x[:, -1:].expand(B, pad)], dim=-1)
    xt = x.reshape(B, -1, n)  # [B, N, n]
    return xt.amin(-1), xt.amax(-1)


class Tiles:
    """A frame seen tile by tile (``n`` queries by ``n`` keys): the per-tile bounds of its
    positions and slots, each computed once, when a term first asks."""

    def __init__(self, frame: Frame, n: int = FLEX_BLOCK) -> None:
        self.frame, self.n = frame, n
        self.B, self.Lq = frame.q_pos.shape
        self.Lk = frame.k_pos.shape[-1]
        self.Nq, self.Nk = -(-self.Lq // n), -(-self.Lk // n)

    def of_queries(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Bounds of a per-query ``x [B, Lq]``: ``[B, Nq, 1]`` each."""
        lo, hi = _tiles(x, self.n)
        return lo[:, :, None], hi[:, :, None]

    def of_keys(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Bounds of a per-key ``x [B, Lk]``: ``[B, 1, Nk]`` each."""
        lo, hi = _tiles(x, self.n)
        return lo[:, None], hi[:, None]

    @cached_property
    def q_pos(self) -> tuple[Tensor, Tensor]:
        return self.of_queries(self.frame.q_pos)

    @cached_property
    def k_pos(self) -> tuple[Tensor, Tensor]:
        return self.of_keys(self.frame.k_pos)


class Rule(Protocol):
    """A visibility term: elementwise (dense mask, ``mask_mod``) and per tile (``BlockMask``)."""

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        """Bool on broadcastable batch / query / key indices: may query ``qi`` see key ``ki``."""
        ...

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:
        """``(some, every)``, bool broadcastable to ``[B, Nq, Nk]``: may some pair of the tile
        see (an upper bound), must every pair (a lower bound)."""
        ...


@dataclass(frozen=True)
class CausalBySlot:
    """Key ``n`` no later than query ``m`` in the keys' order (slots; a cache's order)."""

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        return ki <= f.q_slot[qi]

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:
        qs_lo, qs_hi = _tiles(t.frame.q_slot[None], t.n)  # [1, Nq]
        ks = torch.arange(t.Lk, device=t.frame.q_pos.device)[None]
        ks_lo, ks_hi = _tiles(ks, t.n)  # [1, Nk]
        return ks_lo[:, None] <= qs_hi[:, :, None], ks_hi[:, None] <= qs_lo[:, :, None]


@dataclass(frozen=True)
class CausalByPosition:
    """Key position ``n`` <= query position ``m`` (keys with positions of their own)."""

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        return f.k_pos[b, ki] <= f.q_pos[b, qi]

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:
        (qp_lo, qp_hi), (kp_lo, kp_hi) = t.q_pos, t.k_pos
        return kp_lo <= qp_hi, kp_hi <= qp_lo


@dataclass(frozen=True)
class Window:
    """``m - size < n`` (``size`` keys including the query's own); with ``ahead`` also
    ``n < m + size`` (a window without causality)."""

    size: int
    ahead: bool = False

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        m, n = f.q_pos[b, qi], f.k_pos[b, ki]
        near = n > m - self.size  # W <= 2**63 - 1 and m >= 0: no int64 overflow
        if self.ahead:
            near = near & (n - self.size < m)  # n < m + W, which could overflow int64
        return near

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:
        (qp_lo, qp_hi), (kp_lo, kp_hi), W = t.q_pos, t.k_pos, self.size
        some, every = qp_lo - kp_hi < W, qp_hi - kp_lo < W
        if self.ahead:
            some, every = some & (kp_lo - qp_hi < W), every & (kp_hi - qp_lo < W)
        return some, every


@dataclass(frozen=True)
class Sinks:
    """Key position ``n < count``: the attention sinks (or-ed with a window)."""

    count: int

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        return f.k_pos[b, ki] < self.count

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:
        kp_lo, kp_hi = t.k_pos
        return kp_lo < self.count, kp_hi < self.count


@dataclass(frozen=True)
class Documents:
    """Query and key in the same document: ``q_doc [B, Lq]`` and ``k_doc [B, Lk]`` ids."""

    q_doc: Tensor
    k_doc: Tensor

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        return self.q_doc[b, qi] == self.k_doc[b, ki]

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:  # ids overlap / one id on both sides
        qd_lo, qd_hi = t.of_queries(self.q_doc)  # [B, Nq, 1]
        kd_lo, kd_hi = t.of_keys(self.k_doc)  # [B, 1, Nk]
        some = (kd_lo <= qd_hi) & (qd_lo <= kd_hi)
        return some, (qd_lo == qd_hi) & (kd_lo == kd_hi) & (qd_lo == kd_lo)


@dataclass(frozen=True)
class Padding:
    """The key is real: ``key_valid [B, Lk]`` bool (padding and unwritten slots are False)."""

    key_valid: Tensor

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        return self.key_valid[b, ki]

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:  # any / every key of a tile real
        v_lo, v_hi = t.of_keys(self.key_valid.long())
        return v_hi == 1, v_lo == 1


@dataclass(frozen=True)
class Pairs:
    """A who-sees-whom matrix ``pair [B, Lq, Lk]`` bool (True = may see)."""

    pair: Tensor

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        return self.pair[b, qi, ki]

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:  # any / every pair of a tile may see
        n = t.n
        p = F.pad(self.pair, (0, (-t.Lk) % n, 0, (-t.Lq) % n), value=False)
        p = p.reshape(p.shape[0], p.shape[1] // n, n, p.shape[2] // n, n)  # [B, Nq, n, Nk, n]
        return p.any(4).any(2), p.all(4).all(2)


@dataclass(frozen=True)
class AllOf:
    """Every term allows (no term: every pair)."""

    terms: tuple[Rule, ...]

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        if not self.terms:
            return torch.ones_like(f.q_pos[b, qi], dtype=torch.bool)
        ok = self.terms[0].allowed(f, b, qi, ki)  # not True & ...: and-ing a [B, Lq, 1]
        for term in self.terms[1:]:  # into [., Lq, Lk] is 13x slower than two full masks
            ok = ok & term.allowed(f, b, qi, ki)
        shape = torch.broadcast_shapes(ok.shape, getattr(b, "shape", ()), getattr(qi, "shape", ()))
        return ok if ok.shape == shape else ok.expand(shape).contiguous()  # as f.q_pos[b, qi]

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:
        some = torch.ones(t.B, t.Nq, t.Nk, dtype=torch.bool, device=t.frame.q_pos.device)
        every = some.clone()
        for term in self.terms:
            s, e = term.tiles(t)
            some, every = some & s, every & e
        return some, every


@dataclass(frozen=True)
class AnyOf:
    """Some term allows (at least one term)."""

    terms: tuple[Rule, ...]

    def allowed(self, f: Frame, b: Any, qi: Any, ki: Any) -> Tensor:
        ok = self.terms[0].allowed(f, b, qi, ki)
        for term in self.terms[1:]:
            ok = ok | term.allowed(f, b, qi, ki)
        return ok

    def tiles(self, t: Tiles) -> tuple[Tensor, Tensor]:
        some, every = self.terms[0].tiles(t)
        for term in self.terms[1:]:
            s, e = term.tiles(t)
            some, every = some | s, every | e
        return some, every


def all_of(*rules: Rule) -> AllOf:
    """The rule that holds where every one of ``rules`` holds (and of the bounds too)."""
    return AllOf(tuple(rules))


def any_of(*rules: Rule) -> AnyOf:
    """The rule that holds where some one of ``rules`` holds (or of the bounds too)."""
    if not rules:
        raise ValueError("any_of needs at least one rule (no rule allows nothing)")
    return AnyOf(tuple(rules))


def visibility(
    *, causal: bool, by_position: bool = False, window: int | None = None, sinks: int | None = None,
    documents: tuple[Tensor, Tensor] | None = None, padding: Tensor | None = None,
    pairs: Tensor | None = None,
) -> AllOf:
    """``attend``'s rule from its options: causal (by slot, or ``by_position``), a ``window``
    (plus ``sinks``), ``documents`` ``(q_doc [B, Lq], k_doc [B, Lk])``, ``padding``
    (``key_valid [B, Lk]``) and ``pairs`` ``[B, Lq, Lk]``, all and-ed."""
    terms: list[Rule] = []
    if causal:
        terms.append(CausalByPosition() if by_position else CausalBySlot())
    if window is not None:
        near = Window(window, ahead=not causal)
        terms.append(any_of(near, Sinks(sinks)) if sinks else near)  # StreamingLLM
    if documents is not None:
        terms.append(Documents(*documents))
    if padding is not None:
        terms.append(Padding(padding))
    if pairs is not None:
        terms.append(Pairs(pairs))  # a tree, a prefix-LM
    return all_of(*terms)


@dataclass
class Visibility:
    """The rule's data as one record, every tensor already broadcast to the batch ``B``: a
    constructor of the composed rule (``.frame`` and ``.rule``), kept for compatibility."""

    q_pos: Tensor  # [B, Lq] int64
    k_pos: Tensor  # [B, Lk] int64
    q_slot: Tensor  # [Lq] int64, the queries' slots among the keys (causal order)
    causal: bool
    by_position: bool  # causal compares positions instead of slots
    window: int | None
    key_valid: Tensor | None  # [B, Lk] bool
    q_doc: Tensor | None  # [B, Lq]
    k_doc: Tensor | None  # [B, Lk]
    sinks: int | None = None  # with window: the first S positions stay visible
    pair: Tensor | None = None  # [B, Lq, Lk] bool, who may see whom (True = may see)

    @property
    def frame(self) -> Frame:
        return Frame(self.q_pos, self.k_pos, self.q_slot)

    @property
    def rule(self) -> AllOf:
        docs = None if self.q_doc is None or self.k_doc is None else (self.q_doc, self.k_doc)
        return visibility(
            causal=self.causal, by_position=self.by_position, window=self.window,
            sinks=self.sinks, documents=docs, padding=self.key_valid, pairs=self.pair,
        )

    def allowed(self, b: Any, qi: Any, ki: Any) -> Tensor:
        """Elementwise rule on broadcastable batch/query/key indices (dense or FlexAttention)."""
        return self.rule.allowed(self.frame, b, qi, ki)


def _rule_and_frame(rule: Rule | Visibility, frame: Frame | int | None) -> tuple[Rule, Frame]:
    if isinstance(rule, Visibility):  # an int second argument: the old num_heads, unused
        return rule.rule, rule.frame
    if not isinstance(frame, Frame):
        raise TypeError(f"frame must be a posenc.masks.Frame for a composed rule, got "
                        f"{type(frame).__name__}")
    return rule, frame


def dense_visibility(rule: Rule | Visibility, frame: Frame | None = None) -> Tensor:
    """Boolean ``[B, 1, Lq, Lk]``, True where query ``m`` may see key ``n``. A row may be all
    False (a padded query, a query before every key): attention returns zeros there.
    ``rule`` is a composed rule over ``frame``, or a :class:`Visibility` (its own frame)."""
    rule, frame = _rule_and_frame(rule, frame)
    B, Lq = frame.q_pos.shape
    Lk = frame.k_pos.shape[-1]
    dev = frame.q_pos.device
    b = torch.arange(B, device=dev)[:, None, None]  # [B, 1, 1]
    qi = torch.arange(Lq, device=dev)[None, :, None]  # [1, Lq, 1]
    ki = torch.arange(Lk, device=dev)[None, None, :]  # [1, 1, Lk]
    return rule.allowed(frame, b, qi, ki)[:, None]  # [B, 1, Lq, Lk]


def _table(sel: Tensor) -> tuple[Tensor, Tensor]:
    """A BlockMask's table of selected tiles ``sel [B | 1, Nq, Nk]``: the counts
    ``[B | 1, 1, Nq]`` and the tile indices, selected first, ``[B | 1, 1, Nq, Nk]``."""
    counts = sel.sum(-1, dtype=torch.int32)
    order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[:, None], order[:, None]


def _block_mask(
    some: Tensor, every: Tensor, mask_mod: Any, Lq: int, Lk: int, n: int = FLEX_BLOCK
) -> Any:
    """FlexAttention's ``BlockMask`` from the per-tile bounds ``[B | 1, Nq, Nk]``: *full* tiles
    (every pair sees: no ``mask_mod`` call) and *partial* ones (some pair may); the rest are
    skipped."""
    from torch.nn.attention.flex_attention import BlockMask

    kv_num, kv_idx = _table(some & ~every)
    full_num, full_idx = _table(every)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=n, mask_mod=mask_mod, seq_lengths=(Lq, Lk)
    )


def block_visibility(rule: Rule | Visibility, frame: Frame | int | None = None) -> Any:
    """A FlexAttention ``BlockMask`` for ``rule`` over ``frame``, folded from its terms'
    per-tile bounds (``[B, Lq / 128, Lk / 128]``; slots and positions by their tile min/max,
    documents by their range, validity by any/all), so no ``[Lq, Lk]`` tensor is built. A
    :class:`Visibility` brings its own frame (the second argument, once ``num_heads``, is then
    ignored)."""
    rule, frame = _rule_and_frame(rule, frame)
    t = Tiles(frame)
    some, every = rule.tiles(t)
    some, every = some.expand(t.B, t.Nq, t.Nk), every.expand(t.B, t.Nq, t.Nk).clone()
    if t.Lq % t.n:  # a ragged last tile is never full (flex would read past the end without
        every[:, -1] = False  # mask_mod)
    if t.Lk % t.n:
        every[:, :, -1] = False

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return rule.allowed(frame, b, q_idx, kv_idx)

    return _block_mask(some, every, mask_mod, t.Lq, t.Lk)


def _check_lengths(q_len: object, k_len: object) -> tuple[int, int]:
    q_len = check_int("q_len", q_len, minimum=0)
    k_len = check_int("k_len", k_len, minimum=0)
    if q_len > k_len:
        raise ValueError(
            f"q_len must be <= k_len={k_len} (queries are the last k_len keys), got {q_len}"
        )
    return q_len, k_len


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``[q_len, k_len]``, True where query ``i`` (at absolute ``k_len - q_len + i``)
    may see key ``j``. (SDPA's own ``is_causal`` aligns queries to the *first* keys, which is
    wrong for a KV cache, so it is used only when ``q_len == k_len``.)"""
    q_len, k_len = _check_lengths(q_len, k_len)
    device = check_device("device", device, available=True)
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # [Lq, 1]
    return torch.arange(k_len, device=device)[None, :] <= i  # [Lq, Lk]


def causal_block_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> Any:
    """A FlexAttention ``BlockMask`` for a causal mask with queries at the end of the keys.

    Built tile by tile from ``[Lq / 128, Lk / 128]`` block tables, so it never evaluates the
    mask on the full ``[Lq, Lk]`` grid (``create_block_mask`` in eager mode does, with int64
    index tensors of that size).
    """
    q_len, k_len = _check_lengths(q_len, k_len)
    if not is_compiling():
        device = check_device("device", device, available=True)
    off, n = k_len - q_len, FLEX_BLOCK
    q_lo = torch.arange(0, q_len, n, device=device) + off  # [Nq] first query position per tile
    q_hi = (q_lo - off + n).clamp(max=q_len) - 1 + off  # [Nq] last query position per tile
    k_lo = torch.arange(0, k_len, n, device=device)  # [Nk]
    k_hi = (k_lo + n).clamp(max=k_len) - 1  # [Nk]
    full = k_hi[None, :] <= q_lo[:, None]  # [Nq, Nk] every key visible to every query
    partial = (k_lo[None, :] <= q_hi[:, None]) & ~full  # [Nq, Nk] the diagonal tiles

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx + off >= kv_idx

    return _block_mask(partial[None], full[None], mask_mod, q_len, k_len)
