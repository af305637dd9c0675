"""The integrations layer: what transformers calls at every step of a model that
:func:`~posenc.hf.use` switched to posenc (its ``AttentionMaskInterface`` and
``AttentionInterface`` entries), and the rows they describe.

:func:`positions_mask` gives the positions of a step's queries and keys;
:func:`attention_forward` runs :func:`~posenc.attention.attend` (or
:func:`~posenc.varlen.attend_varlen` for packed documents, split by FlashAttention's rule) with
the layer's scheme. The rules (positions from the 2-D mask, documents from restarting
``position_ids``, visibility, the model's own settings) are written out in
:mod:`posenc.hf.adapter`'s docstring. transformers is never imported here.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import posenc.varlen as varlen  # the module: a patched attend_varlen is the one called

from .._checks import is_compiling, warn_caller
from ..attention import attend
from ..positions import cu_seqlens, packed_positions
from ..schemes import PositionScheme
from .mask_checks import (
    check_4d_dtype,
    check_mask_dims,
    check_tree_convention,
    check_tree_positions,
)
from .saved import unswapped_error
from .sink_cache import LAYOUT_KWARG, ROLLING_KWARG, UNREAD, attend_in_cache


@dataclass(frozen=True)
class _Options:
    """What one attention layer runs: its scheme (None: the model's own RoPE) and backend."""

    scheme: PositionScheme | None = None
    backend: str = "sdpa"


_DEFAULT = _Options()
_OPTIONS = "_posenc_options"  # the attribute of an attention module that holds its _Options


# --------------------------------------------------------------------------- the mask function


def positions_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Tensor | None = None,
    device: torch.device | str = "cpu",
    use_vmap: bool = False,
    **kwargs: Any,
) -> Tensor:
    """posenc's entry in transformers' ``AttentionMaskInterface``: the positions of this
    step's queries and of every key the cache will hand the attention.

    Returns an int64 ``[B | 1, 1, 1, q_length + kv_length]`` tensor (4-D, so that transformers
    passes it through untouched, even when ``generate`` prepares it ahead for a static cache):
    the queries' positions, then the keys', ``-1`` on a key that is padding or a static cache's
    unwritten slot. Query ``i`` is token ``q_offset + i`` of the sequence and key slot ``j``
    token ``kv_offset + j`` (transformers' own mask functions index them so). Positions count
    the real tokens of the 2-D ``attention_mask`` before each one; without a mask, the token's
    index. An empty ``[1, 1, 1, 0]`` tensor means: no padding (no mask, or an all-ones one, the
    case transformers' FlashAttention path drops the mask in), nothing cached, so the new tokens
    are all the keys and their positions are the forward's ``position_ids`` (restarting ones
    mark packed documents). transformers' ``mask_function`` (causal, sliding) is not
    evaluated: the attention applies the same rule from the layer's own settings.
    """
    check_mask_dims(attention_mask)  # a 3-D [B, Lq, Lk] mask: name the unsqueeze
    if use_vmap:  # transformers sets it exactly when a model overlays or_/and_mask_function
        raise ValueError(
            "this model overlays a mask pattern of its own on the causal mask (an "
            "or_mask_function / and_mask_function, e.g. image tokens that see each other); "
            "posenc's attention does not apply it: use transformers' own attention for it"
        )
    fresh = isinstance(q_offset, int) and q_offset == 0 and kv_offset == 0 and kv_length == q_length
    if fresh and attention_mask is not None:  # an all-ones mask: FlashAttention drops it too
        fresh = (not is_compiling() and attention_mask.shape[-1] == kv_length
                 and bool(attention_mask.all()))
    if fresh:
        return torch.zeros(1, 1, 1, 0, dtype=torch.long, device=device)
    end = q_offset + q_length  # the tokens seen so far, this step's included (int or 0-d tensor)
    if attention_mask is None:  # positions are indices (offsets may be 0-d tensors: compiled)
        q_pos = (torch.arange(q_length, device=device) + q_offset)[None]  # [1, Lq]
        k_pos = torch.arange(kv_length, device=device) + kv_offset  # [Lk]
        k_pos = k_pos.masked_fill(k_pos >= end, -1)[None]  # a static cache's later slots: unwritten
        return torch.cat([q_pos, k_pos], dim=-1)[:, None, None]  # [1, 1, 1, Lq + Lk]
    _check_mask_covers(attention_mask, q_offset, q_length)
    span = kv_offset + kv_length  # the tokens up to the last key slot (a static cache: all)
    index = torch.arange(span, device=device)  # [span]
    mask = attention_mask.to(device=device, dtype=torch.bool)  # [B, T]
    T = mask.shape[-1]
    mask = F.pad(mask, (0, span - T), value=False) if T < span else mask[:, :span]  # [B, span]
    pos = (mask.long().cumsum(-1) - 1).masked_fill(~mask, 0)  # [B, span]
    real = mask & (index < end)[None]
    q_index = torch.arange(q_length, device=device) + q_offset  # [Lq]
    k_index = torch.arange(kv_length, device=device) + kv_offset  # [Lk]
    q_pos = pos[:, q_index]  # [B | 1, Lq]
    k_pos = pos[:, k_index].masked_fill(~real[:, k_index], -1)  # [B | 1, Lk]
    return torch.cat([q_pos, k_pos], dim=-1)[:, None, None]  # [B | 1, 1, 1, Lq + Lk]


