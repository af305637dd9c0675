"""ALiBi: attention with linear biases (Press et al., 2022, "Train Short, Test Long").

No position vectors at all: each head ``h`` adds ``-m_h * (i - j)`` to the logit of query ``i``
and key ``j``. The slopes ``m_h`` form a geometric sequence ``2^(-8/n), 2^(-16/n), ...,
2^(-8)`` for ``n`` heads; when ``n`` is not a power of two the paper takes the slopes of the
closest smaller power of two and fills up with every other slope of twice that count.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._checks import (
    MAX_POSITION,
    check_bias_size,
    check_bool,
    check_device,
    check_dtype,
    check_int,
    check_positions,
    check_tensor,
)


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (h + 1) for h in range(n)]


def alibi_slopes(num_heads: int) -> Tensor:
    """The paper's head slopes ``[num_heads]`` in float32, for any head count."""
    num_heads = check_int("num_heads", num_heads, minimum=1)
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = _power_of_two_slopes(closest)
    if closest < num_heads:
        slopes += _power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def _check_lengths(q_len: object, k_len: object) -> tuple[int, int]:
    q_len = check_int("q_len", q_len, minimum=0)
    k_len = q_len if k_len is None else check_int("k_len", k_len, minimum=0)
    if k_len < q_len:
        raise ValueError(f"k_len must be >= q_len={q_len} (queries are the last keys), got {k_len}")
    return q_len, k_len


def _distance(
    q_len: int, k_len: int, *, causal: bool = True, device: torch.device | str | None = None
) -> Tensor:
    """Float32 ``[q_len, k_len]`` holding ``j - i`` (queries are the last ``q_len`` keys).

    ``causal=True`` puts ``-inf`` on future keys (``j > i``); ``causal=False`` gives ``-|i - j|``.
    A slope times this is the ALiBi bias, in one multiply.
    """
    q_len, k_len = _check_lengths(q_len, k_len)
    causal = check_bool("causal", causal)
    j = torch.arange(k_len, dtype=torch.float32, device=device)  # [Lk]
    rel = j[None, :] - j[k_len - q_len :, None]  # [Lq, Lk]  j - i
    if causal:
        return rel.masked_fill_(rel > 0, float("-inf"))
    return rel.abs_().neg_()


