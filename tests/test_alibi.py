import math

import pytest
import torch
import torch.nn.functional as F

from posenc import ALiBi, KVCache, alibi_bias, alibi_score_mod, alibi_slopes, attend, causal_mask
from posenc.alibi import alibi_bias_padded


def paper_slopes(n: int) -> list[float]:
    """Press et al. (2022), the reference code's get_slopes, written out."""

    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return pow2(n)
    closest = 2 ** math.floor(math.log2(n))
    return pow2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n", range(1, 65))
def test_slopes_match_paper_for_1_to_64_heads(n):
    torch.testing.assert_close(alibi_slopes(n), torch.tensor(paper_slopes(n)))


def test_slopes_closed_form_and_simplified_rule():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(h + 1) for h in range(8)]))
    twelve = alibi_slopes(12)
    simplified = torch.tensor([2.0 ** -(h + 1) for h in range(12)])
    assert not torch.allclose(twelve, simplified)  # the article's 1/2^h is the paper's only for 8 heads
    torch.testing.assert_close(twelve[:8], alibi_slopes(8))
    torch.testing.assert_close(twelve[8:], alibi_slopes(16)[0::2][:4])
    assert alibi_slopes(12).dtype == torch.float32


def test_bias_formula_causal_and_bidirectional():
    h, L = 4, 6
    m = alibi_slopes(h)
    b = alibi_bias(h, L)
    bb = alibi_bias(h, L, causal=False)
    for i in range(L):
        for j in range(L):
            if j <= i:
                torch.testing.assert_close(b[:, i, j], -m * (i - j))
            else:
                assert torch.isinf(b[:, i, j]).all() and (b[:, i, j] < 0).all()
            torch.testing.assert_close(bb[:, i, j], -m * abs(i - j))


def test_kv_cache_rows_are_the_last_rows():
    full = alibi_bias(8, 10)
    torch.testing.assert_close(alibi_bias(8, 3, 10), full[:, 7:])
    torch.testing.assert_close(alibi_bias(8, 1, 10, causal=False), alibi_bias(8, 10, causal=False)[:, 9:])


def test_row_constant_does_not_change_probabilities():
    """-m(i - j) and the reference code's m * j differ by a per-row constant: same softmax."""
    h, L = 4, 9
    scores = torch.randn(h, L, L)
    m = alibi_slopes(h)[:, None, None]
    j = torch.arange(L)[None, None, :]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    p1 = (scores + alibi_bias(h, L)).softmax(-1)
    p2 = (scores + m * j).masked_fill(~causal, float("-inf")).softmax(-1)
    torch.testing.assert_close(p1, p2)
    # without the mask, m * j is not the symmetric -m|i - j|: it rewards the far future
    q1 = (scores + alibi_bias(h, L, causal=False)).softmax(-1)
    q2 = (scores + m * j).softmax(-1)
    assert not torch.allclose(q1, q2, atol=1e-3)


def test_float16_bias_and_sdpa_have_no_overflow():
    b = alibi_bias(4, 64, dtype=torch.float16)
    assert b.dtype == torch.float16
    q = k = v = torch.randn(1, 4, 64, 16, dtype=torch.float16)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=b)
    assert torch.isfinite(out).all()


def test_score_mod_equals_bias():
    h, L = 4, 5
    slopes = alibi_slopes(h)
    full = alibi_bias(h, L, causal=False)
    mod = alibi_score_mod(slopes, q_offset=2)
    zero = torch.zeros(())
    for hh in range(h):
        for i in range(3):
            for j in range(L):
                got = mod(zero, 0, torch.tensor(hh), torch.tensor(i), torch.tensor(j))
                want = -slopes[hh] * (i + 2 - j)
                torch.testing.assert_close(got, want)
                if j <= i + 2:
                    torch.testing.assert_close(got, full[hh, i + 2, j])


