"""``RotaryEmbedding(..., seq_dim=-3)``: queries and keys ``[B, L, H, head_dim]`` (torchtune,
flash-attn), named by an argument and never guessed (issue 26).

The reference is torchtune's ``RotaryPositionalEmbeddings`` (torchtune/modules/
position_embeddings.py, v0.6), whose forward takes ``x [b, s, n_h, h_d]`` and an optional
``input_pos [b, s]``, written out below: a cache of ``(cos, sin)`` per position and frequency
(``theta_i = base ** (-2i / dim)``, float32 products of position and frequency), the channel
pairs ``x.reshape(..., -1, 2)`` (interleaved), rotated and flattened back, cast to ``x``'s dtype.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from posenc import RotaryEmbedding

close = torch.testing.assert_close
B, L, H, HK, D = 2, 7, 4, 2, 16


class TorchtuneRoPE:
    """torchtune.modules.RotaryPositionalEmbeddings, written out (no torchtune needed)."""

    def __init__(self, dim: int, max_seq_len: int = 4096, base: float = 10_000) -> None:
        theta = 1.0 / (base ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
        seq_idx = torch.arange(max_seq_len, dtype=theta.dtype)
        idx_theta = torch.einsum("i, j -> ij", seq_idx, theta).float()
        self.cache = torch.stack([torch.cos(idx_theta), torch.sin(idx_theta)], dim=-1)

    def __call__(self, x: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        seq_len = x.size(1)  # x [b, s, n_h, h_d]
        rope_cache = self.cache[:seq_len] if input_pos is None else self.cache[input_pos]
        xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
        rope_cache = rope_cache.view(-1, xshaped.size(1), 1, xshaped.size(3), 2)
        x_out = torch.stack(
            [xshaped[..., 0] * rope_cache[..., 0] - xshaped[..., 1] * rope_cache[..., 1],
             xshaped[..., 1] * rope_cache[..., 0] + xshaped[..., 0] * rope_cache[..., 1]],
            -1,
        )  # fmt: skip
        return x_out.flatten(3).type_as(x)


def qk(dtype=torch.float32, lq=L, lk=L):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, lq, H, D, generator=g).to(dtype)  # [B, L, H, D]
    k = torch.randn(B, lk, HK, D, generator=g).to(dtype)  # grouped-query: fewer key heads
    return q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_torchtune_without_positions_with_an_offset_and_per_row(dtype):
    rot, tt = RotaryEmbedding(D, seq_dim=-3), TorchtuneRoPE(D)
    q, k = qk(dtype)
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    qr, kr = rot(q, k)
    close((qr, kr), (tt(q), tt(k)), **tol)
    assert qr.shape == q.shape and qr.dtype == dtype and qr.is_contiguous()  # the input's layout
    start = torch.arange(5, 5 + L)[None].expand(B, -1)  # [B, L]
    close(rot(q, k, offset=5), (tt(q, input_pos=start), tt(k, input_pos=start)), **tol)
    rows = torch.stack([torch.arange(L), torch.arange(40, 40 + L)])  # [B, L]: per-row positions
    close(rot(q, k, positions=rows), (tt(q, input_pos=rows), tt(k, input_pos=rows)), **tol)
    close(rot(q, k, positions=rows[1]), (tt(q, input_pos=rows[1:].expand(B, -1)),
                                          tt(k, input_pos=rows[1:].expand(B, -1))), **tol)  # fmt: skip
    one = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])  # [1, L] broadcasts over B
    close(rot(q, k, positions=one), rot(q, k, offset=3))


def test_torchtune_at_long_positions_within_its_float32_drift():
    """torchtune's cache holds float32 products position * theta; posenc reduces them mod 2 pi
    first (exact), so past position 512 the two differ by torchtune's rounding only."""
    rot, tt = RotaryEmbedding(D, seq_dim=-3), TorchtuneRoPE(D, max_seq_len=4200)
    q, k = qk()
    rows = torch.arange(4100, 4100 + L)[None].expand(B, -1)
    close(rot(q, k, positions=rows), (tt(q, input_pos=rows), tt(k, input_pos=rows)), atol=2e-3, rtol=0)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("xpos", [None, 64.0])
def test_the_two_layouts_give_the_same_rotation(interleaved, xpos):
    kw = {"interleaved": interleaved, "xpos_scale_base": xpos}
    bhld, blhd = RotaryEmbedding(D, **kw), RotaryEmbedding(D, seq_dim=-3, **kw)
    q, k = qk()
    t = lambda pair: tuple(x.transpose(1, 2) for x in pair)  # noqa: E731
    close(t(blhd(q, k)), bhld(q.transpose(1, 2), k.transpose(1, 2)))
    close(t(blhd(q, k, offset=9)), bhld(q.transpose(1, 2), k.transpose(1, 2), offset=9))
    rows = torch.stack([torch.arange(L), torch.arange(2, 2 + L)])
    close(t(blhd(q, k, positions=rows)), bhld(q.transpose(1, 2), k.transpose(1, 2), positions=rows))
    # keys with their own positions (another length): each tensor by its own
    q3, k3 = qk(lq=3, lk=L)
    kp = torch.arange(L)
    got = blhd(q3, k3, positions=torch.arange(4, 7), key_positions=kp)
    want = bhld(q3.transpose(1, 2), k3.transpose(1, 2), positions=torch.arange(4, 7), key_positions=kp)
    close(t(got), want)


