"""Checkers for chapter 8 (long context in practice): scoring a passkey answer.

A passkey sequence of ``n`` bytes ends with the 5 digits of the key; the model reads
``tokens[:, :-1]`` and its logits ``[B, n - 1, 256]`` at position ``j`` predict byte ``j + 1``,
so the last 5 positions of the logits predict the key. The score is the share of key digits whose
most likely byte is right (teacher forced), as :func:`posenc.lab.evaluate.passkey_accuracy` and
:func:`posenc.lab.passkey_grid` compute it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..data import passkey_batch
from . import attempt, check_lang, say, verdict

__all__ = ["check_digit_accuracy", "digit_accuracy_variant", "HINTS", "HINTS_ZH"]

CASES = [(4, 110, 0), (6, 128, 1), (3, 200, 2)]  # (batch, length, seed)


def digit_accuracy_variant(logits: Tensor, tokens: Tensor, *, mistake: str | None = None) -> float:
    """The share of key digits predicted right, or with one named ``mistake`` (the hints)."""
    pred = logits.argmax(-1)  # [B, n - 1]: the byte predicted for position j + 1
    if mistake == "early":
        return float((pred[:, -6:-1] == tokens[:, -5:]).float().mean())
    if mistake == "late":
        return float((pred[:, -5:] == tokens[:, -6:-1]).float().mean())
    if mistake == "whole_key":
        return float((pred[:, -5:] == tokens[:, -5:]).all(dim=1).float().mean())
    if mistake == "every_byte":
        return float((pred == tokens[:, 1:]).float().mean())
    return float((pred[:, -5:] == tokens[:, -5:]).float().mean())


_OFF_BY_ONE = ("the logits and the key are one position apart: logits[:, j] predicts "
               "tokens[:, j + 1], so the key tokens[:, -5:] is predicted by logits[:, -5:]")
HINTS = {
    "early": _OFF_BY_ONE,
    "late": _OFF_BY_ONE,
    "whole_key": "you counted a key only when all five digits are right; the score is per digit",
    "every_byte": "you scored every byte of the sequence; only the five key digits count",
}

_OFF_BY_ONE_ZH = ("logits 和密钥错开了一个位置：logits[:, j] 预测 tokens[:, j + 1]，所以密钥 "
                  "tokens[:, -5:] 由 logits[:, -5:] 预测")
HINTS_ZH = {
    "early": _OFF_BY_ONE_ZH,
    "late": _OFF_BY_ONE_ZH,
    "whole_key": "你只在五位数字全对时才算这个密钥对；分数是按每一位数字算的",
    "every_byte": "你给序列的每个字节都打了分；只有密钥的五位数字才算",
}

def _logits(tokens: Tensor, seed: int) -> Tensor:
    """Random logits ``[B, n - 1, 256]`` that get about half of all next bytes right."""
    gen = torch.Generator().manual_seed(seed)
    b, n = tokens.shape
    logits = torch.randn(b, n - 1, 256, generator=gen)
    right = torch.rand(b, n - 1, generator=gen) < 0.5
    # a right guess: the true next byte gets the highest logit; a wrong one: a neighbour of it
    target = torch.where(right, tokens[:, 1:], (tokens[:, 1:] + 1) % 256)
    logits.scatter_(-1, target[..., None], 10.0)
    return logits


def check_digit_accuracy(fn: Callable[[Tensor, Tensor], float], *, lang: str = "en") -> bool:
    """Check ``fn(logits, tokens) -> float``, the share of passkey digits predicted right; the
    verdict and hints in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    sep = say(lang, en=": ", zh="：")
    for batch, length, seed in CASES:
        tokens, _, _ = passkey_batch(batch, length, seed=seed)  # [B, n]
        logits = _logits(tokens, seed)
        want = digit_accuracy_variant(logits, tokens)
        name = say(lang, en=f"{batch} sequences of {length} bytes",
                   zh=f"{batch} 个 {length} 字节的序列")
        got, error = attempt(fn, logits.clone(), tokens.clone(), lang=lang)
        if error:
            return verdict(False, f"{name}{sep}{error}")
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, int | float):
            kind = type(got).__name__
            return verdict(False, name + sep + say(lang, en=f"return a float in [0, 1], got {kind}",
                                                   zh=f"应返回 [0, 1] 中的浮点数，得到的是 {kind}"))
        if abs(got - want) < 1e-6:
            continue
        for mistake, hint in HINTS.items():
            wrong = digit_accuracy_variant(logits, tokens, mistake=mistake)
            if abs(wrong - want) > 1e-6 and abs(got - wrong) < 1e-6:
                return verdict(False, name + sep + say(lang, en=hint, zh=HINTS_ZH[mistake]))
        return verdict(False, name + sep + say(lang, en=f"got {got:.4f}, expected {want:.4f}",
                                               zh=f"得到 {got:.4f}，应为 {want:.4f}"))
    return verdict(True, say(lang, en="your score equals the lab's passkey accuracy on every batch tried",
                             zh="在所有试过的批次上，你的分数都与实验室的密钥准确率相等"))
