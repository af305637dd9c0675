"""``attend_varlen`` (issue 26 §3, varlen): flash-attn's ``[total, H, D]`` layout with any scheme.

It must equal the dense path, ``posenc.attend`` on the packed row with ``document_ids``, and
each document attended alone, for NoPE, RoPE, ALiBi and T5, with GQA, a window, ``causal=False``,
``scale``, and in backward; the flash-attn branch runs only on CUDA with flash-attn installed,
but the decision which path runs is tested here without either."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import ALiBi, NoPE, RoPE, attend, document_ids_from_lengths, make_scheme
from posenc.schemes import PositionScheme
from posenc.varlen import _flash_varlen, _varlen_path, attend_varlen

H, H_KV, D = 4, 2, 16


def schemes() -> dict[str, PositionScheme | None]:
    torch.manual_seed(1)
    t5 = make_scheme("t5", num_heads=H)  # causal: buckets the past only
    t5_bi = make_scheme("t5", num_heads=H, causal=False)
    for t in (t5, t5_bi):
        torch.nn.init.normal_(t.rel.embedding.weight)  # a bias that matters
    return {"none": None, "nope": NoPE(), "rope": RoPE(D), "alibi": ALiBi(H), "t5": t5, "t5-bi": t5_bi}


SCHEMES = schemes()


def offsets(lengths: list[int]) -> torch.Tensor:
    """``cu_seqlens`` of ``lengths`` (int32, as flash-attn takes)."""
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist()], dtype=torch.int32)


def qkv(total: int, heads: int = H, kv_heads: int = H_KV, dim: int = D, v_dim: int | None = None,
        dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(total, heads, dim, generator=g, dtype=dtype)
    k = torch.randn(total, kv_heads, dim, generator=g, dtype=dtype)
    v = torch.randn(total, kv_heads, v_dim or dim, generator=g, dtype=dtype)
    return q, k, v


def row(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1)[None]  # [total, H, D] -> [1, H, total, D]


def dense(q, k, v, scheme, lengths, **kw) -> torch.Tensor:
    """The dense path: one packed row, ``document_ids`` from the lengths."""
    ids = document_ids_from_lengths(lengths)[None]  # [1, total]
    return attend(row(q), row(k), row(v), scheme, document_ids=ids, **kw)[0].transpose(0, 1)


def alone(q, k, v, scheme, lengths, **kw) -> torch.Tensor:
    """Each document attended on its own (positions from 0), outputs concatenated."""
    out, s = [], 0
    for n in lengths:
        if n:
            out.append(attend(row(q[s:s + n]), row(k[s:s + n]), row(v[s:s + n]), scheme, **kw)[0]
                       .transpose(0, 1))
        s += n
    return torch.cat(out)


LENGTHS = [5, 3, 5, 1, 0, 7, 1, 2]


@pytest.mark.parametrize("name", list(SCHEMES))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 2, 4, 1000])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_equals_the_dense_path_and_each_document_alone(name, causal, window, backend):
    scheme = SCHEMES[name]
    q, k, v = qkv(sum(LENGTHS))
    got = attend_varlen(q, k, v, scheme, cu_seqlens=offsets(LENGTHS), causal=causal, window=window,
                        backend=backend)
    assert got.shape == (sum(LENGTHS), H, D) and got.dtype == q.dtype
    torch.testing.assert_close(got, dense(q, k, v, scheme, LENGTHS, causal=causal, window=window))
    torch.testing.assert_close(got, alone(q, k, v, scheme, LENGTHS, causal=causal, window=window))


@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=8).filter(lambda n: sum(n) > 0),
    st.sampled_from(["nope", "rope", "alibi", "t5"]),
    st.sampled_from([(4, 4), (4, 2), (4, 1)]),
    st.booleans(),
    st.sampled_from([None, 1, 3]),
)
def test_random_lengths_equal_the_dense_path(lengths, name, heads, causal, window):
    scheme = SCHEMES[name]
    q, k, v = qkv(sum(lengths), *heads)
    got = attend_varlen(q, k, v, scheme, cu_seqlens=offsets(lengths), causal=causal, window=window)
    torch.testing.assert_close(got, dense(q, k, v, scheme, lengths, causal=causal, window=window))


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5"])
@pytest.mark.parametrize("lengths", [[13], [1] * 9, [4, 4, 4], [0, 6, 0, 0, 2, 0]],
                         ids=["one", "ones", "equal", "empties"])
def test_one_sequence_many_of_length_one_and_empty_sequences(name, lengths):
    scheme = SCHEMES[name]
    q, k, v = qkv(sum(lengths))
    cu = offsets(lengths)
    got = attend_varlen(q, k, v, scheme, cu_seqlens=cu)
    torch.testing.assert_close(got, dense(q, k, v, scheme, lengths))
    torch.testing.assert_close(got, alone(q, k, v, scheme, lengths))
    # int64 offsets and a max_seqlen above the longest give the same
    torch.testing.assert_close(attend_varlen(q, k, v, scheme, cu_seqlens=cu.long(), max_seqlen=99), got)
    if lengths == [1] * 9:  # a sequence of one token sees only itself: the output is its v
        torch.testing.assert_close(got, v.repeat_interleave(H // H_KV, dim=1))


def test_an_empty_batch_gives_an_empty_output():
    q, k, v = qkv(0, v_dim=8)
    for cu in (torch.tensor([0]), torch.tensor([0, 0, 0], dtype=torch.int32)):
        got = attend_varlen(q, k, v, ALiBi(H), cu_seqlens=cu)
        assert got.shape == (0, H, 8) and got.dtype == q.dtype


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5"])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_scale_multiplies_the_scores(name, backend):
    # scale s: the scores are s * q.k (+ bias): the dense path with q multiplied by s * sqrt(D)
    scheme, s = SCHEMES[name], 0.37
    q, k, v = qkv(sum(LENGTHS))
    got = attend_varlen(q, k, v, scheme, cu_seqlens=offsets(LENGTHS), scale=s, backend=backend)
    torch.testing.assert_close(got, dense(q * (s * math.sqrt(D)), k, v, scheme, LENGTHS))
    default = attend_varlen(q, k, v, scheme, cu_seqlens=offsets(LENGTHS), backend=backend)
    torch.testing.assert_close(
        attend_varlen(q, k, v, scheme, cu_seqlens=offsets(LENGTHS), scale=1 / math.sqrt(D),
                      backend=backend), default)


def test_v_head_size_may_differ():
    q, k, v = qkv(sum(LENGTHS), v_dim=8)
    for name in ("rope", "alibi"):
        got = attend_varlen(q, k, v, SCHEMES[name], cu_seqlens=offsets(LENGTHS))
        assert got.shape == (sum(LENGTHS), H, 8)
        torch.testing.assert_close(got, dense(q, k, v, SCHEMES[name], LENGTHS))


@pytest.mark.parametrize("name", ["rope", "alibi", "t5"])
def test_bfloat16_close_to_float32(name):
    scheme = SCHEMES[name]
    q, k, v = qkv(sum(LENGTHS))
    want = attend_varlen(q, k, v, scheme, cu_seqlens=offsets(LENGTHS))
    bf = [t.bfloat16() for t in (q, k, v)]
    got = attend_varlen(*bf, scheme, cu_seqlens=offsets(LENGTHS))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(got, dense(*bf, scheme, LENGTHS), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5"])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_gradients_equal_the_dense_path(name, backend):
    scheme = SCHEMES[name]
    lengths = [4, 1, 6, 4, 0, 3]
    leaves = [t.requires_grad_() for t in qkv(sum(lengths))]
    weight = torch.randn(sum(lengths), H, D, generator=torch.Generator().manual_seed(3))
    params = list(scheme.parameters()) if scheme is not None else []

    def grads(out: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.autograd.grad((out * weight).sum(), leaves + params))

    got = grads(attend_varlen(*leaves, scheme, cu_seqlens=offsets(lengths), window=3, backend=backend))
    want = grads(dense(*leaves, scheme, lengths, window=3))
    assert len(got) == 3 + len(params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_long_biased_sequences_in_query_blocks_on_one_thread(name):
    # one CPU thread, a bias and n >= 256: SDPA runs in blocks of queries (the future skipped)
    scheme, lengths = SCHEMES[name], [300, 5, 260, 300]
    leaves = [t.requires_grad_() for t in qkv(sum(lengths))]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = attend_varlen(*leaves, scheme, cu_seqlens=offsets(lengths), window=200)
        want = dense(*leaves, scheme, lengths, window=200)
        torch.testing.assert_close(got, want)
        for a, b in zip(torch.autograd.grad(got.sum(), leaves), torch.autograd.grad(want.sum(), leaves),
                        strict=True):
            torch.testing.assert_close(a, b)
    finally:
        torch.set_num_threads(threads)


def test_flex_backend_equals_the_dense_path():
    lengths = [5, 0, 9, 2]
    q, k, v = qkv(sum(lengths))
    for scheme in (SCHEMES["rope"], SCHEMES["alibi"]):
        got = attend_varlen(q, k, v, scheme, cu_seqlens=offsets(lengths), window=4, scale=0.3,
                            backend="flex")
        want = dense(q * (0.3 * math.sqrt(D)), k, v, scheme, lengths, window=4)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_positions_restart_in_every_sequence():
    # the same document at two places of the stream gives the same output: positions from 0
    q1, k1, v1 = qkv(6, seed=5)
    q0, k0, v0 = qkv(4, seed=6)
    q, k, v = (torch.cat([a, b, a]) for a, b in ((q1, q0), (k1, k0), (v1, v0)))
    for name in ("rope", "alibi", "t5"):
        out = attend_varlen(q, k, v, SCHEMES[name], cu_seqlens=offsets([6, 4, 6]))
        torch.testing.assert_close(out[:6], out[10:])


def test_the_api_names_convert_into_each_other():
    # document ids -> cu_seqlens -> attend_varlen equals attend with the same document ids
    ids = torch.tensor([[7, 7, 7, 2, 2, 9, 9, 9, 9, 4]])
    cu, max_len = posenc.cu_seqlens(ids)
    q, k, v = qkv(ids.shape[-1])
    got = attend_varlen(q, k, v, SCHEMES["rope"], cu_seqlens=cu, max_seqlen=max_len)
    want = attend(row(q), row(k), row(v), SCHEMES["rope"], document_ids=ids)[0].transpose(0, 1)
    torch.testing.assert_close(got, want)
    assert torch.equal(document_ids_from_lengths(cu.diff()), torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3]))


# -- which path runs (flash-attn's branch needs CUDA; the decision does not) --------------------


class ScaledALiBi(ALiBi):
    """An ALiBi whose bias flash-attn's slopes would not reproduce."""

    def bias(self, q_len, k_len, *, causal=True):
        return 2 * super().bias(q_len, k_len, causal=causal)


