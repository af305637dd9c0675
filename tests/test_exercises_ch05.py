"""The chapter 5 checker accepts the paper's slopes and names each usual slip."""

from __future__ import annotations

import math

import torch

from posenc.lab.exercises.ch05 import check_slopes


def paper_slopes(n):
    c = 2 ** math.floor(math.log2(n))  # largest power of two <= n
    first = [2 ** (-8 * h / c) for h in range(1, c + 1)]
    extra = [2 ** (-8 * h / (2 * c)) for h in range(1, 2 * (n - c), 2)]
    return torch.tensor(first + extra)


def test_accepts_the_solution(capsys):
    assert check_slopes(paper_slopes)
    assert capsys.readouterr().out.startswith("✓")
    assert check_slopes(lambda n: paper_slopes(n).tolist())  # a list is fine too
    capsys.readouterr()


def _rejects(fn, capsys, words):
    assert check_slopes(fn) is False
    out = capsys.readouterr().out
    assert out.startswith("✗") and words in out, out


def test_names_the_slips(capsys):
    _rejects(lambda n: torch.tensor([1 / 2**i for i in range(n)]), capsys, "head 0 has slope 1")
    _rejects(lambda n: torch.tensor([1 / 2**h for h in range(1, n + 1)]), capsys, "only for 8")
    _rejects(lambda n: paper_slopes(n).flip(0), capsys, "reverse order")
    _rejects(lambda n: torch.tensor([2 ** (-8 * h / n) for h in range(1, n + 1)]), capsys,
             "not a power of two")
    _rejects(lambda n: paper_slopes(n).sort(descending=True).values, capsys, "wrong order")
    # right for 12 heads, wrong elsewhere: the checker tries other head counts too
    _rejects(lambda n: paper_slopes(n) * (1 if n == 12 else 2), capsys, "num_heads=8")


def test_shapes_and_errors(capsys):
    _rejects(lambda n: paper_slopes(n)[:-1], capsys, "shape")
    _rejects(lambda n: torch.arange(n), capsys, "float")
    _rejects(lambda n: {"a": 1}, capsys, "torch.Tensor")
    _rejects(lambda n: [1, "x"], capsys, "list")
    _rejects(lambda n: math.log(-n), capsys, "ValueError")


def test_stub_gives_false_without_raising(capsys):
    def stub(num_heads):
        raise NotImplementedError  # your code here

    _rejects(stub, capsys, "not implemented yet")


def test_answers_in_chinese(capsys):
    assert check_slopes(paper_slopes, lang="zh")
    assert capsys.readouterr().out.startswith("✓ 你的斜率与 posenc.alibi_slopes 相等")
    assert check_slopes(lambda n: torch.tensor([1 / 2**i for i in range(n)]), lang="zh") is False
    out = capsys.readouterr().out
    assert "头 0 的斜率是 1" in out and "（输入：num_heads=12）" in out, out
    assert check_slopes(lambda n: paper_slopes(n)[:-1], lang="zh") is False
    assert "斜率的形状是 (11,)，应为 (12,)" in capsys.readouterr().out


def test_a_bad_lang_raises():
    import pytest

    with pytest.raises(ValueError, match="lang"):
        check_slopes(paper_slopes, lang="ZH")
