"""Every attention kernel once, and the one decision of which backend runs a call.

``attend`` and ``attend_varlen`` choose a *path* (a decode step of one query, the fast path
of plain causal attention, or attention under a visibility rule); :func:`effective_backend`
then says which backend runs it and why, the one place that holds every fallback:

- ``"flex"`` runs on ``"sdpa"`` with ``sink_logits`` (CPU FlexAttention returns no
  log-sum-exp; warns once), with dropout (FlexAttention applies none), and on the CPU while
  gradients are needed (no FlexAttention backward on the CPU; warns once);
- ``"sdpa"`` runs written out (``"math"``) with a ``softcap`` (SDPA cannot cap its scores).

The kernels: :func:`sdpa` (``enable_gqa`` for grouped heads), :func:`math` (the written-out
softmax), :func:`sdpa_with_sink` (gpt-oss's sink logit as an extra key), :func:`sdpa_causal_chunks`
(a biased causal mask in blocks of queries on one CPU thread), :func:`flex_fn` (FlexAttention,
compiled once). The scheme's bias reaches each backend through four small functions side by
side (index- or position-based, dense or ``score_mod``), and the three runs
(:func:`run_one_query`, :func:`run_fast`, :func:`run_by_rule`) dispatch on the decision with
no further conditions. Masks use ``-inf`` through SDPA, never ``masked_fill(-1e9)``, which
overflows in float16.
"""

from __future__ import annotations

import math as _m
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_float, check_tensor, is_compiling, warn_caller
from .masks import Visibility, block_visibility, causal_block_mask, causal_mask, dense_visibility
from .schemes import PositionScheme

BACKENDS = ("sdpa", "math", "flex")
CAUSAL_CHUNK = 128  # queries per block of sdpa_causal_chunks (at least; Lq // 8 when larger)

_compiled_flex: Callable | None = None
_warned: set[str] = set()


@dataclass(frozen=True)
class Softmax:
    """How scores become weights, besides the scheme and the visibility rule."""

    scale: float | None = None  # the factor on q k^T; default 1 / sqrt(Dh)
    softcap: float | None = None  # c * tanh(s / c) before bias and mask (Gemma 2)
    sink_logits: Tensor | None = None  # [H]: one extra logit per head in each denominator
    dropout_p: float = 0.0

    @property
    def plain(self) -> bool:
        """No cap and no sink logit: SDPA's own softmax serves."""
        return self.softcap is None and self.sink_logits is None


PLAIN = Softmax()


def check_softmax(
    q: Tensor, scale: object, softcap: object, sink_logits: object, dropout_p: float = 0.0
) -> Softmax:
    """Check ``scale``, ``softcap`` and ``sink_logits`` (``dropout_p`` comes checked)."""
    if scale is None and softcap is None and sink_logits is None:
        return PLAIN if dropout_p == 0.0 else Softmax(dropout_p=dropout_p)
    scale = None if scale is None else check_float("scale", scale, positive=True)
    softcap = None if softcap is None else check_float("softcap", softcap, positive=True)
    if sink_logits is not None:
        check_tensor("sink_logits", sink_logits, floating=True)
        assert isinstance(sink_logits, Tensor)
        if tuple(sink_logits.shape) != (q.shape[1],):
            raise ValueError(
                f"sink_logits must have shape [{q.shape[1]}] (one logit per query head), got "
                f"{tuple(sink_logits.shape)}"
            )
        if not is_compiling() and bool((sink_logits.isnan() | (sink_logits == float("inf"))).any()):
            raise ValueError(
                f"sink_logits must be finite or -inf (no sink), got {sink_logits.tolist()}"
            )
        sink_logits = sink_logits.to(q.device)
    return Softmax(scale, softcap, sink_logits, dropout_p)


# ---- the decision ------------------------------------------------------------------------


class Route(NamedTuple):
    """Which backend runs a call, and why it is not the one asked for ("" when it is)."""

    backend: str
    reason: str = ""
    warning: str | None = None  # the key of the once-per-process warning to give