def _check_mask_covers(attention_mask: Tensor, q_offset: int | Tensor, q_length: int) -> None:
    """A 2-D ``attention_mask`` covers every token so far, this step's included (``generate``
    grows it by a column a step); past them it is padded with False (a static cache's
    unwritten slots). A shorter one (a hand loop passing the prompt's mask each step) would
    make this step's own tokens padding: refused (eager; a device offset is not read back)."""
    T = attention_mask.shape[-1]
    if is_compiling() or (isinstance(q_offset, Tensor) and q_offset.device.type != "cpu"):
        return
    end = int(q_offset) + q_length
    if T >= end:
        return
    which = f"token {end - 1}" if q_length == 1 else f"tokens {end - q_length} .. {end - 1}"
    raise ValueError(
        f"attention_mask has {T} columns, but this step's queries are {which} of the sequence "
        f"(the cache holds {end - q_length} earlier ones): a 2-D attention_mask covers every "
        f"token so far, cached and new, [B, {end}] here; grow it "
        "by one column per step as generate does, e.g. attention_mask = torch.cat("
        "[attention_mask, attention_mask.new_ones(B, 1)], dim=-1) (without it, this step's "
        "own tokens would count as padding)"
    )


# --------------------------------------------------------------------------- the attention


def attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """posenc's entry in transformers' ``AttentionInterface``: ``query [B, H, Lq, D]``,
    ``key / value [B, H_kv, Lk, D]`` (every key of the cache) -> ``([B, Lq, H, D], None)``.

    Runs :func:`~posenc.attention.attend` with the layer's scheme (:func:`~posenc.hf.use`;
    none: the model's RoPE already rotated q and k), the positions :func:`positions_mask` gave,
    the layer's ``sliding_window``, ``scaling``, ``softcap`` and sinks (``s_aux``, else
    ``module.sinks``). Packed documents (restarting ``position_ids``, no mask, nothing cached)
    run through :func:`~posenc.varlen.attend_varlen` in eager mode, at a cost of ``sum n_i**2``
    rather than one ``[L, L]`` mask (flash-attn's varlen kernel where it runs), when it computes
    the same thing: no softcap or sinks, and positions that count from each document's start
    (or the model's own RoPE, which has rotated q and k already).
    """
    opts: _Options | None = getattr(module, _OPTIONS, None)
    if opts is None:
        opts = _unswapped(module)
    B, Lq, Lk = query.shape[0], query.shape[-2], key.shape[-2]
    rows = _layout(attention_mask, kwargs.get("position_ids"), B, Lq, Lk, query.device)
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None or cu_k is not None:  # a packing collator's FlashAttention kwargs
        rows = _rows_from_cu(cu_q, cu_k, attention_mask, rows, B, Lq, Lk, query.device)
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", True)))
    extra: dict[str, Any] = {"causal": causal, "backend": opts.backend, "dropout_p": float(dropout)}
    if scaling is not None:
        extra["scale"] = float(scaling)
    if softcap is not None:
        extra["softcap"] = float(softcap)
    if sinks is not None:
        extra["sink_logits"] = sinks
    rolling = kwargs.get(ROLLING_KWARG)
    if rolling is not None:  # a posenc.hf.SinkCache layer: its rolling KVCache and rule
        if not is_compiling():
            rolling.__dict__.pop(UNREAD, None)  # read by posenc (SinkCache checks it)
        return _attend_rolling(query, key, value, opts.scheme, rows, rolling, sliding_window,
                               extra | {"layout": kwargs.get(LAYOUT_KWARG, "true")}), None
    if rows.cu_seqlens is not None and softcap is None and sinks is None and opts.backend != "flex" and (
            rows.restart or (opts.scheme is None and (rows.contiguous or sliding_window is None))):
        return _attend_packed(query, key, value, opts, rows, causal=causal, window=sliding_window,
                              scale=scaling, dropout_p=float(dropout)), None
    if (sliding_window is not None and rows.key_valid is not None and rows.key_valid.dim() == 2
            and not is_compiling()):
        _warn_on_holes(rows.key_valid, sliding_window)
    out = attend(
        query, key, value, opts.scheme, positions=rows.positions, key_positions=rows.key_positions,
        attention_mask=rows.key_valid, document_ids=rows.documents, window=sliding_window,
        **extra,
    )  # [B, H, Lq, Dv]
    return out.transpose(1, 2).contiguous(), None