def test_partial_rotary_and_decode_step():
    rot = RotaryEmbedding(D, seq_dim=-3, partial_rotary_factor=0.5)
    q, k = qk(lq=1, lk=1)  # one new token: [B, 1, H, D]
    qr, kr = rot(q, k, offset=11)
    ref = RotaryEmbedding(D, partial_rotary_factor=0.5)(q.transpose(1, 2), k.transpose(1, 2), offset=11)
    close((qr.transpose(1, 2), kr.transpose(1, 2)), ref)
    assert torch.equal(qr[..., 8:], q[..., 8:])


def test_compiles_in_one_graph():
    torch._dynamo.reset()
    rot = RotaryEmbedding(D, seq_dim=-3)
    q, k = qk()
    rows = torch.stack([torch.arange(L), torch.arange(3, 3 + L)])
    counter = CompileCounter()
    got = torch.compile(rot, backend=counter, fullgraph=True)(q, k, positions=rows)
    close(got, rot(q, k, positions=rows))
    assert counter.frame_count == 1
    torch._dynamo.reset()


CASES = [
    (lambda: RotaryEmbedding(8, seq_dim=1), ValueError,
     r"seq_dim must be -2 \(q and k \[B, H, L, head_dim\].*or -3 \(\[B, L, H, head_dim\].*got 1"),
    (lambda: RotaryEmbedding(8, seq_dim=-1), ValueError, r"seq_dim must be -2 .* got -1"),
    (lambda: RotaryEmbedding(8, seq_dim="blhd"), TypeError, "seq_dim must be an int, got 'blhd'"),
    (lambda: RotaryEmbedding(8, seq_dim=True), TypeError, "seq_dim must be an int, got True"),
    (lambda: RotaryEmbedding(8, exact_angles=1), TypeError, "exact_angles must be a bool"),
]  # fmt: skip


@pytest.mark.parametrize("call, error, match", CASES)
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


LAYOUT_3 = re.escape("the sequence is dim -3 of [B, L, H, head_dim] (seq_dim=-3); "
                     "for [B, H, L, head_dim] build RotaryEmbedding(..., seq_dim=-2)")  # fmt: skip
LAYOUT_2 = re.escape("the sequence is dim -2 of [B, H, L, head_dim] (seq_dim=-2); "
                     "for [B, L, H, head_dim] build RotaryEmbedding(..., seq_dim=-3)")  # fmt: skip


def test_shape_errors_name_the_sequence_dimension_and_the_argument():
    rot3, rot2 = RotaryEmbedding(D, seq_dim=-3), RotaryEmbedding(D)
    q, k = qk()  # [2, 7, 4, 16], [2, 7, 2, 16]
    for call, match in [
        (lambda: rot3(q, k[:, :5]), "q and k must have the same seq length here, got 7 and 5 .*"),
        (lambda: rot3(q, k[:1]), r"q and k shapes must agree except in the head count \(dim -2\)"),
        (lambda: rot3(q, k, positions=torch.arange(4)), r"positions must have 7 entries per row "
                                                        r"\(q's seq length; "),
        (lambda: rot3(q[0], k[0], positions=torch.arange(L)[None]),
         r"positions of shape \(1, 7\) \(\[B, L\]\) need q of shape \[B, L, H, head_dim\]"),
        (lambda: rot3(q[0, :, 0], k[0, :, 0]), r"q must have at least 3 dims, got shape \(7, 16\) \("),
        (lambda: rot3(q[..., :8], k[..., :8]), r"q and k must end in head_dim=16"),
        (lambda: rot3(q[:, :3], k, positions=torch.arange(3), key_positions=torch.arange(5)),
         r"key_positions must have 7 entries per row \(k's seq length; "),
    ]:
        with pytest.raises(ValueError, match=match + ".*" + LAYOUT_3):
            call()
    for call, match in [  # the default module given [B, L, H, head_dim]: where the shapes disagree
        (lambda: rot2(q, k), "q and k must have the same seq length here, got 4 and 2 .*"),
        (lambda: rot2(q, q, positions=torch.arange(L)), r"positions must have 4 entries per row "
                                                        r"\(q's seq length; "),
    ]:
        with pytest.raises(ValueError, match=match + ".*" + LAYOUT_2):
            call()


def test_repr_names_a_non_default_layout():
    assert "seq_dim=-3" in repr(RotaryEmbedding(8, seq_dim=-3))
    assert "seq_dim" not in repr(RotaryEmbedding(8))
