"""Checkers for chapter 2 (absolute vs relative position): T5's relative bias matrix.

T5 (Raffel et al., 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer") adds ``b_h(bucket(n - m))`` to the logit of query ``m`` and key ``n``: one learned
scalar per head and bucket of the offset ``n - m``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from . import attempt, check_lang, compare, say, verdict

__all__ = ["check_relative_bias"]


def _bias(weight: Tensor, m: Tensor, n: Tensor, offset_sign: int = 1) -> Tensor:
    offsets = offset_sign * (n[None, :] - m[:, None])  # [Lq, Lk]: n - m
    return weight[posenc.t5_relative_bucket(offsets)].permute(2, 0, 1)  # [H, Lq, Lk]


def check_relative_bias(fn: Callable[..., Tensor], *, seed: int = 0, lang: str = "en") -> bool:
    """Check ``fn(weight, q_len, k_len) -> [H, q_len, k_len]``: T5's bias from its table.

    ``weight`` is a ``[32, H]`` table (one scalar per bucket and head; bidirectional buckets,
    ``max_distance=128``). The queries are the last ``q_len`` of ``k_len`` positions, so query
    ``m`` runs over ``k_len - q_len .. k_len - 1`` and key ``n`` over ``0 .. k_len - 1``. Compared
    with ``posenc.T5RelativeBias``. The verdict is in ``lang`` (``"en"`` or ``"zh"``).
    """
    check_lang(lang)
    gen = torch.Generator().manual_seed(seed)
    for heads, q_len, k_len in [(2, 6, 6), (4, 40, 40), (3, 5, 300), (1, 1, 17)]:
        module = posenc.T5RelativeBias(num_heads=heads)
        with torch.no_grad():
            module.embedding.weight.copy_(torch.randn(32, heads, generator=gen))
            want = module(q_len, k_len)  # [H, Lq, Lk]
        weight = module.embedding.weight.detach().clone()
        got, error = attempt(fn, weight, q_len, k_len, lang=lang)
        setting = say(lang, en=f"{heads} heads, q_len={q_len}, k_len={k_len}",
                      zh=f"{heads} 个头，q_len={q_len}，k_len={k_len}")
        if error:
            return verdict(False, setting + say(lang, en=": ", zh="：") + error)
        problem = compare(got, want, what=say(lang, en="the bias", zh="偏置"), lang=lang)
        if problem is None:
            continue
        if isinstance(got, Tensor):
            got = got.detach().cpu()
            if got.shape == (q_len, k_len, heads):
                return verdict(False, setting + say(
                    lang, en=": heads come last; permute to [H, q_len, k_len]",
                    zh="：头这一维放在了最后；请换成 [H, q_len, k_len]"))
            m_end = torch.arange(k_len - q_len, k_len)  # queries at the end (right)
            m_start = torch.arange(q_len)  # queries at the start (wrong when q_len < k_len)
            n = torch.arange(k_len)
            if got.shape == want.shape:
                if torch.allclose(got, _bias(weight, m_end, n, offset_sign=-1)):
                    return verdict(False, setting + say(
                        lang, en=": the offset has the wrong sign; the bucket takes n - m (key "
                        "minus query), not m - n",
                        zh="：偏移量的符号反了；分桶用的是 n - m（键减查询），不是 m - n"))
                if q_len < k_len and torch.allclose(got, _bias(weight, m_start, n)):
                    span = f"m = {k_len - q_len} .. {k_len - 1}"
                    return verdict(False, setting + say(
                        lang, en=f": the queries are the LAST q_len positions ({span}), not "
                        "the first",
                        zh=f"：查询是最后 q_len 个位置（{span}），不是最前面的"))
        return verdict(False, setting + say(lang, en=": ", zh="：") + str(problem))
    return verdict(True, say(
        lang, en="your bias equals posenc.T5RelativeBias, for full and cached queries",
        zh="你的偏置与 posenc.T5RelativeBias 相等，完整查询和缓存下的查询都一样"))