def _attend_rolling(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme | None, rows: _Rows, cache: Any,
    window: int | None, settings: dict[str, Any],
) -> Tensor:
    """A :class:`~posenc.hf.sink_cache.SinkCache` step: ``attend`` writes the new keys into the
    layer's rolling cache and applies its sinks-and-window rule; the mask function described
    the new tokens only (their positions, and which are padding). ``settings``: attend's
    ``causal``, ``backend``, ``dropout_p``, ``scale``, ``softcap``, ``sink_logits``, and
    ``layout`` (the SinkCache's; ``"in_cache"``: :func:`~posenc.hf.sink_cache.attend_in_cache`)."""
    layout = settings.pop("layout", "true")
    if window is not None and window != cache.window:
        raise ValueError(
            f"this layer has sliding_window={window}, but posenc.hf.SinkCache(window="
            f"{cache.window}) imposes its own window: build the SinkCache with window={window}"
        )
    packed = rows.documents is not None and not is_compiling()  # compiled: always a tensor
    if packed or (rows.key_valid is not None and rows.key_valid.dim() != 2):
        raise ValueError(
            "posenc.hf.SinkCache keeps each row's first keys, not each document's or branch's: "
            "pass unpacked rows (no restarting position_ids, no 4-D mask) with it"
        )
    if layout == "in_cache":
        return attend_in_cache(q, k, v, scheme, rows.positions, rows.key_valid, cache, settings)
    out = attend(q, k, v, scheme, positions=rows.positions, attention_mask=rows.key_valid,
                 cache=cache, **settings)  # [B, H, Lq, Dv]
    return out.transpose(1, 2).contiguous()


def _unswapped(module: nn.Module) -> _Options:
    """A layer :func:`~posenc.hf.use` did not set up: the model's own RoPE, unless its config
    records a swapped scheme (``config.posenc``, written by ``use`` and kept by
    ``save_pretrained``), which a reloaded model's rotary embedding no longer applies (or
    which ``use`` wrote through a config this model shares with another)."""
    saved = getattr(getattr(module, "config", None), "posenc", None)
    if isinstance(saved, dict) and saved.get("scheme") is not None:
        raise unswapped_error(saved)
    return _DEFAULT


