"""Llama 4 attention temperature tuning: equal to transformers' Llama4TextAttention."""

import math

import pytest
import torch

from posenc.temperature import llama4_attn_scale


def test_formula_written_out():
    pos = torch.tensor([0, 1, 6, 7, 8, 15, 16, 100])
    got = llama4_attn_scale(pos, floor_scale=8, attn_scale=0.1)
    want = [1 + 0.1 * math.log(1 + (p + 1) // 8) for p in pos.tolist()]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32))
    assert got.dtype == torch.float32


def test_one_below_floor_scale_then_grows():
    s = llama4_attn_scale(torch.arange(100_000))  # Llama 4 defaults: floor_scale 8192, attn_scale 0.1
    assert (s[:8191] == 1).all() and s[8191] > 1
    assert (s.diff() >= 0).all()


def test_batched_positions_keep_shape():
    pos = torch.tensor([[0, 5, 9], [3, 4, 20]])
    s = llama4_attn_scale(pos, floor_scale=4, attn_scale=0.5)
    assert s.shape == (2, 3)
    torch.testing.assert_close(s[1], llama4_attn_scale(pos[1], floor_scale=4, attn_scale=0.5))


@pytest.mark.parametrize("past", [0, 5])
def test_nope_layer_equals_llama4_text_attention(past):
    """A NoPE layer of HF's Llama 4 (attn_temperature_tuning on) against plain attention whose
    queries are multiplied by llama4_attn_scale: the same output, also with a KV cache."""
    tf = pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    cfg = tf.Llama4TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                              num_hidden_layers=1, no_rope_layers=[0], floor_scale=3, attn_scale=0.3,
                              attn_temperature_tuning=True, attention_bias=False, intermediate_size=64,
                              intermediate_size_mlp=64, vocab_size=50)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = Llama4TextAttention(cfg, 0).eval()
    assert not attn.use_rope
    L, total = 7, 7 + past
    x = torch.randn(1, total, 32)
    mask = torch.full((total, total), float("-inf")).triu(1)[None, None]  # [1, 1, L, L] causal
    cache = None
    if past:
        cache = tf.DynamicCache(config=cfg)
        with torch.no_grad():
            attn(x[:, :past], None, mask[..., :past, :past], cache=cache)
    with torch.no_grad():
        out_hf, _ = attn(x[:, past:], None, mask[..., past:, :], cache=cache)

    q = attn.q_proj(x).view(1, total, 4, 8).transpose(1, 2)  # [B, H, L, Dh]
    k = attn.k_proj(x).view(1, total, 4, 8).transpose(1, 2)
    v = attn.v_proj(x).view(1, total, 4, 8).transpose(1, 2)
    scale = llama4_attn_scale(torch.arange(total), floor_scale=3, attn_scale=0.3)  # [L]
    q = q * scale[:, None]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8) + mask[0, 0]
    out = (s.softmax(-1) @ v).transpose(1, 2).reshape(1, total, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn.o_proj(out)[:, past:], out_hf)
    assert L == out_hf.shape[1]


# ------------------------------------------------------------ iRoPE layers in the lab's model


def test_per_layer_list_of_one_scheme_equals_the_scheme():
    from posenc.lab.model import TransformerLM

    tokens = torch.randint(0, 256, (2, 12))
    torch.manual_seed(0)
    a = TransformerLM(scheme="rope", dim=32, num_layers=2, num_heads=4)
    torch.manual_seed(0)
    b = TransformerLM(scheme=["rope", "rope"], dim=32, num_layers=2, num_heads=4)
    torch.testing.assert_close(a(tokens), b(tokens), rtol=0, atol=0)


def test_irope_layers_and_temperature_in_the_model():
    from posenc.lab.config import TrainConfig
    from posenc.lab.model import TemperedNoPE
    from posenc.lab.train import build_model
    from posenc.schemes import NoPE, RoPE

    cfg = TrainConfig(scheme=["rope", "rope", "rope", "nope"], num_layers=4, dim=32,
                      scheme_options={"nope": {"floor_scale": 16, "attn_scale": 0.2}})
    model = build_model(cfg)
    kinds = [type(b.attn.scheme) for b in model.blocks]
    assert kinds == [RoPE, RoPE, RoPE, TemperedNoPE]
    assert model.blocks[0].attn.scheme is model.blocks[2].attn.scheme  # one RoPE shared
    assert cfg.scheme_label == "rope+rope+rope+nope" and "rope+rope+rope+nope" in cfg.cache_path("x").name
    plain = build_model(TrainConfig(scheme=["rope", "nope"], num_layers=2, dim=32)).blocks[1].attn.scheme
    assert type(plain) is NoPE
    assert cfg.key("x") != TrainConfig(scheme=["rope", "rope", "rope", "nope"], num_layers=4, dim=32).key("x")