@pytest.mark.parametrize(
    ("scheme", "kw", "path"),
    [
        (None, {}, "flash-attn"),
        (NoPE(), {}, "flash-attn"),
        (RoPE(64), {}, "flash-attn"),
        (ALiBi(8), {"dtype": torch.float16}, "flash-attn"),
        (make_scheme("t5", num_heads=8), {}, "sdpa"),  # a learned bias flash-attn cannot add
        (ScaledALiBi(8), {}, "sdpa"),
        (RoPE(64), {"flash_attn": False}, "sdpa"),  # not installed
        (RoPE(64), {"device_type": "cpu"}, "sdpa"),
        (RoPE(64), {"dtype": torch.float32}, "sdpa"),
        (RoPE(64), {"head_dim": 60}, "sdpa"),
        (RoPE(64), {"head_dim": 512}, "sdpa"),
        (RoPE(64), {"v_head_dim": 32}, "sdpa"),
        (RoPE(64), {"backend": "math"}, "math"),
        (RoPE(64), {"backend": "flex"}, "flex"),
    ],
)
def test_dispatch_decision(scheme, kw, path):
    args = {"backend": "sdpa", "device_type": "cuda", "dtype": torch.bfloat16, "head_dim": 64,
            "flash_attn": True, **kw}
    assert _varlen_path(scheme, **args) == path


