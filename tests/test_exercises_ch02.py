"""The chapter 2 checker accepts T5's bias built from its table and names common slips."""

import torch

import posenc
from posenc.lab.exercises.ch02 import check_relative_bias


def t5_bias(weight, q_len, k_len):
    m = torch.arange(k_len - q_len, k_len)[:, None]  # queries: the last q_len positions
    n = torch.arange(k_len)[None, :]
    return weight[posenc.t5_relative_bucket(n - m)].permute(2, 0, 1)  # [H, Lq, Lk]


def test_accepts_a_correct_bias(capsys):
    assert check_relative_bias(t5_bias)
    assert capsys.readouterr().out.startswith("✓")


def test_rejects_the_wrong_offset_sign(capsys):
    def flipped(weight, q_len, k_len):
        m = torch.arange(k_len - q_len, k_len)[:, None]
        n = torch.arange(k_len)[None, :]
        return weight[posenc.t5_relative_bucket(m - n)].permute(2, 0, 1)

    assert not check_relative_bias(flipped)
    assert "n - m" in capsys.readouterr().out


def test_rejects_queries_at_the_start(capsys):
    def first(weight, q_len, k_len):
        m = torch.arange(q_len)[:, None]
        n = torch.arange(k_len)[None, :]
        return weight[posenc.t5_relative_bucket(n - m)].permute(2, 0, 1)

    assert not check_relative_bias(first)
    assert "LAST" in capsys.readouterr().out


def test_rejects_heads_last(capsys):
    assert not check_relative_bias(lambda w, q, k: t5_bias(w, q, k).permute(1, 2, 0))
    assert "heads come last" in capsys.readouterr().out


def test_stub_gives_false_without_raising(capsys):
    def stub(weight, q_len, k_len):
        raise NotImplementedError

    assert not check_relative_bias(stub)
    assert "not implemented yet" in capsys.readouterr().out
    assert not check_relative_bias(lambda w, q, k: [[0.0]])


def test_answers_in_chinese(capsys):
    assert check_relative_bias(t5_bias, lang="zh")
    assert capsys.readouterr().out.startswith("✓ 你的偏置与 posenc.T5RelativeBias 相等")
    assert not check_relative_bias(lambda w, q, k: t5_bias(w, q, k).permute(1, 2, 0), lang="zh")
    out = capsys.readouterr().out
    assert "2 个头，q_len=6，k_len=6：头这一维放在了最后" in out, out
    assert not check_relative_bias(lambda w, q, k: [[0.0]], lang="zh")
    assert "偏置应当是 torch.Tensor" in capsys.readouterr().out


def test_a_bad_lang_raises():
    import pytest

    with pytest.raises(ValueError, match="lang"):
        check_relative_bias(t5_bias, lang="english")
