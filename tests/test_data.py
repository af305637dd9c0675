"""The byte corpus (split by file, hashed) and the synthetic tasks (passkey, copying)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.lab.data import (
    SEPARATOR,
    STDLIB_MODULES,
    copy_batch,
    eval_chunks,
    is_validation,
    load_corpus,
    make_passkey,
    passkey_batch,
    passkey_min_length,
    random_windows,
    stdlib_path,
)


def fake_stdlib(root, names):
    for i, name in enumerate(names):
        path = root.joinpath(*name.split(".")).with_suffix(".py")
        if i % 3 == 2:  # some modules are packages
            path = root.joinpath(*name.split("."), "__init__.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"# {name}\n".encode() * (i + 1))
    return root


NAMES = [f"mod{i:02d}" for i in range(40)] + ["pkg.sub"]


def test_split_by_file(tmp_path):
    corpus = load_corpus(NAMES, root=fake_stdlib(tmp_path, NAMES))
    train = [m for m, s, _ in corpus.files if s == "train"]
    val = [m for m, s, _ in corpus.files if s == "val"]
    assert train and val and not set(train) & set(val)
    assert sorted(train + val) == sorted(NAMES)
    assert all(is_validation(m) for m in val) and not any(is_validation(m) for m in train)

    def joined(mods):
        return SEPARATOR.join(stdlib_path(m, tmp_path).read_bytes() for m in sorted(mods))

    assert bytes(corpus.train.tolist()) == joined(train)
    assert bytes(corpus.val.tolist()) == joined(val)
    assert corpus.bytes == sum(size for _, _, size in corpus.files)
    assert corpus.train.dtype == torch.uint8


def test_sha256_reports_exactly_what_was_read(tmp_path):
    root = fake_stdlib(tmp_path, NAMES)
    a = load_corpus(NAMES, root=root)
    assert len(a.sha256) == 64 and int(a.sha256, 16) >= 0
    assert load_corpus(list(reversed(NAMES)), root=root).sha256 == a.sha256  # order-free
    assert load_corpus(NAMES[1:], root=root).sha256 != a.sha256
    digest = hashlib.sha256()
    for m in sorted(NAMES):
        data = stdlib_path(m, root).read_bytes()
        digest.update(m.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    assert a.sha256 == digest.hexdigest()


def test_real_stdlib_corpus():
    corpus = load_corpus()
    assert len(corpus.files) == len(STDLIB_MODULES) == len(set(STDLIB_MODULES))
    assert list(STDLIB_MODULES) == sorted(STDLIB_MODULES)
    n_val = sum(s == "val" for _, s, _ in corpus.files)
    assert 0.05 < n_val / len(STDLIB_MODULES) < 0.2
    assert corpus.bytes > 2_000_000 and corpus.val.numel() > 200_000
    assert corpus.summary()["sha256"] == corpus.sha256
    assert load_corpus() is corpus  # read once per process


def test_missing_module_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="'nosuchmodule'"):
        load_corpus(["nosuchmodule"], root=tmp_path)
    with pytest.raises(ValueError, match="at least one"):
        load_corpus([], root=tmp_path)


def test_random_windows_and_eval_chunks():
    data = torch.arange(200, dtype=torch.uint8)
    x, y = random_windows(data, 4, 10, generator=torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (4, 10) and x.dtype == torch.long
    torch.testing.assert_close(y[:, :-1], x[:, 1:])
    x2, _ = random_windows(data, 4, 10, generator=torch.Generator().manual_seed(1))
    assert torch.equal(x, x2)
    a, ya = eval_chunks(data, 10, 40, block=20)
    b, yb = eval_chunks(data, 20, 40, block=20)
    assert a.shape == (4, 10) and b.shape == (2, 20)
    assert torch.equal(a.flatten(), b.flatten()) and torch.equal(ya.flatten(), yb.flatten())
    torch.testing.assert_close(ya[:, :-1], a[:, 1:])
    # the segments spread over the whole of data: first at the start, last at the end
    assert a[0, 0] == 0 and yb[-1, -1] == 199
    c, _ = eval_chunks(data, 7, 40, block=20)  # 20 // 7 = 2 windows per segment
    assert c.shape == (4, 7) and torch.equal(c[0], a[0, :7])
    with pytest.raises(ValueError, match="too few"):
        eval_chunks(data, 300, 300)
    with pytest.raises(ValueError, match="block must be an int >= 20"):
        eval_chunks(data, 20, 40, block=10)


# -------------------------------------------------------------------------------- passkey


@given(length=st.integers(passkey_min_length(), 600), seed=st.integers(0, 10**6),
       depth=st.none() | st.floats(0.0, 1.0))
def test_passkey_properties(length, seed, depth):
    ex = make_passkey(length, seed=seed, depth=depth)
    text = bytes(ex.tokens.tolist())
    assert ex.tokens.shape == (length,) and ex.tokens.dtype == torch.long
    assert len(ex.key) == 5 and ex.key.isdigit() and ex.key[0] != "0"
    assert text.endswith(b"What is the pass key? The pass key is " + ex.key.encode())
    assert ex.answer_start == length - 5
    assert text[ex.key_start : ex.key_start + 5] == ex.key.encode()
    assert text.count(ex.key.encode()) == 3  # stated twice in the needle, answered once
    assert 0.0 <= ex.depth <= 1.0


def test_passkey_seeded_and_depth():
    a, b = make_passkey(300, seed=3), make_passkey(300, seed=3)
    assert torch.equal(a.tokens, b.tokens) and a.key == b.key
    keys = {make_passkey(300, seed=s).key for s in range(20)}
    assert len(keys) > 15
    shallow, deep = make_passkey(400, seed=1, depth=0.0), make_passkey(400, seed=1, depth=1.0)
    assert shallow.key_start < 40 < 250 < deep.key_start


def test_passkey_batch_mask():
    tokens, mask, keys = passkey_batch(4, 200, seed=0)
    assert tokens.shape == mask.shape == (4, 200) and len(keys) == 4
    assert mask.sum(1).tolist() == [5] * 4
    for row, m, key in zip(tokens, mask, keys, strict=True):
        next_bytes = row[1:][m[:-1]]
        assert bytes(next_bytes.tolist()) == key.encode()


def test_passkey_bad_input():
    with pytest.raises(ValueError, match="length"):
        make_passkey(passkey_min_length() - 1)
    with pytest.raises(ValueError, match="depth"):
        make_passkey(300, depth=1.5)


# ---------------------------------------------------------------------------------- copy


@pytest.mark.parametrize("length", [3, 10, 11, 64])
def test_copy_batch(length):
    x, y, mask = copy_batch(5, length, seed=2)
    assert x.shape == y.shape == mask.shape == (5, length)
    torch.testing.assert_close(y[:, :-1], x[:, 1:])
    n = length // 2
    seq = torch.cat([x, y[:, -1:]], dim=1)  # the whole sequence
    torch.testing.assert_close(seq[:, -n:], seq[:, -2 * n - 1 : -n - 1])
    assert (seq[:, -n - 1] == ord("|")).all()
    assert mask.sum().item() == 5 * n and mask[:, -n:].all()
    assert torch.equal(copy_batch(5, length, seed=2)[0], x)
