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

from ._checks import check_dtype, check_int, check_tensor


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
    it never needs a ``[B, H, L, L]`` copy.
    """
    num_heads = check_int("num_heads", num_heads, minimum=1)
    q_len = check_int("q_len", q_len, minimum=0)
    k_len = q_len if k_len is None else check_int("k_len", k_len, minimum=0)
    if k_len < q_len:
        raise ValueError(f"k_len must be >= q_len={q_len} (queries are the last keys), got {k_len}")
    dtype = check_dtype("dtype", dtype)
    slopes = alibi_slopes(num_heads).to(device)  # [H]
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # [Lq, 1] absolute query pos
    j = torch.arange(k_len, device=device)[None, :]  # [1, Lk]
    dist = (i - j).to(torch.float32)  # [Lq, Lk]
    bias = -slopes[:, None, None] * (dist if causal else dist.abs())  # [H, Lq, Lk]
    if causal:
        bias = bias.masked_fill(j > i, float("-inf"))
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
    q_offset = check_int("q_offset", q_offset, minimum=0)
    slopes = slopes.to(torch.float32)

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score - slopes[h] * (q_idx + q_offset - kv_idx)

    return score_mod
