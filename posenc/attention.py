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
runs a call and why (``posenc.backends.effective_backend``), are in ``posenc.backends``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_bool,
    check_dropout,
    check_int,
    check_rows,
    check_sinks,
    check_tensor,
    check_window,
    is_compiling,
)
from .attend_inputs import (
    Call,
    Seen,
    check_call,
    check_qkv,
    check_runs,
    check_seen,
    near,
    new_valid,
    refuse_with_rolling,
    varlen_layout,
    warn_hidden,
    warn_if_restarting,
)
from .backends import (  # noqa: F401  (BACKENDS, CAUSAL_CHUNK: re-exported)
    BACKENDS,
    CAUSAL_CHUNK,
    RuleFacts,
    Softmax,
    check_softmax,
    run_by_rule,
    run_fast,
    run_one_query,
)
from .cache import KVCache
from .masks import Visibility, causal_block_mask, causal_mask  # noqa: F401  (re-exported)
from .positions import packed_positions
from .schemes import PositionScheme, make_scheme
from .varlen import VarlenOptions, attend_documents


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
    path: SDPA's ``is_causal`` or one cached ``[1, H, Lq, Lk]`` bias. ``document_ids`` alone
    (eager ``sdpa``, nothing cached, default positions) run each document alone, ``sum n_i**2``
    (:mod:`posenc.varlen`). Otherwise ``sdpa`` and ``math`` get one mask ``[B, H, Lq, Lk]``
    from the rule, ``flex`` a ``BlockMask`` and a ``score_mod`` (no ``[Lq, Lk]`` tensor).

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
    if cu_seqlens is not None or max_seqlen is not None:  # flash-attn's layout: its own function
        opts = VarlenOptions(causal, window, scale, dropout_p, backend)
        return varlen_layout(q, k, v, scheme, cu_seqlens, max_seqlen, opts,
                             dict(positions=positions, key_positions=key_positions,
                                  attention_mask=attention_mask, document_ids=document_ids,
                                  cache=cache, sinks=sinks, softcap=softcap,
                                  sink_logits=sink_logits))
    # 1. check: every argument, before anything is written (a refused call leaves the cache)
    B, Lq = check_qkv(q, k, v, own_keys=key_positions is not None)
    call = check_call(q, scheme, cache, backend, causal, window, sinks, dropout_p)
    if call.rolling:
        refuse_with_rolling(document_ids, attention_mask)
    softmax = check_softmax(q, scale, softcap, sink_logits, call.dropout_p)
    # 2. positions: given, restarting per document, or following the cache
    where = _positions(q, k, positions, key_positions, document_ids, cache)
    seen = check_seen(attention_mask, cache, B, Lq, k.shape[-2], q)
    # 3. rotate: the scheme's hook (RoPE turns q and k by their positions)
    q, k = call.scheme.rotate(q, k, *where.rotate_args())
    # 4. cache: the new keys join the cached ones; what the queries see
    keys = _all_keys(k, v, where, cache, seen, B)
    if call.window is not None and keys.evicted and not is_compiling():
        warn_hidden(keys.pos, where.q_pos, call.window, call.sinks)
    # 5. attend: the path that needs the least
    path = choose_path(call, where, seen, softmax, keys, compiling=is_compiling())
    if path == "documents":
        return attend_documents(q, keys.k, keys.v, call.scheme, where.doc, call.causal,
                                call.window, softmax.scale)
    if path == "one_query":
        near_keys = near(where.q_pos, keys.pos, call.window, call.sinks)  # [1 | B, Lk] or None
        valid = keys.valid if near_keys is None else (
            near_keys if keys.valid is None else keys.valid & near_keys)
        return run_one_query(q, keys.k, keys.v, valid, call.backend, softmax)
    if path == "fast":
        return run_fast(q, keys.k, keys.v, call.scheme, call.causal, call.backend, softmax)
    rule, facts = _rule(call, where, seen, keys)
    return run_by_rule(q, keys.k, keys.v, call.scheme, rule, softmax, call.backend, facts)