def _rows_from_cu(
    cu_q: Any, cu_k: Any, mask: Any, rows: _Rows, B: int, Lq: int, Lk: int,
    device: torch.device,
) -> _Rows:
    """Documents from a packing collator's ``cu_seq_lens_q/k`` (FlashAttention's varlen
    offsets over the flattened batch), as transformers' FlashAttention path reads them when no
    padding mask is given. Refused where they cannot describe this call (a padding mask or a
    cache, q and k offsets that differ) or where ``position_ids`` restart inside one of their
    documents; positions stay the forward's ``position_ids``."""
    for name, cu in (("cu_seq_lens_q", cu_q), ("cu_seq_lens_k", cu_k)):
        if not isinstance(cu, Tensor) or cu.dim() != 1 or cu.is_floating_point() or cu.numel() < 2:
            got = f"{type(cu).__name__}" + (f" {cu.dtype} {tuple(cu.shape)}"
                                            if isinstance(cu, Tensor) else "")
            raise ValueError(
                f"{name} must be a 1-D integer tensor of document offsets [0, n_0, n_0 + n_1, "
                f"..., {B * Lq}] (both cu_seq_lens_q and cu_seq_lens_k, as "
                f"DataCollatorWithFlattening(return_flash_attn_kwargs=True) gives), got {got}"
            )
    assert isinstance(cu_q, Tensor) and isinstance(cu_k, Tensor)
    if mask.shape[-1] != 0 or Lk != Lq:
        raise ValueError(
            "cu_seq_lens_q/k mark packed documents of new tokens, but this call has "
            + ("a padding attention_mask" if Lk == Lq else f"{Lk - Lq} cached keys")
            + ": posenc cannot tell which offsets the padding or the cache shift; pass "
            "cu_seq_lens_q/k only with unpadded packed rows and no cache (use_cache=False), or "
            "drop them (restarting position_ids mark the documents)"
        )
    cu = cu_q.to(device=device, dtype=torch.long)
    compiling = is_compiling()
    if not compiling:
        ok = (cu_k.shape == cu_q.shape and bool((cu_k.to(device) == cu).all())
              and int(cu[0]) == 0 and int(cu[-1]) == B * Lq and bool((cu.diff() > 0).all()))
        if not ok:
            raise ValueError(
                f"cu_seq_lens_q and cu_seq_lens_k must be the same increasing offsets from 0 to "
                f"{B * Lq} (the batch's {B} x {Lq} tokens), got {cu_q.tolist()} and "
                f"{cu_k.tolist()}"
            )
    index = torch.arange(B * Lq, device=device)
    documents = (torch.searchsorted(cu, index, right=True) - 1).reshape(B, Lq)
    documents = documents - documents[:, :1]  # [B, L]: 0, 1, ... in each row
    pos = rows.positions if rows.positions is not None else index[:Lq].expand(B, Lq)
    if compiling:
        return _Rows(positions=pos, documents=documents)
    if rows.documents is not None:  # position_ids restart: each restart must start a document
        starts_pos = rows.documents.diff(dim=-1) != 0
        starts_cu = documents.diff(dim=-1) != 0
        bad = (starts_pos & ~starts_cu).nonzero()
        if bad.numel():
            row, col = (int(v) for v in bad[0])
            raise ValueError(
                f"position_ids restart at token {col + 1} of row {row} (position "
                f"{int(pos[row, col + 1])}), inside one of the documents cu_seq_lens_q/k mark "
                f"({cu_q.tolist()}): the two disagree; pass the collator's position_ids and "
                "offsets together, or only one of them"
            )
    if B * Lq and int(cu.diff().max()) == Lq and B == cu.numel() - 1:  # one document a row
        return rows
    return _packed_rows(pos, documents)


def _warn_on_holes(key_valid: Tensor, window: int) -> None:
    """A 2-D mask with zeros between real tokens: the window counts positions (the real tokens
    before each one), transformers' own attention counts indices; say so rather than differ."""
    left = key_valid.long().cummax(-1).values.bool()  # [B, Lk]: a real key at or before
    right = key_valid.flip(-1).long().cummax(-1).values.flip(-1).bool()  # ... at or after
    if bool((left & right & ~key_valid).any()):
        warn_caller(
            f"attention_mask has zeros between real tokens and the layer has sliding_window="
            f"{window}: posenc's window counts positions (the real tokens before each one), "
            "transformers' own attention counts indices, so the two differ on such rows; "
            "remove the holes (pack the row) to get transformers' answer"
        )


def _attend_packed(
    q: Tensor, k: Tensor, v: Tensor, opts: _Options, rows: _Rows, **settings: Any
) -> Tensor:
    """Packed documents in flash-attn's ``[total, H, D]`` layout (every row's documents one
    after another): ``q [B, H, L, D]`` -> ``[B, L, H, Dv]``, transformers' output layout.
    ``settings``: ``attend_varlen``'s ``causal``, ``window``, ``scale`` and ``dropout_p``."""
    B, H, L, _ = q.shape
    qf, kf, vf = (t.transpose(1, 2).reshape(B * L, t.shape[1], t.shape[-1]) for t in (q, k, v))
    assert rows.cu_seqlens is not None
    out = varlen.attend_varlen(  # through the module: a patched attend_varlen runs
        qf, kf, vf, opts.scheme, cu_seqlens=rows.cu_seqlens, max_seqlen=rows.max_seqlen,
        backend=opts.backend, **settings,
    )  # [B * L, H, Dv]
    return out.reshape(B, L, H, out.shape[-1])


