import pytest
import torch
import torch.nn.functional as F

from posenc import SCHEMES, KVCache, MultiHeadAttention, attend, causal_mask, make_scheme


def naive_attention(q, k, v, bias=None, causal=True):
    """Loop over queries: softmax(q k / sqrt(d) + b) v, queries being the last keys."""
    B, H, Lq, D = q.shape
    Lk = k.shape[-2]
    out = torch.zeros_like(q)
    for i in range(Lq):
        limit = Lk - Lq + i + 1 if causal else Lk
        s = q[:, :, i : i + 1] @ k[:, :, :limit].transpose(-1, -2) / D**0.5  # [B, H, 1, limit]
        if bias is not None:
            s = s + bias[:, i : i + 1, :limit]
        out[:, :, i : i + 1] = s.softmax(-1) @ v[:, :, :limit]
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("name", ["alibi", "t5", "nope"])
def test_attend_matches_naive_loop(name, backend, causal):
    torch.manual_seed(0)
    scheme = make_scheme(name, dim=32, num_heads=4, causal=causal)
    q, k, v = torch.randn(3, 2, 4, 7, 8).unbind(0)
    bias = scheme.bias(7, 7, causal=causal)
    want = naive_attention(q, k, v, bias, causal)
    torch.testing.assert_close(attend(q, k, v, scheme, causal=causal, backend=backend), want)


def test_causal_mask_aligns_queries_to_the_last_keys():
    m = causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize("name", SCHEMES)
def test_incremental_decoding_equals_full_pass(name):
    """Prefill 5 tokens, then decode 1 at a time with a KV cache: same outputs as one pass."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, scheme=name, max_len=16).eval()
    x = torch.randn(2, 12, 32)
    x_in = mha.scheme.embed(x, torch.arange(12))  # the model applies the embed hook
    full = mha(x_in)
    cache = KVCache()
    steps = [mha(x_in[:, :5], cache=cache)]
    for t in range(5, 12):
        x_t = mha.scheme.embed(x[:, t : t + 1], torch.tensor([t]))
        steps.append(mha(x_t, cache=cache))
    assert len(cache) == 12
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_nope_without_mask_is_permutation_equivariant():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, scheme="nope", causal=False)
    x = torch.randn(1, 9, 32)
    perm = torch.randperm(9)
    torch.testing.assert_close(mha(x)[:, perm], mha(x[:, perm]), atol=1e-6, rtol=1e-5)
    # with any position scheme the symmetry is gone
    rope = MultiHeadAttention(32, 4, scheme="rope", causal=False)
    rope.load_state_dict(mha.state_dict())
    assert not torch.allclose(rope(x)[:, perm], rope(x[:, perm]), atol=1e-4)


def test_rope_scores_shift_invariant_in_attention():
    """Shifting every position by the same amount leaves RoPE attention unchanged."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, scheme="rope")
    x = torch.randn(2, 6, 32)
    torch.testing.assert_close(
        mha(x, positions=torch.arange(6)), mha(x, positions=torch.arange(100, 106)), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["alibi", "t5", "rope"])
def test_low_precision_attention_is_finite(dtype, name):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, scheme=name).to(dtype)
    x = torch.randn(2, 20, 32, dtype=dtype)
    y = mha(x)
    assert y.dtype == dtype and torch.isfinite(y).all()
    ref = MultiHeadAttention(32, 4, scheme=name)
    ref.load_state_dict({k: v.float() for k, v in mha.state_dict().items()})
    torch.testing.assert_close(y.float(), ref(x.float()), atol=5e-2, rtol=5e-2)


def test_float16_masked_fill_minus_1e9_overflows_but_posenc_does_not():
    scores = torch.randn(4, 4, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="overflow"):
        scores.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), -1e9)
    q = k = v = torch.randn(1, 2, 4, 8, dtype=torch.float16)
    out = attend(q, k, v, make_scheme("alibi", num_heads=2))
    assert torch.isfinite(out).all()


