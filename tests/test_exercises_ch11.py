"""Chapter 11's checkers accept a right solution and reject wrong ones with a hint."""

from __future__ import annotations

import re

import pytest
import torch
from _wrap import flat

import posenc
from posenc.lab import serving
from posenc.lab.exercises import WIDTH, display_width
from posenc.lab.exercises.ch11 import (
    check_alibi_after_eviction,
    check_merge_partials,
    check_rerotate,
    check_shard_positions,
    check_streaming_keep,
    check_tree_mask,
)

CHECKS = [check_alibi_after_eviction, check_streaming_keep, check_rerotate,
          check_shard_positions, check_tree_mask, check_merge_partials]


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


def alibi(slopes, m, n):
    dist = (m[:, None] - n[None, :]).float()
    return (-slopes[:, None, None] * dist).masked_fill(dist < 0, float("-inf"))


def keep_delta(length, sinks, window):
    if length <= sinks + window:
        keep = torch.arange(length)
    else:
        keep = torch.cat([torch.arange(sinks), torch.arange(length - window, length)])
    return keep, torch.arange(len(keep)) - keep


def tree(parents, prefix):
    """Written out: depth by walking up, a node sees the prefix, its ancestors and itself."""
    n = len(parents)
    depth, mask = [], torch.zeros(n, prefix + n, dtype=torch.bool)
    mask[:, :prefix] = True
    for i in range(n):
        node, d = i, 0
        while node >= 0:
            mask[i, prefix + node] = True
            node, d = parents[node], d + 1
        depth.append(d - 1)
    return prefix + torch.tensor(depth), mask


def merge(outputs, lses):
    stacked = torch.stack(lses)
    lse = torch.logsumexp(stacked, 0)
    weight = torch.exp(stacked - lse).nan_to_num(0.0)
    return (weight[..., None] * torch.stack(outputs)).sum(0), lse


def _rejects(check, fn, capsys, words, lang="en"):
    assert check(fn, lang=lang) is False
    out = flat(capsys.readouterr().out)
    assert out.startswith("✗") and words in out, out
    return out


def test_accept_the_solutions(capsys):
    assert check_shard_positions(doc_shards)
    assert check_rerotate(rerotate)
    assert check_alibi_after_eviction(alibi)
    assert check_streaming_keep(keep_delta)
    # the exercise's window is the cache's recent slots, attention's window minus one
    assert check_streaming_keep(lambda n, s, w: posenc.streaming_keep(n, s, w + 1))
    assert check_tree_mask(tree)
    assert check_tree_mask(lambda p, n: serving.tree_positions_and_mask(p, prefix=n))
    assert check_merge_partials(merge)
    assert check_merge_partials(serving.merge_partials)
    out = capsys.readouterr().out
    assert out.count("✓") == 9 and "✗" not in out


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
    _rejects(check, lambda n, s, w: keep_delta(n, s, w)[0], capsys, "pair of tensors")
    _rejects(check, lambda n, s, w: (keep_delta(n, s, w)[0].float(), keep_delta(n, s, w)[1]),
             capsys, "integers")
    _rejects(check, lambda n, s, w: (keep_delta(n, s, w)[0], keep_delta(n, s, w)[1].float()),
             capsys, "integers")
    _rejects(check, lambda n, s, w: (keep_delta(n, s, w)[0], keep_delta(n, s, w)[1].float()),
             capsys, "整数", lang="zh")


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

    def in_place(k, d, b):
        k.copy_(rerotate(k, d, b))
        return k

    _rejects(check, in_place, capsys, "in place")


def test_tree_slips(capsys):
    check = check_tree_mask
    right = tree
    _rejects(check, lambda p, n: (n + torch.arange(len(p)), right(p, n)[1]), capsys,
             "share a position")
    _rejects(check, lambda p, n: (right(p, n)[0] - n, right(p, n)[1]), capsys,
             "add its length")
    _rejects(check, lambda p, n: (right(p, n)[0] + 1, right(p, n)[1]), capsys, "off by one")
    _rejects(check, lambda p, n: (right(p, n)[0].float(), right(p, n)[1]), capsys,
             "integers")

    def causal(p, n):
        return right(p, n)[0], torch.ones(len(p), n + len(p), dtype=torch.bool).tril(n)

    _rejects(check, causal, capsys, "siblings' branches")

    def no_self(p, n):
        pos, mask = right(p, n)
        mask[:, n:] &= ~torch.eye(len(p), dtype=torch.bool)
        return pos, mask

    _rejects(check, no_self, capsys, "see itself")

    def no_prefix(p, n):
        pos, mask = right(p, n)
        mask[:, :n] = False
        return pos, mask

    _rejects(check, no_prefix, capsys, "whole prefix")
    _rejects(check, lambda p, n: (right(p, n)[0], right(p, n)[1].int()), capsys, "bool")
    _rejects(check, lambda p, n: (right(p, n)[0], right(p, n)[1][:, n:]), capsys, "shape")
    _rejects(check, lambda p, n: right(p, n)[0], capsys, "pair of tensors")


