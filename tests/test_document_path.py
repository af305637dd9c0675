"""attend(document_ids=) and MultiHeadAttention(document_ids=) on the grouped path (issue 33):
packed documents equal each document attended alone, forward and backward, for RoPE, ALiBi,
T5, NoPE and GQA, and the path is taken (choose_path's answer, seen through a spy)."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import attention
from posenc.schemes import make_scheme

LENGTHS = [5, 3, 5, 1, 4]  # a repeated length: one SDPA call serves two documents
H, H_KV, D = 4, 2, 8


@pytest.fixture
def paths(monkeypatch):
    taken: list[str] = []
    choose = attention.choose_path

    def spy(*args, **kwargs):
        taken.append(choose(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(attention, "choose_path", spy)
    return taken


def _ids(lengths):
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])


@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "nope"])
@pytest.mark.parametrize("kv_heads", [H, H_KV])
@pytest.mark.parametrize("causal", [True, False])
def test_packed_equals_each_document_alone(name, kv_heads, causal, paths):
    torch.manual_seed(0)
    scheme = make_scheme(name, dim=H * D, num_heads=H, causal=causal)
    L = sum(LENGTHS)
    q = torch.randn(2, H, L, D, requires_grad=True)
    k = torch.randn(2, kv_heads, L, D, requires_grad=True)
    v = torch.randn(2, kv_heads, L, D, requires_grad=True)
    doc = torch.stack([_ids(LENGTHS), _ids(LENGTHS[::-1])])  # two rows, two layouts
    out = posenc.attend(q, k, v, scheme, document_ids=doc, causal=causal)
    assert paths == ["documents"]
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad((out * g).sum(), (q, k, v))
    for b, lengths in enumerate([LENGTHS, LENGTHS[::-1]]):
        start = 0
        for n in lengths:
            rows = slice(start, start + n)
            qa, ka, va = (t[b : b + 1, :, rows].detach().requires_grad_() for t in (q, k, v))
            alone = posenc.attend(qa, ka, va, scheme, causal=causal)
            da = torch.autograd.grad((alone * g[b : b + 1, :, rows]).sum(), (qa, ka, va))
            torch.testing.assert_close(out[b : b + 1, :, rows], alone)
            for got, want in zip((dq, dk, dv), da, strict=True):
                torch.testing.assert_close(got[b : b + 1, :, rows], want)
            start += n


def test_window_and_scale_equal_the_dense_rule(paths):
    torch.manual_seed(1)
    L = sum(LENGTHS)
    q, k, v = torch.randn(1, H, L, D), torch.randn(1, H_KV, L, D), torch.randn(1, H_KV, L, D)
    doc = _ids(LENGTHS)[None]
    scheme = make_scheme("rope", dim=H * D, num_heads=H)
    got = posenc.attend(q, k, v, scheme, document_ids=doc, window=2, scale=0.3)
    want = posenc.attend(q, k, v, scheme, document_ids=doc, window=2, scale=0.3, backend="math")
    assert paths == ["documents", "rule"]
    torch.testing.assert_close(got, want)


def test_the_layer_takes_the_grouped_path(paths):
    torch.manual_seed(2)
    layer = posenc.MultiHeadAttention(H * D, H, num_kv_heads=H_KV, scheme="rope")
    x = torch.randn(1, sum(LENGTHS), H * D)
    doc = _ids(LENGTHS)[None]
    got = layer(x, document_ids=doc)
    assert paths == ["documents"]
    start = 0
    for n in LENGTHS:
        torch.testing.assert_close(got[:, start : start + n], layer(x[:, start : start + n]))
        start += n


def test_what_varlen_cannot_express_keeps_the_dense_mask(paths):
    L = sum(LENGTHS)
    q = torch.randn(1, H, L, D)
    doc = _ids(LENGTHS)[None]
    posenc.attend(q, q, q, document_ids=doc, attention_mask=torch.ones(1, L))
    posenc.attend(q, q, q, make_scheme("rope", dim=H * D, num_heads=H), document_ids=doc,
                  positions=torch.arange(L))
    posenc.attend(q, q, q, document_ids=doc, window=2, sinks=1)
    assert paths == ["rule", "rule", "rule"]