@dataclass(frozen=True)
class _Rows:
    """What :func:`~posenc.attention.attend` is told about one call's rows; None where its
    default is the same. ``cu_seqlens`` / ``max_seqlen``: packed documents' varlen offsets over
    the flattened batch (eager mode only); ``restart``: the positions count 0, 1, ... from each
    document's start; ``contiguous``: they go on by 1 inside each document."""

    positions: Tensor | None = None  # [B, Lq]
    key_positions: Tensor | None = None  # [B, Lk]
    key_valid: Tensor | None = None  # [B, Lk]
    documents: Tensor | None = None  # [B, Lq]
    cu_seqlens: Tensor | None = None  # [N + 1]
    max_seqlen: int = 0
    restart: bool = False
    contiguous: bool = False


def _layout(
    mask: Tensor | None, position_ids: Tensor | None, B: int, Lq: int, Lk: int, device: torch.device
) -> _Rows:
    """The rows' positions, key positions, valid keys and documents from the mask function's
    tensor (or, with no padding mask and nothing cached, from the forward's ``position_ids``)."""
    if mask is None:
        raise ValueError(
            "posenc's attention got attention_mask=None: transformers did not run posenc's mask "
            "function, so padding would be ignored. Switch the model with posenc.hf.use(model) "
            "or set attn_implementation to a name registered by posenc.hf.register() (it "
            "registers the attention and its mask together); a PagedAttentionCache (continuous "
            "batching) is not supported"
        )
    if isinstance(mask, Tensor):
        check_4d_dtype(mask, Lq, Lk)  # a caller's 4-D int mask, not the mask function's
    if isinstance(mask, Tensor) and mask.dim() == 4 and mask.dtype == torch.bool:
        return _tree_rows(mask, position_ids, B, Lq, Lk, device)
    if not isinstance(mask, Tensor) or mask.dim() != 4 or mask.dtype != torch.long:
        raise ValueError(
            "posenc's attention got an attention_mask its mask function did not make "
            f"({type(mask).__name__}"
            f"{'' if not isinstance(mask, Tensor) else f' {mask.dtype} {tuple(mask.shape)}'}): "
            "a 4-D mask passed to the model replaces transformers' mask creation; posenc takes "
            "a bool [batch, 1, queries, keys] who-sees-whom mask (True = sees; a speculative "
            "tree) with position_ids, or the 2-D [batch, length] padding mask"
        )
    if mask.shape[-1] == 0:  # no padding mask and nothing cached: the forward's position_ids
        if Lk != Lq:
            raise ValueError(_keys_unknown(Lq, Lk, Lq))
        return _fresh_rows(position_ids, B, Lq, device)
    if mask.shape[-1] != Lq + Lk:
        raise ValueError(_keys_unknown(Lq, Lk, mask.shape[-1] - Lq))
    flat = mask[:, 0, 0].expand(B, Lq + Lk)
    q_pos, k_pos = flat[:, :Lq], flat[:, Lq:]
    valid = k_pos >= 0  # [B, Lk]
    if Lk == Lq:  # the keys are this step's tokens: causal by slot
        if position_ids is not None and is_compiling():  # eager: positions_mask drops all-ones
            fresh = _fresh_rows(position_ids, B, Lq, device)
            assert fresh.positions is not None and fresh.documents is not None
            whole = valid.all()  # no padding: the forward's position_ids, as FlashAttention
            return _Rows(positions=torch.where(whole, fresh.positions, q_pos), key_valid=valid,
                         documents=torch.where(whole, fresh.documents, 0))
        return _Rows(positions=q_pos, key_valid=valid)
    return _Rows(positions=q_pos, key_positions=k_pos.clamp(min=0), key_valid=valid)


def _tree_rows(
    mask: Tensor, position_ids: Tensor | None, B: int, Lq: int, Lk: int, device: torch.device
) -> _Rows:
    """A bool 4-D who-sees-whom mask passed to the model (transformers hands it over as is):
    ``mask [B | 1, 1, Lq, Lk]`` (True = the query sees the key), and-ed with causality. The new
    tokens sit at the forward's ``position_ids`` (a tree's depths: pass them, siblings share
    one); the cached keys before them, an unpadded prefix, at ``0 .. Lk - Lq - 1``."""
    if mask.shape[0] not in (1, B) or mask.shape[1] != 1 or mask.shape[-2:] != (Lq, Lk):
        raise ValueError(
            f"a 4-D bool attention_mask must have shape [{B} or 1, 1, {Lq}, {Lk}] (queries x "
            f"the cached plus new keys), got {tuple(mask.shape)}"
        )
    check_tree_convention(mask, Lq, Lk)  # True = masked: no query sees its own key
    if position_ids is None:
        pos = torch.arange(Lk - Lq, Lk, device=device).expand(B, Lq)
    else:
        pos = position_ids.to(device=device, dtype=torch.long)
        pos = (pos[None] if pos.dim() == 1 else pos).expand(B, Lq)  # [B, Lq]
    key_pos = None
    if Lk != Lq:
        key_pos = torch.cat([torch.arange(Lk - Lq, device=device).expand(B, Lk - Lq), pos], -1)
        check_tree_positions(mask, pos, key_pos)  # [B, Lk]: the cached keys at their indices
    return _Rows(positions=pos, key_positions=key_pos, key_valid=mask.expand(B, 1, Lq, Lk))


