"""Who may see whom: the visibility rule of attention, as data.

One rule, built from positions (and slots, for the causal order of a cache), serves every
layout: query ``m`` may see key ``n`` when

- ``causal``: ``n`` comes no later than ``m`` (by slot, or by position when the keys carry
  their own positions, e.g. gathered from other shards);
- ``window=W``: ``m - W < n`` (W keys including itself, transformers' sliding-window rule;
  Beltagy et al., 2020; without ``causal`` also ``n < m + W``); with ``sinks=S`` also every
  ``n < S`` (StreamingLLM's attention sinks; Xiao et al., 2024);
- a who-sees-whom matrix ``[B, Lq, Lk]`` (a speculative tree, a prefix-LM): its True pairs;
- ``document_ids``: both are in the same document (packed rows);
- ``attention_mask``: the key is a real token (not padding) and, in a static cache, written.

A query that may see no key at all (a fully padded row, a query before every gathered key)
gets zeros from attention on every backend, as FlexAttention gives.

``dense_visibility`` gives the boolean ``[B, 1, Lq, Lk]`` SDPA takes; ``block_visibility``
gives FlexAttention's ``BlockMask`` (Dong et al., 2024) from ``[Lq / 128, Lk / 128]`` tables of
per-tile bounds, so no ``[Lq, Lk]`` tensor is ever built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

FLEX_BLOCK = 128  # FlexAttention's tile size


@dataclass
class Visibility:
    """The rule's data, every tensor already broadcast to the batch ``B``."""

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

    def allowed(self, b: Any, qi: Any, ki: Any) -> Tensor:
        """Elementwise rule on broadcastable batch/query/key indices (dense or FlexAttention)."""
        m, n = self.q_pos[b, qi], self.k_pos[b, ki]
        ok = torch.ones_like(m, dtype=torch.bool)
        if self.causal:
            ok = ok & ((n <= m) if self.by_position else (ki <= self.q_slot[qi]))
        if self.window is not None:  # n > m - W: the int sum is [B, Lq, 1], only the test is wide
            near = n > m - self.window  # W <= 2**63 - 1 and m >= 0: no int64 overflow
            if not self.causal:
                near = near & (n - self.window < m)  # n < m + W, which could overflow int64
            if self.sinks:
                near = near | (n < self.sinks)  # the attention sinks
            ok = ok & near
        if self.q_doc is not None and self.k_doc is not None:
            ok = ok & (self.q_doc[b, qi] == self.k_doc[b, ki])
        if self.key_valid is not None:
            ok = ok & self.key_valid[b, ki]
        if self.pair is not None:
            ok = ok & self.pair[b, qi, ki]
        return ok


def dense_visibility(rule: Visibility) -> Tensor:
    """Boolean ``[B, 1, Lq, Lk]``, True where query ``m`` may see key ``n``. A row may be all
    False (a padded query, a query before every key): attention returns zeros there."""
    B, Lq = rule.q_pos.shape
    Lk = rule.k_pos.shape[-1]
    dev = rule.q_pos.device
    b = torch.arange(B, device=dev)[:, None, None]  # [B, 1, 1]
    qi = torch.arange(Lq, device=dev)[None, :, None]  # [1, Lq, 1]
    ki = torch.arange(Lk, device=dev)[None, None, :]  # [1, 1, Lk]
    return rule.allowed(b, qi, ki)[:, None]  # [B, 1, Lq, Lk]


