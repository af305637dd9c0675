"""Position schemes as objects with hooks (see DESIGN.md).

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

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ._checks import check_int
from .alibi import alibi_bias, alibi_score_mod, alibi_slopes
from .learned import LearnedPositionalEmbedding
from .rope import RotaryEmbedding
from .sinusoidal import SinusoidalPositionalEmbedding
from .t5 import T5RelativeBias

SCHEMES = ("sinusoidal", "learned", "rope", "alibi", "t5", "nope")
"""The names ``make_scheme`` accepts."""


class PositionScheme(nn.Module):
    """Base class; on its own it is NoPE: every hook is the identity."""

    name = "nope"

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, L, D]`` at ``positions [L]`` or ``[B, L]`` -> ``[B, L, D]``."""
        return x

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``q, k [B, H, L, Dh]`` of the new tokens at ``positions`` -> rotated ``q, k``."""
        return q, k

    def bias(self, q_len: int, k_len: int, *, causal: bool = True) -> Tensor | None:
        """Additive logit bias ``[H, q_len, k_len]`` (queries are the last ``q_len`` keys)."""
        return None

    def score_mod(self, q_offset: int) -> Callable | None:
        """The same bias as a FlexAttention ``score_mod``, if the scheme has one."""
        return None


class NoPE(PositionScheme):
    """No position information: only a causal mask, if any, tells tokens apart."""


class SinusoidalPE(PositionScheme):
    """Vaswani et al. (2017): the fixed sinusoidal table added to the input."""

    name = "sinusoidal"

    def __init__(self, dim: int, **kwargs) -> None:
        super().__init__()
        self.pe = SinusoidalPositionalEmbedding(dim, **kwargs)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.pe(x, positions=positions)


class LearnedPE(PositionScheme):
    """A trained vector per absolute slot, added to the input (GPT-2, BERT)."""

    name = "learned"

    def __init__(self, dim: int, max_len: int, **kwargs) -> None:
        super().__init__()
        self.pe = LearnedPositionalEmbedding(max_len, dim, **kwargs)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.pe(x, positions=positions)


class RoPE(PositionScheme):
    """Su et al. (2021): rotate queries and keys by their positions."""

    name = "rope"

    def __init__(self, head_dim: int, **kwargs) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(head_dim, **kwargs)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.rotary(q, k, positions=positions)


class ALiBi(PositionScheme):
    """Press et al. (2022): a per-head linear penalty ``-m_h (i - j)`` on the logits."""

    name = "alibi"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)  # [H]

    def bias(self, q_len: int, k_len: int, *, causal: bool = True) -> Tensor:
        return alibi_bias(
            self.num_heads, q_len, k_len, causal=causal, dtype=torch.float32,
            device=self.slopes.device,
        )

    def score_mod(self, q_offset: int) -> Callable:
        return alibi_score_mod(self.slopes, q_offset=q_offset)


class T5Bias(PositionScheme):
    """Raffel et al. (2020): a learned scalar per head and log-spaced distance bucket."""

    name = "t5"

    def __init__(self, num_heads: int, **kwargs) -> None:
        super().__init__()
        self.rel = T5RelativeBias(num_heads, **kwargs)

    def bias(self, q_len: int, k_len: int, *, causal: bool = True) -> Tensor:
        return self.rel(q_len, k_len)


def make_scheme(
    name: str | PositionScheme | None,
    *,
    dim: int | None = None,
    num_heads: int | None = None,
    max_len: int | None = None,
    causal: bool = True,
    **kwargs,
) -> PositionScheme:
    """Create a scheme by name: ``"sinusoidal" | "learned" | "rope" | "alibi" | "t5" | "nope"``.

    ``dim`` is the model width (the embed schemes) and ``num_heads`` the head count; RoPE rotates
    ``dim // num_heads`` channels per head. ``max_len`` is required for ``"learned"``. A T5 bias
    in a causal model buckets only the past (``bidirectional=False``). Extra keyword arguments go
    to the scheme (e.g. ``base`` or ``scaling`` for RoPE, ``scale`` for sinusoidal).
    """
    if name is None:
        return NoPE()
    if isinstance(name, PositionScheme):
        return name
    if not isinstance(name, str):
        raise TypeError(f"scheme must be a name or a PositionScheme, got {type(name).__name__}")
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; allowed: {', '.join(SCHEMES)}")

    def need(arg: str, value: int | None) -> int:
        if value is None:
            raise ValueError(f"scheme {name!r} needs {arg}")
        return check_int(arg, value, minimum=1)

    if name == "nope":
        return NoPE()
    if name == "sinusoidal":
        return SinusoidalPE(need("dim", dim), max_len=max_len, **kwargs)
    if name == "learned":
        return LearnedPE(need("dim", dim), need("max_len", max_len), **kwargs)
    if name == "alibi":
        return ALiBi(need("num_heads", num_heads))
    if name == "t5":
        kwargs.setdefault("bidirectional", not causal)
        return T5Bias(need("num_heads", num_heads), **kwargs)
    dim, num_heads = need("dim", dim), need("num_heads", num_heads)
    if dim % num_heads:
        raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
    return RoPE(dim // num_heads, **kwargs)