def test_merge_slips(capsys):
    check = check_merge_partials
    _rejects(check, lambda o, s: (torch.stack(o).mean(0), merge(o, s)[1]), capsys,
             "plain average")
    _rejects(check, lambda o, s: (merge(o, s)[0], torch.stack(s).amax(0)), capsys,
             "logsumexp")

    def unguarded(o, s):  # exp(-inf - -inf) = NaN on a row no block saw
        stacked = torch.stack(s)
        lse = torch.logsumexp(stacked, 0)
        return (torch.exp(stacked - lse)[..., None] * torch.stack(o)).sum(0), lse

    _rejects(check, unguarded, capsys, "NaN")
    _rejects(check, lambda o, s: merge(o, s)[0], capsys, "pair of tensors")


def test_stub_gives_false_without_raising(capsys):
    def stub(*args):
        raise NotImplementedError  # your code here

    for check in CHECKS:
        _rejects(check, stub, capsys, "not implemented yet")
        _rejects(check, "not a function", capsys, "expected a function")


def test_answers_in_chinese(capsys):
    assert check_shard_positions(doc_shards, lang="zh")
    assert check_rerotate(rerotate, lang="zh")
    assert check_alibi_after_eviction(alibi, lang="zh")
    assert check_streaming_keep(keep_delta, lang="zh")
    assert check_tree_mask(tree, lang="zh")
    assert check_merge_partials(merge, lang="zh")
    out = capsys.readouterr().out
    assert out.count("✓") == 6 and "你的" in out and "your" not in out
    cases = [
        (check_shard_positions, contiguous_docs, "连续切块"),
        (check_rerotate, lambda k, d, b: rerotate(k, d, b, sign=-1.0), "转了 -delta"),
        (check_alibi_after_eviction, lambda s, m, n: alibi(
            s, torch.arange(len(n) - len(m), len(n)), torch.arange(len(n))), "槽位下标"),
        (check_streaming_keep, lambda n, s, w: (keep_delta(n, s, w)[0],
                                                -keep_delta(n, s, w)[1]), "新位置减旧位置"),
        (check_tree_mask, lambda p, n: (n + torch.arange(len(p)), tree(p, n)[1]), "兄弟节点"),
        (check_merge_partials, lambda o, s: (torch.stack(o).mean(0), merge(o, s)[1]),
         "简单平均"),
    ]
    for check, fn, words in cases:
        out = _rejects(check, fn, capsys, words, lang="zh")
        assert "（输入：" in out and "input:" not in out, out


_CJK = re.compile(r"[\u4e00-\u9fff]")


def test_chinese_hints_fit_the_page_and_space_latin_names(capsys):
    """Every Chinese line fits WIDTH display columns (a formula may overflow only on its own)
    and a Latin name is set off from Chinese characters by a space."""
    wrongs = [
        (check_shard_positions, contiguous_docs),
        (check_rerotate, lambda k, d, b: rerotate(k, d, b, interleaved=False)),
        (check_alibi_after_eviction, lambda s, m, n: alibi(
            s, torch.arange(len(n) - len(m), len(n)), torch.arange(len(n)))),
        (check_streaming_keep, lambda n, s, w: (keep_delta(n, s, w)[0],
                                                -keep_delta(n, s, w)[1])),
        (check_tree_mask, lambda p, n: (tree(p, n)[0] - n, tree(p, n)[1])),
        (check_tree_mask, lambda p, n: (tree(p, n)[0], torch.ones(
            len(p), n + len(p), dtype=torch.bool).tril(n))),
        (check_merge_partials, lambda o, s: (torch.stack(o).mean(0), merge(o, s)[1])),
        (check_merge_partials, lambda o, s: (merge(o, s)[0], torch.stack(s).amax(0))),
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


@pytest.mark.parametrize("check", CHECKS)
def test_a_bad_lang_raises(check):
    with pytest.raises(ValueError, match="lang"):
        check(keep_delta, lang="fr")
