"""The chapter 3 checkers accept the sinusoidal table and the shift matrix, and name common slips."""

import torch

from posenc.lab.exercises.ch03 import check_shift_matrix, check_table


def table(num_positions, dim):
    pos = torch.arange(num_positions, dtype=torch.float32)[:, None]
    omega = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    out = torch.zeros(num_positions, dim)
    out[:, 0::2], out[:, 1::2] = torch.sin(pos * omega), torch.cos(pos * omega)
    return out


def shift(k, dim):
    omega = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    c, s = torch.cos(omega * k), torch.sin(omega * k)
    return torch.block_diag(*[torch.stack([torch.stack([ci, si]), torch.stack([-si, ci])])
                              for ci, si in zip(c, s, strict=True)])


def test_table_accepts_the_formula(capsys):
    assert check_table(table)
    assert capsys.readouterr().out.startswith("✓")


def test_table_names_the_slips(capsys):
    def exponent(n, d):
        pos = torch.arange(n, dtype=torch.float32)[:, None]
        omega = 10000.0 ** (-torch.arange(d // 2, dtype=torch.float32) / d)  # i/d, not 2i/d
        return torch.stack([torch.sin(pos * omega), torch.cos(pos * omega)], -1).flatten(-2)

    assert not check_table(exponent)
    assert "exponent" in capsys.readouterr().out
    assert not check_table(lambda n, d: torch.cat([table(n, d)[:, 0::2], table(n, d)[:, 1::2]], 1))
    assert "channel order" in capsys.readouterr().out
    assert not check_table(lambda n, d: torch.stack([table(n, d)[:, 1::2], table(n, d)[:, 0::2]],
                                                    -1).flatten(-2))
    assert "swapped" in capsys.readouterr().out
    assert not check_table(lambda n, d: table(n, d)[:-1])
    assert "shape" in capsys.readouterr().out


def test_shift_accepts_the_rotation_and_rejects_its_transpose(capsys):
    assert check_shift_matrix(shift)
    assert capsys.readouterr().out.startswith("✓")
    assert not check_shift_matrix(lambda k, d: shift(k, d).T)
    assert "M_(-k)" in capsys.readouterr().out
    assert not check_shift_matrix(lambda k, d: torch.eye(d))


def test_stubs_give_false_without_raising(capsys):
    def stub(*args):
        raise NotImplementedError

    assert not check_table(stub) and not check_shift_matrix(stub)
    assert capsys.readouterr().out.count("not implemented yet") == 2
    assert not check_shift_matrix(lambda k, d: "M")


def test_answers_in_chinese(capsys):
    assert check_table(table, lang="zh") and check_shift_matrix(shift, lang="zh")
    out = capsys.readouterr().out
    assert "✓ 你的编码表与 posenc.sinusoidal_table 相等" in out
    assert "✓ 对试过的每个位置、k 和维度，M_k PE(pos) 都等于 PE(pos + k)" in out
    assert not check_table(lambda n, d: torch.stack([table(n, d)[:, 1::2], table(n, d)[:, 0::2]],
                                                    -1).flatten(1), lang="zh")
    assert "sin 和 cos 放反了" in capsys.readouterr().out
    assert not check_shift_matrix(lambda k, d: shift(k, d).T, lang="zh")
    assert "你构造的是 M_(-k)" in capsys.readouterr().out


def test_a_bad_lang_raises():
    import pytest

    for check, fn in ((check_table, table), (check_shift_matrix, shift)):
        with pytest.raises(ValueError, match="lang"):
            check(fn, lang="cn")
