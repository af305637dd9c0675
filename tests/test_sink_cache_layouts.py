"""posenc.hf.SinkCache's two key layouts (issue 34): sinks at their true positions, and
StreamingLLM's positions inside the cache, against posenc's own decode of the same Llama
weights, token by token, over 4x the window; and the compiled decode loop's graph count."""

from __future__ import annotations

import copy

import pytest
import torch

import posenc
import posenc.hf

pytest.importorskip("transformers")
from test_hf_adapter import llama_config  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

S, W = 2, 6
TOKENS = 5 + 4 * W  # a prompt of 5, then 4x the window one token at a time


def _llama(scheme: object, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(copy.deepcopy(llama_config(initializer_range=0.2))).eval()
    return posenc.hf.use(model, scheme)


def _reference(model: torch.nn.Module, ids: torch.Tensor, layout: str) -> torch.Tensor:
    """The model's layers run by hand, one token at a time, with posenc's attend: ``"true"``
    through a rolling ``KVCache(max_len=S + W, sinks=S, window=W)`` (keys at their true
    positions); ``"in_cache"`` as StreamingLLM states it: every unrotated key kept, the kept
    ones (the first S and the last W - 1 before the query) renumbered 0, 1, ... and the query
    at the next number. Returns the logits ``[1, T, V]``."""
    inner = model.model
    layers = list(inner.layers)
    rolling = [posenc.KVCache(max_len=S + W, sinks=S, window=W) for _ in layers]
    raw_k: list[list[torch.Tensor]] = [[] for _ in layers]
    raw_v: list[list[torch.Tensor]] = [[] for _ in layers]
    out = []
    for t in range(ids.shape[1]):
        h = inner.embed_tokens(ids[:, t:t + 1])  # [1, 1, D]
        for i, layer in enumerate(layers):
            att = layer.self_attn
            scheme = att._posenc_options.scheme
            x = layer.input_layernorm(h)
            hd = att.head_dim
            q = att.q_proj(x).view(1, 1, -1, hd).transpose(1, 2)  # [1, H, 1, hd]
            k = att.k_proj(x).view(1, 1, -1, hd).transpose(1, 2)
            v = att.v_proj(x).view(1, 1, -1, hd).transpose(1, 2)
            if layout == "true":
                o = posenc.attend(q, k, v, scheme, positions=torch.tensor([t]),
                                  cache=rolling[i], scale=att.scaling)
            else:
                raw_k[i].append(k)
                raw_v[i].append(v)
                kept = list(range(min(S, t + 1))) + list(range(max(S, t - W + 1), t + 1))
                K = torch.cat([raw_k[i][j] for j in kept], dim=-2)
                V = torch.cat([raw_v[i][j] for j in kept], dim=-2)
                n = len(kept)
                o = posenc.attend(q, K, V, scheme, positions=torch.tensor([n - 1]),
                                  key_positions=torch.arange(n), scale=att.scaling)
            h = h + att.o_proj(o.transpose(1, 2).reshape(1, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        out.append(model.lm_head(inner.norm(h)))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("layout", ["true", "in_cache"])
@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_sink_cache_generate_equals_posenc_rolling_decode(scheme, layout):
    model = _llama(scheme)
    prompt = torch.tensor([[5, 17, 33, 8, 71]])
    cache = posenc.hf.SinkCache(sinks=S, window=W, config=model.config, positions=layout)
    with torch.no_grad():
        got = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                             cache=cache, max_new_tokens=4 * W, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        seq = got.sequences
        assert seq.shape[1] == TOKENS
        ref = _reference(model, seq, layout)  # [1, T, V]
    P = prompt.shape[1]
    torch.testing.assert_close(torch.stack(got.logits, 1), ref[:, P - 1:-1], atol=1e-5,
                               rtol=1e-5)
    assert cache.layers[0].kv.k.shape[-2] == S + W + 1  # fixed memory


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_in_cache_prefill_longer_than_the_cache_equals_the_token_by_token_decode(scheme):
    model = _llama(scheme)
    ids = torch.randint(3, 100, (1, 3 * W))
    cache = posenc.hf.SinkCache(sinks=S, window=W, config=model.config, positions="in_cache")
    with torch.no_grad():
        got = model(input_ids=ids, cache=cache, use_cache=True).logits
        ref = _reference(model, ids, "in_cache")
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_the_layouts_differ_once_the_cache_is_full_and_agree_before():
    model = _llama("rope")
    ids = torch.randint(3, 100, (1, 2 * (S + W)))
    with torch.no_grad():
        a, b = (model(input_ids=ids, use_cache=True, cache=posenc.hf.SinkCache(
            sinks=S, window=W, config=model.config, positions=p)).logits
            for p in ("true", "in_cache"))
    torch.testing.assert_close(a[:, :S + W], b[:, :S + W], atol=1e-5, rtol=1e-5)
    assert (a[:, S + W:] - b[:, S + W:]).abs().max() > 1e-3


def test_in_cache_refuses_the_models_own_rope_and_a_bad_layout():
    model = _llama(None)
    cache = posenc.hf.SinkCache(sinks=S, window=W, config=model.config, positions="in_cache")
    with pytest.raises(ValueError, match=r"use\(model, 'rope'\)"):
        model(input_ids=torch.tensor([[5, 17, 33]]), cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="in_cache"):
        posenc.hf.SinkCache(sinks=S, window=W, positions="cache")


@pytest.mark.parametrize("layout", ["true", "in_cache"])
def test_compiled_decode_over_4x_the_window_makes_2_graphs_and_equals_posenc_decode(layout):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = _llama("rope")
    cache = posenc.hf.SinkCache(sinks=S, window=W, config=model.config, positions=layout)
    counter = CompileCounter()
    step = torch.compile(model.forward, backend=counter, fullgraph=True, dynamic=False)
    ids = torch.tensor([[5, 17, 33, 8, 71]])
    got = []
    with torch.no_grad():
        out = step(input_ids=ids, cache=cache, use_cache=True).logits
        got.append(out)
        for _ in range(4 * W):  # no attention_mask: positions from the cache's 0-dim count
            out = step(input_ids=out[:, -1:].argmax(-1), cache=cache,
                       use_cache=True).logits
            got.append(out)
        seq = torch.cat([ids] + [o[:, -1:].argmax(-1) for o in got[:-1]], dim=1)
        ref = _reference(model, seq, layout)
    assert counter.frame_count == 2  # prefill, step
    torch.testing.assert_close(torch.cat(got, dim=1), ref, atol=1e-5, rtol=1e-5)
