"""Multi-head attention that takes any position scheme and calls its hooks.

``attend`` is the functional core: rotate (RoPE), append to the KV cache, add the bias (ALiBi,
T5), mask, softmax. ``MultiHeadAttention`` wraps it with the q/k/v/out projections. The
``embed`` hook (sinusoidal, learned) acts on the token embeddings, so the model calls it once
before the first block; attention never changes when a scheme is added.

Backends: ``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention``, the default),
``"math"`` (the written-out ``softmax(q k^T / sqrt(d) + b) v``, for teaching and tests) and
``"flex"`` (``torch.nn.attention.flex_attention`` with the scheme's ``score_mod``, compiled with
``torch.compile`` so that no ``[L, L]`` bias is ever built; Dong et al., 2024). Where
FlexAttention is missing (torch < 2.5) ``"flex"`` warns once and falls back to ``"sdpa"``.
Masks use ``-inf`` through SDPA, never ``masked_fill(-1e9)``, which overflows in float16.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_float, check_int, check_positions, check_tensor
from .alibi import _check_bool
from .schemes import NoPE, PositionScheme, make_scheme

BACKENDS = ("sdpa", "math", "flex")


class KVCache:
    """Keys and values of the tokens seen so far, ``[B, H, T, Dh]``; keys are stored rotated."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new ``k, v [B, H, L, Dh]``; return all keys and values so far."""
        for name, t in (("k", k), ("v", v)):
            check_tensor(name, t, floating=True)
            if t.dim() != 4:
                raise ValueError(f"{name} must have shape [B, H, L, Dh], got {tuple(t.shape)}")
        if k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
            raise ValueError(
                f"k and v must have the same shape, dtype and device, got {tuple(k.shape)} "
                f"{k.dtype} {k.device} and {tuple(v.shape)} {v.dtype} {v.device}"
            )
        if self.k is None or self.v is None:
            self.k, self.v = k, v
        else:
            if k.shape[:-2] != self.k.shape[:-2] or k.shape[-1] != self.k.shape[-1]:
                raise ValueError(
                    f"new k {tuple(k.shape)} does not match the cached keys {tuple(self.k.shape)} "
                    "(batch, heads and head_dim must agree)"
                )
            if k.dtype != self.k.dtype or k.device != self.k.device:
                raise ValueError(
                    f"new k is {k.dtype} on {k.device}, the cache holds {self.k.dtype} on {self.k.device}"
                )
            self.k, self.v = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
        return self.k, self.v


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
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # [Lq, 1]
    return torch.arange(k_len, device=device)[None, :] <= i  # [Lq, Lk]


_compiled_flex: Callable | None = None
_warned: set[str] = set()
FLEX_BLOCK = 128  # FlexAttention's tile size


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        warnings.warn(message, stacklevel=4)
        _warned.add(key)


