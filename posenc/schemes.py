"""Position schemes as objects with hooks.

A scheme can enter attention at exactly one of three places:

==========  =======================================  ============================
hook        what changes                             schemes
==========  =======================================  ============================
``embed``   the input ``x + P[pos]``                 sinusoidal, learned absolute
``rotate``  queries and keys ``R(pos) q, R(pos) k``  RoPE
``bias``    the logits ``s_ij + b_h(i, j)``          ALiBi, T5 relative bias
==========  =======================================  ============================

NoPE (Kazemnejad et al., 2023) uses none of them. Attention calls ``rotate`` and ``bias``; the
model calls ``embed`` once on the token embeddings. Adding a scheme never touches attention.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ._checks import check_bool, check_dtype, check_int, check_tensor, is_compiling
from .alibi import _check_lengths, _distance, alibi_bias, alibi_score_mod, alibi_slopes
from .learned import LearnedPositionalEmbedding
from .rope import RotaryEmbedding
from .sinusoidal import SinusoidalPositionalEmbedding
from .t5 import T5RelativeBias, t5_relative_bucket

SCHEMES = ("sinusoidal", "learned", "rope", "alibi", "t5", "nope")
"""The names ``make_scheme`` accepts."""


def _check_kwargs(owner: str, target: Callable, kwargs: Mapping, taken: tuple[str, ...] = ()) -> None:
    """Raise TypeError for a keyword argument ``target`` does not take (or ``owner`` sets itself)."""
    params = inspect.signature(target).parameters
    allowed = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY and n not in taken]
    for key in kwargs:
        if key not in allowed:
            raise TypeError(
                f"{owner} got an unexpected keyword argument {key!r}; "
                f"allowed: {', '.join(allowed) or 'none'}"
            )


def _fold_causal(bias: Tensor, q_len: int, k_len: int) -> Tensor:
    """``-inf`` on the future keys of ``bias [..., q_len, k_len]`` (queries are the last keys)."""
    future = torch.ones(q_len, k_len, dtype=torch.bool, device=bias.device).triu(k_len - q_len + 1)
    return bias.masked_fill(future, float("-inf"))


class PositionScheme(nn.Module):
    """Base class; on its own it is NoPE: every hook is the identity.

    Subclasses implement ``embed``, ``rotate`` or ``bias``. Attention asks for ``attn_mask``, the
    bias with the causal mask folded in, shaped for SDPA; the default builds it from ``bias`` on
    every call, the bias schemes here cache it.
    """

    name = "nope"
    num_heads: int | None = None
    """The number of heads a per-head bias is built for (ALiBi, T5), None for other schemes.
    Attention refuses a ``q`` with another head count."""

    def __init__(self) -> None:
        super().__init__()

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, L, D]`` at ``positions [L]`` or ``[B, L]`` -> ``[B, L, D]``."""
        check_tensor("x", x, floating=True)
        return x

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor, key_positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``q [B, H, Lq, Dh]`` at ``positions`` and ``k [B, H_kv, Lk, Dh]`` at ``key_positions``
        (default: ``positions``, then ``Lk == Lq``) -> rotated ``q, k``."""
        check_tensor("q", q, floating=True)
        check_tensor("k", k, floating=True)
        return q, k

    @property
    def has_bias(self) -> bool:
        """True when the scheme adds a logit bias (it overrides ``bias``)."""
        return type(self).bias is not PositionScheme.bias

    def position_bias(self, q_pos: Tensor, k_pos: Tensor, *, causal: bool = True) -> Tensor | None:
        """The bias from positions: ``q_pos [B, Lq]``, ``k_pos [B, Lk]`` -> ``[B, H, Lq, Lk]``
        float32 (``None`` without a bias). Masking is the caller's job."""
        return None

    def position_score_mod(self, q_pos: Tensor, k_pos: Tensor, *, causal: bool = True) -> Callable | None:
        """``position_bias`` as a FlexAttention ``score_mod`` (positions ``[B, L]``)."""
        return None

    def bias(self, q_len: int, k_len: int, *, causal: bool = True) -> Tensor | None:
        """Additive logit bias ``[H, q_len, k_len]`` (queries are the last ``q_len`` keys)."""
        _check_lengths(q_len, k_len)
        return None

    def attn_mask(
        self,
        q_len: int,
        k_len: int,
        *,
        causal: bool = True,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Tensor | None:
        """The float mask SDPA takes: ``bias`` plus ``-inf`` on future keys when ``causal``,
        ``[1, H, q_len, k_len]`` in ``dtype``; ``None`` when the scheme has no bias."""
        q_len, k_len = _check_lengths(q_len, k_len)
        causal = check_bool("causal", causal)
        dtype = check_dtype("dtype", dtype) or torch.float32
        bias = self.bias(q_len, k_len, causal=causal)  # [H, Lq, Lk] or None
        if bias is None:
            return None
        bias = bias.to(device=device, dtype=torch.float32)
        if causal:
            bias = _fold_causal(bias, q_len, k_len)
        return bias.to(dtype)[None]  # [1, H, Lq, Lk]

    def score_mod(self, q_offset: int) -> Callable | None:
        """The same bias as a FlexAttention ``score_mod``, if the scheme has one."""
        return None


class NoPE(PositionScheme):
    """No position information: only a causal mask, if any, tells tokens apart."""


class SinusoidalPE(PositionScheme):
    """Vaswani et al. (2017): the fixed sinusoidal table added to the input."""

    name = "sinusoidal"

    def __init__(self, dim: int, **kwargs: Any) -> None:
        super().__init__()
        _check_kwargs("SinusoidalPE", SinusoidalPositionalEmbedding, kwargs)
        self.pe = SinusoidalPositionalEmbedding(dim, **kwargs)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.pe(x, positions=positions)


class LearnedPE(PositionScheme):
    """A trained vector per absolute slot, added to the input (GPT-2, BERT)."""

    name = "learned"

    def __init__(self, dim: int, max_len: int, **kwargs: Any) -> None:
        super().__init__()
        _check_kwargs("LearnedPE", LearnedPositionalEmbedding, kwargs)
        self.pe = LearnedPositionalEmbedding(max_len, dim, **kwargs)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.pe(x, positions=positions)


class RoPE(PositionScheme):
    """Su et al. (2021): rotate queries and keys by their positions.

    The keyword arguments go to :class:`~posenc.rope.RotaryEmbedding`. Its default layout is
    ``interleaved=True``: channel pairs ``(0, 1), (2, 3), ...`` (RoFormer, Meta's LLaMA code).
    Hugging Face models (Llama, Qwen, Mistral) rotate ``(i, i + d/2)``: pass
    ``interleaved=False`` for their weights (the two layouts give different answers)."""

    name = "rope"

    def __init__(self, head_dim: int, **kwargs: Any) -> None:
        super().__init__()
        _check_kwargs("RoPE", RotaryEmbedding, kwargs)
        self.rotary = RotaryEmbedding(head_dim, **kwargs)

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor, key_positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        if key_positions is None or key_positions is positions:
            return self.rotary(q, k, positions=positions)
        return self.rotary(q, k, positions=positions, key_positions=key_positions)


MASK_CACHE_BYTES = 256 << 20
"""The largest bias mask a scheme keeps between calls, in bytes: an int >= 0 (default 256 MiB:
8 heads at L = 2896 in float32). A longer pass builds its mask per call and frees it; for long
sequences the ``flex`` backend never builds one at all. Set it to 0 to cache nothing. A scheme's
own ``cache_bytes`` (an int >= 0, or None: use this one) overrides it.

Set it on this module, ``posenc.schemes.MASK_CACHE_BYTES = 0``: the package ``posenc`` holds no
copy, and ``posenc.MASK_CACHE_BYTES = 0`` raises rather than create a name nothing reads."""


def _check_budget(name: str, value: object) -> int:
    """A mask-cache budget: an int of bytes >= 0 (0 caches nothing)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int number of bytes >= 0 (0: cache no mask), got {value!r} "
            f"({type(value).__name__})"
        )
    if value < 0:
        raise ValueError(f"{name} must be an int number of bytes >= 0 (0: cache no mask), got {value}")
    return value


class _CachedMask(PositionScheme):
    """A bias that depends on ``j - i`` only: one ``[1, H, S, S]`` mask, built for the longest
    full pass seen, serves every ``(q_len, k_len)`` with ``k_len <= S`` as a slice (the KV-cache
    rows are its last rows). It is rebuilt when ``dtype``, ``device``, ``causal`` or the
    parameters change, and never kept while it would carry a gradient or while compiling. It
    costs ``H * S * S`` elements (32 MiB for 8 heads at S = 1024 in float32) and is kept only
    under ``MASK_CACHE_BYTES`` (or the scheme's ``cache_bytes``); ``clear_cache()`` frees it."""

    _mask: tuple[tuple, Tensor] | None = None
    _cache_bytes: int | None = None

    @property
    def cache_bytes(self) -> int | None:
        """This scheme's mask-cache budget in bytes (an int >= 0), or None: use
        ``posenc.schemes.MASK_CACHE_BYTES``."""
        return self._cache_bytes

    @cache_bytes.setter
    def cache_bytes(self, value: int | None) -> None:
        self._cache_bytes = None if value is None else _check_budget("cache_bytes", value)

    def clear_cache(self) -> None:
        """Drop the cached mask (it is rebuilt on the next call)."""
        self._mask = None

    def _build(self, q_len: int, k_len: int, causal: bool, device: torch.device) -> Tensor:
        raise NotImplementedError  # [H, Lq, Lk] float32, causal mask folded in

    def _params_version(self) -> tuple:
        return ()

    def attn_mask(
        self,
        q_len: int,
        k_len: int,
        *,
        causal: bool = True,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Tensor:
        q_len, k_len = _check_lengths(q_len, k_len)
        causal = check_bool("causal", causal)
        dtype = check_dtype("dtype", dtype) or torch.float32
        device = torch.device(device) if device is not None else self._device()
        if is_compiling() or (
            any(p.requires_grad for p in self.parameters()) and torch.is_grad_enabled()
        ):
            return self._build(q_len, k_len, causal, device).to(dtype)[None]  # not cached
        key = (bool(causal), dtype, device, torch.is_inference_mode_enabled(), self._params_version())
        if self._mask is not None and self._mask[0] == key and self._mask[1].shape[-1] >= k_len:
            return self._mask[1][:, :, k_len - q_len : k_len, :k_len]  # [1, H, Lq, Lk]
        mask = self._build(q_len, k_len, causal, device).to(dtype)[None]  # [1, H, Lq, Lk]
        if self._cache_bytes is None:
            budget = _check_budget("posenc.schemes.MASK_CACHE_BYTES", MASK_CACHE_BYTES)
        else:
            budget = self._cache_bytes
        if q_len == k_len and mask.numel() * mask.element_size() <= budget:
            self._mask = (key, mask)
        return mask

    def _device(self) -> torch.device:
        raise NotImplementedError


class ALiBi(_CachedMask):
    """Press et al. (2022): a per-head linear penalty ``-m_h (i - j)`` on the logits.

    ``attn_mask`` caches the bias with the causal mask folded in for the longest full pass seen,
    ``[1, H, S, S]``, and slices it for shorter passes and KV-cache rows (``clear_cache()``).
    """

    name = "alibi"
    num_heads: int
    slopes: Tensor  # [H]

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)  # [H]

    def bias(self, q_len: int, k_len: int, *, causal: bool = True) -> Tensor:
        return alibi_bias(
            self.num_heads, q_len, k_len, causal=causal, dtype=torch.float32,
            device=self.slopes.device,
        )

    def _device(self) -> torch.device:
        return self.slopes.device

    def _build(self, q_len: int, k_len: int, causal: bool, device: torch.device) -> Tensor:
        rel = _distance(q_len, k_len, causal=causal, device=device)  # [Lq, Lk]
        return self.slopes.to(device, torch.float32)[:, None, None] * rel  # [H, Lq, Lk]

    def score_mod(self, q_offset: int) -> Callable:
        return alibi_score_mod(self.slopes, q_offset=q_offset)

    def position_bias(self, q_pos: Tensor, k_pos: Tensor, *, causal: bool = True) -> Tensor:
        rel = q_pos.long()[:, :, None] - k_pos.long()[:, None, :]  # [B, Lq, Lk]  m - n, exact
        if not causal:
            rel = rel.abs()
        return -self.slopes.to(torch.float32)[None, :, None, None] * rel.to(torch.float32)[:, None]

    def position_score_mod(self, q_pos: Tensor, k_pos: Tensor, *, causal: bool = True) -> Callable:
        slopes = self.slopes.to(torch.float32)
        q_pos, k_pos = q_pos.long(), k_pos.long()  # differences in int64: exact at any position

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            rel = (q_pos[b, q_idx] - k_pos[b, kv_idx]).to(torch.float32)  # m - n
            return score - slopes[h] * (rel if causal else rel.abs())

        return score_mod


class T5Bias(_CachedMask):
    """Raffel et al. (2020): a learned scalar per head and log-spaced distance bucket.

    The table is ``rel.embedding.weight [num_buckets, num_heads]``, the name to load Hugging
    Face T5 weights into (``relative_attention_bias.weight``). Outside training (no gradient)
    ``attn_mask`` caches the masked bias like :class:`ALiBi`, rebuilt when the table changes.
    """

    name = "t5"
    num_heads: int

    def __init__(self, num_heads: int, **kwargs: Any) -> None:
        super().__init__()
        _check_kwargs("T5Bias", T5RelativeBias, kwargs)
        self.rel = T5RelativeBias(num_heads, **kwargs)
        self.num_heads = self.rel.num_heads

    def bias(self, q_len: int, k_len: int, *, causal: bool = True) -> Tensor:
        return self.rel(q_len, k_len)

    def _device(self) -> torch.device:
        return self.rel.embedding.weight.device

    def _params_version(self) -> tuple:
        w = self.rel.embedding.weight
        return (w.data_ptr(), w._version)

    def position_bias(self, q_pos: Tensor, k_pos: Tensor, *, causal: bool = True) -> Tensor:
        rel = self.rel
        buckets = t5_relative_bucket(
            k_pos.long()[:, None, :] - q_pos.long()[:, :, None], bidirectional=rel.bidirectional,
            num_buckets=rel.num_buckets, max_distance=rel.max_distance,
        )  # [B, Lq, Lk]
        return rel.embedding(buckets).permute(0, 3, 1, 2).to(torch.float32)  # [B, H, Lq, Lk]

    def position_score_mod(self, q_pos: Tensor, k_pos: Tensor, *, causal: bool = True) -> Callable:
        rel = self.rel
        table = rel.embedding.weight.to(torch.float32)  # [NB, H]
        q_pos, k_pos = q_pos.long(), k_pos.long()  # differences in int64: exact at any position

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bucket = t5_relative_bucket(
                k_pos[b, kv_idx] - q_pos[b, q_idx], bidirectional=rel.bidirectional,
                num_buckets=rel.num_buckets, max_distance=rel.max_distance,
            )
            return score + table[bucket, h]

        return score_mod

    def _build(self, q_len: int, k_len: int, causal: bool, device: torch.device) -> Tensor:
        rel = self.rel
        i = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # [Lq, 1]
        j = torch.arange(k_len, device=device)[None, :]  # [1, Lk]
        buckets = t5_relative_bucket(
            j - i, bidirectional=rel.bidirectional, num_buckets=rel.num_buckets,
            max_distance=rel.max_distance,
        )  # [Lq, Lk]
        table = rel.embedding.weight.to(device, torch.float32).t()  # [H, NB]
        if causal:  # one extra bucket of -inf for the future keys: the mask costs nothing
            table = torch.cat([table, table.new_full((table.shape[0], 1), float("-inf"))], 1)
            buckets = buckets.masked_fill(j > i, rel.num_buckets)
        return table[:, buckets]  # [H, Lq, Lk]


def _a_class(cls: type) -> str:
    """The end of the message for a scheme class passed where an instance belongs."""
    params = inspect.signature(cls).parameters
    need = [n for n, p in params.items() if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return (f"got the class {cls.__name__}; pass an instance, e.g. "
            f"{cls.__name__}({', '.join(need)})")


def _check_scheme(scheme: object, heads: int | None = None, hint: str = "") -> PositionScheme:
    """``scheme`` as ``attend`` takes it: None (NoPE) or an instance, never a class or a bare
    ``RotaryEmbedding``; with ``heads``, a bias (if any) for that many query heads. ``hint``
    ends the head-count message."""
    if scheme is None:
        return NoPE()
    if not isinstance(scheme, PositionScheme):
        if isinstance(scheme, type):
            what = (_a_class(scheme) if issubclass(scheme, PositionScheme) else
                    f"got the class {scheme.__name__}; pass a scheme instance, e.g. "
                    "posenc.RoPE(head_dim)")
        elif isinstance(scheme, RotaryEmbedding):
            what = "got a RotaryEmbedding; pass the scheme, posenc.RoPE(head_dim, ...)"
        else:
            what = f"got {type(scheme).__name__}"
        raise TypeError(f"scheme must be a PositionScheme or None, {what}")
    if heads is not None and scheme.num_heads is not None and scheme.num_heads != heads:
        raise ValueError(f"scheme {scheme.name!r} has a bias for {scheme.num_heads} heads but q "
                         f"has {heads} heads; they must be equal{hint}")
    return scheme


def _not_a_name(given: object) -> TypeError:
    """The error for a ``make_scheme`` argument that is neither a name nor a scheme."""
    if isinstance(given, type) and issubclass(given, PositionScheme):
        return TypeError(f"scheme must be a name or a PositionScheme, {_a_class(given)} "
                         f"(or a name: {', '.join(map(repr, SCHEMES))})")
    return TypeError(f"scheme must be a name or a PositionScheme, got {type(given).__name__}")


def make_scheme(
    name: str | PositionScheme | None,
    *,
    dim: int | None = None,
    num_heads: int | None = None,
    max_len: int | None = None,
    causal: bool = True,
    **kwargs: Any,
) -> PositionScheme:
    """Create a scheme by name: ``"sinusoidal" | "learned" | "rope" | "alibi" | "t5" | "nope"``.

    ``dim`` is the model width (the embed schemes) and ``num_heads`` the head count; RoPE rotates
    ``dim // num_heads`` channels per head. ``max_len`` is required for ``"learned"``. A T5 bias
    in a causal model buckets only the past (``bidirectional=False``). Extra keyword arguments go
    to the scheme (e.g. ``base`` or ``scaling`` for RoPE, ``scale`` for sinusoidal). RoPE's
    default layout is ``interleaved=True`` (pairs ``(0, 1), (2, 3), ...``); Hugging Face's
    Llama-family weights need ``interleaved=False`` (pairs ``(i, i + d/2)``).
    """
    if name is None:
        name = "nope"
    if isinstance(name, PositionScheme):
        if kwargs:
            raise TypeError(
                f"make_scheme got keyword arguments {sorted(kwargs)} with a ready PositionScheme; "
                "pass them to its constructor instead"
            )
        return name
    if not isinstance(name, str):
        raise _not_a_name(name)
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; allowed: {', '.join(SCHEMES)}")

    def need(arg: str, value: int | None) -> int:
        if value is None:
            raise ValueError(f"scheme {name!r} needs {arg}")
        return check_int(arg, value, minimum=1)

    owner = f"make_scheme({name!r})"
    if name in ("nope", "alibi"):
        _check_kwargs(owner, NoPE, kwargs)
    if name == "nope":
        return NoPE()
    if name == "alibi":
        return ALiBi(need("num_heads", num_heads))
    if name == "sinusoidal":
        _check_kwargs(owner, SinusoidalPositionalEmbedding, kwargs, taken=("max_len",))
        return SinusoidalPE(need("dim", dim), max_len=max_len, **kwargs)
    if name == "learned":
        _check_kwargs(owner, LearnedPositionalEmbedding, kwargs)
        return LearnedPE(need("dim", dim), need("max_len", max_len), **kwargs)
    if name == "t5":
        _check_kwargs(owner, T5RelativeBias, kwargs)
        kwargs.setdefault("bidirectional", not causal)
        return T5Bias(need("num_heads", num_heads), **kwargs)
    _check_kwargs(owner, RotaryEmbedding, kwargs)
    dim, num_heads = need("dim", dim), need("num_heads", num_heads)
    if dim % num_heads:
        raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
    if (dim // num_heads) % 2:
        raise ValueError(
            f"scheme 'rope' rotates pairs of channels: dim // num_heads = {dim} // {num_heads} = "
            f"{dim // num_heads} must be even"
        )
    return RoPE(dim // num_heads, **kwargs)
