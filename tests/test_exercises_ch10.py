"""Chapter 10's checkers accept a right solution and reject wrong ones with a hint."""

from __future__ import annotations

import re

import pytest
import torch
from _wrap import flat

import posenc
from posenc.lab import production as prod
from posenc.lab.exercises import WIDTH, display_width
from posenc.lab.exercises.ch10 import (
    check_alibi_after_eviction,
    check_cu_seqlens,
    check_positions_from_mask,
    check_rerotate,
    check_shard_positions,
    check_streaming_keep,
)


def positions(mask, new):
    mask = mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, -new:]


def shard(seq_len, rank, world):
    c, tail = seq_len // (2 * world), 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                      torch.arange(tail * c, (tail + 1) * c)])


def doc_shards(lengths, rank, world):
    return torch.cat([shard(n, rank, world) for n in lengths])


def contiguous_docs(lengths, rank, world):
    return torch.cat([posenc.shard_positions(n, rank, world, load_balance=False)
                      for n in lengths])


def rerotate(k, delta, base=10000.0, *, sign=1.0, interleaved=True):
    inv = posenc.rope_inv_freq(k.shape[-1], base=base)[0]
    cos, sin = posenc.rope_cos_sin(delta.abs(), inv, interleaved=interleaved)
    return posenc.apply_rope(k, cos, sign * sin * delta.sign()[:, None], interleaved=interleaved)


def cu(document_ids):
    rows = document_ids.reshape(-1, document_ids.shape[-1])
    new = torch.ones_like(rows, dtype=torch.bool)
    new[:, 1:] = rows[:, 1:] != rows[:, :-1]
    starts = new.flatten().nonzero().flatten()
    offsets = torch.cat([starts, torch.tensor([rows.numel()])]).to(torch.int32)
    return offsets, int(offsets.diff().max())


def alibi(slopes, m, n):
    dist = (m[:, None] - n[None, :]).float()
    return (-slopes[:, None, None] * dist).masked_fill(dist < 0, float("-inf"))


def keep_delta(length, sinks, window):
    if length <= sinks + window:
        keep = torch.arange(length)
    else:
        keep = torch.cat([torch.arange(sinks), torch.arange(length - window, length)])
    return keep, torch.arange(len(keep)) - keep


def _rejects(check, fn, capsys, words, lang="en"):
    assert check(fn, lang=lang) is False
    out = flat(capsys.readouterr().out)
    assert out.startswith("✗") and words in out, out
    return out


def test_accept_the_solutions(capsys):
    assert check_positions_from_mask(positions)
    assert check_positions_from_mask(lambda m, new: posenc.positions_from_mask(m)[:, -new:])
    assert check_shard_positions(doc_shards)
    assert check_shard_positions(lambda ls, r, w: torch.cat([posenc.shard_positions(n, r, w)
                                                             for n in ls]))
    assert check_rerotate(rerotate)
    assert check_cu_seqlens(cu)
    assert check_cu_seqlens(posenc.cu_seqlens)
    assert check_alibi_after_eviction(alibi)
    assert check_streaming_keep(keep_delta)
    assert check_streaming_keep(prod.streaming_keep)
    out = capsys.readouterr().out
    assert out.count("✓") == 10 and "✗" not in out


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


def test_alibi_after_eviction_slips(capsys):
    check = check_alibi_after_eviction

    def from_slots(slopes, m, n):  # slot indices: the queries are the last len(m) slots
        return alibi(slopes, torch.arange(len(n) - len(m), len(n)), torch.arange(len(n)))

    _rejects(check, from_slots, capsys, "slot indices")
    _rejects(check, lambda s, m, n: -alibi(s, m, n).nan_to_num(neginf=0.0).masked_fill(
        alibi(s, m, n).isneginf(), float("-inf")), capsys, "sign is reversed")
    _rejects(check, lambda s, m, n: -s[:, None, None] * (m[:, None] - n[None, :]).float(),
             capsys, "-inf")
    _rejects(check, lambda s, m, n: alibi(s, m, n)[:1], capsys, "shape")