def alibi_bias(
    num_heads: int,
    q_len: int,
    k_len: int | None = None,
    *,
    causal: bool = True,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """The additive bias ``[num_heads, q_len, k_len]``: ``-m_h * (i - j)``.

    The queries are the last ``q_len`` of the ``k_len`` positions (a KV cache holds the rest).
    ``causal=True`` puts ``-inf`` on future keys, so the bias doubles as the causal mask;
    ``causal=False`` uses the symmetric ``-m_h * |i - j|``. Broadcast it over the batch:
    it never needs a ``[B, H, L, L]`` copy. Built in float32 from an ``arange`` difference and
    one multiply, then cast to ``dtype`` (default: torch's default dtype). For left-padded
    batches see :func:`alibi_bias_padded`.
    """
    num_heads = check_int("num_heads", num_heads, minimum=1)
    q_len, k_len = _check_lengths(q_len, k_len)
    dtype = check_dtype("dtype", dtype)
    device = check_device("device", device, available=True)
    check_bias_size("alibi_bias", num_heads, q_len, k_len)
    slopes = alibi_slopes(num_heads).to(device)  # [H]
    rel = _distance(q_len, k_len, causal=causal, device=device)  # [Lq, Lk]
    bias = slopes[:, None, None] * rel  # [H, Lq, Lk]; m_h > 0, so -inf stays -inf
    return bias.to(dtype or torch.get_default_dtype())


def alibi_bias_padded(
    num_heads: int,
    attention_mask: Tensor,
    *,
    q_len: int | None = None,
    position_ids: Tensor | None = None,
    causal: bool = True,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """ALiBi for a (left-)padded batch: ``[B, num_heads, q_len, k_len]``, mask included.

    ``attention_mask [B, k_len]`` marks real tokens (1/True) and padding (0/False), as in
    Hugging Face. Key positions are ``position_ids [B, k_len]`` if given, else BLOOM's
    ``cumsum(attention_mask) - 1`` (padding at 0), so a left-padded row counts from its first
    real token. The queries are the last ``q_len`` (default ``k_len``) keys. A query at
    position ``p_i`` gets ``-m_h (p_i - p_j)`` on visible keys (real, and not in the future when
    ``causal``; ``-m_h |p_i - p_j|`` when not causal) and ``-inf`` elsewhere. Queries that are
    themselves padding see only their own key (bias 0), so no row is all ``-inf`` (no NaN);
    ignore their outputs. Softmax probabilities on real queries equal BLOOM's
    ``build_alibi_tensor`` (``m_h p_j``, a per-row shift of this) plus its causal/padding mask.
    """
    num_heads = check_int("num_heads", num_heads, minimum=1)
    check_tensor("attention_mask", attention_mask)
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must have shape [B, k_len], got shape {tuple(attention_mask.shape)}"
        )
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise TypeError(f"attention_mask must be a bool or integer tensor, got dtype {attention_mask.dtype}")
    mask = attention_mask != 0  # [B, Lk]
    if attention_mask.dtype != torch.bool and not torch.equal(mask, attention_mask == 1):
        raise ValueError("attention_mask must hold only 0 and 1")
    k_len = mask.shape[-1]
    q_len, k_len = _check_lengths(k_len if q_len is None else q_len, k_len)
    check_bias_size("alibi_bias_padded", mask.shape[0] * num_heads, q_len, k_len)
    dtype = check_dtype("dtype", dtype)
    causal = check_bool("causal", causal)
    if position_ids is None:
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, Lk]
    else:
        check_positions("position_ids", position_ids)
        if position_ids.shape != mask.shape:
            raise ValueError(
                f"position_ids must have the shape of attention_mask {tuple(mask.shape)}, "
                f"got {tuple(position_ids.shape)}"
            )
        pos = position_ids
    device = mask.device
    pos = pos.long()  # the difference in int64, exact at any position, then float32
    rel = (pos[:, None, :] - pos[:, k_len - q_len :, None]).to(torch.float32)  # [B, Lq, Lk]  p_j - p_i
    if not causal:
        rel = rel.abs_().neg_()
    visible = mask[:, None, :]  # [B, 1, Lk]
    past = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)  # j <= i
    own = past & ~past.tril(k_len - q_len - 1)  # [Lq, Lk] j == i
    if causal:
        visible = visible & past  # [B, Lq, Lk]
    pad_query = ~mask[:, k_len - q_len :, None]  # [B, Lq, 1]
    visible = torch.where(pad_query, own, visible)  # [B, Lq, Lk]
    rel = rel.masked_fill_(~visible, float("-inf"))
    slopes = alibi_slopes(num_heads).to(device)  # [H]
    bias = slopes[None, :, None, None] * rel[:, None]  # [B, H, Lq, Lk]
    return bias.to(dtype or torch.get_default_dtype())


def alibi_score_mod(slopes: Tensor, *, q_offset: int = 0) -> Callable:
    """A ``score_mod`` for ``torch.nn.attention.flex_attention`` adding ``-m_h * (i - j)``.

    ``q_offset`` is the absolute position of the first query (the KV-cache length). The bias is
    computed per score inside the kernel; no ``[L, L]`` tensor is built. Combine it with a causal
    ``block_mask`` (see ``posenc.attention``) for decoder models.
    """
    check_tensor("slopes", slopes, floating=True)
    if slopes.dim() != 1:
        raise ValueError(f"slopes must be 1-D [num_heads], got shape {tuple(slopes.shape)}")
    if not torch.isfinite(slopes).all():
        raise ValueError(f"slopes must be finite, got {slopes.tolist()}")
    q_offset = check_int("q_offset", q_offset, minimum=0)
    if q_offset >= MAX_POSITION:
        raise ValueError(f"q_offset must be < 2**31 = {MAX_POSITION} (a position), got {q_offset}")
    slopes = slopes.to(torch.float32)

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score - slopes[h] * ((q_idx - kv_idx) + q_offset)  # the integer i - j, then float

    return score_mod
