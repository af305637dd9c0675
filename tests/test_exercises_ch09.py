"""Chapter 9's checkers accept a right solution and reject wrong ones with a hint."""

import torch

import posenc as pe
from posenc.lab.exercises.ch09 import check_axial, check_text_resumes


def right(h, w, d):
    inv = pe.rope_inv_freq(d)[0]
    rows, cols = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
    angles = torch.cat([rows[:, None] * inv[0::2], cols[:, None] * inv[1::2]], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def swapped(h, w, d):
    inv = pe.rope_inv_freq(d)[0]
    rows, cols = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
    angles = torch.cat([rows[:, None] * inv[1::2], cols[:, None] * inv[0::2]], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def qwen2_vl(h, w, d):
    inv = pe.rope_inv_freq(d // 2)[0]
    rows, cols = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
    angles = torch.cat([rows[:, None] * inv, cols[:, None] * inv], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def interleaved(h, w, d):
    cos, sin = right(h, w, d)
    perm = pe.rope_permutation(d, to="interleaved")
    return cos[:, perm], sin[:, perm]


def test_accepts_right_solution(capsys):
    assert check_axial(right)
    assert capsys.readouterr().out.startswith("✓")


def test_rejects_with_hints(capsys):
    cases = [
        (swapped, "swapped"),
        (qwen2_vl, "Qwen2-VL"),
        (interleaved, "wrong channel order"),
        (lambda h, w, d: right(h, w, d)[0], "return a pair"),
        (lambda h, w, d: 1 / 0, "ZeroDivisionError"),
        (lambda h, w, d: (right(h, w, d)[0][:-1], right(h, w, d)[1]), "shape"),
    ]
    for fn, hint in cases:
        assert not check_axial(fn)
        out = capsys.readouterr().out
        assert out.startswith("✗") and hint in out, out


def test_stub_is_not_implemented(capsys):
    def stub(h, w, d):
        raise NotImplementedError

    assert not check_axial(stub)
    assert "not implemented yet" in capsys.readouterr().out


def test_text_resumes(capsys):
    assert check_text_resumes(7)
    assert not check_text_resumes(10)
    assert "max(h, w)" in capsys.readouterr().out
    assert not check_text_resumes("7")


def test_answers_in_chinese(capsys):
    assert check_axial(right, lang="zh")
    assert capsys.readouterr().out.startswith("✓ 在所有试过的网格上")
    assert not check_axial(swapped, lang="zh")
    out = capsys.readouterr().out
    assert "行和列对调了" in out and "swapped" not in out, out
    assert not check_text_resumes(10, lang="zh")
    assert "只前进 max(h, w)" in capsys.readouterr().out


def test_a_bad_lang_raises():
    import pytest

    with pytest.raises(ValueError, match="lang"):
        check_axial(right, lang="ZH")
    with pytest.raises(ValueError, match="lang"):
        check_text_resumes(7, lang="")
