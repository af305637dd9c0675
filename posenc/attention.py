"""Multi-head attention that takes any position scheme and calls its hooks.

``attend`` is the functional core: rotate (RoPE), append to the KV cache, add the bias (ALiBi,
T5), mask, softmax. ``MultiHeadAttention`` wraps it with the q/k/v/out projections. The
``embed`` hook (sinusoidal, learned) acts on the token embeddings, so the model calls it once
before the first block; attention never changes when a scheme is added.

Backends: ``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention``, the default),
``"math"`` (the written-out ``softmax(q k^T / sqrt(d) + b) v``, for teaching and tests) and
``"flex"`` (``torch.nn.attention.flex_attention`` with the scheme's ``score_mod`` and a
``BlockMask`` of the visibility rule, compiled with ``torch.compile`` so that no ``[L, L]`` bias
or mask is ever built; Dong et al., 2024). The kernels, and the one table of which backend
runs a call and why (:func:`~posenc.backends.effective_backend`), are in :mod:`posenc.backends`.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import varlen
from ._checks import (
    check_bool,
    check_dropout,
    check_int,
    check_rows,
    check_tensor,
    check_window,
    is_compiling,
    warn_caller,
)
from .backends import (  # noqa: F401  (BACKENDS, CAUSAL_CHUNK: re-exported)
    BACKENDS,
    CAUSAL_CHUNK,
    RuleFacts,
    check_sinks,
    check_softmax,
    run_by_rule,
    run_fast,
    run_one_query,
)
from .cache import KVCache
from .masks import (  # noqa: F401  (causal_mask, causal_block_mask: re-exported)
    Visibility,
    causal_block_mask,
    causal_mask,
)
from .positions import _check_mask, packed_positions
from .rolling_cache import check_rule
from .schemes import NoPE, PositionScheme, _a_class, make_scheme


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: PositionScheme | None = None,
    *,
    positions: Tensor | None = None,
    key_positions: Tensor | None = None,
    attention_mask: Tensor | None = None,
    document_ids: Tensor | None = None,
    window: int | None = None,
    causal: bool = True,
    cache: KVCache | None = None,
    backend: str = "sdpa",
    dropout_p: float = 0.0,
    sinks: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sink_logits: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    max_seqlen: int | None = None,
) -> Tensor:
    """Attention of ``q [B, H, Lq, Dh]`` over ``k [B, H_kv, Lk, Dh]``, ``v [B, H_kv, Lk, Dv]``
    with a position scheme and a visibility rule; returns ``[B, H, Lq, Dv]``. ``Dv`` is
    usually ``Dh``; it may differ, as in multi-head latent attention (DeepSeek-V3: 192 for q
    and k, 128 for v), on every backend, as torch's SDPA allows.

    Positions, never indices, drive every scheme:

    - ``positions`` ``[Lq]`` or ``[B, Lq]``: the queries' (and, by default, the new keys')
      positions. Default: ``arange(Lq)`` after the tokens the ``cache`` has seen, or, with
      ``document_ids``, restarting at 0 in each document (:func:`~posenc.positions.packed_positions`).
    - ``key_positions`` ``[Lk]`` or ``[B, Lk]``: the keys' own positions (keys gathered from
      other shards under context parallelism); ``Lk`` may then differ from ``Lq``, and
      ``positions`` is required (no default could tell where the queries sit). RoPE rotates
      ``k`` by them, ALiBi and T5 use key position minus query position, and ``causal`` means
      key position <= query position.

    Visibility (see :mod:`posenc.masks`): ``causal`` (the new tokens follow the cached ones);
    ``attention_mask [B, T]`` (1 / True = a real token, transformers' convention, over the
    cached plus new keys; a static cache also takes any length up to its ``max_len``): padded
    keys are never attended; ``document_ids [B, Lq]`` (integer labels, each document one
    contiguous run): a token sees only its own document; ``window=W``: query at position m
    sees keys n with m - W < n <= m (W keys including itself, also while decoding with a
    cache). A query row that may see no key (a fully padded row, a query before every key)
    is zeros on every backend, as FlexAttention returns.

    GQA / MQA: ``H % H_kv == 0``; query head h reads kv head ``h // (H / H_kv)``; the cache
    stores ``H_kv`` heads. Layout: ``[B, H, L, head_dim]``, never guessed. flash-attn's
    ``[B, L, H, head_dim]`` with fewer kv heads is an error that names the transpose; with as
    many kv heads as query heads the shapes cannot tell it, so give ``positions`` (whose ``L``
    then matches dim 1, not dim 2: an error naming the transpose) or transpose first.

    With none of the options above (and default positions for a bias scheme) this is the fast
    path: SDPA's ``is_causal`` or one cached ``[1, H, Lq, Lk]`` bias.
    Otherwise ``sdpa`` and ``math`` get one boolean or float mask ``[B, H, Lq, Lk]`` built from
    the rule, and ``flex`` a ``BlockMask`` plus a ``score_mod`` (never an ``[Lq, Lk]`` tensor):
    use ``flex`` for long packed or windowed sequences on a GPU.

    Where models really run:

    - ``sinks=S`` with ``window=W``: the window plus the first ``S`` positions (StreamingLLM's
      attention sinks; Xiao et al., 2024), in prefill and training as in decoding.
    - a rolling ``cache=KVCache(max_len=S + W, sinks=S, window=W)`` keeps only the first ``S``
      keys and the last ``W`` and imposes that rule (``window`` and ``sinks`` may be left out
      or must equal the cache's); its ``attention_mask`` is ``[B, T]`` with ``T >= Lq``, whose
      last ``Lq`` columns describe the new keys (the cache remembers earlier padding).
    - ``attention_mask`` may also be a boolean ``[B, Lq, Lk]`` or ``[B, 1, Lq, Lk]``
      who-sees-whom matrix over the same keys as the 2-D mask (True = may see, transformers'
      4-D convention): a speculative-decoding tree, a prefix-LM (with ``causal=False``). It is
      and-ed with the other rules; positions still come from ``positions``.
    - ``scale``: the factor on ``q k^T`` (default ``1 / sqrt(Dh)``; Gemma's
      ``query_pre_attn_scalar``, YaRN's and MLA's mscale).
    - ``softcap=c``: ``c * tanh(s / c)`` on the scaled scores, before the bias and the mask
      (Gemma 2). SDPA cannot apply it, so ``backend="sdpa"`` computes that call written out.
    - ``sink_logits [H]``: one learned logit per head in every softmax's denominator, whose
      probability is dropped (gpt-oss): SDPA gets it as an extra key of value zero (``flex``
      runs such a call on SDPA: CPU FlexAttention returns no log-sum-exp).
    - ``cu_seqlens`` / ``max_seqlen``: q, k, v in flash-attn's varlen layout ``[total, H, D]``;
      handed to :func:`posenc.varlen.attend_varlen` (cost ~ the sum of ``n_i**2``).

    Raises:
        TypeError: q, k, v not floating tensors of one dtype; a position, document id or mask
            of the wrong dtype; ``scheme`` or ``cache`` of the wrong type; ``causal`` not a
            bool, ``window`` not an int; a scheme class where an instance belongs.
        ValueError: shapes that do not fit ``[B, H, L, Dh]`` / ``[B, H_kv, L, Dh]``; ``H`` not a
            multiple of ``H_kv``; ``Lk != Lq`` without ``key_positions`` (earlier keys belong in
            the cache); ``key_positions`` without ``positions``; a scheme whose ``num_heads``
            is not ``H``; a mask or position of the wrong shape or value (a mask shorter than the
            cached plus new keys); ``document_ids`` whose document comes back after another
            (in the call, or after the cached tokens); an unknown ``backend``; ``window`` not
            in ``[1, 2**63 - 1]``; with a rolling cache, ``window`` or ``sinks`` other than the
            cache's, ``document_ids`` or a who-sees-whom mask. Every argument is checked
            before the ``cache`` is written: a refused call leaves the cache as it was.
    """
    if cu_seqlens is not None or max_seqlen is not None:
        return _varlen(q, k, v, scheme, cu_seqlens, max_seqlen, causal, window, scale, backend,
                       dropout_p, dict(positions=positions, key_positions=key_positions,
                                       attention_mask=attention_mask, document_ids=document_ids,
                                       cache=cache, sinks=sinks, softcap=softcap,
                                       sink_logits=sink_logits))
    B, Lq = _check_qkv(q, k, v, own_keys=key_positions is not None)
    scheme, causal, window, dropout_p = _check_options(scheme, cache, backend, causal, window, dropout_p)
    rolling = cache is not None and cache.rolling
    if rolling:  # the cache holds the sinks and the last W keys: the rule is its own
        assert cache is not None
        window, sinks = _rolling_rule(cache, window, sinks, document_ids, attention_mask)
    check_sinks(window, sinks)
    softmax = check_softmax(q, scale, softcap, sink_logits, dropout_p)
    heads = scheme.num_heads
    if heads is not None and heads != q.shape[1]:
        raise ValueError(
            f"scheme {scheme.name!r} has a bias for {heads} heads but q has {q.shape[1]} "
            "heads; they must be equal"
        )
    q_pos, k_pos, doc = _positions(q, k, positions, key_positions, document_ids, cache)
    # every argument is checked before the cache is written: a refused call leaves it as it was
    pair = None
    if attention_mask is not None and not isinstance(attention_mask, Tensor):
        raise TypeError(
            f"attention_mask must be a torch.Tensor ([B, T] padding, or a bool [B, Lq, Lk] / "
            f"[B, 1, Lq, Lk] who-sees-whom matrix), got {type(attention_mask).__name__}"
        )
    if attention_mask is not None and attention_mask.dim() > 4:
        raise ValueError(
            "attention_mask must have shape [B, T] (1 = real token), or be a bool [B, Lq, Lk] or "
            f"[B, 1, Lq, Lk] who-sees-whom matrix, got {tuple(attention_mask.shape)}"
        )
    if attention_mask is not None and attention_mask.dim() in (3, 4):
        pair, attention_mask = _pair_mask(attention_mask, cache, B, Lq, k.shape[-2]), None
    key_valid = _key_valid(attention_mask, cache, B, Lq, k.shape[-2], q.device)  # [1 | B, Lk]
    if k_pos is None:  # a scheme written for the 3-argument hook keeps working
        q, k = scheme.rotate(q, k, q_pos)  # [B, H, L, Dh], [B, H_kv, L, Dh]
    else:
        q, k = scheme.rotate(q, k, q_pos, k_pos)  # [B, H, Lq, Dh], [B, H_kv, Lk, Dh]
    new_valid = _new_valid(key_valid, cache, B, Lq)  # [B, Lq] or None: the cache remembers it
    k, v, keys_pos, keys_doc, written, q_slot = _all_keys(
        k, v, q_pos if k_pos is None else k_pos, doc, cache, Lq, new_valid,
        defaulted=positions is None and k_pos is None and doc is None,
    )  # k, v [B, H_kv, Lk, Dh | Dv]; positions [Lk] or [B, Lk]; ids [B, Lk]; written slots [Lk]
    if window is not None and cache is not None and cache.evicted and not is_compiling():
        _warn_hidden(keys_pos, q_pos, window, sinks)
    if rolling:  # [B, S + W + Lq]: the written stored slots that are not padding, and the new keys
        key_valid = written
    else:
        if cache is not None and cache.valid is not None:  # padding shown earlier stays hidden
            key_valid = cache.valid if key_valid is None else key_valid & cache.valid
        if written is not None:  # a static cache: only the written slots are keys
            key_valid = written[None] if key_valid is None else key_valid & written
    evicted = cache is not None and cache.evicted
    if (Lq == 1 and attention_mask is None and doc is None and (window is None or causal)
            and k_pos is None and pair is None and softmax.plain and not scheme.has_bias
            and backend != "flex"):  # a decode step without a bias: no [Lq, Lk] rule to build
        near = _near(q_pos, keys_pos, window, sinks)  # [1 | B, Lk] or None
        if near is not None:
            key_valid = near if key_valid is None else key_valid & near
        return run_one_query(q, k, v, key_valid, backend, softmax)
    if (key_valid is None and doc is None and window is None and k_pos is None and not evicted
            and pair is None and softmax.plain
            and not (positions is not None and scheme.has_bias)):
        return run_fast(q, k, v, scheme, causal, backend, softmax)
    if pair is not None and written is not None and pair.shape[-1] < k.shape[-2]:
        pair = F.pad(pair, (0, k.shape[-2] - pair.shape[-1]), value=False)  # unwritten slots
    rule = Visibility(
        q_pos=q_pos.expand(B, Lq), k_pos=keys_pos.expand(B, -1),
        q_slot=q_slot + torch.arange(Lq, device=q.device), causal=causal,
        by_position=k_pos is not None, window=window,
        key_valid=None if key_valid is None else key_valid.expand(B, -1),
        q_doc=doc, k_doc=None if keys_doc is None else keys_doc.expand(B, -1),
        sinks=sinks, pair=None if pair is None else pair.to(q.device).expand(B, -1, -1),
    )
    index_bias = k_pos is None and not evicted and not (cache is not None and cache.static)
    # a query sees its own key unless padding or keys of their own hide it: only then can a
    # row see no key (the written slots of a static cache include the query's own)
    may_be_empty = attention_mask is not None or k_pos is not None or pair is not None
    return run_by_rule(q, k, v, scheme, rule, softmax, backend, RuleFacts(index_bias, may_be_empty))


def _rolling_rule(
    cache: KVCache, window: int | None, sinks: object, document_ids: object, attention_mask: object
) -> tuple[int, int]:
    """``(window, sinks)`` a rolling cache imposes; other rules it cannot serve are refused."""
    assert cache.window is not None and cache.sinks is not None
    check_rule(window, sinks, cache.window, cache.sinks)
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
    return cache.window, cache.sinks


def _near(q_pos: Tensor, keys_pos: Tensor, window: int | None, sinks: int | None) -> Tensor | None:
    """One query's sliding window (plus its sinks) over the keys' positions, ``[1 | B, Lk]``
    bool (the rule of :class:`~posenc.masks.Visibility` for a causal query); None: no window."""
    if window is None:
        return None
    near = keys_pos > q_pos[..., -1:] - window  # [Lk] or [B, Lk]; m >= 0: no int64 overflow
    if sinks:
        near = near | (keys_pos < sinks)  # the attention sinks
    return near if near.dim() == 2 else near[None]  # [1 | B, Lk]


def _pair_mask(mask: Tensor, cache: KVCache | None, B: int, Lq: int, Lk_new: int) -> Tensor:
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
    held = 0
    if cache is not None and cache.k is not None and not is_compiling():
        held = len(cache)
    want = held + Lk_new
    static = cache is not None and cache.max_len is not None
    Lk = mask.shape[-1]
    fits = Lk == want or (static and cache is not None and want <= Lk <= (cache.max_len or 0))
    if (mask.shape[0] != 1 and mask.shape[0] != B) or mask.shape[1] != Lq or not fits:
        where = (f"; the cache holds {held} keys from earlier calls (cache.reset() starts anew)"
                 if held else "")
        raise ValueError(
            f"attention_mask: a who-sees-whom mask must have shape [{B}, {Lq}, {want}] or "
            f"[{B}, 1, {Lq}, {want}] (queries x cached plus new keys), got {shape}{where}"
        )
    return mask


def _varlen(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme | None, cu_seqlens: Tensor | None,
    max_seqlen: int | None, causal: bool, window: int | None, scale: float | None, backend: str,
    dropout_p: float, others: dict[str, object],
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
    return varlen.attend_varlen(
        q, k, v, scheme, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, causal=causal,
        window=window, scale=scale, backend=backend, dropout_p=dropout_p,
    )


def _warn_hidden(keys_pos: Tensor, q_pos: Tensor, window: int, sinks: int | None) -> None:
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


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, *, own_keys: bool) -> tuple[int, int]:
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


def _positions(
    q: Tensor, k: Tensor, positions: Tensor | None, key_positions: Tensor | None,
    document_ids: Tensor | None, cache: KVCache | None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``(query positions, key positions or None, document ids [B, Lq] or None)``, checked.
    The queries' positions are given, restart per document, or follow the cache."""
    B, Lq = q.shape[0], q.shape[-2]
    doc = k_pos = None
    if key_positions is not None:
        if document_ids is not None:
            raise ValueError("document_ids with key_positions is not supported: give the "
                             "gathered keys' positions and mask documents with attention_mask")
        k_pos = check_rows("key_positions", key_positions, B, k.shape[-2], labels=False)
        k_pos = k_pos.to(q.device, torch.long)  # int64: differences of uint8 would wrap
    if document_ids is not None:
        doc = check_rows("document_ids", document_ids, B, Lq, labels=True).to(q.device).expand(B, Lq)
    if positions is not None:
        positions = check_rows("positions", positions, B, Lq, labels=False, like=q)
        if cache is not None and Lq > 1 and not is_compiling():  # a prefill-like call only
            _warn_if_restarting(positions, cache, B)
        if doc is not None:
            _check_runs(doc, cache)
        return positions.to(q.device, torch.long), k_pos, doc
    if k_pos is not None:
        raise ValueError(
            "positions is required when key_positions is given: the queries' positions cannot "
            "be told from keys of their own (give both, e.g. positions=mine, "
            "key_positions=gathered)"
        )
    if doc is not None:
        if cache is not None and cache.k is not None:
            raise ValueError("with document_ids and a non-empty cache, give positions "
                             "(the documents' positions continue across calls)")
        return packed_positions(doc), k_pos, doc  # [B, Lq]
    if cache is not None:
        return cache.next_positions(Lq, q.device), k_pos, doc  # [Lq]
    return torch.arange(Lq, device=q.device), k_pos, doc  # [Lq]


def _warn_if_restarting(positions: Tensor, cache: KVCache, B: int) -> None:
    """New tokens whose positions all lie below what a filled cache's rows reached: most
    likely a new batch on a cache that was not reset (eager calls of more than one token; a
    host sync)."""
    nxt = cache.next_start
    if cache.k is None or nxt is None or nxt.shape[0] != B:  # a new batch size: _check_new says
        return
    top = positions.to(nxt.device).amax(-1)  # [] or [B]
    if bool((top < nxt).any()):
        warnings.warn(
            f"cache: the new tokens' positions (up to {int(top.max())}) all lie below the "
            f"positions the cache's rows reached ({nxt.tolist()}), and the cache holds "
            f"{len(cache)} tokens: a new batch on a filled cache? call reset() on the cache "
            "(or LayerCaches) first; earlier tokens would stay visible",
            stacklevel=4,
        )


def _check_runs(doc: Tensor, cache: KVCache | None) -> None:
    """Each document one contiguous run of its id in every row, over the cached plus new
    tokens: an id that comes back after another would join two runs (``packed_positions``
    checks the same when it makes the positions). Not while compiling (a host sync)."""
    if is_compiling():
        return
    ids = doc.to(torch.long)  # [B, Lq]
    held = None if cache is None else cache.document_ids  # [B, T]
    if held is not None and held.shape[0] == ids.shape[0]:
        if cache is not None and cache.filled is not None:
            held = held[:, : int(cache.filled)]  # the written slots of a static cache
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


def _new_valid(key_valid: Tensor | None, cache: KVCache | None, B: int, Lq: int) -> Tensor | None:
    """``[B, Lq]`` bool, which new keys the 2-D mask calls real, for the cache to remember;
    None without a mask (or, eagerly, when a growing cache has seen no padding at all)."""
    if key_valid is None or cache is None:
        return None
    if cache.rolling:  # _key_valid kept the new keys' columns
        return key_valid.expand(B, Lq)
    if cache.static:  # the mask spans every slot: the new keys sit from the write pointer on
        start = cache.filled if cache.filled is not None else torch.zeros((), dtype=torch.long)
        slots = start.to(key_valid.device) + torch.arange(Lq, device=key_valid.device)
        return key_valid.index_select(1, slots).expand(B, Lq)
    new = key_valid[:, key_valid.shape[-1] - Lq:].expand(B, Lq)  # [B, Lq]
    if cache.valid is None and not is_compiling() and bool(new.all()):
        return None  # nothing to remember: the fast path stays open
    return new


def _all_keys(
    k: Tensor, v: Tensor, k_pos: Tensor, doc: Tensor | None, cache: KVCache | None, Lq: int,
    new_valid: Tensor | None = None, defaulted: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | int]:
    """Every key the queries attend over, as a :class:`~posenc.cache.CacheView`'s fields: the
    cache's after adding the new keys, or the new keys alone."""
    if cache is not None:
        return cache._update(k, v, k_pos, doc, new_valid, defaulted)
    return k, v, k_pos, doc, None, k.shape[-2] - Lq  # a plain tuple: cheaper than a CacheView


def _key_valid(
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
    if cache is not None and cache.rolling:  # the last Lq columns: the new keys
        if (key_valid.shape[0] != 1 and key_valid.shape[0] != B) or T < Lq:
            raise ValueError(
                f"attention_mask must have shape [{B}, T] with T >= {Lq} (the new keys) with a "
                "rolling KVCache (its last Lq columns describe the new keys; the cache "
                f"remembers earlier padding), got {tuple(attention_mask.shape)}"
            )
        return key_valid[:, T - Lq:].to(device)  # [1 | B, Lq]
    static = cache is not None and cache.static
    if cache is None:
        Lk = Lk_new
    elif cache.max_len is not None:
        Lk = cache.max_len
    else:
        Lk = (0 if cache.k is None else cache.k.shape[-2]) + Lk_new
    if static and T < Lk:  # the slots past the mask: unwritten
        assert cache is not None
        held = 0 if cache.filled is None or is_compiling() else int(cache.filled)
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


def _not_continued(held: int, Lq: int, T: int) -> str:
    """A mask over the new tokens alone given to a cache that holds earlier ones: most likely
    a new batch on a cache that was not reset."""
    return (
        f"the cache holds {held} tokens from earlier calls, and attention_mask covers only the "
        f"{T} new ones: a new batch on a filled cache? call reset() on the cache (or "
        "LayerCaches) first; to continue the cached rows, give the mask over the cached plus "
        f"new keys ([B, {held + Lq}])"
    )


_NOPE = NoPE()
_layers_made = 0


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention ``[B, L, D] -> [B, L, D]`` with a position scheme.

    ``scheme`` is a name (see ``make_scheme``) or a ``PositionScheme`` shared with the model.
    ``num_kv_heads`` (default ``num_heads``) < ``num_heads`` gives grouped-query attention
    (Ainslie et al., 2023; ``1`` is multi-query attention): keys and values have that many
    heads, each shared by ``num_heads / num_kv_heads`` query heads, and so does the cache.
    ``window=W`` makes every query see only its last ``W`` keys (itself included), as Mistral's
    and Gemma's sliding-window layers; ``sinks=S`` keeps the first ``S`` positions visible too
    (StreamingLLM's attention sinks), in training and prefill as in decoding. The ``embed`` hook
    is *not* applied here: the model adds it to the token embeddings.

    ``layer_name`` (default ``"MultiHeadAttention#<n>"``, unique per layer made) names the layer
    in errors: a :class:`~posenc.cache.KVCache` is claimed by the first layer that writes it,
    and another layer given it raises (a cache serves one layer; see
    :class:`~posenc.cache.LayerCaches`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        window: int | None = None,
        sinks: int | None = None,
        scheme: str | PositionScheme | None = "nope",
        causal: bool = True,
        backend: str = "sdpa",
        bias: bool = False,
        dropout: float = 0.0,
        max_len: int | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_int("dim", dim, minimum=1)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.num_kv_heads = num_heads if num_kv_heads is None else check_int(
            "num_kv_heads", num_kv_heads, minimum=1
        )
        if num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        self.window = None if window is None else check_window("window", window)
        self.sinks = None if sinks is None else check_int("sinks", sinks, minimum=0)
        if self.sinks and self.window is None:
            raise ValueError(f"sinks={sinks} needs window=W (the window plus the first sinks positions)")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.head_dim = dim // num_heads
        self.causal, self.backend = check_bool("causal", causal), backend
        self.dropout = check_dropout("dropout", dropout)
        self.scheme = make_scheme(scheme, dim=dim, num_heads=num_heads, max_len=max_len, causal=causal)
        heads = getattr(self.scheme, "num_heads", None)
        if heads is not None and heads != num_heads:
            raise ValueError(
                f"scheme {self.scheme.name!r} was built for {heads} heads, but num_heads={num_heads}"
            )
        rotary = getattr(self.scheme, "rotary", None)
        if rotary is not None and rotary.head_dim != self.head_dim:
            raise ValueError(
                f"scheme 'rope' rotates head_dim={rotary.head_dim}, but dim // num_heads = "
                f"{dim} // {num_heads} = {self.head_dim}"
            )
        kv = self.num_kv_heads * self.head_dim
        self.qkv = nn.Linear(dim, dim + 2 * kv, bias=bias)  # [q | k | v] rows
        self.proj = nn.Linear(dim, dim, bias=bias)
        global _layers_made
        _layers_made += 1
        self.layer_name = f"MultiHeadAttention#{_layers_made}"

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """Attend over ``x [B, L, D]``; returns ``[B, L, D]``.

        ``positions`` (``[L]`` or ``[B, L]``, integer) are the tokens' positions, by default
        ``arange(L)`` after the tokens the cache has seen (restarting per document with
        ``document_ids``). With a ``cache`` (a :class:`~posenc.cache.KVCache`, one per layer)
        the new keys and values are appended to it and the queries see every cached token:
        decoding one token at a time gives the outputs of one full pass. ``attention_mask``
        ``[B, T]`` (1 = real token, over cached plus new tokens), or a bool who-sees-whom matrix
        ``[B, L, T]`` (a speculative tree; see :func:`attend`), and ``document_ids [B, L]`` are
        passed to :func:`attend`. The scheme's ``embed`` hook is the model's job, not this
        layer's. Dropout on the attention weights acts in training mode.

        Raises:
            TypeError: ``x`` is not a floating-point tensor of the layer's dtype, ``positions``
                not an integer tensor, ``cache`` not a :class:`~posenc.cache.KVCache`.
            ValueError: ``x`` is not ``[B, L, dim]`` on the layer's device; ``positions`` has
                the wrong shape or a negative entry; ``cache`` holds keys of another batch,
                head count or head size, or another layer's keys.
        """
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape [B, L, {self.dim}], got {tuple(x.shape)}")
        w = self.qkv.weight
        if x.dtype != w.dtype and not torch.is_autocast_enabled(
            x.device.type
        ):  # autocast mixes them on purpose
            raise TypeError(
                f"x must have the layer's dtype {w.dtype}, got {x.dtype}; cast one of them "
                f"(x.to({w.dtype}) or layer.to({x.dtype}))"
            )
        if x.device != w.device:
            raise ValueError(
                f"x must be on the layer's device {w.device}, got {x.device}; move one of them "
                f"(x.to('{w.device}') or layer.to('{x.device}'))"
            )
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
            if cache.owner is not None:
                cache.claim(self.layer_name)  # raises if another layer wrote it
        H, H_kv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv(x)  # [B, L, (H + 2 H_kv) Dh]
        if H_kv == H:
            q, k, v = qkv.unflatten(-1, (3, H, Dh)).unbind(2)  # each [B, L, H, Dh]
        else:
            q, k, v = qkv.split([H * Dh, H_kv * Dh, H_kv * Dh], dim=-1)
            q, k, v = q.unflatten(-1, (H, Dh)), k.unflatten(-1, (H_kv, Dh)), v.unflatten(-1, (H_kv, Dh))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, L, Dh], [B, H_kv, L, Dh]
        y = attend(
            q, k, v, self.scheme, causal=self.causal, positions=positions, cache=cache,
            attention_mask=attention_mask, document_ids=document_ids, window=self.window,
            sinks=self.sinks, backend=self.backend, dropout_p=self.dropout if self.training else 0.0,
        )  # [B, H, L, Dh]
        if cache is not None and cache.owner is None:
            cache.claim(self.layer_name)  # after the write: a refused call claims nothing
        return self.proj(y.transpose(1, 2).flatten(2))  # [B, L, D]