@pytest.mark.parametrize("causal", [True, False])
def test_flex_attention_equals_sdpa_with_bias(causal):
    """Also bidirectional: flex's fast path once added ALiBi's causal -m (i - j) to keys after
    the query (the index score_mod has no causal flag) where the others add -m |i - j|."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 32, 16).unbind(0)
    with torch.no_grad():
        ref = attend(q, k, v, ALiBi(4), causal=causal)
        out = attend(q, k, v, ALiBi(4), causal=causal, backend="flex")
        naive = attend(q, k, v, ALiBi(4), causal=causal, backend="math")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(naive, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("q_len,k_len", [(300, 300), (5, 260), (130, 131), (1, 1)])
def test_causal_block_mask_matches_dense_mask(q_len, k_len):
    pytest.importorskip("torch.nn.attention.flex_attention")
    from posenc.attention import causal_block_mask

    dense = causal_block_mask(q_len, k_len).to_dense()[0, 0]  # [Nq, Nk] tiles with any visible key
    want = causal_mask(q_len, k_len)
    n = 128
    for qb in range(dense.shape[0]):
        for kb in range(dense.shape[1]):
            tile = want[qb * n : (qb + 1) * n, kb * n : (kb + 1) * n]
            assert bool(dense[qb, kb]) == bool(tile.any())


def test_flex_attention_with_kv_cache_offset():
    pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 4, 200, 16).unbind(0)
    with torch.no_grad():
        ref = attend(q, k, v, ALiBi(4))[:, :, 150:]
        cache = KVCache()
        cache.update(k[:, :, :150], v[:, :, :150])
        out = attend(q[:, :, 150:], k[:, :, 150:], v[:, :, 150:], ALiBi(4), cache=cache, backend="flex")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_padded_bias_without_padding_is_the_plain_bias():
    mask = torch.ones(2, 9, dtype=torch.long)
    for causal in (True, False):
        want = alibi_bias(6, 9, causal=causal)[None].expand(2, -1, -1, -1)
        torch.testing.assert_close(alibi_bias_padded(6, mask, causal=causal), want)
        rows = alibi_bias(6, 3, 9, causal=causal)[None].expand(2, -1, -1, -1)
        torch.testing.assert_close(alibi_bias_padded(6, mask, q_len=3, causal=causal), rows)


def test_padded_bias_written_out():
    """-m_h (p_i - p_j) on real, past keys; padded queries see only themselves; no NaN rows."""
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 1, 1]])
    h = 3
    m = alibi_slopes(h)
    b = alibi_bias_padded(h, mask)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    for r in range(3):
        for i in range(6):
            for j in range(6):
                if not mask[r, i]:
                    want = torch.zeros(h) if i == j else torch.full((h,), float("-inf"))
                elif mask[r, j] and j <= i:
                    want = -m * float(pos[r, i] - pos[r, j])
                else:
                    want = torch.full((h,), float("-inf"))
                torch.testing.assert_close(b[r, :, i, j], want)
    assert torch.isfinite(b.softmax(-1)).all()
    torch.testing.assert_close(alibi_bias_padded(h, mask.bool(), position_ids=pos), b)
    torch.testing.assert_close(alibi_bias_padded(h, mask, q_len=2), b[:, :, 4:])


@pytest.mark.parametrize("num_heads", [4, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_bias_matches_bloom(num_heads, dtype):
    """transformers' BLOOM (build_alibi_tensor + its causal/padding mask, eager softmax): with the
    q/k projection zeroed its attention weights are softmax(alibi + mask) - ours on real queries."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BloomConfig(vocab_size=11, hidden_size=8 * num_heads, n_layer=1, n_head=num_heads)
    cfg._attn_implementation = "eager"
    model = transformers.BloomModel(cfg).eval().to(dtype)
    qkv = model.h[0].self_attention.query_key_value
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])
    with torch.no_grad():
        qkv.weight.zero_()
        qkv.bias.zero_()
        ids = torch.randint(0, 11, mask.shape)
        probs = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[0]
    ours = alibi_bias_padded(num_heads, mask, dtype=dtype).float().softmax(-1)  # [B, H, L, L]
    real = mask.bool()[:, None, :, None].expand_as(ours)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ours[real], probs.float()[real], atol=tol, rtol=tol)


def test_alibi_scheme_mask_cache_slices_kv_rows():
    a = ALiBi(4)
    full = a.attn_mask(10, 10)  # builds the [1, H, 10, 10] square
    assert full.shape == (1, 4, 10, 10)
    torch.testing.assert_close(full[0], alibi_bias(4, 10))
    for q_len, k_len in [(3, 10), (1, 7), (5, 5), (2, 12)]:
        got = a.attn_mask(q_len, k_len)
        torch.testing.assert_close(got[0], alibi_bias(4, q_len, k_len))
    torch.testing.assert_close(a.attn_mask(4, 6, causal=False)[0], alibi_bias(4, 4, 6, causal=False))
    half = a.attn_mask(3, 8, dtype=torch.float16)
    assert half.dtype == torch.float16 and half.shape == (1, 4, 3, 8)


def test_alibi_clear_cache_frees_the_mask():
    a = ALiBi(2)
    a.attn_mask(6, 6)
    assert a._mask is not None
    a.clear_cache()
    assert a._mask is None
    torch.testing.assert_close(a.attn_mask(2, 6)[0], alibi_bias(2, 2, 6))