def _autocast(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no device type
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def causal_block_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> Any:
    """A FlexAttention ``BlockMask`` for a causal mask with queries at the end of the keys.

    Built tile by tile from ``[Lq / 128, Lk / 128]`` block tables, so it never evaluates the
    mask on the full ``[Lq, Lk]`` grid (``create_block_mask`` in eager mode does, with int64
    index tensors of that size).
    """
    from torch.nn.attention.flex_attention import BlockMask

    q_len, k_len = _check_lengths(q_len, k_len)
    off, n = k_len - q_len, FLEX_BLOCK
    q_lo = torch.arange(0, q_len, n, device=device) + off  # [Nq] first query position per tile
    q_hi = (q_lo - off + n).clamp(max=q_len) - 1 + off  # [Nq] last query position per tile
    k_lo = torch.arange(0, k_len, n, device=device)  # [Nk]
    k_hi = (k_lo + n).clamp(max=k_len) - 1  # [Nk]
    full = k_hi[None, :] <= q_lo[:, None]  # [Nq, Nk] every key visible to every query
    partial = (k_lo[None, :] <= q_hi[:, None]) & ~full  # [Nq, Nk] the diagonal tiles

    def table(sel: Tensor) -> tuple[Tensor, Tensor]:
        counts = sel.sum(-1, dtype=torch.int32)  # [Nq]
        order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # selected first
        return counts[None, None], order[None, None]  # [1, 1, Nq], [1, 1, Nq, Nk]

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx + off >= kv_idx

    kv_num, kv_idx = table(partial)
    full_num, full_idx = table(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=n, mask_mod=mask_mod, seq_lengths=(q_len, k_len)
    )


def _flex(q: Tensor, k: Tensor, v: Tensor, score_mod: Callable | None, causal: bool) -> Tensor | None:
    """FlexAttention, compiled once; ``None`` where this torch has none."""
    global _compiled_flex
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        _warn_once("import", f"backend='flex' needs torch >= 2.5 (this is {torch.__version__}); using 'sdpa'")
        return None
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if needs_grad and q.device.type == "cpu":
        _warn_once("cpu-grad", "FlexAttention has no backward on CPU; using 'sdpa' while training")
        return None
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    block_mask = causal_block_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return _compiled_flex(q, k, v, score_mod=score_mod, block_mask=block_mask)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: PositionScheme | None = None,
    *,
    causal: bool = True,
    positions: Tensor | None = None,
    cache: KVCache | None = None,
    backend: str = "sdpa",
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention over ``q, k, v [B, H, L, Dh]`` with a position scheme; returns ``[B, H, L, Dh]``.

    ``positions`` (``[L]`` or ``[B, L]``) default to ``len(cache) + arange(L)``. With a ``cache``
    the new keys/values are appended and the queries attend to everything cached. A bias scheme
    (ALiBi, T5) hands SDPA one ``[1, H, Lq, Lk]`` float mask with the causal mask folded in
    (``PositionScheme.attn_mask``, cached per shape), so SDPA takes its fused path.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape [B, H, L, Dh], got {tuple(t.shape)}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q, k, v must agree in batch, heads and head_dim (k and v fully), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"q and k must hold the same new tokens, got {q.shape[-2]} and {k.shape[-2]}; "
            "earlier keys belong in the cache"
        )
    if scheme is not None and not isinstance(scheme, PositionScheme):
        raise TypeError(f"scheme must be a PositionScheme or None, got {type(scheme).__name__}")
    if cache is not None and not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    causal = _check_bool("causal", causal)
    dropout_p = _check_dropout("dropout_p", dropout_p)
    scheme = scheme if scheme is not None else _NOPE
    offset = len(cache) if cache is not None else 0
    if positions is None:
        positions = torch.arange(offset, offset + q.shape[-2], device=q.device)  # [L]
    check_positions("positions", positions)

    q, k = scheme.rotate(q, k, positions)  # [B, H, L, Dh]
    if cache is not None:
        k, v = cache.update(k, v)  # [B, H, T, Dh]
    q_len, k_len = q.shape[-2], k.shape[-2]

    if backend == "flex" and dropout_p == 0.0:
        score_mod = scheme.score_mod(k_len - q_len)
        if score_mod is None and scheme.bias(1, 1) is not None:
            raise ValueError(f"backend='flex' needs a score_mod; scheme {scheme.name!r} has none")
        out = _flex(q, k, v, score_mod, causal)
        if out is not None:
            return out

    mask = scheme.attn_mask(q_len, k_len, causal=causal, dtype=q.dtype, device=q.device)
    if mask is not None and mask.shape[1] not in (1, q.shape[1]):  # [1, H, Lq, Lk]
        raise ValueError(
            f"scheme {scheme.name!r} has a bias for {mask.shape[1]} heads but q has {q.shape[1]} heads"
        )
    if backend == "math":
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, Lq, Lk]
        if mask is not None:
            scores = scores + mask
        elif causal:
            scores = scores.masked_fill(~causal_mask(q_len, k_len, q.device), float("-inf"))
        probs = F.dropout(scores.softmax(dim=-1), p=dropout_p)
        return probs @ v

    if mask is None:
        if causal and q_len == k_len:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        mask = causal_mask(q_len, k_len, q.device) if causal else None  # [Lq, Lk] bool
    elif causal and q.device.type == "cpu" and q_len >= 2 * CAUSAL_CHUNK and torch.get_num_threads() == 1:
        return _sdpa_causal_chunks(q, k, v, mask, dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


CAUSAL_CHUNK = 128


def _sdpa_causal_chunks(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float) -> Tensor:
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
        out.append(F.scaled_dot_product_attention(
            q[:, :, s:e], k[:, :, :ke], v[:, :, :ke], attn_mask=mask[..., s:e, :ke], dropout_p=dropout_p,
        ))  # [B, H, e - s, Dh]
    return torch.cat(out, dim=-2)  # [B, H, Lq, Dh]


def _check_dropout(name: str, value: object) -> float:
    value = check_float(name, value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


_NOPE = NoPE()


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention ``[B, L, D] -> [B, L, D]`` with a position scheme.

    ``scheme`` is a name (see ``make_scheme``) or a ``PositionScheme`` shared with the model.
    The ``embed`` hook is *not* applied here: the model adds it to the token embeddings.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
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
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.head_dim = dim // num_heads
        self.causal, self.backend = _check_bool("causal", causal), backend
        self.dropout = _check_dropout("dropout", dropout)
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
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(
        self, x: Tensor, *, positions: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        """Attend over ``x [B, L, D]``; returns ``[B, L, D]``.

        ``positions`` (``[L]`` or ``[B, L]``, integer) are the tokens' positions, by default
        ``len(cache) + arange(L)``. With a ``cache`` (a :class:`KVCache`, one per layer) the new
        keys and values are appended to it and the queries see every cached token: decoding one
        token at a time gives the outputs of one full pass. The scheme's ``embed`` hook is the
        model's job, not this layer's. Dropout on the attention weights acts in training mode.

        Raises:
            TypeError: ``x`` is not a floating-point tensor, ``positions`` not an integer
                tensor, ``cache`` not a :class:`KVCache`.
            ValueError: ``x`` is not ``[B, L, dim]``; ``positions`` has the wrong shape or a
                negative entry; ``cache`` holds keys of another batch, head count or head size.
        """
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape [B, L, {self.dim}], got {tuple(x.shape)}")
        w = self.qkv.weight
        if x.dtype != w.dtype and not _autocast(x.device.type):  # autocast mixes them on purpose
            raise TypeError(
                f"x must have the layer's dtype {w.dtype}, got {x.dtype}; cast one of them "
                f"(x.to({w.dtype}) or layer.to({x.dtype}))"
            )
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, L, Dh]
        y = attend(
            q, k, v, self.scheme, causal=self.causal, positions=positions, cache=cache,
            backend=self.backend, dropout_p=self.dropout if self.training else 0.0,
        )  # [B, H, L, Dh]
        return self.proj(y.transpose(1, 2).flatten(2))  # [B, L, D]