def test_without_flash_attn_or_cuda_the_grouped_path_runs():
    q, k, v = qkv(sum(LENGTHS))
    assert _varlen_path(SCHEMES["rope"], device_type="cpu", dtype=torch.bfloat16) == "sdpa"
    if _flash_varlen() is None:
        assert _varlen_path(SCHEMES["rope"], device_type="cuda", dtype=torch.bfloat16) == "sdpa"


FLASH = torch.cuda.is_available() and _flash_varlen() is not None


@pytest.mark.skipif(not FLASH, reason="flash-attn's varlen kernel needs CUDA and flash_attn")
@pytest.mark.parametrize("name", ["nope", "rope", "alibi"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 3])
def test_flash_attn_equals_the_grouped_path(name, causal, window):  # pragma: no cover - GPU only
    lengths = [5, 3, 0, 17, 1, 9]
    scheme = schemes()[name]
    if scheme is not None:
        scheme = scheme.cuda()
    q, k, v = (t.cuda().half() for t in qkv(sum(lengths), dim=64))
    cu = offsets(lengths).cuda()
    assert _varlen_path(scheme, device_type="cuda", dtype=torch.float16, head_dim=64) == "flash-attn"
    got = attend_varlen(q, k, v, scheme, cu_seqlens=cu, causal=causal, window=window, scale=0.2)
    want = attend_varlen(q.float(), k.float(), v.float(), scheme, cu_seqlens=cu, causal=causal,
                         window=window, scale=0.2)
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)