_WARNINGS = {
    "flex-sink": "backend='flex' with sink_logits: FlexAttention's log-sum-exp is not compiled "
                 "on CPU, so these calls run on 'sdpa' (an extra key per head)",
    "cpu-grad": "FlexAttention has no backward on CPU; using 'sdpa' while training",
}


def effective_backend(
    requested: str, softmax: Softmax, *, path: str, device_type: str = "cpu",
    needs_grad: bool = False,
) -> Route:
    """The backend that runs a call on ``path`` (``"one_query"``, ``"fast"`` or ``"rule"``),
    from plain facts: a pure function, the one table of fallbacks (see the module's text)."""
    route = Route(requested)
    if requested == "flex":
        if softmax.sink_logits is not None:  # the fast paths take no sink logit
            route = Route("sdpa", "sink logits: CPU FlexAttention returns no log-sum-exp",
                          "flex-sink")
        elif softmax.dropout_p != 0.0:
            route = Route("sdpa", "dropout: FlexAttention applies none")
        elif needs_grad and device_type == "cpu":
            route = Route("sdpa", "training on the CPU: FlexAttention has no backward there",
                          "cpu-grad")
    if route.backend == "sdpa" and softmax.softcap is not None and path == "rule":
        why = "softcap: SDPA cannot cap its scores"
        return Route("math", f"{route.reason}; then {why}" if route.reason else why,
                     route.warning)
    return route


def needs_grad(q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme) -> bool:
    """Whether this call records gradients (of q, k, v or the scheme's parameters)."""
    grads = any(t.requires_grad for t in (q, k, v)) or any(p.requires_grad for p in scheme.parameters())
    return torch.is_grad_enabled() and grads


def _route(requested: str, softmax: Softmax, path: str, q: Tensor, k: Tensor, v: Tensor,
           scheme: PositionScheme) -> str:
    """:func:`effective_backend` for this call, with its once-per-process warning given."""
    route = effective_backend(
        requested, softmax, path=path, device_type=q.device.type,
        needs_grad=requested == "flex" and needs_grad(q, k, v, scheme),
    )
    if route.warning is not None and route.warning not in _warned:
        warn_caller(_WARNINGS[route.warning])
        _warned.add(route.warning)
    return route.backend


# ---- the kernels -------------------------------------------------------------------------


