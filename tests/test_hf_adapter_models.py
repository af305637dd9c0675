"""Each model family keeps its own RoPE under posenc's attention (``posenc.hf.use(model)``).

For Llama (default, llama3 and yarn RoPE), Mistral (a sliding window of 4), Qwen2 (q/k/v
biases), Gemma 2 (logit softcap, ``head_dim`` 32 != 64 / 4, ``query_pre_attn_scalar``,
alternating sliding/full layers), Gemma 3 (q/k norms, alternating sliding/full layers with a
RoPE base each), GPT-NeoX (a quarter of each head rotated) and gpt-oss (learned sinks,
alternating sliding/full layers, yarn), all with grouped-query heads:

- left-padded logits = transformers' own attention (``sdpa``; ``eager`` for Gemma 2 and gpt-oss,
  whose softcap and sinks only eager applies);
- batched, left-padded greedy ``generate`` = transformers' (tokens equal, logits close);
- a ``DataCollatorWithFlattening`` row = each document alone;
- ``generate`` with a ``StaticCache`` (the rolling sliding-window layers for the windowed
  families) = with the default ``DynamicCache``;
- for Llama and Gemma 2: ``torch.compile(fullgraph=True)`` traces the forward in one graph, equal
  to eager, and a compiled static-cache ``generate`` equals the eager one.

The prompts (4 and 7 tokens) plus 6 generated tokens run past every window.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_hf_adapter import (
    DOCS,
    TOL,
    common,
    greedy,
    left_padded,
    logits,
    packed,
    pair,
)

transformers = pytest.importorskip("transformers")
from torch._dynamo.testing import CompileCounter  # noqa: E402
from transformers import (  # noqa: E402
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 16}


def _neox(partial: float = 0.25) -> GPTNeoXConfig:
    c = {k: v for k, v in common().items() if k != "num_key_value_heads"}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial}
    return GPTNeoXConfig(**c, rope_parameters=rope)  # head_dim 16: 4 channels rotate


FAMILIES = {  # name: (model class, config, transformers' reference attention)
    "llama": (LlamaForCausalLM, lambda: LlamaConfig(**common()), "sdpa"),
    "llama-llama3": (LlamaForCausalLM, lambda: LlamaConfig(**common(rope_parameters=LLAMA3)), "sdpa"),
    "llama-yarn": (LlamaForCausalLM, lambda: LlamaConfig(**common(rope_parameters=YARN)), "sdpa"),
    "mistral": (MistralForCausalLM, lambda: MistralConfig(**common(sliding_window=4)), "sdpa"),
    "qwen2": (Qwen2ForCausalLM, lambda: Qwen2Config(**common()), "sdpa"),
    "gemma2": (Gemma2ForCausalLM, lambda: Gemma2Config(**common(
        head_dim=32, query_pre_attn_scalar=24, attn_logit_softcapping=4.0, sliding_window=4)), "eager"),
    "gemma3": (Gemma3ForCausalLM, lambda: Gemma3TextConfig(**common(
        head_dim=32, query_pre_attn_scalar=32, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"])), "sdpa"),
    "gpt_neox": (GPTNeoXForCausalLM, _neox, "sdpa"),
    "gpt_oss": (GptOssForCausalLM, lambda: GptOssConfig(**common(
        head_dim=16, sliding_window=4, num_local_experts=2, num_experts_per_tok=1,
        rope_parameters=YARN | {"beta_fast": 32.0, "beta_slow": 1.0})), "eager"),
}


def _sharpen(model: torch.nn.Module, family: str) -> None:
    """Make the family's own feature bite: random weights keep scores near 0.01, so Gemma 2's
    queries are scaled up until the softcap (4.0) clips, and gpt-oss's sinks get logits of
    order 1."""
    if family not in ("gemma2", "gpt_oss"):
        return
    with torch.no_grad():
        for layer in model.model.layers:
            if family == "gemma2":
                layer.self_attn.q_proj.weight.mul_(60.0)
            if family == "gpt_oss":
                layer.self_attn.sinks.copy_(torch.linspace(-1.5, 2.0, layer.self_attn.sinks.numel()))


def _models(family: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    cls, config, ref_impl = FAMILIES[family]
    ref, ours = pair(cls, config(), ref_impl=ref_impl)
    _sharpen(ref, family)
    _sharpen(ours, family)
    return ref, ours


@pytest.fixture(params=list(FAMILIES))
def family(request):
    return request.param


def test_padded_logits_equal_transformers(family):
    ref, ours = _models(family)
    ids, mask = left_padded()
    want = logits(ref, ids, attention_mask=mask)
    got = logits(ours, ids, attention_mask=mask)
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], **TOL)
    alone = logits(ref, ids[:1, -4:])  # the short prompt, unpadded
    torch.testing.assert_close(got[0, -4:], alone[0], atol=1e-4, rtol=1e-4)


def test_generate_equals_transformers(family):
    ref, ours = _models(family)
    ids, mask = left_padded()
    want, got = greedy(ref, ids, mask), greedy(ours, ids, mask)
    assert torch.equal(got.sequences, want.sequences)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(want.logits), **TOL)


def test_packed_row_equals_each_document_alone(family):
    ref, ours = _models(family)
    batch = packed()
    got = logits(ours, batch["input_ids"], position_ids=batch["position_ids"])
    start = 0
    for d in DOCS:
        alone = logits(ref, torch.tensor([d]))
        torch.testing.assert_close(got[:, start:start + len(d)], alone, **TOL)
        start += len(d)


def test_static_cache_generate_equals_dynamic(family):
    _, ours = _models(family)
    ids, mask = left_padded()
    dynamic = greedy(ours, ids, mask)
    static = greedy(ours, ids, mask, cache_implementation="static")
    assert torch.equal(static.sequences, dynamic.sequences)
    torch.testing.assert_close(torch.stack(static.logits), torch.stack(dynamic.logits), **TOL)


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gpt_neox", "gpt_oss"])
def test_the_family_setting_bites(family):
    # the parity checks would pass with the setting ignored if it changed nothing: it does
    # change the reference's logits (window, softcap, partial rotary, sinks)
    cls, config, ref_impl = FAMILIES[family]
    torch.manual_seed(0)
    ref = cls(config()).eval()
    ref.set_attn_implementation(ref_impl)
    _sharpen(ref, family)
    plain = copy.deepcopy(ref)
    with torch.no_grad():
        if family == "gemma2":
            plain.config.attn_logit_softcapping = None
            for layer in plain.model.layers:
                layer.self_attn.attn_logit_softcapping = None
        elif family == "gpt_oss":
            for layer in plain.model.layers:
                layer.self_attn.sinks.fill_(-1e4)
        elif family == "mistral":
            plain.config.sliding_window = None
        else:  # GPT-NeoX: rotating every channel instead of a quarter
            plain = cls(_neox(1.0)).eval()
            plain.load_state_dict(ref.state_dict())
            plain.set_attn_implementation(ref_impl)
    ids, mask = left_padded()
    diff = (logits(ref, ids, attention_mask=mask) - logits(plain, ids, attention_mask=mask))[mask.bool()]
    assert diff.abs().max() > 1e-3


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_compiled_forward_and_static_generate(family):
    torch._dynamo.reset()  # no shapes seen by earlier tests: this test's own graphs only
    ref, ours = _models(family)
    ids, mask = left_padded()
    counter = CompileCounter()
    compiled = torch.compile(ours, backend=counter, fullgraph=True)
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert counter.frame_count == 1
    torch.testing.assert_close(got, logits(ours, ids, attention_mask=mask, use_cache=False),
                               atol=1e-6, rtol=1e-6)
    eager = greedy(ours, ids, mask)
    step = CompileCounter()
    forward = ours.forward
    ours.forward = torch.compile(forward, backend=step, fullgraph=True)
    try:
        static = greedy(ours, ids, mask, cache_implementation="static")
    finally:
        ours.forward = forward
    assert step.frame_count <= 2  # the prefill and one decode graph for every step
    assert torch.equal(static.sequences, eager.sequences)
    torch.testing.assert_close(torch.stack(static.logits), torch.stack(eager.logits), **TOL)


def test_compile_after_another_shape():
    # a recompile for a new batch shape makes the batch size dynamic (automatic dynamic shapes)
    torch._dynamo.reset()
    _, first = pair(LlamaForCausalLM, LlamaConfig(**common()))
    batch = packed()
    with torch.no_grad():
        torch.compile(first, backend=CompileCounter(), fullgraph=True)(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    _, second = pair(LlamaForCausalLM, LlamaConfig(**common()), seed=1)
    ids, mask = left_padded()
    with torch.no_grad():
        got = torch.compile(second, backend=CompileCounter(), fullgraph=True)(
            input_ids=ids, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(got, logits(second, ids, attention_mask=mask, use_cache=False), **TOL)


def test_a_mask_with_holes_under_a_window_warns():
    """A 0 between real tokens: posenc's window counts positions, transformers' indices (the
    practitioner's review measured 0.19 apart): a warning says so; no holes, no warning."""
    import warnings

    ref, ours = _models("mistral")
    ids, mask = left_padded()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # left padding alone: not a hole
        logits(ours, ids, attention_mask=mask)
    holed = mask.clone()
    row = int(holed.sum(-1).argmax())
    holed[row, -3] = 0  # a hole inside the longest row
    with pytest.warns(UserWarning, match="zeros between real tokens and the layer has sliding_window=4"):
        got = logits(ours, ids, attention_mask=holed)
    want = logits(ref, ids, attention_mask=holed)
    # what the warning is about: the real tokens after the hole differ from transformers'
    assert (got[row, -2:] - want[row, -2:]).abs().max() > 1e-3
