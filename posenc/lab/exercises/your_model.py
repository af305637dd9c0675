"""Checkers for the exercises of the reference page "Your model's positions": the pairs of a
released model that meet angles unseen in training at a target context, and the factor gpt-oss's
YaRN puts on the attention logits (Peng et al., 2024; OpenAI, 2025)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ...explain import RopeReport, explain
from ...rope_families import FAMILY_NAMES, family
from . import attempt, check_lang, say, verdict

__all__ = ["unseen_pairs", "check_unseen", "check_gpt_oss_logits"]

_TOL = 1e-4  # relative: a pair stretched by exactly target / trained stays on its arc


def unseen_pairs(report: RopeReport) -> list[int]:
    """The pairs that meet angles unseen in training at ``report.target_length``: they complete
    less than one turn within the training length (``turns < 1``: they saw an arc, not the
    circle) and, after the model's scaling, turn further at the target than they did in
    training (``scaled_turns > turns``)."""
    if report.turns is None or report.scaled_turns is None:
        raise ValueError("the report has no training or target length: nothing to compare")
    turns, scaled = report.turns.double(), report.scaled_turns.double()
    unseen = (turns < 1) & (scaled > turns * (1 + _TOL))
    return [int(i) for i in torch.nonzero(unseen).flatten()]


def _cases() -> list[tuple[str, int]]:
    """Every family at its training length, twice it, its full window and 1M positions."""
    out = []
    for name in FAMILY_NAMES:
        report = explain(family(name)["config"])
        trained = report.training_length or 4096
        for target in (trained, 2 * trained, report.target_length or trained, 2**20):
            out.append((name, int(target)))
    return out


def _as_pairs(out: Any, pairs: int) -> list[int] | None:
    """A list, tuple or 1-D tensor of pair indices (a boolean mask over the pairs is read as
    the pairs it marks); ``None`` when ``out`` is none of these."""
    if isinstance(out, torch.Tensor):
        if out.dtype == torch.bool and out.dim() == 1 and out.numel() == pairs:
            out = torch.nonzero(out).flatten()
        if out.dim() != 1 or out.is_floating_point():
            return None
        out = out.tolist()
    if not isinstance(out, (list, tuple, set)):
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in out):
        return None
    return sorted(out)


def _unseen_hint(got: list[int], report: RopeReport, lang: str) -> str | None:
    turns, scaled = report.turns, report.scaled_turns
    assert turns is not None and scaled is not None
    never = [int(i) for i in torch.nonzero(turns < 1).flatten()]
    past_one = [int(i) for i in torch.nonzero(scaled > 1).flatten()]
    if got and set(got) - set(never):
        return say(lang, en="you count pairs that turn at least once in training; those have "
                            "seen the whole circle, and a longer input brings back angles they "
                            "know",
                   zh="你把训练中至少转满一圈的对也算进去了；它们见过整个圆周，更长的输入"
                      "只会带回见过的角度")
    if got == never:
        return say(lang, en="that is every pair that never turns in training; a pair the "
                            "scaling stretches enough stays on its arc at the target: compare "
                            "scaled_turns with turns",
                   zh="这是训练中转不满一圈的全部旋转对；缩放拉伸得足够的对，在目标长度上仍停"
                      "留在见过的弧内：请比较 scaled_turns 与 turns")
    if got == past_one:
        return say(lang, en="a pair that stays under one turn can still leave its arc: the "
                            "question is whether it turns further than in training, "
                            "scaled_turns > turns",
                   zh="不满一圈的对也可能离开见过的弧：要问的是它是否比训练时转得更远，"
                      "即 scaled_turns > turns")
    return None


def check_unseen(fn: Callable[[RopeReport], Any], *, lang: str = "en") -> bool:
    """``fn(report) -> pair indices``: the pairs that meet angles unseen in training at
    ``report.target_length`` (a list of ints or a 1-D integer tensor), compared with
    :func:`unseen_pairs` for every family of :mod:`posenc.rope_families` at four target
    lengths; the verdict and hints in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    for name, target in _cases():
        report = explain(family(name)["config"], context=target)
        out, err = attempt(fn, report, lang=lang)
        if err:
            return verdict(False, err)
        got = _as_pairs(out, report.num_pairs)
        if got is None:
            kind = type(out).__name__
            return verdict(False, say(lang, en=f"return the pair indices as a list of ints, got "
                                               f"{kind}",
                                      zh=f"请返回由整数组成的旋转对序号列表，得到的是 {kind}"))
        want = unseen_pairs(report)
        if got != want:
            where = say(lang, en=f"{name} at {target:,} positions", zh=f"{name}，{target:,} 个位置")
            hint = _unseen_hint(got, report, lang) or say(
                lang, en=f"expected {len(want)} pairs, got {len(got)}",
                zh=f"应为 {len(want)} 对，得到 {len(got)} 对")
            return verdict(False, f"{where}: {hint}")
    return verdict(True, say(lang, en="your pairs match for every family and target tried",
                             zh="在所有试过的模型和目标长度上，你找出的旋转对都正确"))


