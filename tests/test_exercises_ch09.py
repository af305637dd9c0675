"""Chapter 9's checkers accept a right solution and reject wrong ones with a hint."""

import torch
from _wrap import flat

import posenc as pe
from posenc.lab.exercises.ch09 import (
    _llama4,
    _mla,
    _xpos,
    check_axial,
    check_llama4_scale,
    check_mla_rope,
    check_text_resumes,
    check_xpos,
)


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
    assert flat(capsys.readouterr().out).startswith("✓")


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
        out = flat(capsys.readouterr().out)
        assert out.startswith("✗") and hint in out, out


def test_stub_is_not_implemented(capsys):
    def stub(h, w, d):
        raise NotImplementedError

    assert not check_axial(stub)
    assert "not implemented yet" in flat(capsys.readouterr().out)


def test_text_resumes(capsys):
    assert check_text_resumes(10)
    assert "10 = start + max(rows, columns)" in flat(capsys.readouterr().out)
    assert not check_text_resumes(14)  # 6 + 8: every image token counted
    assert "max(h, w)" in flat(capsys.readouterr().out)
    assert not check_text_resumes(7)  # the old exercise's answer
    assert "from 6 to 9" in flat(capsys.readouterr().out)
    assert not check_text_resumes("10")


def xpos_right(q, k, scale_base):
    L, d = q.shape
    zeta = (torch.arange(0, d, 2).float() + 0.4 * d) / (1.4 * d)
    power = (torch.arange(L).float() - L // 2) / scale_base
    s = (zeta ** power[:, None]).repeat_interleave(2, dim=-1)
    cos, sin = pe.rope_cos_sin(torch.arange(L), pe.rope_inv_freq(d)[0])
    return pe.apply_rope(q, cos * s, sin * s), pe.apply_rope(k, cos / s, sin / s)


def scale_right(positions, floor_scale, attn_scale):
    return 1 + attn_scale * torch.log1p(torch.floor((positions + 1) / floor_scale))


def mla_right(q, k_rope, cos, sin):
    r = k_rope.shape[-1]
    q_rot = pe.apply_rope(q[..., -r:], cos, sin, interleaved=False)
    return torch.cat([q[..., :-r], q_rot], -1), pe.apply_rope(k_rope, cos, sin, interleaved=False)


def test_xpos(capsys):
    assert check_xpos(xpos_right)
    assert flat(capsys.readouterr().out).startswith("✓")
    cases = [
        (dict(scale=False), "plain RoPE"),
        (dict(key_power=1.0), "the key is multiplied"),
        (dict(sign=-1.0), "wrong sign"),
        (dict(centre=0), "centre"),
        (dict(step=1.0), "you used i instead"),
        (dict(per_base=False), "divided by scale_base"),
        (dict(repeat=False), "repeat_interleave"),
    ]
    for kw, hint in cases:
        assert not check_xpos(lambda q, k, b, kw=kw: _xpos(q, k, b, **kw))
        out = flat(capsys.readouterr().out)
        assert out.startswith("✗") and hint in out, out
    assert not check_xpos(lambda q, k, b: xpos_right(q, k, b)[0])
    assert "return a pair" in flat(capsys.readouterr().out)
    assert not check_xpos(lambda q, k, b: (q, k * 2))  # unknown slip: names the difference
    assert "differs at index" in flat(capsys.readouterr().out)


def test_llama4_scale(capsys):
    assert check_llama4_scale(scale_right)
    assert flat(capsys.readouterr().out).startswith("✓")
    cases = [
        (dict(plus_one=0.0), "off by one"),
        (dict(log1p=False), "log(1 + ...)"),
        (dict(floor=False), "floor is missing"),
        (dict(one=0.0), "1 + is missing"),
    ]
    for kw, hint in cases:
        assert not check_llama4_scale(lambda p, f, a, kw=kw: _llama4(p, f, a, **kw).float())
        out = flat(capsys.readouterr().out)
        assert out.startswith("✗") and hint in out, out
    assert not check_llama4_scale(lambda p, f, a: p[:-1] * 1.0)
    assert "shape" in flat(capsys.readouterr().out)


def test_mla_rope(capsys):
    assert check_mla_rope(mla_right)
    assert flat(capsys.readouterr().out).startswith("✓")
    cases = [
        (dict(first=True), "last rope_dim channels"),
        (dict(interleaved=True), "half layout"),
        (dict(rotate_k=False), "k_rope rotates too"),
        (dict(sign=-1.0), "wrong sign"),
    ]
    for kw, hint in cases:
        assert not check_mla_rope(lambda q, k, c, s, kw=kw: _mla(q, k, c, s, **kw))
        out = flat(capsys.readouterr().out)
        assert out.startswith("✗") and hint in out, out
    assert not check_mla_rope(lambda q, k, c, s: (mla_right(q, k, c, s)[0][..., -4:], k))
    assert "whole query" in flat(capsys.readouterr().out)
    assert not check_mla_rope(lambda q, k, c, s: None)
    assert "return a pair" in flat(capsys.readouterr().out)


def test_answers_in_chinese(capsys):
    assert check_axial(right, lang="zh")
    assert flat(capsys.readouterr().out).startswith("✓ 在所有试过的网格上")
    assert not check_axial(swapped, lang="zh")
    out = flat(capsys.readouterr().out)
    assert "行和列对调了" in out and "swapped" not in out, out
    assert not check_text_resumes(14, lang="zh")
    assert "只前进 max(h, w)" in flat(capsys.readouterr().out)
    assert check_text_resumes(10, lang="zh")
    assert "文本从 10 = 起点 + max(行数, 列数)" in flat(capsys.readouterr().out)
    assert check_xpos(xpos_right, lang="zh")
    assert flat(capsys.readouterr().out).startswith("✓ 你的 xPos")
    assert not check_xpos(lambda q, k, b: _xpos(q, k, b, key_power=1.0), lang="zh")
    out = flat(capsys.readouterr().out)
    assert "键也乘上了缩放" in out and "multiplied" not in out and "input" not in out, out
    assert not check_llama4_scale(lambda p, f, a: _llama4(p, f, a, plus_one=0.0).float(),
                                  lang="zh")
    out = flat(capsys.readouterr().out)
    assert "差了 1" in out and "off by one" not in out and "（输入：" in out, out
    assert check_mla_rope(mla_right, lang="zh")
    assert flat(capsys.readouterr().out).startswith("✓ 在试过的每种形状上")
    assert not check_mla_rope(lambda q, k, c, s: _mla(q, k, c, s, rotate_k=False), lang="zh")
    out = flat(capsys.readouterr().out)
    assert "k_rope 也要旋转" in out and "rotates" not in out, out


def test_a_bad_lang_raises():
    import pytest

    with pytest.raises(ValueError, match="lang"):
        check_axial(right, lang="ZH")
    with pytest.raises(ValueError, match="lang"):
        check_text_resumes(10, lang="")
    for checker, fn in ((check_xpos, xpos_right), (check_llama4_scale, scale_right),
                        (check_mla_rope, mla_right)):
        with pytest.raises(ValueError, match="lang"):
            checker(fn, lang="fr")