def _keys_unknown(Lq: int, Lk: int, slots: int) -> str:
    return (
        f"the cache handed posenc's attention {Lk} keys for {Lq} queries, but its mask sizes "
        f"describe {slots} key slots: posenc cannot tell the keys' positions (a cache that "
        "drops or reorders keys its get_mask_sizes does not report), so it refuses rather than "
        "guess; use DynamicCache, StaticCache or their sliding-window layers"
    )


_fresh_memo: tuple[Any, int, int, _Rows] | None = None


def _fresh_rows(position_ids: Tensor | None, B: int, L: int, device: torch.device) -> _Rows:
    """New tokens with no padding mask and nothing cached: positions from the forward's
    ``position_ids`` (None: the default ``arange``, one document per row).

    Documents by FlashAttention's rule: each row starts one, and so does every position equal
    to the row's smallest. In eager mode, plain ``arange`` rows give no positions and no
    documents, rows of one document no documents, so attend keeps its fast path, and packed rows
    get their varlen offsets; the answer is kept for the same ``position_ids`` tensor, which
    every layer of one forward shares.
    """
    global _fresh_memo
    if position_ids is None:
        return _Rows()
    if not isinstance(position_ids, Tensor) or position_ids.is_floating_point():
        got = type(position_ids).__name__
        if isinstance(position_ids, Tensor):
            got += f" {position_ids.dtype}"
        raise TypeError(f"position_ids must be an integer tensor, got {got}")
    if position_ids.dim() == 1:
        position_ids = position_ids[None]
    if position_ids.dim() != 2 or position_ids.shape[-1] != L or position_ids.shape[0] not in (1, B):
        want = f"[{L}] or [1, {L}]" + ("" if B == 1 else f" or [{B}, {L}]")
        raise ValueError(
            f"position_ids must have shape {want} (one position per token; multimodal 3-D "
            f"positions are not supported), got {tuple(position_ids.shape)}"
        )
    compiling = is_compiling()
    if not compiling and _fresh_memo is not None:
        ref, version, batch, kept = _fresh_memo
        if ref() is position_ids and version == position_ids._version and batch == B:
            return kept
    pos = position_ids.to(device=device, dtype=torch.long)  # [1 | B, L]
    if not compiling and bool((pos == torch.arange(L, device=device)).all()):
        rows = _Rows()  # plain rows (a model's own position_ids): attend's defaults
    else:
        pos = pos.expand(B, L)  # [B, L]
        starts = pos == pos.amin(-1, keepdim=True)  # [B, L]
        starts = torch.cat([torch.ones_like(starts[:, :1]), starts[:, 1:]], dim=-1)
        documents = starts.long().cumsum(-1) - 1  # [B, L]
        if compiling:
            return _Rows(positions=pos, documents=documents)
        rows = _packed_rows(pos, documents)
    _fresh_memo = (weakref.ref(position_ids), position_ids._version, B, rows)
    return rows


def _packed_rows(pos: Tensor, documents: Tensor) -> _Rows:
    """Eager mode: drop what attend's defaults already say, and find the varlen offsets."""
    L = pos.shape[-1]
    if L == 0 or bool((documents[:, -1] == 0).all()):  # one document in every row
        plain = bool((pos == torch.arange(L, device=pos.device)).all())
        return _Rows() if plain else _Rows(positions=pos)
    counted = packed_positions(documents)  # [B, L]: 0, 1, ... from each document's start
    first = pos.gather(-1, (torch.arange(L, device=pos.device) - counted))  # each start's position
    contiguous = bool((pos - first == counted).all())
    cu, longest = cu_seqlens(documents)
    return _Rows(positions=pos, documents=documents, cu_seqlens=cu, max_seqlen=longest,
                 restart=contiguous and bool((first == 0).all()), contiguous=contiguous)