def _gpt_oss_factor() -> float:
    """The attention factor on cos and sin of gpt-oss's YaRN, from posenc.explain."""
    return float(explain(family("gpt-oss")["config"]).attention_factor)


def check_gpt_oss_logits(answer: object, *, lang: str = "en") -> bool:
    """The factor gpt-oss's YaRN (factor 32) puts on the attention logits: the square of the
    attention factor on ``cos`` and ``sin``, ``(0.1 ln 32 + 1)**2``; the verdict in ``lang``."""
    check_lang(lang)
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        kind = type(answer).__name__
        return verdict(False, say(lang, en=f"answer with a number, got {kind}",
                                  zh=f"请用一个数作答，得到的是 {kind}"))
    root = _gpt_oss_factor()
    want = root * root

    def near(x: float) -> bool:
        return math.isclose(float(answer), x, rel_tol=2e-3)

    if near(want):
        return verdict(True, say(lang, en=f"the logits grow by {want:.4f} = (0.1 ln 32 + 1)^2: "
                                          f"a temperature t = {1 / want:.4f}",
                                 zh=f"logits 放大为 {want:.4f} 倍 = (0.1 ln 32 + 1)^2，即温度 "
                                    f"t = {1 / want:.4f}"))
    known = [
        (root, say(lang, en=f"{root:.4f} is the factor on cos and sin; q and k are both "
                            "rotated with it, so their dot product gets it twice",
                   zh=f"{root:.4f} 是乘在 cos 和 sin 上的因子；q 和 k 都乘了它，点积里它出现"
                      "两次")),
        (1 / want, say(lang, en="that is the temperature t; the logits are divided by t, so "
                                "they are multiplied by 1 / t",
                       zh="这是温度 t；logits 除以 t，也就是乘以 1 / t")),
        ((0.1 * math.log10(32) + 1) ** 2, say(lang, en="YaRN's formula uses the natural "
                                                       "logarithm, ln, not log10",
                                              zh="YaRN 的公式用自然对数 ln，不是 log10")),
        ((0.1 * math.log(131072) + 1) ** 2, say(lang, en="s is the factor, 32, not the "
                                                         "window length",
                                                zh="s 是缩放因子 32，不是窗口长度")),
    ]
    for value, hint in known:
        if near(value):
            return verdict(False, hint)
    return verdict(False, say(lang, en=f"{answer} is off; start from YaRN's sqrt(1/t) = "
                                       "0.1 ln s + 1 with gpt-oss's factor s",
                              zh=f"{answer} 不对；从 YaRN 的 sqrt(1/t) = 0.1 ln s + 1 出发，"
                                 "s 取 gpt-oss 的缩放因子"))
