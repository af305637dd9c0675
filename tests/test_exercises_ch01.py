"""The chapter 1 checker accepts self-attention written from the formula and names common slips."""

import torch

from posenc.lab.exercises.ch01 import check_attention


def attention(x, w_q, w_k, w_v, causal=False):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = q @ k.T / k.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(dim=-1) @ v


def test_accepts_a_correct_attention(capsys):
    assert check_attention(attention)
    assert capsys.readouterr().out.startswith("✓")


def test_rejects_missing_scale(capsys):
    def unscaled(x, w_q, w_k, w_v, causal=False):
        return attention(x * 1.0, w_q * x.shape[-1] ** 0.25, w_k * x.shape[-1] ** 0.25, w_v, causal)

    assert not check_attention(unscaled)
    assert "sqrt(d)" in capsys.readouterr().out


def test_rejects_missing_mask(capsys):
    assert not check_attention(lambda x, w_q, w_k, w_v, causal=False: attention(x, w_q, w_k, w_v))
    assert "causal mask is missing" in capsys.readouterr().out


def test_rejects_softmax_over_queries(capsys):
    def columns(x, w_q, w_k, w_v, causal=False):
        return (x @ w_q @ (x @ w_k).T / x.shape[-1] ** 0.5).softmax(dim=0) @ (x @ w_v)

    assert not check_attention(columns)
    assert "dim 0" in capsys.readouterr().out


def test_stub_and_crash_give_false_without_raising(capsys):
    def stub(x, w_q, w_k, w_v, causal=False):
        raise NotImplementedError

    assert not check_attention(stub)
    assert "not implemented yet" in capsys.readouterr().out
    assert not check_attention(lambda x, w_q, w_k, w_v, causal=False: x @ w_q @ w_k)
    assert not check_attention(lambda *a, **k: 1 / 0)
    assert "ZeroDivisionError" in capsys.readouterr().out


def test_say_picks_the_language_and_names_a_bad_one():
    import pytest

    from posenc.lab.exercises import LANGS, attempt, compare, say

    assert LANGS == ("en", "zh")
    assert say("en", en="yes", zh="是") == "yes" and say("zh", en="yes", zh="是") == "是"
    for bad in ("fr", "EN", None, 1):
        with pytest.raises(ValueError, match="lang"):
            say(bad, en="yes", zh="是")
    # the shared hints speak Chinese too
    assert compare([1], torch.zeros(2), what="输出", lang="zh") == "输出应当是 torch.Tensor，得到的是 list"
    assert "形状" in compare(torch.zeros(3), torch.zeros(2), what="输出", lang="zh")
    assert "2 倍" in compare(2 * torch.ones(2), torch.ones(2), what="输出", lang="zh")
    _, error = attempt(lambda: 1 / 0, lang="zh")
    assert error.startswith("你的函数抛出了 ZeroDivisionError")


def test_answers_in_chinese(capsys):
    assert check_attention(attention, lang="zh")
    out = capsys.readouterr().out
    assert out.startswith("✓ 你的注意力与 posenc.attend 相等"), out
    assert not check_attention(lambda x, w_q, w_k, w_v, causal=False: attention(x, w_q, w_k, w_v),
                               lang="zh")
    assert "缺少因果掩码" in capsys.readouterr().out

    def stub(x, w_q, w_k, w_v, causal=False):
        raise NotImplementedError

    assert not check_attention(stub, lang="zh")
    out = capsys.readouterr().out
    assert "还没有实现" in out and "not implemented" not in out


def test_a_bad_lang_raises_before_running():
    import pytest

    calls = []
    with pytest.raises(ValueError, match="lang must be one of"):
        check_attention(lambda *a, **k: calls.append(1), lang="de")
    assert not calls