def test_streaming_keep_slips(capsys):
    check = check_streaming_keep

    def no_sinks(length, sinks, window):  # the latest sinks + window: a plain window
        size = sinks + window
        keep = torch.arange(max(length - size, 0), length)
        return keep, torch.arange(len(keep)) - keep

    _rejects(check, no_sinks, capsys, "first sinks slots must stay")
    _rejects(check, lambda n, s, w: (keep_delta(n, s, w)[0], -keep_delta(n, s, w)[1]),
             capsys, "new position minus old")

    def window_from_zero(length, sinks, window):
        keep, delta = keep_delta(length, sinks, window)
        return keep, delta - sinks * (torch.arange(len(keep)) >= sinks)

    _rejects(check, window_from_zero, capsys, "sinks first")

    def always_evict(length, sinks, window):
        keep = torch.cat([torch.arange(sinks), torch.arange(max(length - window, sinks),
                                                            length)])
        return keep[:sinks + window], torch.zeros(min(len(keep), sinks + window))

    _rejects(check, always_evict, capsys, "delta differs")


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


def test_shard_slips(capsys):
    check = check_shard_positions
    _rejects(check, contiguous_docs, capsys, "contiguous chunks")

    def whole_row(lengths, r, w):  # head-tail of the whole row, positions per document
        ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        return posenc.packed_positions(ids[None])[0][posenc.shard_positions(sum(lengths), r, w)]

    _rejects(check, whole_row, capsys, "cut every document")

    def row_indices(lengths, r, w):  # indices into the row, not positions
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        return torch.cat([shard(n, r, w) + s for n, s in zip(lengths, starts, strict=True)])

    _rejects(check, row_indices, capsys, "restart at 0")
    _rejects(check, lambda ls, r, w: doc_shards(ls, r, w).flip(0), capsys, "wrong order")
    _rejects(check, lambda ls, r, w: doc_shards(ls, r, w).float(), capsys, "integers")


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

    for check in (check_positions_from_mask, check_shard_positions, check_rerotate,
                  check_cu_seqlens, check_alibi_after_eviction, check_streaming_keep):
        _rejects(check, stub, capsys, "not implemented yet")
        _rejects(check, "not a function", capsys, "expected a function")


def test_answers_in_chinese(capsys):
    assert check_positions_from_mask(positions, lang="zh")
    assert check_shard_positions(doc_shards, lang="zh")
    assert check_rerotate(rerotate, lang="zh")
    assert check_cu_seqlens(cu, lang="zh")
    assert check_alibi_after_eviction(alibi, lang="zh")
    assert check_streaming_keep(keep_delta, lang="zh")
    out = capsys.readouterr().out
    assert out.count("✓") == 6 and "你的" in out and "your" not in out
    cases = [
        (check_positions_from_mask, lambda m, k: torch.arange(k).expand(m.shape[0], k),
         "从第一个新词元开始计数"),
        (check_positions_from_mask, lambda m, k: (m.long().cumsum(-1) - 1)[:, -k:],
         "填充位置应当是 0"),
        (check_shard_positions, contiguous_docs, "连续切块"),
        (check_rerotate, lambda k, d, b: rerotate(k, d, b, sign=-1.0), "转了 -delta"),
        (check_rerotate, lambda k, d, b: 1 / 0, "你的函数抛出了"),
        (check_cu_seqlens, lambda ids: (cu(ids)[0].diff(), cu(ids)[1]), "累加和"),
        (check_alibi_after_eviction, lambda s, m, n: alibi(
            s, torch.arange(len(n) - len(m), len(n)), torch.arange(len(n))), "槽位下标"),
        (check_streaming_keep, lambda n, s, w: (keep_delta(n, s, w)[0],
                                                -keep_delta(n, s, w)[1]), "新位置减旧位置"),
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
        (check_shard_positions, contiguous_docs),
        (check_shard_positions, lambda ls, r, w: doc_shards(ls, r, w).flip(0)),
        (check_rerotate, lambda k, d, b: rerotate(k, d, b, interleaved=False)),
        (check_cu_seqlens, lambda ids: (cu(ids)[0].long(), cu(ids)[1])),
        (check_alibi_after_eviction, lambda s, m, n: alibi(
            s, torch.arange(len(n) - len(m), len(n)), torch.arange(len(n)))),
        (check_streaming_keep, lambda n, s, w: (keep_delta(n, s, w)[0],
                                                -keep_delta(n, s, w)[1])),
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


@pytest.mark.parametrize("check", [check_positions_from_mask, check_shard_positions,
                                   check_rerotate, check_cu_seqlens,
                                   check_alibi_after_eviction, check_streaming_keep])
def test_a_bad_lang_raises(check):
    with pytest.raises(ValueError, match="lang"):
        check(positions, lang="fr")