def _tiles(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Per-tile min and max of ``x [B, L]`` over tiles of ``n``: each ``[B, ceil(L / n)]``.
    A ragged last tile is padded with its last value, so the padding never widens a bound."""
    B, L = x.shape
    pad = (-L) % n
    if pad:
        x = torch.cat([x, x[:, -1:].expand(B, pad)], dim=-1)
    xt = x.reshape(B, -1, n)  # [B, N, n]
    return xt.amin(-1), xt.amax(-1)


def block_visibility(rule: Visibility, num_heads: int) -> Any:
    """A FlexAttention ``BlockMask`` for ``rule``, built from per-tile bounds.

    A tile of keys is *full* for a tile of queries when the rule certainly holds for every
    pair (no ``mask_mod`` call needed), *partial* when it may hold for some; the rest is
    skipped. Bounds: slots and positions by their tile min/max, documents by their range,
    validity by any/all. Everything is ``[B, Lq / 128, Lk / 128]``.
    """
    from torch.nn.attention.flex_attention import BlockMask

    n = FLEX_BLOCK
    B, Lq = rule.q_pos.shape
    Lk = rule.k_pos.shape[-1]
    qp_lo, qp_hi = _tiles(rule.q_pos, n)  # [B, Nq]
    kp_lo, kp_hi = _tiles(rule.k_pos, n)  # [B, Nk]
    qp_lo, qp_hi, kp_lo, kp_hi = qp_lo[:, :, None], qp_hi[:, :, None], kp_lo[:, None], kp_hi[:, None]
    some = torch.ones(B, qp_lo.shape[1], kp_lo.shape[2], dtype=torch.bool, device=rule.q_pos.device)
    every = some.clone()
    if rule.causal:
        if rule.by_position:
            some &= kp_lo <= qp_hi
            every &= kp_hi <= qp_lo
        else:
            qs_lo, qs_hi = _tiles(rule.q_slot[None], n)  # [1, Nq]
            ks = torch.arange(Lk, device=rule.q_pos.device)[None]
            ks_lo, ks_hi = _tiles(ks, n)  # [1, Nk]
            some &= ks_lo[:, None] <= qs_hi[:, :, None]
            every &= ks_hi[:, None] <= qs_lo[:, :, None]
    if rule.window is not None:
        W = rule.window
        some_w, every_w = qp_lo - kp_hi < W, qp_hi - kp_lo < W
        if not rule.causal:
            some_w, every_w = some_w & (kp_lo - qp_hi < W), every_w & (kp_hi - qp_lo < W)
        if rule.sinks:
            some_w, every_w = some_w | (kp_lo < rule.sinks), every_w | (kp_hi < rule.sinks)
        some &= some_w
        every &= every_w
    if rule.q_doc is not None and rule.k_doc is not None:
        qd_lo, qd_hi = _tiles(rule.q_doc, n)
        kd_lo, kd_hi = _tiles(rule.k_doc, n)
        some &= (kd_lo[:, None] <= qd_hi[:, :, None]) & (qd_lo[:, :, None] <= kd_hi[:, None])
        one_q, one_k = (qd_lo == qd_hi)[:, :, None], (kd_lo == kd_hi)[:, None]
        every &= one_q & one_k & (qd_lo[:, :, None] == kd_lo[:, None])
    if rule.key_valid is not None:
        v = rule.key_valid.long()
        v_lo, v_hi = _tiles(v, n)
        some &= (v_hi == 1)[:, None]
        every &= (v_lo == 1)[:, None]
    if rule.pair is not None:  # any / every pair of a tile may see
        p = F.pad(rule.pair, (0, (-Lk) % n, 0, (-Lq) % n), value=False)
        p = p.reshape(B, p.shape[1] // n, n, p.shape[2] // n, n)  # [B, Nq, n, Nk, n]
        some &= p.any(4).any(2)
        every &= p.all(4).all(2)
    # a ragged last tile is never 'full' (flex would read past the end without mask_mod)
    if Lq % n:
        every[:, -1] = False
    if Lk % n:
        every[:, :, -1] = False
    partial = some & ~every

    def table(sel: Tensor) -> tuple[Tensor, Tensor]:
        counts = sel.sum(-1, dtype=torch.int32)  # [B, Nq]
        order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[:, None], order[:, None]  # [B, 1, Nq], [B, 1, Nq, Nk]

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return rule.allowed(b, q_idx, kv_idx)

    kv_num, kv_idx = table(partial)
    full_num, full_idx = table(every)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=n, mask_mod=mask_mod, seq_lengths=(Lq, Lk)
    )
