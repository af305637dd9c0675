"""Checkers for chapter 7 (long context): YaRN's frequencies, built from the ramp.

YaRN (Peng et al., ICLR 2024, "YaRN: Efficient Context Window Extension of Large Language
Models") keeps the fast RoPE pairs, divides the slow ones by the factor ``s`` and blends the
pairs between with a ramp that is linear in the pair index, from ``floor(i(beta_fast))`` to
``ceil(i(beta_slow))``, where ``i(beta) = (d / 2) ln(L / (2 pi beta)) / ln(base)`` is the pair
that turns ``beta`` times within the training length ``L`` (the reference code and Hugging Face).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from . import attempt, check_lang, compare, say, verdict

__all__ = ["check_yarn_inv_freq", "yarn_variant", "HINTS", "HINTS_ZH"]

SETTINGS = [  # (head_dim, base, factor, original_len, beta_fast, beta_slow)
    (128, 10000.0, 8.0, 4096, 32.0, 1.0),
    (64, 10000.0, 4.0, 2048, 32.0, 1.0),
    (128, 500000.0, 16.0, 8192, 16.0, 2.0),
    (16, 10000.0, 4.0, 64, 32.0, 1.0),
]


def yarn_variant(head_dim: int, base: float, factor: float, original_len: int, beta_fast: float,
                 beta_slow: float, *, mistake: str | None = None) -> Tensor:
    """YaRN's inverse frequencies ``[head_dim // 2]``, or with one named ``mistake`` (the hints)."""
    d, L = head_dim, original_len
    per_pair = 1 if mistake == "channels" else 2  # i(beta) counts pairs: d / 2

    def pair_at(beta: float) -> float:
        return (d / per_pair) * math.log(L / (2 * math.pi * beta)) / math.log(base)

    theta = 1.0 / base ** (torch.arange(0, d, 2).float() / d)  # [d/2]
    i = torch.arange(d // 2, dtype=torch.float32) + (1 if mistake == "from_one" else 0)
    if mistake == "turns":  # the paper's ramp, linear in the turn count r = L / lambda
        r = L * theta / (2 * math.pi)
        keep = ((r - beta_slow) / (beta_fast - beta_slow)).clamp(0, 1)
        return (1 - keep) * theta / factor + keep * theta
    low, high = pair_at(beta_fast), pair_at(beta_slow)
    if mistake == "swapped":
        low, high = high, low
    if mistake != "no_rounding":
        low, high = math.floor(low), math.ceil(high)
    if mistake != "no_clamp":
        low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((i - low) / (high - low)).clamp(0, 1)  # 0 for fast pairs, 1 for slow ones
    keep = ramp if mistake == "reversed" else 1 - ramp
    return (1 - keep) * theta / factor + keep * theta


HINTS = {
    "swapped": "the ramp runs the wrong way: beta_fast (many turns) marks the low pair index "
               "where the ramp starts, beta_slow the high one where it ends",
    "reversed": "the blend is the wrong way round: fast pairs (low index) keep theta_i, slow "
                "pairs (high index) get theta_i / s",
    "no_rounding": "the ramp's ends are rounded outward: floor(i(beta_fast)) and "
                   "ceil(i(beta_slow))",
    "channels": "i(beta) counts pairs, not channels: (d / 2) ln(L / (2 pi beta)) / ln(base), "
                "a factor of 2 too large",
    "from_one": "off by one: pairs are numbered from 0, so pair 0 is the fastest",
    "no_clamp": "clamp the ramp's start at pair 0 (i(beta_fast) is negative for a short "
                "context)",
    "turns": "you ramped linearly in the turn count L / lambda_i (the paper's formula); "
             "posenc, Hugging Face and the released checkpoints ramp linearly in the pair index",
}


HINTS_ZH = {
    "swapped": "斜坡方向反了：beta_fast（圈数多）标出斜坡起点的小序号，beta_slow 标出斜坡终点的大序号",
    "reversed": "混合的方向反了：高频维度对（序号小）保持 theta_i，低频维度对（序号大）取 theta_i / s",
    "no_rounding": "斜坡的两端要向外取整：floor(i(beta_fast)) 和 ceil(i(beta_slow))",
    "channels": "i(beta) 数的是维度对，不是维度：(d / 2) ln(L / (2 pi beta)) / ln(base)，你的结果大了一倍",
    "from_one": "差了 1：维度对从 0 开始编号，维度对 0 的频率最高",
    "no_clamp": "把斜坡的起点截断到维度对 0（上下文很短时 i(beta_fast) 是负数）",
    "turns": "你的斜坡在圈数 L / lambda_i 上线性变化（论文的公式）；posenc、Hugging Face 和已发布的"
             "检查点都在维度对序号上线性变化",
}


def check_yarn_inv_freq(fn: Callable[..., Tensor], *, lang: str = "en") -> bool:
    """Check ``fn(head_dim, base, factor, original_len, beta_fast, beta_slow) -> [head_dim // 2]``,
    YaRN's new inverse frequencies (no attention factor), against :func:`posenc.rope_inv_freq`;
    the verdict and hints in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    sep = say(lang, en=": ", zh="：")
    for setting in SETTINGS:
        d, base, factor, L, bf, bs = setting
        cfg = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L,
               "beta_fast": bf, "beta_slow": bs}
        want, _ = posenc.rope_inv_freq(d, base=base, scaling=cfg)  # [d/2]
        name = f"head_dim={d}, base={base:g}, factor={factor:g}, L={L}, betas=({bf:g}, {bs:g})"
        got, error = attempt(fn, *setting, lang=lang)
        if error:
            return verdict(False, f"{name}{sep}{error}")
        problem = compare(got, want, what="inv_freq", atol=1e-7, rtol=1e-5, lang=lang)
        if problem is None:
            continue
        if isinstance(got, Tensor) and got.shape == want.shape:
            got = got.detach().float().cpu()
            for mistake, hint in HINTS.items():
                wrong = yarn_variant(*setting, mistake=mistake)
                if not torch.allclose(wrong, want) and torch.allclose(got, wrong, rtol=1e-5,
                                                                      atol=1e-7):
                    return verdict(False, f"{name}{sep}{say(lang, en=hint, zh=HINTS_ZH[mistake])}")
        return verdict(False, f"{name}{sep}{problem}")
    return verdict(True, say(lang, en="your frequencies equal posenc's YaRN, tiny context included",
                             zh="你的频率与 posenc 的 YaRN 相等，包括很短的上下文"))