def test_sdpa_is_causal_is_wrong_for_a_cache_so_posenc_does_not_use_it():
    q, k, v = torch.randn(3, 1, 1, 6, 8).unbind(0)
    cache = KVCache()
    cache.update(k[:, :, :4], v[:, :, :4])
    ours = attend(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], cache=cache)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, full[:, :, 4:])
    top_left = F.scaled_dot_product_attention(q[:, :, 4:], k, v, is_causal=True)
    assert not torch.allclose(top_left, full[:, :, 4:])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", SCHEMES)
def test_attn_mask_is_bias_plus_causal_mask_once(name, causal):
    """The 4-D mask attend hands SDPA: the bias, -inf on future keys, nothing else."""
    torch.manual_seed(0)
    scheme = make_scheme(name, dim=32, num_heads=4, max_len=16, causal=causal)
    for q_len, k_len in [(6, 6), (2, 6), (9, 9), (1, 4)]:
        got = scheme.attn_mask(q_len, k_len, causal=causal)
        bias = scheme.bias(q_len, k_len, causal=causal)
        if bias is None:
            assert got is None
            continue
        want = bias.float()
        if causal:
            want = want.masked_fill(~causal_mask(q_len, k_len), float("-inf"))
        assert got.shape == (1, 4, q_len, k_len)
        torch.testing.assert_close(got[0], want)
        assert not torch.isnan(got).any() and torch.isfinite(got).any(-1).all()  # no all -inf row


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_decoding_after_a_longer_pass_uses_the_cached_mask(name):
    """A full pass caches the square mask; prefill and decode then read slices of it."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, scheme=name).eval()
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        mha(torch.randn(1, 16, 32))  # caches a 16 x 16 mask
        full = mha(x)
        cache = KVCache()
        steps = [mha(x[:, :5], cache=cache)] + [mha(x[:, t : t + 1], cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_t5_mask_cache_follows_the_weights():
    torch.manual_seed(0)
    scheme = make_scheme("t5", num_heads=4)
    with torch.no_grad():
        before = scheme.attn_mask(8, 8).clone()
        scheme.rel.embedding.weight.add_(1.0)  # an optimizer step is an in-place update
        torch.testing.assert_close(scheme.attn_mask(8, 8), before + torch.where(before.isinf(), 0.0, 1.0))
        state = {k: torch.zeros_like(v) for k, v in scheme.state_dict().items()}
        scheme.load_state_dict(state)
        assert (scheme.attn_mask(8, 8)[torch.isfinite(before)] == 0).all()


def test_bias_schemes_train_through_attend():
    """With gradients on, T5's mask is built per call and its table gets a gradient; ALiBi's
    cached mask (even one made under inference_mode) is usable for training."""
    torch.manual_seed(0)
    for name in ("t5", "alibi"):
        mha = MultiHeadAttention(32, 4, scheme=name)
        x = torch.randn(2, 10, 32)
        with torch.inference_mode():
            mha(x)
        mha(x).square().sum().backward()
        assert mha.qkv.weight.grad is not None and torch.isfinite(mha.qkv.weight.grad).all()
        if name == "t5":
            g = mha.scheme.rel.embedding.weight.grad
            assert g is not None and g.abs().sum() > 0 and torch.isfinite(g).all()


@pytest.mark.parametrize("q_len,k_len", [(300, 300), (260, 400), (1000, 1000)])
@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_long_causal_bias_pass_in_query_blocks_equals_one_sdpa_call(name, q_len, k_len):
    """attend splits a long causal biased pass into query blocks; same result as one call."""
    torch.manual_seed(0)
    scheme = make_scheme(name, num_heads=2)
    q = torch.randn(2, 2, q_len, 8)
    k, v = torch.randn(2, 2, 2, k_len, 8).unbind(0)
    p = k_len - q_len  # cached tokens
    cache = KVCache()
    cache.update(k[:, :, :p], v[:, :, :p])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the block path is taken with one thread
    try:
        with torch.no_grad():
            out = attend(q, k[:, :, p:], v[:, :, p:], scheme, cache=cache)
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=scheme.attn_mask(q_len, k_len))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
