import math

import pytest
import torch

from posenc import T5RelativeBias, t5_relative_bucket


def hf_bucket(relative_position: int, bidirectional=True, num_buckets=32, max_distance=128) -> int:
    """Hugging Face T5Attention._relative_position_bucket, for one integer."""
    ret = 0
    n = relative_position
    if bidirectional:
        num_buckets //= 2
        ret += num_buckets if n > 0 else 0
        n = abs(n)
    else:
        n = max(-n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return ret + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 20)])
def test_buckets_match_hf(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-400, 401)
    got = t5_relative_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    want = [hf_bucket(r, bidirectional, num_buckets, max_distance) for r in rel.tolist()]
    assert got.tolist() == want
    assert got.dtype == torch.long


def test_bucket_properties():
    rel = torch.arange(0, 300)
    b = t5_relative_bucket(-rel, bidirectional=False)
    assert b[:16].tolist() == list(range(16))  # exact region: one bucket per distance
    assert (b.diff() >= 0).all() and b.max() == 31  # monotone, saturates at max_distance
    assert (b[128:] == 31).all()


def test_module_bias_is_lookup_of_buckets():
    torch.manual_seed(0)
    mod = T5RelativeBias(4, bidirectional=False, num_buckets=8, max_distance=16)
    bias = mod(5, 9)  # [H, 5, 9]: last 5 queries of 9 keys
    assert bias.shape == (4, 5, 9)
    for i in range(5):
        for j in range(9):
            bucket = hf_bucket(j - (i + 4), False, 8, 16)
            torch.testing.assert_close(bias[:, i, j], mod.embedding.weight[bucket])
    torch.testing.assert_close(mod(9)[:, 4:], bias)


@pytest.mark.parametrize("is_decoder", [False, True])
def test_loads_hf_t5_relative_bias_weights(is_decoder):
    transformers = pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.t5.modeling_t5 import T5Attention

    torch.manual_seed(0)
    cfg = transformers.T5Config(d_model=16, d_kv=4, num_heads=3, relative_attention_num_buckets=16,
                                relative_attention_max_distance=40, is_decoder=is_decoder)  # fmt: skip
    hf = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0)
    ours = T5RelativeBias(3, bidirectional=not is_decoder, num_buckets=16, max_distance=40)
    ours.load_state_dict({"embedding.weight": hf.relative_attention_bias.weight})  # the doc's name
    for q_len, k_len in [(50, 50), (1, 50), (7, 90)]:
        want = hf.compute_bias(q_len, k_len, past_seen_tokens=k_len - q_len)[0]  # [H, Lq, Lk]
        torch.testing.assert_close(ours(q_len, k_len), want, rtol=0, atol=0)
