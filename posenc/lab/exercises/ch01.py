"""Checkers for chapter 1 (why order matters): self-attention written from its formula.

``Attn(X) = softmax(X W_Q (X W_K)^T / sqrt(d)) X W_V`` (Vaswani et al., 2017, "Attention Is All
You Need", eq. 1), optionally with a causal mask (query ``m`` sees keys ``n <= m``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from . import attempt, check_lang, compare, say, verdict

__all__ = ["check_attention"]


def _reference(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, causal: bool) -> Tensor:
    q, k, v = ((x @ w)[None, None] for w in (w_q, w_k, w_v))  # [1, 1, L, d] each
    return posenc.attend(q, k, v, scheme=posenc.make_scheme("nope"), causal=causal)[0, 0]


def _variants(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, causal: bool,
              lang: str = "en") -> dict[str, Tensor]:
    """Common slips, each as the output it produces, keyed by the hint (in ``lang``)."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # [L, d] each
    d = k.shape[-1]
    future = torch.ones(len(x), len(x), dtype=torch.bool).triu(1)  # key n > query m

    def run(scores: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        return scores.softmax(dim=dim) @ v

    scores = q @ k.T / d**0.5  # [L, L]
    mask = future if causal else None
    slips = {
        say(lang, en="the scores are not divided by sqrt(d)",
            zh="分数没有除以 sqrt(d)"): run(q @ k.T, mask),
        say(lang, en="the scores are divided by d instead of sqrt(d)",
            zh="分数除以的是 d，应当除以 sqrt(d)"): run(q @ k.T / d, mask),
        say(lang, en="the softmax runs over the queries (dim 0); each row (one query) should "
            "sum to 1",
            zh="softmax 是沿查询（dim 0）做的；每一行（一个查询）之和应为 1"):
            run(scores, mask, dim=0),
    }
    if causal:
        slips[say(lang, en="the causal mask is missing: query m must not see keys n > m",
                  zh="缺少因果掩码：查询 m 不能看到 n > m 的键")] = run(scores, None)
        slips[say(lang, en="the mask hides the past instead of the future (use triu(1), not "
                  "tril(-1))",
                  zh="掩码遮住的是过去而不是未来（用 triu(1)，不要用 tril(-1)）")] = run(
            scores, future.T
        )
    else:
        slips[say(lang, en="a causal mask is applied although causal=False",
                  zh="causal=False 时却加了因果掩码")] = run(scores, future)
    return slips


def check_attention(fn: Callable[..., Tensor], *, seed: int = 0, lang: str = "en") -> bool:
    """Check ``fn(x, w_q, w_k, w_v, causal=False) -> [L, d]``: one head of self-attention.

    Runs ``fn`` on random ``x [L, d]`` and projections ``[d, d]``, with and without the causal
    mask, and compares with ``posenc.attend`` (scheme ``"nope"``). The verdict is in ``lang``
    (``"en"`` or ``"zh"``).
    """
    check_lang(lang)
    sep = say(lang, en=": ", zh="：")
    gen = torch.Generator().manual_seed(seed)
    for L, d, causal in [(5, 8, False), (7, 4, False), (6, 8, True), (9, 16, True)]:
        x = torch.randn(L, d, generator=gen)
        w_q, w_k, w_v = (torch.randn(d, d, generator=gen) / d**0.5 for _ in range(3))
        got, error = attempt(fn, x.clone(), w_q, w_k, w_v, causal=causal, lang=lang)
        setting = f"L={L}, d={d}, causal={causal}"
        if error:
            return verdict(False, setting + sep + error)
        want = _reference(x, w_q, w_k, w_v, causal)
        problem = compare(got, want, what=say(lang, en="the output", zh="输出"), atol=1e-5,
                          rtol=1e-4, lang=lang)
        if problem is None:
            continue
        if isinstance(got, Tensor) and got.shape == want.shape:
            for slip, output in _variants(x, w_q, w_k, w_v, causal, lang).items():
                if torch.allclose(got.detach().double().cpu(), output.double(), atol=1e-5, rtol=1e-4):
                    return verdict(False, setting + sep + slip)
        return verdict(False, setting + sep + problem)
    return verdict(True, say(
        lang, en="your attention equals posenc.attend, with and without the causal mask",
        zh="你的注意力与 posenc.attend 相等，加不加因果掩码都一样"))
