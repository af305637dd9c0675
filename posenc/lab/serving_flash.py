"""flash-attn's ``flash_attn_with_kvcache`` written out on the CPU (chapter 11).

:func:`kvcache_step_reference` rotates the new query and key at each row's offset, writes them
into a contiguous or paged cache there and attends over the row's filled prefix, from the
kernel's documented semantics. :mod:`posenc.lab.serving` re-exports it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_bool, check_int, check_tensor

__all__ = ["kvcache_step_reference"]


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
    as :class:`~posenc.lab.serving_paged.PagedKVCache` keeps it) the caches are
    ``[num_blocks, block_size, H_kv, D]`` and row ``b``'s slot ``t`` is block
    ``block_table[b, t // block_size]``, offset
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