def flex_fn() -> Callable:
    """FlexAttention, compiled once (called as is inside a compiled region)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if is_compiling():
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def repeat_kv(t: Tensor, groups: int) -> Tensor:
    """``[B, H_kv, T, D] -> [B, H_kv * groups, T, D]``: query head ``h`` reads kv head
    ``h // groups`` (transformers' ``repeat_kv``)."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _grouped(q: Tensor, k: Tensor) -> bool:
    """Whether k/v carry fewer heads than q, as a Python bool: under ``torch.compile`` with
    dynamic shapes the comparison is a ``SymBool``, which SDPA's ``enable_gqa`` refuses; the
    branch makes dynamo guard on it and pass a constant."""
    if q.shape[1] != k.shape[1]:
        return True
    return False


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0, *,
         is_causal: bool = False, scale: float | None = None) -> Tensor:
    """torch's SDPA, grouped-query heads through ``enable_gqa``."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=_grouped(q, k),
    )


def math(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, allowed: Tensor | None,
    softmax: Softmax = PLAIN, *, float32_softmax: bool = True,
) -> Tensor:
    """The written-out softmax: ``q k^T * scale``, capped, plus the bias, masked (``allowed``),
    with the sink logit in the denominator. The weights are computed (and dropped out) in
    float32, or with ``float32_softmax=False`` in q's dtype, as the fast path always has (the
    two differ under dropout in half precision: kept until a measured change unifies them)."""
    g = q.shape[1] // k.shape[1]
    s = q @ repeat_kv(k, g).transpose(-2, -1)  # [B, H, Lq, Lk]
    s = s / _m.sqrt(q.shape[-1]) if softmax.scale is None else s * softmax.scale
    if softmax.softcap is not None:
        s = torch.tanh(s.float() / softmax.softcap) * softmax.softcap
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    if not float32_softmax:
        return F.dropout(s.softmax(dim=-1), p=softmax.dropout_p) @ repeat_kv(v, g)
    if softmax.sink_logits is not None:
        sink = softmax.sink_logits.float()[None, :, None, None].expand(*s.shape[:-1], 1)
        probs = torch.cat([s.float(), sink], dim=-1).softmax(dim=-1)[..., :-1]  # sink dropped
    else:
        probs = s.float().softmax(dim=-1)
    probs = F.dropout(probs, p=softmax.dropout_p).to(q.dtype)
    return probs @ repeat_kv(v, g)  # [B, H, Lq, Dv]


def sdpa_with_sink(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, softmax: Softmax) -> Tensor:
    """SDPA with gpt-oss's sink logit: one extra key whose score is 0 plus the head's logit in
    the float mask, and whose value is 0, so it only adds to the denominator."""
    assert softmax.sink_logits is not None
    B, H, Lq = q.shape[0], q.shape[1], q.shape[-2]
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    mask = mask.expand(B, H, Lq, -1)  # [B, H, Lq, Lk]
    sink = softmax.sink_logits.to(q.dtype)[None, :, None, None].expand(B, H, Lq, 1)
    mask = torch.cat([mask, sink], dim=-1)  # [B, H, Lq, Lk + 1]
    k = torch.cat([k, k.new_zeros(*k.shape[:-2], 1, k.shape[-1])], dim=-2)
    v = torch.cat([v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1])], dim=-2)
    return sdpa(q, k, v, mask, softmax.dropout_p, scale=softmax.scale)


def chunks_pay(q: Tensor) -> bool:
    """Whether a causal float mask runs in blocks (:func:`sdpa_causal_chunks`): a long pass on
    one CPU thread, not compiling."""
    return (q.device.type == "cpu" and q.shape[-2] >= 2 * CAUSAL_CHUNK and not is_compiling()
            and torch.get_num_threads() == 1)


def sdpa_causal_chunks(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float, scale: float | None = None
) -> Tensor:
    """SDPA with a causal float mask, one block of queries at a time against the keys up to the
    block's last query: the keys after it are ``-inf`` anyway. SDPA's CPU kernel skips the
    future only with ``is_causal``, which takes no bias; this skips it for a biased mask, about
    half the work for a long pass (blocks of ``max(128, Lq // 8)`` queries). Used with one
    thread only: with two threads on a busy 2-core machine every extra SDPA call is another
    point where one thread waits for the other, and the blocks measured 1.4-2.4x slower than
    one call (benchmarks/README.md)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    off, chunk = k_len - q_len, max(CAUSAL_CHUNK, q_len // 8)
    out = []
    for s in range(0, q_len, chunk):
        e = min(s + chunk, q_len)
        ke = off + e  # keys visible to the block's last query
        out.append(sdpa(q[:, :, s:e], k[:, :, :ke], v[:, :, :ke], mask[..., s:e, :ke], dropout_p,
                        scale=scale))  # [B, H, e - s, Dv]
    return torch.cat(out, dim=-2)  # [B, H, Lq, Dv]


# ---- the scheme's bias, per backend (index- or position-based) ---------------------------


def _check_heads(scheme: PositionScheme, heads: int, H: int) -> None:
    if heads not in (1, H):
        raise ValueError(f"scheme {scheme.name!r} has a bias for {heads} heads but q has {H} heads")


def index_mask(scheme: PositionScheme, q: Tensor, k_len: int, causal: bool) -> Tensor | None:
    """The fast path's dense bias: the scheme's cached ``[1, H, Lq, Lk]`` float mask (causal
    ``-inf`` included) for queries at the end of the keys, or None."""
    if type(scheme).attn_mask is PositionScheme.attn_mask and not scheme.has_bias:
        return None  # no bias: the base class's attn_mask gives None
    mask = scheme.attn_mask(q.shape[-2], k_len, causal=causal, dtype=q.dtype, device=q.device)
    if mask is not None:
        _check_heads(scheme, mask.shape[1], q.shape[1])
    return mask


def index_score_mod(scheme: PositionScheme, q: Tensor, k_len: int, causal: bool) -> Callable | None:
    """The fast path's ``score_mod``: the scheme's index form, else its position form over the
    default positions (e.g. T5), else refused for a bias scheme."""
    q_len = q.shape[-2]
    score_mod = scheme.score_mod(k_len - q_len) if causal else None  # it has no causal flag
    if score_mod is None and scheme.has_bias:  # T5, non-causal ALiBi: from default positions
        B = q.shape[0]
        q_pos = torch.arange(k_len - q_len, k_len, device=q.device).expand(B, q_len)
        score_mod = scheme.position_score_mod(
            q_pos, torch.arange(k_len, device=q.device).expand(B, k_len), causal=causal
        )
    if score_mod is None and not causal:  # a scheme with the index form only
        score_mod = scheme.score_mod(k_len - q_len)
    if score_mod is None and scheme.has_bias:
        raise ValueError(f"backend='flex' needs a score_mod; scheme {scheme.name!r} has none")
    return score_mod


def position_bias_or_index(
    scheme: PositionScheme, rule: Visibility, H: int, index_bias: bool
) -> Tensor | None:
    """The rule's dense bias, float32 ``[B | 1, H, Lq, Lk]`` or None: from the positions, else
    (``index_bias``: the keys are the slots ``0..Lk-1``) from the scheme's index form."""
    bias = scheme.position_bias(rule.q_pos, rule.k_pos, causal=rule.causal)  # [B, H, Lq, Lk]
    if bias is None and scheme.has_bias:  # a scheme with an index-only bias(q_len, k_len)
        if not index_bias:
            raise ValueError(
                f"scheme {scheme.name!r} defines bias(q_len, k_len) but not position_bias, so it "
                "cannot follow key_positions, a static cache or an evicting cache"
            )
        index = scheme.bias(rule.q_pos.shape[-1], rule.k_pos.shape[-1], causal=rule.causal)
        if index is not None:
            bias = index[None].to(torch.float32)  # [1, H, Lq, Lk]
    if bias is not None:
        _check_heads(scheme, bias.shape[1], H)
    return bias


def position_score_mod_or_refuse(
    scheme: PositionScheme, rule: Visibility, softcap: float | None
) -> Callable | None:
    """The rule's ``score_mod`` from the positions, after Gemma 2's cap ``c * tanh(s / c)``;
    a bias scheme without one is refused."""
    score_mod = scheme.position_score_mod(rule.q_pos, rule.k_pos, causal=rule.causal)
    if score_mod is None and scheme.has_bias:
        raise ValueError(f"backend='flex' needs a score_mod; scheme {scheme.name!r} has none")
    if softcap is None:
        return score_mod

    def capped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        score = torch.tanh(score / softcap) * softcap
        return score if score_mod is None else score_mod(score, b, h, q_idx, kv_idx)

    return capped


def square_mask(
    scheme: PositionScheme, n: int, causal: bool, dtype: torch.dtype, device: torch.device
) -> Tensor | None:
    """The float mask ``[1, H, n, n]`` of one sequence at positions ``0..n-1`` (varlen's
    groups): the scheme's cached index form, else its position form with causal ``-inf``."""
    mask = scheme.attn_mask(n, n, causal=causal, dtype=dtype, device=device)  # [1, H, n, n]
    if mask is None:  # a scheme whose bias is written from positions only
        p = torch.arange(n, device=device)[None]  # [1, n]
        bias = scheme.position_bias(p, p, causal=causal)  # [1, H, n, n] or None
        if bias is not None:
            hidden = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
            mask = (bias.masked_fill(hidden, float("-inf")) if causal else bias).to(dtype)
    return mask


# ---- the three runs ----------------------------------------------------------------------


def run_one_query(
    q: Tensor, k: Tensor, v: Tensor, key_valid: Tensor | None, backend: str, softmax: Softmax
) -> Tensor:
    """A decode step of one query after every key, with no bias: causality and an eviction
    change nothing, so the rule is which keys are real and near (``key_valid [1 | B, Lk]``:
    padding the cache remembers, a static cache's written slots, the window): no
    ``[B, 1, Lq, Lk]`` rule to build."""
    mask = None if key_valid is None else key_valid[:, None, None, :]  # [1 | B, 1, 1, Lk]
    if effective_backend(backend, softmax, path="one_query").backend == "math":
        return math(q, k, v, None, mask, softmax)
    return sdpa(q, k, v, mask, softmax.dropout_p, scale=softmax.scale)


def run_fast(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme, causal: bool, backend: str,
    softmax: Softmax,
) -> Tensor:
    """No padding, documents, window or moved keys: SDPA's ``is_causal`` or the scheme's cached
    ``[1, H, Lq, Lk]`` bias (queries are the last ``Lq`` keys, so every row sees a key)."""
    q_len, k_len, scale = q.shape[-2], k.shape[-2], softmax.scale
    chosen = _route(backend, softmax, "fast", q, k, v, scheme)
    if chosen == "flex":
        score_mod = index_score_mod(scheme, q, k_len, causal)
        block_mask = causal_block_mask(q_len, k_len, q.device) if causal else None
        return flex_fn()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                         enable_gqa=_grouped(q, k))
    mask = index_mask(scheme, q, k_len, causal)
    if chosen == "math":
        allowed = causal_mask(q_len, k_len, q.device) if causal and mask is None else None
        return math(q, k, v, mask, allowed, softmax, float32_softmax=False)
    if mask is None:
        if causal and q_len == k_len:
            return sdpa(q, k, v, None, softmax.dropout_p, is_causal=True, scale=scale)
        mask = causal_mask(q_len, k_len, q.device) if causal else None  # [Lq, Lk] bool
    elif causal and chunks_pay(q):
        g = q.shape[1] // k.shape[1]  # repeated k/v here, as always (varlen: enable_gqa)
        return sdpa_causal_chunks(q, repeat_kv(k, g), repeat_kv(v, g), mask, softmax.dropout_p,
                                  scale)
    return sdpa(q, k, v, mask, softmax.dropout_p, scale=scale)


@dataclass(frozen=True)
class RuleFacts:
    """What a run under a rule may assume: ``index_bias``, the keys are the slots
    ``0..Lk-1`` (an index-only bias fits); ``may_be_empty``, some row may see no key (a mask
    was given, keys have positions of their own, a who-sees-whom matrix)."""

    index_bias: bool = True
    may_be_empty: bool = True


def run_by_rule(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme, rule: Visibility, softmax: Softmax,
    backend: str, facts: RuleFacts,
) -> Tensor:
    """Attention under a visibility rule: FlexAttention with a ``BlockMask`` and ``score_mod``,
    or one dense mask for SDPA / the written-out softmax. A row that sees no key is zeros."""
    chosen = _route(backend, softmax, "rule", q, k, v, scheme)
    if chosen == "flex":
        score_mod = position_score_mod_or_refuse(scheme, rule, softmax.softcap)
        return flex_fn()(q, k, v, score_mod=score_mod, block_mask=block_visibility(rule),
                         scale=softmax.scale, enable_gqa=_grouped(q, k))
    allowed = dense_visibility(rule)  # [B, 1, Lq, Lk]
    # eager SDPA on the CPU gives a row that sees no key zeros and zero gradients itself
    zeroes = (chosen == "sdpa" and softmax.sink_logits is None and q.device.type == "cpu"
              and not is_compiling())
    empty = ~allowed.any(-1, keepdim=True) if facts.may_be_empty and not zeroes else None
    if empty is not None:  # [B, 1, Lq, 1]
        allowed = allowed | empty  # a row that sees no key attends to every key, then is zeroed
    bias = position_bias_or_index(scheme, rule, q.shape[1], facts.index_bias)
    if chosen == "math":
        out = math(q, k, v, bias, allowed, softmax)
    else:
        mask = allowed if bias is None else bias.masked_fill(~allowed, float("-inf")).to(q.dtype)
        if softmax.sink_logits is not None:
            out = sdpa_with_sink(q, k, v, mask, softmax)
        else:
            out = sdpa(q, k, v, mask, softmax.dropout_p, scale=softmax.scale)
    return out if empty is None else out.masked_fill(empty, 0.0)  # [B, H, Lq, Dv]
