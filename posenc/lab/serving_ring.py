"""Context parallelism as torch runs it (ring attention), on one device (chapter 11).

:func:`partial_attention` computes one block of queries over one block of keys with its
log-sum-exp, :func:`merge_partials` merges such blocks, and :func:`attend_sharded` runs a whole
sequence split over ranks, equal to :func:`~posenc.attention.attend` over the whole sequence.
:mod:`posenc.lab.serving` re-exports these names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

import posenc
from posenc._checks import check_bool, check_int, check_positions, check_tensor
from posenc.schemes import PositionScheme, _check_scheme

from .serving_checks import LAYOUT

__all__ = ["partial_attention", "merge_partials", "attend_sharded", "ShardedAttention"]


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