def test_incremental_decoding_with_tempered_nope_equals_full_forward():
    from posenc.attention import KVCache
    from posenc.lab.model import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(scheme=["rope", "nope"], dim=32, num_layers=2, num_heads=4,
                          scheme_kwargs={"nope": {"floor_scale": 2, "attn_scale": 0.5}}).eval()
    tokens = torch.randint(0, 256, (1, 9))
    with torch.no_grad():
        full = model(tokens)
        caches = [KVCache() for _ in model.blocks]
        steps = [model(tokens[:, :5], caches=caches)] + [model(tokens[:, i:i + 1], caches=caches)
                                                           for i in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_lab_nope_layer_equals_llama4_text_attention():
    """MultiHeadAttention with the lab's TemperedNoPE = HF's Llama 4 NoPE attention (same weights)."""
    tf = pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    from posenc.attention import MultiHeadAttention
    from posenc.lab.model import TemperedNoPE

    cfg = tf.Llama4TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                              num_hidden_layers=1, no_rope_layers=[0], floor_scale=4, attn_scale=0.25,
                              attn_temperature_tuning=True, attention_bias=False, intermediate_size=64,
                              intermediate_size_mlp=64, vocab_size=50)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = Llama4TextAttention(cfg, 0).eval()
    ours = MultiHeadAttention(32, 4, scheme=TemperedNoPE(floor_scale=4, attn_scale=0.25)).eval()
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        ours.proj.weight.copy_(hf.o_proj.weight)
        x = torch.randn(2, 21, 32)
        mask = torch.full((21, 21), float("-inf")).triu(1)[None, None]
        torch.testing.assert_close(ours(x), hf(x, None, mask)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs,msg", [
    ({"scheme": ["rope", "learned"], "num_layers": 2}, "may hold rope, alibi, t5, nope"),
    ({"scheme": ["rope", "nope"], "num_layers": 3}, "scheme lists 2 layers but num_layers=3"),
    ({"scheme": ["rope", "nope"], "num_layers": 2, "scheme_options": {"base": 500.0}}, "scheme_options maps"),
])
def test_per_layer_bad_input(kwargs, msg):
    from posenc.lab.config import TrainConfig

    with pytest.raises(ValueError, match=msg):
        TrainConfig(**kwargs)


def test_tempered_nope_bad_input():
    from posenc.lab.model import TransformerLM

    with pytest.raises(ValueError, match="scheme 'nope' takes floor_scale and attn_scale"):
        TransformerLM(scheme="nope", dim=32, num_layers=1, scheme_kwargs={"base": 2})


def test_chunked_rope_layer_attends_within_its_chunk_only():
    """Llama 4's RoPE layers use chunked attention: the bias equals a written-out block mask, a
    token never sees an earlier chunk, and decoding with a KV cache equals the full pass."""
    from posenc.attention import KVCache
    from posenc.lab.model import ChunkedRoPE, TransformerLM

    scheme = ChunkedRoPE(8, attention_chunk=3)
    want = torch.tensor([[0.0 if n // 3 == m // 3 else float("-inf") for n in range(7)]
                         for m in range(2, 7)])  # queries are the last 5 of 7 positions
    torch.testing.assert_close(scheme.bias(5, 7)[0], want)

    torch.manual_seed(0)
    model = TransformerLM(scheme=["rope"], dim=32, num_layers=1, num_heads=4,
                          scheme_kwargs={"rope": {"attention_chunk": 4}}).eval()
    tokens = torch.randint(0, 255, (1, 11))
    changed = tokens.clone()
    changed[0, 1] += 1  # a token of chunk 0
    with torch.no_grad():
        diff = (model(tokens) - model(changed)).abs().amax(-1)[0]  # [L]
        assert (diff[:4] > 0)[1:].all() and (diff[4:] == 0).all()
        caches = [KVCache()]
        steps = [model(tokens[:, :6], caches=caches)] + [model(tokens[:, i:i + 1], caches=caches)
                                                           for i in range(6, 11)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(tokens), atol=1e-5, rtol=1e-5)
