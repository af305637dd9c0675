"""The chapter 8 checker accepts the passkey scoring and rejects the usual slips with a hint."""

import pytest
from _wrap import flat

from posenc.lab.data import passkey_batch
from posenc.lab.exercises.ch08 import (
    CASES,
    HINTS,
    _logits,
    check_digit_accuracy,
    digit_accuracy_variant,
)


def test_accepts_the_solution(capsys):
    assert check_digit_accuracy(digit_accuracy_variant)
    assert flat(capsys.readouterr().out).startswith("✓")
    # a tensor of one element is accepted as well
    assert check_digit_accuracy(lambda lg, t: (lg[:, -5:].argmax(-1) == t[:, -5:]).float().mean())


def test_reference_equals_the_lab_scoring():
    # passkey_accuracy's formula: argmax over the logits, compared where the answer mask is set
    for batch, length, seed in CASES:
        tokens, mask, _ = passkey_batch(batch, length, seed=seed)
        logits = _logits(tokens, seed)
        want = (logits.argmax(-1) == tokens[:, 1:])[mask[:, :-1]].float().mean().item()
        assert digit_accuracy_variant(logits, tokens) == pytest.approx(want)
        assert 0.1 < want < 0.9  # neither all right nor all wrong: the slips differ


@pytest.mark.parametrize("mistake", sorted(HINTS))
def test_each_mistake_is_rejected_with_its_hint(mistake, capsys):
    assert not check_digit_accuracy(lambda lg, t: digit_accuracy_variant(lg, t, mistake=mistake))
    assert HINTS[mistake] in flat(capsys.readouterr().out)


def test_stub_and_wrong_type(capsys):
    def stub(logits, tokens):
        raise NotImplementedError

    assert check_digit_accuracy(stub) is False
    assert "not implemented yet" in flat(capsys.readouterr().out)
    assert not check_digit_accuracy(lambda lg, t: "0.5")
    assert "return a float" in flat(capsys.readouterr().out)


def test_answers_in_chinese(capsys):
    assert check_digit_accuracy(digit_accuracy_variant, lang="zh")
    assert flat(capsys.readouterr().out).startswith("✓ 在所有试过的批次上")
    assert not check_digit_accuracy(
        lambda lg, t: digit_accuracy_variant(lg, t, mistake="whole_key"), lang="zh"
    )
    out = flat(capsys.readouterr().out)
    assert "五位数字全对" in out and "个 110 字节的序列" in out and HINTS["whole_key"] not in out


def test_a_bad_lang_raises():
    with pytest.raises(ValueError, match="lang"):
        check_digit_accuracy(digit_accuracy_variant, lang="fr")
