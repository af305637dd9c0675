"""The chapter 7 checker accepts YaRN's ramp built from the formula and names common mistakes."""

import pytest
import torch
from _wrap import flat

import posenc
from posenc.lab.exercises.ch07 import HINTS, SETTINGS, check_yarn_inv_freq, yarn_variant


def test_accepts_the_formula_and_posenc(capsys):
    assert check_yarn_inv_freq(yarn_variant)

    def lib(d, base, factor, L, bf, bs):
        cfg = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L,
               "beta_fast": bf, "beta_slow": bs}
        return posenc.rope_inv_freq(d, base=base, scaling=cfg)[0]

    assert check_yarn_inv_freq(lib)
    assert flat(capsys.readouterr().out).startswith("✓")


def test_stub_gives_false_without_raising(capsys):
    def stub(*args):
        raise NotImplementedError

    assert check_yarn_inv_freq(stub) is False
    assert "not implemented yet" in flat(capsys.readouterr().out)


@pytest.mark.parametrize("mistake", sorted(HINTS))
def test_each_mistake_is_rejected_with_its_hint(mistake, capsys):
    # every mistake changes the result for at least one setting
    assert any(not torch.allclose(yarn_variant(*s, mistake=mistake), yarn_variant(*s))
               for s in SETTINGS)
    assert not check_yarn_inv_freq(lambda *a: yarn_variant(*a, mistake=mistake))
    assert HINTS[mistake] in flat(capsys.readouterr().out)


def test_rejects_wrong_shape_and_type(capsys):
    assert not check_yarn_inv_freq(lambda *a: yarn_variant(*a)[:-1])
    assert "shape" in flat(capsys.readouterr().out)
    assert not check_yarn_inv_freq(lambda *a: yarn_variant(*a).tolist())
    assert "torch.Tensor" in flat(capsys.readouterr().out)


def test_answers_in_chinese(capsys):
    assert check_yarn_inv_freq(yarn_variant, lang="zh")
    assert flat(capsys.readouterr().out).startswith("✓ 你的频率与 posenc 的 YaRN 相等")
    assert not check_yarn_inv_freq(lambda *a: yarn_variant(*a, mistake="swapped"), lang="zh")
    out = flat(capsys.readouterr().out)
    assert "斜坡方向反了" in out and HINTS["swapped"] not in out, out


def test_a_bad_lang_raises():
    with pytest.raises(ValueError, match="lang"):
        check_yarn_inv_freq(yarn_variant, lang="ZH")