@dataclass(frozen=True)
class Where:
    """Where the new tokens sit: query positions ``[Lq | B, Lq]``, the keys' own or None, the
    document ids ``[B, Lq]`` or None; ``given``: positions came from the caller."""

    q_pos: Tensor
    k_pos: Tensor | None
    doc: Tensor | None
    given: bool

    def rotate_args(self) -> tuple[Tensor, ...]:
        """The positions the rotate hook takes (a 3-argument hook keeps working)."""
        return (self.q_pos,) if self.k_pos is None else (self.q_pos, self.k_pos)


@dataclass(frozen=True)
class Keys:
    """Every key the queries attend over (the cache's after the write, or the new keys alone),
    with positions, documents, ``valid [1 | B, Lk]``, the first query's slot, whether ``evict``
    dropped keys, and whether key slot ``j`` holds the ``j``-th key (a bias by index is one
    by position)."""

    k: Tensor
    v: Tensor
    pos: Tensor
    doc: Tensor | None
    valid: Tensor | None
    slot: Tensor | int
    evicted: bool
    by_index: bool


def choose_path(call: Call, where: Where, seen: Seen, softmax: Softmax, keys: Keys,
                compiling: bool = False) -> str:
    """``"one_query"`` (a decode step with no bias: no ``[Lq, Lk]`` rule), ``"fast"`` (plain
    causal or full attention: SDPA's ``is_causal`` or the scheme's cached bias), ``"documents"``
    (each document alone, grouped by length as ``attend_varlen``; not ``compiling``) or ``"rule"``."""
    if _one_query_without_rule(call, where, seen, softmax):
        return "one_query"
    if _default_keys_without_rule(call, where, seen, softmax, keys):
        return "fast"
    if _documents_each_alone(call, where, seen, softmax, keys, compiling):
        return "documents"
    return "rule"


def _one_query_without_rule(call: Call, where: Where, seen: Seen, softmax: Softmax) -> bool:
    return (where.q_pos.shape[-1] == 1 and not seen.masked and where.doc is None
            and (call.window is None or call.causal) and where.k_pos is None
            and seen.pairs is None and softmax.plain and not call.scheme.has_bias
            and call.backend != "flex")


def _default_keys_without_rule(
    call: Call, where: Where, seen: Seen, softmax: Softmax, keys: Keys
) -> bool:
    return (keys.valid is None and where.doc is None and call.window is None
            and where.k_pos is None and not keys.evicted and seen.pairs is None and softmax.plain
            and not (where.given and call.scheme.has_bias))


def _documents_each_alone(
    call: Call, where: Where, seen: Seen, softmax: Softmax, keys: Keys, compiling: bool
) -> bool:
    """Packed documents each attended alone give the answer: nothing spans documents (no
    cached keys, padding, pair mask, sinks), positions restart per document (given ones only
    where the scheme reads none), plain SDPA softmax, no dropout, eager (a host read)."""
    no_positions = (type(call.scheme).rotate is PositionScheme.rotate
                    and not call.scheme.has_bias)  # NoPE, embedding schemes: positions unread
    return (where.doc is not None and not compiling and call.backend == "sdpa"
            and (not where.given or no_positions) and where.k_pos is None
            and not call.sinks and not call.rolling and not seen.masked and seen.pairs is None
            and keys.valid is None and keys.by_index  # growing or none, never evicted
            and isinstance(keys.slot, int) and keys.slot == 0
            and softmax.plain and softmax.dropout_p == 0.0)


