"""Chapter 10's checkers accept a right solution and reject wrong ones with a hint."""

from __future__ import annotations

import re

import pytest
import torch
from _wrap import flat

import posenc
from posenc.lab.exercises import WIDTH, display_width
from posenc.lab.exercises.ch10 import (
    check_cu_seqlens,
    check_positions_from_mask,
    check_window_sinks,
)


def positions(mask, new):
    mask = mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, -new:]


def cu(document_ids):
    rows = document_ids.reshape(-1, document_ids.shape[-1])
    new = torch.ones_like(rows, dtype=torch.bool)
    new[:, 1:] = rows[:, 1:] != rows[:, :-1]
    starts = new.flatten().nonzero().flatten()
    offsets = torch.cat([starts, torch.tensor([rows.numel()])]).to(torch.int32)
    return offsets, int(offsets.diff().max())


def _rejects(check, fn, capsys, words, lang="en"):
    assert check(fn, lang=lang) is False
    out = flat(capsys.readouterr().out)
    assert out.startswith("✗") and words in out, out
    return out


def test_accept_the_solutions(capsys):
    assert check_positions_from_mask(positions)
    assert check_positions_from_mask(lambda m, new: posenc.positions_from_mask(m)[:, -new:])
    assert check_cu_seqlens(cu)
    assert check_cu_seqlens(posenc.cu_seqlens)
    out = capsys.readouterr().out
    assert out.count("✓") == 4 and "✗" not in out


def test_cu_seqlens_slips(capsys):
    check = check_cu_seqlens
    _rejects(check, lambda ids: (cu(ids)[0].diff(), cu(ids)[1]), capsys, "lengths")
    _rejects(check, lambda ids: (cu(ids)[0][1:], cu(ids)[1]), capsys, "leading 0")
    _rejects(check, lambda ids: (cu(ids)[0].long(), cu(ids)[1]), capsys, "int32")
    _rejects(check, lambda ids: (cu(ids)[0], torch.tensor(cu(ids)[1])), capsys, "Python int")
    _rejects(check, lambda ids: cu(ids)[0], capsys, "pair")

    def by_id(ids):  # counts each id once over the batch: merges rows
        counts = torch.unique(ids.flatten(), return_counts=True)[1]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        return offsets.to(torch.int32), int(counts.max())

    _rejects(check, by_id, capsys, "torch.unique")


def test_positions_slips(capsys):
    check = check_positions_from_mask
    _rejects(check, lambda m, k: torch.arange(k).expand(m.shape[0], k), capsys,
             "counted from the first new token")
    _rejects(check, lambda m, k: torch.arange(m.shape[1])[-k:].expand(m.shape[0], k), capsys,
             "slot indices")
    _rejects(check, lambda m, k: posenc.positions_from_mask(m), capsys,
             "positions of every token")
    _rejects(check, lambda m, k: (m.long().cumsum(-1) - 1)[:, -k:], capsys,
             "padded slots should hold 0")
    _rejects(check, lambda m, k: positions(m, k) + m.long()[:, -k:], capsys, "off by one")
    _rejects(check, lambda m, k: positions(m, k).float(), capsys, "integers")
    _rejects(check, lambda m, k: positions(m, k)[:, 1:], capsys, "shape")
    _rejects(check, lambda m, k: 1 / 0, capsys, "ZeroDivisionError")


def test_stub_gives_false_without_raising(capsys):
    def stub(*args):
        raise NotImplementedError  # your code here

    for check in (check_positions_from_mask, check_cu_seqlens, check_window_sinks):
        _rejects(check, stub, capsys, "not implemented yet")
        _rejects(check, "not a function", capsys, "expected a function")


def test_answers_in_chinese(capsys):
    assert check_positions_from_mask(positions, lang="zh")
    assert check_cu_seqlens(cu, lang="zh")
    out = capsys.readouterr().out
    assert out.count("✓") == 2 and "你的" in out and "your" not in out
    cases = [
        (check_positions_from_mask, lambda m, k: torch.arange(k).expand(m.shape[0], k),
         "从第一个新词元开始计数"),
        (check_positions_from_mask, lambda m, k: (m.long().cumsum(-1) - 1)[:, -k:],
         "transformers 4 填的是 1"),
        (check_positions_from_mask, lambda m, k: positions(m, k) + m.long()[:, -k:],
         "差了 1"),
        (check_cu_seqlens, lambda ids: (cu(ids)[0].diff(), cu(ids)[1]), "累加和"),
        (check_cu_seqlens, lambda ids: (cu(ids)[0].long(), cu(ids)[1]), "变长内核"),
        (check_cu_seqlens, lambda ids: (cu(ids)[0][1:], cu(ids)[1]), "第 i 篇文档"),
    ]
    for check, fn, words in cases:
        out = _rejects(check, fn, capsys, words, lang="zh")
        assert "（输入：" in out and "input:" not in out, out


