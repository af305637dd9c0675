"""The chapter 4 checker accepts RoPE built from 2x2 rotations and names each usual slip."""

from __future__ import annotations

import torch

from posenc.lab.exercises.ch04 import check_rope


def rope_2x2(x, positions, base=10000.0, *, sign=1.0, exponent=2.0, angle_scale=1.0,
             half=False):
    """RoPE from explicit 2x2 rotation matrices, with optional slips."""
    L, d = x.shape
    out = x.clone()
    for row in range(L):
        for i in range(d // 2):
            a = angle_scale * float(positions[row]) * base ** (-exponent * i / d)
            c, s = torch.cos(torch.tensor(a)), sign * torch.sin(torch.tensor(a))
            rot = torch.stack([torch.stack([c, -s]), torch.stack([s, c])])  # [2, 2]
            j = [i, i + d // 2] if half else [2 * i, 2 * i + 1]
            out[row, j] = rot @ x[row, j]
    return out


def test_accepts_the_solution(capsys):
    assert check_rope(rope_2x2)
    assert capsys.readouterr().out.startswith("✓")


def _rejects(fn, capsys, words):
    assert check_rope(fn) is False
    out = capsys.readouterr().out
    assert out.startswith("✗") and words in out, out


def test_names_the_slips(capsys):
    _rejects(lambda x, p, b: rope_2x2(x, p, b, half=True), capsys, "half layout")
    _rejects(lambda x, p, b: rope_2x2(x, p, b, sign=-1.0), capsys, "wrong sign")
    _rejects(lambda x, p, b: rope_2x2(x, p, b, exponent=1.0), capsys, "base^(-i/d)")
    _rejects(lambda x, p, b: rope_2x2(x, p, b, exponent=4.0), capsys, "base^(-4i/d)")
    _rejects(lambda x, p, b: rope_2x2(x, p, b, angle_scale=2.0), capsys, "twice too large")
    _rejects(lambda x, p, b: x.clone(), capsys, "unrotated")
    _rejects(lambda x, p, b: rope_2x2(x, p, 10000.0), capsys, "base=100")  # ignores base


def test_in_place_and_shapes_and_errors(capsys):
    def in_place(x, p, b):
        x.copy_(rope_2x2(x, p, b))
        return x

    _rejects(in_place, capsys, "in place")
    _rejects(lambda x, p, b: rope_2x2(x, p, b)[:, :-1], capsys, "shape")
    _rejects(lambda x, p, b: rope_2x2(x, p, b).tolist(), capsys, "torch.Tensor")
    _rejects(lambda x, p, b: 1 / 0, capsys, "ZeroDivisionError")


def test_stub_gives_false_without_raising(capsys):
    def stub(x, positions, base):
        raise NotImplementedError  # your code here

    _rejects(stub, capsys, "not implemented yet")
    _rejects("not a function", capsys, "expected a function")


def test_answers_in_chinese(capsys):
    assert check_rope(rope_2x2, lang="zh")
    assert capsys.readouterr().out.startswith("✓ 你的 2×2 旋转与 posenc.apply_rope（交错的维度对）结果一致")
    for slip, words in [({"half": True}, "对半布局"), ({"sign": -1.0}, "符号反了"),
                        ({"exponent": 1.0}, "base^(-i/d)"), ({"angle_scale": 2.0}, "大了一倍")]:
        assert check_rope(lambda x, p, b, s=slip: rope_2x2(x, p, b, **s), lang="zh") is False
        out = capsys.readouterr().out
        assert out.startswith("✗") and words in out and "（输入：" in out, out
        assert "input:" not in out


def test_a_bad_lang_raises():
    import pytest

    with pytest.raises(ValueError, match="lang"):
        check_rope(rope_2x2, lang="")