def _rule(call: Call, where: Where, seen: Seen, keys: Keys) -> tuple[Visibility, RuleFacts]:
    """The visibility rule over every key, and what the run may assume."""
    B, Lq = keys.k.shape[0], where.q_pos.shape[-1]
    pair = seen.pairs
    if pair is not None and pair.shape[-1] < keys.k.shape[-2]:  # a static cache's slots
        pair = F.pad(pair, (0, keys.k.shape[-2] - pair.shape[-1]), value=False)  # unwritten
    device = keys.k.device
    rule = Visibility(
        q_pos=where.q_pos.expand(B, Lq), k_pos=keys.pos.expand(B, -1),
        q_slot=keys.slot + torch.arange(Lq, device=device), causal=call.causal,
        by_position=where.k_pos is not None, window=call.window,
        key_valid=None if keys.valid is None else keys.valid.expand(B, -1),
        q_doc=where.doc, k_doc=None if keys.doc is None else keys.doc.expand(B, -1),
        sinks=call.sinks, pair=None if pair is None else pair.to(device).expand(B, -1, -1),
    )
    # a query sees its own key unless padding or keys of their own hide it: only then can a
    # row see no key (the written slots of a static cache include the query's own)
    return rule, RuleFacts(
        index_bias=where.k_pos is None and keys.by_index,
        may_be_empty=seen.masked or where.k_pos is not None or seen.pairs is not None,
    )


def _positions(
    q: Tensor, k: Tensor, positions: Tensor | None, key_positions: Tensor | None,
    document_ids: Tensor | None, cache: KVCache | None,
) -> Where:
    """Where the new tokens sit (:class:`Where`: query positions, the keys' own or None,
    document ids ``[B, Lq]`` or None), checked.
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
        doc = check_rows("document_ids", document_ids, B, Lq, labels=True, like=q).to(q.device).expand(B, Lq)
    if positions is not None:
        positions = check_rows("positions", positions, B, Lq, labels=False, like=q)
        if cache is not None and Lq > 1 and not is_compiling():  # a prefill-like call only
            warn_if_restarting(positions, cache, B)
        if doc is not None:
            check_runs(doc, cache)
        return Where(positions.to(q.device, torch.long), k_pos, doc, True)
    if k_pos is not None:
        raise ValueError(
            "positions is required when key_positions is given: the queries' positions cannot "
            "be told from keys of their own (give both, e.g. positions=mine, "
            "key_positions=gathered)"
        )
    if doc is not None:
        if cache is not None and cache.holds_storage():
            raise ValueError("with document_ids and a non-empty cache, give positions "
                             "(the documents' positions continue across calls)")
        return Where(packed_positions(doc), k_pos, doc, False)  # [B, Lq]
    if cache is not None:
        return Where(cache.next_positions(Lq, q.device), k_pos, doc, False)  # [Lq]
    return Where(torch.arange(Lq, device=q.device), k_pos, doc, False)  # [Lq]


def _all_keys(
    k: Tensor, v: Tensor, where: Where, cache: KVCache | None, seen: Seen, B: int
) -> Keys:
    """Every key the queries attend over: the cache's after adding the new keys (with the
    padding it remembers and, in a static cache, only the written slots), or the new keys
    alone."""
    Lq = where.q_pos.shape[-1]
    k_pos = where.q_pos if where.k_pos is None else where.k_pos
    if cache is None:
        return Keys(k, v, k_pos, where.doc, seen.padding, k.shape[-2] - Lq, False, True)
    defaulted = not where.given and where.k_pos is None and where.doc is None
    rolling = cache.imposed_rule() is not None
    view = cache.append(
        k, v, k_pos, where.doc, new_valid(seen.padding, cache, B, Lq), defaulted)
    # the view's valid: the padding the cache remembers and, in a static cache, only the
    # written slots; a rolling cache's [B, S + W + Lq] already holds this call's padding
    valid = view.valid
    if not rolling and seen.padding is not None:
        valid = seen.padding if valid is None else seen.padding & valid
    return Keys(view.k, view.v, view.positions, view.document_ids, valid, view.q_slot,
                cache.holds_evicted(), cache.positions_are_slots)


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
        self.sinks = check_sinks(self.window, sinks, owner="MultiHeadAttention: ")
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
            cache.check_claim(self.layer_name)  # raises if another layer wrote it
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
        if cache is not None:
            cache.claim(self.layer_name)  # after the write: a refused call claims nothing
        return self.proj(y.transpose(1, 2).flatten(2))  # [B, L, D]
