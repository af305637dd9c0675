"""T5 relative position bias (Raffel et al., 2020; after Shaw et al., 2018).

Each head learns one scalar per *bucket* of relative distance ``j - i``. Small distances get a
bucket each; larger ones share logarithmically wider buckets up to ``max_distance``, past which
everything falls in the last bucket. ``t5_relative_bucket`` reproduces the buckets of
Hugging Face's ``T5Attention._relative_position_bucket`` exactly.

``T5RelativeBias`` keeps its table in ``embedding.weight`` ``[num_buckets, num_heads]``, the
same layout as HF's ``T5Attention.relative_attention_bias.weight`` (only the first layer of a
stack has one; the others reuse its bias). To load a checkpoint::

    sd = hf_model.state_dict()
    enc = T5RelativeBias(cfg.num_heads, bidirectional=True,
                         num_buckets=cfg.relative_attention_num_buckets,
                         max_distance=cfg.relative_attention_max_distance)
    enc.load_state_dict({"embedding.weight":
        sd["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]})

and ``bidirectional=False`` with ``decoder.block.0.layer.0.SelfAttention...`` for the decoder
(HF: ``bidirectional = not is_decoder``). ``forward(q_len, k_len)`` then equals HF's
``compute_bias(q_len, k_len, past_seen_tokens=k_len - q_len)[0]``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._checks import check_bias_size, check_bool, check_int, check_tensor


def t5_relative_bucket(
    relative_position: Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """Bucket index (LongTensor, same shape) of each ``relative_position = key - query``."""
    check_tensor("relative_position", relative_position)
    bidirectional = check_bool("bidirectional", bidirectional)
    if (
        relative_position.is_floating_point()
        or relative_position.is_complex()
        or relative_position.dtype == torch.bool
    ):
        raise TypeError(
            f"relative_position must be an integer tensor, got dtype {relative_position.dtype}"
        )
    num_buckets = check_int("num_buckets", num_buckets, minimum=2)
    max_distance = check_int("max_distance", max_distance, minimum=1)
    rel = relative_position.long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        if num_buckets % 2:
            raise ValueError(f"num_buckets must be even when bidirectional, got {num_buckets}")
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets  # keys after the query
        n = rel.abs()
    else:
        n = (-rel).clamp(min=0)  # only the past counts
    max_exact = num_buckets // 2
    if max_exact < 1:
        raise ValueError(
            f"num_buckets must be >= {4 if bidirectional else 2} "
            f"(bidirectional={bidirectional}), got {2 * num_buckets if bidirectional else num_buckets}"
        )
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance must be > num_buckets // 2 per direction ({max_exact}), got {max_distance}"
        )
    is_small = n < max_exact
    large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, n, large)


class T5RelativeBias(nn.Module):
    """A learned table ``embedding.weight [num_buckets, num_heads]``; ``forward(q_len, k_len)``
    gives the bias ``[num_heads, q_len, k_len]`` (queries are the last ``q_len`` of ``k_len``
    positions).

    ``embedding.weight`` is HF's ``relative_attention_bias.weight`` (T5's
    ``...block.0.layer.0.SelfAttention.relative_attention_bias.weight``): load it with
    ``load_state_dict({"embedding.weight": w})``; see the module docstring.
    """

    def __init__(
        self,
        num_heads: int,
        *,
        bidirectional: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.bidirectional = check_bool("bidirectional", bidirectional)
        self.num_buckets = check_int("num_buckets", num_buckets, minimum=2)
        self.max_distance = check_int("max_distance", max_distance, minimum=1)
        t5_relative_bucket(  # validate the bucket settings now, not on the first forward
            torch.zeros(1, dtype=torch.long), bidirectional=bidirectional,
            num_buckets=num_buckets, max_distance=max_distance,
        )
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, q_len: int, k_len: int | None = None) -> Tensor:
        """The bias ``[num_heads, q_len, k_len]`` to add to attention logits
        ``[B, num_heads, q_len, k_len]``, in the table's dtype and device, with its gradient.

        The queries are the last ``q_len`` of ``k_len`` positions (``k_len`` defaults to
        ``q_len``; a KV cache gives ``k_len > q_len``): entry ``[h, i, j]`` is
        ``embedding.weight[bucket, h]`` with ``bucket = t5_relative_bucket(j - (k_len - q_len + i))``.
        No causal mask is applied: with ``bidirectional=False`` every future key falls in bucket 0,
        so the caller masks them.

        Raises:
            TypeError: ``q_len`` or ``k_len`` is not an int.
            ValueError: ``q_len`` or ``k_len`` is negative, or ``k_len < q_len``.
        """
        q_len = check_int("q_len", q_len, minimum=0)
        k_len = q_len if k_len is None else check_int("k_len", k_len, minimum=0)
        if k_len < q_len:
            raise ValueError(f"k_len must be >= q_len={q_len}, got {k_len}")
        check_bias_size("T5RelativeBias", self.num_heads, q_len, k_len)
        device = self.embedding.weight.device
        i = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # [Lq, 1]
        j = torch.arange(k_len, device=device)[None, :]  # [1, Lk]
        buckets = t5_relative_bucket(
            j - i, bidirectional=self.bidirectional, num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )  # [Lq, Lk]
        return self.embedding(buckets).permute(2, 0, 1)  # [H, Lq, Lk]

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, bidirectional={self.bidirectional}, "
            f"num_buckets={self.num_buckets}, max_distance={self.max_distance}"
        )
