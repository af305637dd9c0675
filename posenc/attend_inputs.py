"""``attend``'s arguments, checked and put in normal form before anything is written.

:func:`check_call` gives the :class:`Call` (the scheme, the visibility options, the backend,
a rolling cache's rule imposed); :func:`check_seen` the :class:`Seen` (a ``[B, T]`` padding mask
over the cached plus new keys, a ``[B, Lq, Lk]`` who-sees-whom matrix); :func:`check_runs` that
each document is one contiguous run. Every check runs before the cache is written: a refused
call leaves the cache as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import (
    check_bool,
    check_dropout,
    check_sinks,
    check_tensor,
    check_window,
    is_compiling,
    layout_hint,
    warn_caller,
)
from .backends import BACKENDS
from .cache import KVCache
from .positions import _check_mask
from .rolling_cache import check_rule
from .schemes import NoPE, PositionScheme, _a_class
from .varlen import VarlenOptions, attend_varlen

_NOPE = NoPE()


@dataclass(frozen=True)
class Call:
    """What a call asks, checked: the scheme (NoPE for None), the visibility options (a
    rolling cache's ``window`` and ``sinks`` imposed), the backend and the dropout."""

    scheme: PositionScheme
    causal: bool
    window: int | None
    sinks: int | None
    backend: str
    dropout_p: float
    rolling: bool  # a rolling cache: its slots wrap around, its rule is its own


def check_call(
    q: Tensor, scheme: object, cache: object, backend: object, causal: object, window: object,
    sinks: object, dropout_p: object,
) -> Call:
    """The plain arguments as a :class:`Call`, checked in the order ``attend`` always has."""
    scheme, causal, window, dropout_p = _check_options(scheme, cache, backend, causal, window,
                                                       dropout_p)
    imposed = cache.imposed_rule() if isinstance(cache, KVCache) else None
    rolling = imposed is not None
    if imposed is not None:  # the cache holds the sinks and the last W keys: the rule is its own
        check_rule(window, sinks, *imposed)
        window, sinks = imposed
    check_sinks(window, sinks)
    heads = scheme.num_heads
    if heads is not None and heads != q.shape[1]:
        hint = layout_hint(q, 2, heads, f"the scheme's {heads} heads", q.shape[1])
        raise ValueError(
            f"scheme {scheme.name!r} has a bias for {heads} heads but q has {q.shape[1]} "
            "heads; they must be equal" + (f". {hint}" if hint else "")
        )
    return Call(scheme, causal, window, sinks, backend, dropout_p, rolling)  # type: ignore[arg-type]


def refuse_with_rolling(document_ids: object, attention_mask: object) -> None:
    """What a rolling cache cannot serve: documents, a who-sees-whom matrix."""
    if document_ids is not None:
        raise ValueError(
            "document_ids with a rolling KVCache(sinks=..., window=...) is not supported: the "
            "cache keeps the first keys of each row, not of each document (pack documents "
            "without a cache, or give each its own row)"
        )
    if isinstance(attention_mask, Tensor) and attention_mask.dim() in (3, 4):
        raise ValueError(
            f"attention_mask: a {attention_mask.dim()}-D who-sees-whom mask cannot be given with "
            "a rolling KVCache, whose slots wrap around; give a [B, T] padding mask (its last "
            "Lq columns describe the new keys)"
        )


@dataclass(frozen=True)
class Seen:
    """Who may be seen, as given: ``padding`` ``[1 | B, Lk]`` bool (real keys over the cached
    plus new keys; a static cache: every slot), ``pairs`` ``[1 | B, Lq, Lk]`` bool."""

    padding: Tensor | None = None
    pairs: Tensor | None = None

    @property
    def masked(self) -> bool:
        """A ``[B, T]`` padding mask was given (some row may then see no key)."""
        return self.padding is not None


def check_seen(
    attention_mask: object, cache: KVCache | None, B: int, Lq: int, Lk_new: int, q: Tensor,
) -> Seen:
    """``attention_mask`` as a :class:`Seen`: a ``[B, T]`` padding mask or a bool
    ``[B, Lq, Lk]`` / ``[B, 1, Lq, Lk]`` who-sees-whom matrix, checked against the cache
    (a mask that fits ``q`` read as ``[B, L, H, D]`` says so: the transpose)."""
    if attention_mask is None:
        return _NO_MASK
    if not isinstance(attention_mask, Tensor):
        raise TypeError(
            f"attention_mask must be a torch.Tensor ([B, T] padding, or a bool [B, Lq, Lk] / "
            f"[B, 1, Lq, Lk] who-sees-whom matrix), got {type(attention_mask).__name__}"
        )
    if attention_mask.dim() > 4:
        raise ValueError(
            "attention_mask must have shape [B, T] (1 = real token), or be a bool [B, Lq, Lk] or "
            f"[B, 1, Lq, Lk] who-sees-whom matrix, got {tuple(attention_mask.shape)}"
        )
    try:
        if attention_mask.dim() in (3, 4):
            return Seen(pairs=pair_mask(attention_mask, cache, B, Lq, Lk_new))
        return Seen(padding=key_valid_of(attention_mask, cache, B, Lq, Lk_new, q.device))
    except ValueError as err:
        n = attention_mask.shape[-1] if attention_mask.dim() else 0
        held = 0 if cache is None else len(cache)  # a decode step [B, 1, H, D]: n = held + 1
        what = f"the attention_mask's {n} columns" + (f" less {held} cached" if held else "")
        hint = layout_hint(q, 1, n - held, what, Lk_new - held)
        if not hint or (held and q.shape[1] >= q.shape[2]):  # over a cache: a [B, 1, H, D] step
            raise
        raise ValueError(f"{err}. {hint}") from None


_NO_MASK = Seen()


def near(q_pos: Tensor, keys_pos: Tensor, window: int | None, sinks: int | None) -> Tensor | None:
    """One query's sliding window (plus its sinks) over the keys' positions, ``[1 | B, Lk]``
    bool (the rule of :class:`~posenc.masks.Visibility` for a causal query); None: no window."""
    if window is None:
        return None
    near = keys_pos > q_pos[..., -1:] - window  # [Lk] or [B, Lk]; m >= 0: no int64 overflow
    if sinks:
        near = near | (keys_pos < sinks)  # the attention sinks
    return near if near.dim() == 2 else near[None]  # [1 | B, Lk]


def pair_mask(mask: Tensor, cache: KVCache | None, B: int, Lq: int, Lk_new: int) -> Tensor:
    """A who-sees-whom ``attention_mask`` ``[B, Lq, Lk]`` / ``[B, 1, Lq, Lk]`` (True = may see)
    over the cached plus new keys (a static cache: up to ``max_len`` slots): ``[1 | B, Lq, Lk]``."""
    if mask.dtype != torch.bool:
        raise TypeError(
            f"attention_mask: a {mask.dim()}-D who-sees-whom mask must be bool (True = may see), "
            f"got dtype {mask.dtype}; an additive float mask m converts with (m == 0)"
        )
    shape = tuple(mask.shape)
    if mask.dim() == 4:
        if mask.shape[1] != 1:
            raise ValueError(
                f"attention_mask: a 4-D mask must have shape [B, 1, Lq, Lk] (one matrix for "
                f"every head), got {shape}"
            )
        mask = mask[:, 0]
    columns = None if cache is None else cache.mask_columns(Lk_new)
    held = 0 if columns is None else columns.held
    want = held + Lk_new
    Lk = mask.shape[-1]
    fits = Lk == want if columns is None else columns.pairs_fit(Lk)
    if (mask.shape[0] != 1 and mask.shape[0] != B) or mask.shape[1] != Lq or not fits:
        where = (f"; the cache holds {held} keys from earlier calls (cache.reset() starts anew)"
                 if held else "")
        raise ValueError(
            f"attention_mask: a who-sees-whom mask must have shape [{B}, {Lq}, {want}] or "
            f"[{B}, 1, {Lq}, {want}] (queries x cached plus new keys), got {shape}{where}"
        )
    return mask


def warn_hidden(keys_pos: Tensor, q_pos: Tensor, window: int, sinks: int | None) -> None:
    """Warn when an evicted cache holds keys the window rule hides from every query now and
    later (e.g. StreamingLLM's kept sinks under ``window=W`` without ``sinks=S``)."""
    first = q_pos.min()  # later queries sit later: a key hidden from this one stays hidden
    hidden = keys_pos <= first - window
    if sinks:
        hidden &= keys_pos >= sinks
    if bool(hidden.any()):
        shown = sorted(set(keys_pos[hidden].tolist()))
        more = ", ..." if len(shown) > 8 else ""
        count = int(hidden.reshape(-1, hidden.shape[-1]).any(0).sum())  # slots, over the rows
        warn_caller(
            f"the cache holds {count} key(s) that window={window} hides from every "
            f"query (positions {str(shown[:8])[1:-1]}{more}): kept attention "
            "sinks? pass sinks=S so the rule shows them, or evict them"
        )


def check_qkv(q: Tensor, k: Tensor, v: Tensor, *, own_keys: bool) -> tuple[int, int]:
    """Shapes, dtypes and devices of ``q, k, v``; returns ``(B, Lq)``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
        if t.dim() != 4:
            hint = (" ([total, H, D] is flash-attn's varlen layout: give cu_seqlens= too)"
                    if t.dim() == 3 else "")
            raise ValueError(f"{name} must have shape [B, H, L, Dh], got {tuple(t.shape)}{hint}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, Lq, D = q.shape
    if (k.shape != v.shape and k.shape[:-1] != v.shape[:-1]) or k.shape[0] != B or k.shape[-1] != D:
        raise ValueError(
            f"q, k, v must agree in batch and head_dim (k and v in all but v's head size, "
            f"which may differ from q's and k's), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(
            f"q has {H} heads and k/v have {k.shape[1]}: the query heads must be a multiple of "
            "the kv heads (grouped-query attention)"
        )
    if not own_keys and k.shape[-2] != Lq:
        flash = q.shape[1] == k.shape[1] and k.shape[2] > 0 and Lq % k.shape[2] == 0
        raise ValueError(
            f"q and k must hold the same new tokens, got {Lq} and {k.shape[-2]}; "
            "earlier keys belong in the cache (or give key_positions for keys of their own)"
            + (f". q {tuple(q.shape)} and k {tuple(k.shape)} look like [B, L, H, head_dim] "
               f"(flash-attn's layout) with {Lq} query heads and {k.shape[2]} kv heads: attend "
               "reads [B, H, L, head_dim]: pass q.transpose(1, 2), k.transpose(1, 2), "
               "v.transpose(1, 2)" if flash else "")
        )
    return B, Lq


def _check_options(
    scheme: object, cache: object, backend: object, causal: object, window: object, dropout_p: object
) -> tuple[PositionScheme, bool, int | None, float]:
    """The plain arguments: ``(scheme or NoPE, causal, window, dropout_p)``, checked."""
    if scheme is not None and not isinstance(scheme, PositionScheme):
        if isinstance(scheme, type) and issubclass(scheme, PositionScheme):
            raise TypeError(f"scheme must be a PositionScheme or None, {_a_class(scheme)}")
        raise TypeError(f"scheme must be a PositionScheme or None, got {type(scheme).__name__}")
    if cache is not None and not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return (  # the plain values take the quick test (this runs on every call)
        scheme if scheme is not None else _NOPE,
        causal if type(causal) is bool else check_bool("causal", causal),
        None if window is None else check_window("window", window),
        dropout_p if type(dropout_p) is float and 0.0 <= dropout_p <= 1.0
        else check_dropout("dropout_p", dropout_p),
    )


def check_runs(doc: Tensor, cache: KVCache | None) -> None:
    """Each document one contiguous run of its id in every row, over the cached plus new
    tokens: an id that comes back after another would join two runs (``packed_positions``
    checks the same when it makes the positions). Not while compiling (a host sync)."""
    if is_compiling():
        return
    ids = doc.to(torch.long)  # [B, Lq]
    held = None if cache is None else cache.held_document_ids()  # [B, T]
    if held is not None and held.shape[0] == ids.shape[0]:
        ids = torch.cat([held.to(ids.device, torch.long), ids], dim=-1)  # [B, T + Lq]
    if ids.shape[-1] < 2:
        return
    runs = (ids[:, 1:] != ids[:, :-1]).sum(-1) + 1  # [B]
    srt = ids.sort(-1).values
    distinct = (srt[:, 1:] != srt[:, :-1]).sum(-1) + 1  # [B]
    if not bool((runs == distinct).all()):
        b = int((runs != distinct).nonzero()[0, 0])
        where = " (the cached plus new tokens)" if ids.shape[-1] > doc.shape[-1] else ""
        shown = f" {ids[b].tolist()}" if ids.shape[-1] <= 32 else ""
        raise ValueError(
            "document_ids must hold each document as one contiguous run (e.g. [0, 0, 1, 1, 1]); "
            f"in row {b}{where}{shown}, {int(runs[b] - distinct[b])} id(s) come back after "
            "another id"
        )


def new_valid(key_valid: Tensor | None, cache: KVCache | None, B: int, Lq: int) -> Tensor | None:
    """``[B, Lq]`` bool, which new keys the 2-D mask calls real, for the cache to remember;
    None without a mask (or, eagerly, when a growing cache has seen no padding at all)."""
    if key_valid is None or cache is None:
        return None
    # rolling: key_valid_of kept the new keys' columns; static: the mask spans every slot,
    # the new keys sit from the write pointer on; growing: the last Lq columns
    return cache.mask_columns(Lq).new_columns(key_valid, B)


def key_valid_of(
    attention_mask: Tensor | None, cache: KVCache | None, B: int, Lq: int, Lk_new: int,
    device: torch.device,
) -> Tensor | None:
    """``[1 | B, Lk]`` bool: the keys that are real tokens, over the cached plus new keys (all
    ``max_len`` slots of a static cache); None without a mask. Checked before the cache is
    written (the caller ands in a static cache's written slots after the write)."""
    if attention_mask is None:
        return None
    key_valid = _check_mask("attention_mask", attention_mask)
    T = key_valid.shape[-1]
    columns = None if cache is None else cache.mask_columns(Lk_new)
    if columns is not None and columns.cut:  # rolling: the last Lq columns, the new keys
        if (key_valid.shape[0] != 1 and key_valid.shape[0] != B) or T < Lq:
            raise ValueError(
                f"attention_mask must have shape [{B}, T] with T >= {Lq} (the new keys) with a "
                "rolling KVCache (its last Lq columns describe the new keys; the cache "
                f"remembers earlier padding), got {tuple(attention_mask.shape)}"
            )
        return key_valid[:, T - Lq:].to(device)  # [1 | B, Lq]
    static = columns is not None and columns.slotted
    Lk = Lk_new if columns is None else columns.width
    if static and T < Lk:  # the slots past the mask: unwritten
        assert columns is not None
        held = columns.held
        if T < held + Lq:
            if held and T == Lq:
                raise ValueError(_not_continued(held, Lq, T))
            raise ValueError(
                f"attention_mask covers {T} keys, but the cache held {held} and this "
                f"call adds {Lq}: it must cover the {held + Lq} cached plus new keys "
                f"(or all max_len={Lk} slots)"
            )
        key_valid = F.pad(key_valid, (0, Lk - T), value=False)
    if (key_valid.shape[0] != 1 and key_valid.shape[0] != B) or key_valid.shape[-1] != Lk:
        if not static and Lk > Lk_new and key_valid.shape[-1] == Lk_new:
            raise ValueError(_not_continued(Lk - Lk_new, Lq, Lk_new))
        want = f"[{B}, {Lk}] (cached plus new keys)" if not static else (
            f"[{B}, T] with the cached plus new keys <= T <= max_len={Lk}")
        raise ValueError(f"attention_mask must have shape {want}, got {tuple(attention_mask.shape)}")
    return key_valid.to(device)




def warn_if_restarting(positions: Tensor, cache: KVCache, B: int) -> None:
    """New tokens whose positions all lie below what a filled cache's rows reached: most
    likely a new batch on a cache that was not reset (eager calls of more than one token; a
    host sync)."""
    nxt = cache.reached()
    if nxt is None or nxt.shape[0] != B:  # a new batch size: _check_new says
        return
    top = positions.to(nxt.device).amax(-1)  # [] or [B]
    if bool((top < nxt).any()):
        warn_caller(
            f"cache: the new tokens' positions (up to {int(top.max())}) all lie below the "
            f"positions the cache's rows reached ({nxt.tolist()}), and the cache holds "
            f"{len(cache)} tokens: a new batch on a filled cache? call reset() on the cache "
            "(or LayerCaches) first; earlier tokens would stay visible"
        )


def _not_continued(held: int, Lq: int, T: int) -> str:
    """A mask over the new tokens alone given to a cache that holds earlier ones: most likely
    a new batch on a cache that was not reset."""
    return (
        f"the cache holds {held} tokens from earlier calls, and attention_mask covers only the "
        f"{T} new ones: a new batch on a filled cache? call reset() on the cache (or "
        "LayerCaches) first; to continue the cached rows, give the mask over the cached plus "
        f"new keys ([B, {held + Lq}])"
    )


def varlen_layout(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme | None, cu_seqlens: Tensor | None,
    max_seqlen: int | None, opts: VarlenOptions, others: dict[str, object],
) -> Tensor:
    """``attend`` on flash-attn's varlen layout: :func:`posenc.varlen.attend_varlen`."""
    if cu_seqlens is None:
        raise ValueError(
            f"max_seqlen={max_seqlen!r} is given without cu_seqlens: max_seqlen belongs to the "
            "varlen layout ([total, H, D] with cu_seqlens); drop it or give cu_seqlens"
        )
    given = [name for name, value in others.items() if value is not None]
    if given:
        raise ValueError(
            f"with cu_seqlens (q, k, v as [total, H, D]) attend takes no {', '.join(given)}: "
            "positions restart at 0 in each sequence and each sequence sees only itself; for "
            "those options use [B, H, L, D] with document_ids"
        )
    return attend_varlen(
        q, k, v, scheme, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, causal=opts.causal,
        window=opts.window, scale=opts.scale, backend=opts.backend, dropout_p=opts.dropout_p,
    )
