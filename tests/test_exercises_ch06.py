"""The chapter 6 checker accepts ALiBi's bias built from the formula and rejects common mistakes."""

import math

import torch

import posenc
from posenc.lab.exercises.ch06 import check_alibi_bias


def paper_slopes(h):
    p = 2 ** math.floor(math.log2(h))
    s = [2 ** (-8 * i / p) for i in range(1, p + 1)]
    return torch.tensor(s + [2 ** (-4 * i / p) for i in range(1, 2 * (h - p), 2)])


def build(slopes, q_len, k_len, *, first=False, sign=-1.0, future=float("-inf")):
    m = torch.arange(q_len) if first else torch.arange(k_len - q_len, k_len)
    dist = (m[:, None] - torch.arange(k_len)[None, :]).float()  # [Lq, Lk]: m - n
    bias = sign * slopes[:, None, None] * dist  # [H, Lq, Lk]
    return bias.masked_fill(dist < 0, future)


def solution(h, q_len, k_len):
    return build(paper_slopes(h), q_len, k_len)


def test_accepts_the_formula(capsys):
    assert check_alibi_bias(solution)
    assert check_alibi_bias(posenc.alibi_bias)
    assert capsys.readouterr().out.startswith("✓")


def test_stub_gives_false_without_raising(capsys):
    def stub(h, q_len, k_len):
        raise NotImplementedError

    assert check_alibi_bias(stub) is False
    assert "not implemented yet" in capsys.readouterr().out


def test_rejects_the_article_slopes(capsys):
    assert not check_alibi_bias(lambda h, q, k: build(1 / 2 ** torch.arange(h).float(), q, k))
    assert "source article" in capsys.readouterr().out


def test_rejects_clamped_future(capsys):
    assert not check_alibi_bias(lambda h, q, k: build(paper_slopes(h), q, k, future=0.0))
    assert "-inf" in capsys.readouterr().out


def test_rejects_naive_slopes_for_12_heads(capsys):
    def naive(h, q, k):
        return build(2.0 ** (-8.0 * torch.arange(1, h + 1).float() / h), q, k)

    assert not check_alibi_bias(naive)
    assert "not a power of two" in capsys.readouterr().out


def test_rejects_wrong_sign_first_queries_and_shape(capsys):
    assert not check_alibi_bias(lambda h, q, k: build(paper_slopes(h), q, k, sign=1.0))
    assert "sign" in capsys.readouterr().out
    assert not check_alibi_bias(lambda h, q, k: build(paper_slopes(h), q, k, first=True))
    assert "LAST" in capsys.readouterr().out
    assert not check_alibi_bias(lambda h, q, k: solution(h, q, k)[0])
    assert "shape" in capsys.readouterr().out
    assert not check_alibi_bias(lambda h, q, k: None)
    assert "torch.Tensor" in capsys.readouterr().out


def test_answers_in_chinese(capsys):
    assert check_alibi_bias(solution, lang="zh")
    assert capsys.readouterr().out.startswith("✓ 你的偏置与 posenc.alibi_bias 相等")
    assert not check_alibi_bias(lambda h, q, k: build(1 / 2 ** torch.arange(h).float(), q, k),
                                lang="zh")
    out = capsys.readouterr().out
    assert "8 个头，q_len=6，k_len=6：" in out and "中文原文" in out, out
    assert not check_alibi_bias(lambda h, q, k: build(paper_slopes(h), q, k, future=0.0),
                                lang="zh")
    assert "必须是 -inf" in capsys.readouterr().out


def test_a_bad_lang_raises():
    import pytest

    with pytest.raises(ValueError, match="lang"):
        check_alibi_bias(solution, lang="es")