_CJK = re.compile(r"[\u4e00-\u9fff]")


def test_chinese_hints_fit_the_page_and_space_latin_names(capsys):
    """Every Chinese line fits WIDTH display columns (a formula may overflow only on its own)
    and a Latin name is set off from Chinese characters by a space."""
    wrongs = [
        (check_positions_from_mask, lambda m, k: (m.long().cumsum(-1) - 1)[:, -k:]),
        (check_positions_from_mask, lambda m, k: torch.arange(k).expand(m.shape[0], k)),
        (check_positions_from_mask, lambda m, k: posenc.positions_from_mask(m)),
        (check_cu_seqlens, lambda ids: (cu(ids)[0].long(), cu(ids)[1])),
        (check_cu_seqlens, lambda ids: (cu(ids)[0][1:], cu(ids)[1])),
        (check_window_sinks, lambda m, n, w, s: visible(m, n, w + 1, s)),
        (check_window_sinks, lambda m, n, w, s: visible(m, n, w, 0)),
        (check_window_sinks, lambda m, n, w, s: visible(m, n, w, s).long()),
    ]
    for check, fn in wrongs:
        check(fn, lang="zh")
        for line in capsys.readouterr().out.splitlines():
            if "输入" not in line:  # the input line shows a tensor as it is
                assert display_width(line) <= WIDTH, line
            for a, b in zip(line, line[1:], strict=False):
                if (a.isascii() and a.isalnum() and _CJK.match(b)) or (
                        _CJK.match(a) and b.isascii() and b.isalnum()):
                    raise AssertionError(f"no space between {a!r} and {b!r}: {line}")


@pytest.mark.parametrize("check", [check_positions_from_mask, check_cu_seqlens,
                                   check_window_sinks])
def test_a_bad_lang_raises(check):
    with pytest.raises(ValueError, match="lang"):
        check(positions, lang="fr")


def visible(m, n, window, sinks):
    m, n = m[:, None], n[None, :]
    return (n <= m) & ((m - n < window) | (n < sinks))


def test_window_sinks_rule_is_attends(capsys):
    """The checker's cases: the written-out rule is the one posenc.attend applies."""
    from posenc.lab.exercises.ch10 import _WINDOWS

    for m, n, window, sinks in _WINDOWS:
        zq, zk = torch.zeros(1, 1, len(m), 4), torch.zeros(1, 1, len(n), 4)
        out = posenc.attend(zq, zk, torch.eye(len(n))[None, None], positions=m,
                            key_positions=n, window=window, sinks=sinks or None,
                            backend="math")
        assert torch.equal(out[0, 0] > 0, visible(m, n, window, sinks))
    assert check_window_sinks(visible)
    assert check_window_sinks(visible, lang="zh")


def test_window_sinks_slips(capsys):
    check = check_window_sinks

    def wide(m, n, w, s):  # m - n <= W: one key too many
        return visible(m, n, w + 1, s)

    def future_sinks(m, n, w, s):
        return visible(m, n, w, 0) | (n[None, :] < s).expand(len(m), -1)

    def by_slot(m, n, w, s):
        return visible(torch.arange(len(n))[-len(m):], torch.arange(len(n)), w, s)

    _rejects(check, wide, capsys, "off by one")
    _rejects(check, future_sinks, capsys, "n <= m")
    _rejects(check, lambda m, n, w, s: visible(m, n, w, 0), capsys, "sinks are missing")
    _rejects(check, by_slot, capsys, "slot indices")
    _rejects(check, lambda m, n, w, s: visible(m, n, w, s).long(), capsys, "bool")
    _rejects(check, lambda m, n, w, s: visible(m, n, w, s)[:, 1:], capsys, "shape")
    _rejects(check, wide, capsys, "差了 1", lang="zh")
    _rejects(check, future_sinks, capsys, "汇聚点仍然是过去的键", lang="zh")
    with pytest.raises(ValueError, match="lang"):
        check(visible, lang="fr")
