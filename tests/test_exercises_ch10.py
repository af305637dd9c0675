"""Chapter 10's checkers accept a right solution and reject wrong ones with a hint."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.lab.exercises.ch10 import (
    check_positions_from_mask,
    check_rerotate,
    check_shard_positions,
)


def positions(mask):
    mask = mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def shard(seq_len, rank, world):
    c, tail = seq_len // (2 * world), 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                      torch.arange(tail * c, (tail + 1) * c)])


def rerotate(k, delta, base=10000.0, *, sign=1.0, interleaved=True):
    inv = posenc.rope_inv_freq(k.shape[-1], base=base)[0]
    cos, sin = posenc.rope_cos_sin(delta.abs(), inv, interleaved=interleaved)
    return posenc.apply_rope(k, cos, sign * sin * delta.sign()[:, None], interleaved=interleaved)


def _rejects(check, fn, capsys, words, lang="en"):
    assert check(fn, lang=lang) is False
    out = capsys.readouterr().out
    assert out.startswith("✗") and words in out, out
    return out


def test_accept_the_solutions(capsys):
    assert check_positions_from_mask(positions)
    assert check_positions_from_mask(posenc.positions_from_mask)
    assert check_shard_positions(shard)
    assert check_shard_positions(posenc.shard_positions)
    assert check_rerotate(rerotate)
    out = capsys.readouterr().out
    assert out.count("✓") == 5 and "✗" not in out


def test_positions_slips(capsys):
    check = check_positions_from_mask
    _rejects(check, lambda m: torch.arange(m.shape[1]).expand(m.shape), capsys, "arange(L)")
    _rejects(check, lambda m: m.long().cumsum(-1) - 1, capsys, "padded slots should hold 0")
    _rejects(check, lambda m: positions(m) + m.long(), capsys, "off by one")
    _rejects(check, lambda m: positions(m).float(), capsys, "integers")
    _rejects(check, lambda m: positions(m)[:, 1:], capsys, "shape")
    _rejects(check, lambda m: 1 / 0, capsys, "ZeroDivisionError")


def test_shard_slips(capsys):
    check = check_shard_positions
    contiguous = lambda n, r, w: posenc.shard_positions(n, r, w, load_balance=False)  # noqa: E731
    _rejects(check, contiguous, capsys, "contiguous chunks")

    def strided(n, r, w):
        c = n // (2 * w)
        return torch.cat([torch.arange(r * c, (r + 1) * c),
                          torch.arange((r + w) * c, (r + w + 1) * c)])

    _rejects(check, strided, capsys, "r + W")
    _rejects(check, lambda n, r, w: shard(n, r, w).flip(0), capsys, "wrong order")
    _rejects(check, lambda n, r, w: shard(n, r, w).float(), capsys, "integers")


def test_rerotate_slips(capsys):
    check = check_rerotate
    _rejects(check, lambda k, d, b: k.clone(), capsys, "unrotated")
    _rejects(check, lambda k, d, b: rerotate(k, d, b, sign=-1.0), capsys, "-delta")
    _rejects(check, lambda k, d, b: rerotate(k, d, b, interleaved=False), capsys,
             "half layout")
    _rejects(check, lambda k, d, b: rerotate(k, d, 10000.0), capsys, "base=100")

    def in_place(k, d, b):
        k.copy_(rerotate(k, d, b))
        return k

    _rejects(check, in_place, capsys, "in place")


def test_stub_gives_false_without_raising(capsys):
    def stub(*args):
        raise NotImplementedError  # your code here

    for check in (check_positions_from_mask, check_shard_positions, check_rerotate):
        _rejects(check, stub, capsys, "not implemented yet")
        _rejects(check, "not a function", capsys, "expected a function")


def test_answers_in_chinese(capsys):
    assert check_positions_from_mask(positions, lang="zh")
    assert check_shard_positions(shard, lang="zh")
    assert check_rerotate(rerotate, lang="zh")
    out = capsys.readouterr().out
    assert out.count("✓") == 3 and "你的" in out and "your" not in out
    cases = [
        (check_positions_from_mask, lambda m: torch.arange(m.shape[1]).expand(m.shape),
         "arange(L)"),
        (check_positions_from_mask, lambda m: m.long().cumsum(-1) - 1, "填充位置应当是 0"),
        (check_shard_positions,
         lambda n, r, w: posenc.shard_positions(n, r, w, load_balance=False), "连续切块"),
        (check_rerotate, lambda k, d, b: rerotate(k, d, b, sign=-1.0), "转了 -delta"),
        (check_rerotate, lambda k, d, b: 1 / 0, "你的函数抛出了"),
    ]
    for check, fn, words in cases:
        out = _rejects(check, fn, capsys, words, lang="zh")
        assert "（输入：" in out and "input:" not in out, out


@pytest.mark.parametrize("check", [check_positions_from_mask, check_shard_positions,
                                   check_rerotate])
def test_a_bad_lang_raises(check):
    with pytest.raises(ValueError, match="lang"):
        check(positions, lang="fr")
