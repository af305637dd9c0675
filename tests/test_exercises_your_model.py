"""The checkers of "Your model's positions" accept a right solution and reject wrong ones with
a hint, in both languages; the page's label table has both languages."""

import math

import pytest
import torch
from _wrap import flat

from posenc.lab.exercises.your_model import check_gpt_oss_logits, check_unseen, unseen_pairs


def right(report):
    never = report.turns < 1
    return torch.nonzero(never & (report.scaled_turns > report.turns * (1 + 1e-4))).flatten()


def right_list(report):
    return [i for i in range(report.num_pairs)
            if report.turns[i] < 1 and report.scaled_turns[i] > report.turns[i] * 1.0001]


def test_unseen_accepts_the_solution(capsys):
    assert check_unseen(right)
    assert flat(capsys.readouterr().out).startswith("✓")
    assert check_unseen(right_list, lang="zh")
    assert "正确" in flat(capsys.readouterr().out)


@pytest.mark.parametrize(("fn", "hint"), [
    (lambda r: torch.nonzero(r.scaled_turns > r.turns * 1.0001).flatten(), "at least once"),
    (lambda r: torch.nonzero(r.turns < 1).flatten(), "compare scaled_turns with turns"),
    (lambda r: [], "expected"),
    (lambda r: 1 / 0, "ZeroDivisionError"),
    (lambda r: r.turns, "list of ints"),
])
def test_unseen_rejects_with_hints(capsys, fn, hint):
    assert not check_unseen(fn)
    out = flat(capsys.readouterr().out)
    assert out.startswith("✗") and hint in out, out


def test_unseen_answers_in_chinese(capsys):
    assert not check_unseen(lambda r: torch.nonzero(r.turns < 1).flatten(), lang="zh")
    assert "scaled_turns" in flat(capsys.readouterr().out)
    with pytest.raises(ValueError, match="lang"):
        check_unseen(right, lang="fr")


def test_unseen_pairs_of_llama31():
    import posenc
    from posenc.rope_families import family

    config = family("llama3.1")["config"]
    assert unseen_pairs(posenc.explain(config, context=65536)) == []  # 8 x 8192: on the arc
    assert unseen_pairs(posenc.explain(config, context=131072)) == list(range(35, 64))


def test_gpt_oss_logits(capsys):
    root = 0.1 * math.log(32) + 1
    assert check_gpt_oss_logits(root**2)
    assert flat(capsys.readouterr().out).startswith("✓")
    for wrong, hint in [(root, "twice"), (1 / root**2, "temperature"),
                        ((0.1 * math.log10(32) + 1) ** 2, "log10"), (2.5, "is off"),
                        ("1.81", "a number")]:
        assert not check_gpt_oss_logits(wrong)
        out = flat(capsys.readouterr().out)
        assert out.startswith("✗") and hint in out, out
    assert check_gpt_oss_logits(torch.tensor(root**2), lang="zh")
    assert "温度" in flat(capsys.readouterr().out)


def test_page_labels_have_both_languages():
    from posenc.lab.labels import labels, table
    from posenc.rope_families import FAMILY_NAMES

    tables = table("your_model")
    assert set(tables) == {"en", "zh"}
    assert set(labels("your_model", "zh")["family"]) == set(FAMILY_NAMES)
