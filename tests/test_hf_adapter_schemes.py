"""Another position scheme in a transformers model: ``posenc.hf.use(model, "alibi" | "t5" | "nope"
| "rope")``.

The model's rotary embedding becomes the identity and posenc's scheme acts inside attention, on
positions from the 2-D mask (never the forward's ``arange`` on padded rows). For each scheme, on
a tiny Llama (and ALiBi also on a Mistral with a sliding window of 4, whose caches drop keys):

- a left-padded row = its prompt alone;
- cached greedy ``generate`` (``DynamicCache``, and ``StaticCache``) = one full pass over the
  generated sequence;
- a ``DataCollatorWithFlattening`` row = each document alone;
- one SFT step on a packed batch: the loss and every gradient = those of the documents alone,
  weighted by their label counts;
- ``"rope"`` (posenc's RoPE from ``RotaryEmbedding.from_hf_config``) = transformers' own RoPE
  for the default, llama3 and yarn scalings, GPT-NeoX's partial rotary and Gemma 3's RoPE per
  layer type (a base of 10,000 on sliding layers, 1,000,000 on full ones);
- a Llama with ALiBi learns a repeated pattern (its loss falls).
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_hf_adapter import DOCS, PAD, TOL, common, greedy, left_padded, llama_config, logits, packed, pair

import posenc

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

SWAPS = ["alibi", "t5", "nope", "rope"]
CASES = [("llama", s) for s in SWAPS] + [("mistral", "alibi"), ("mistral", "t5")]


def _model(family: str, scheme: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if family == "mistral":
        model = MistralForCausalLM(MistralConfig(**common(sliding_window=4)))
    else:
        model = LlamaForCausalLM(llama_config())
    model = posenc.hf.use(model.eval(), scheme)
    if scheme == "t5":  # a learned bias starts at 0: give it values, so that it matters
        with torch.no_grad():
            for p in model.posenc_scheme.parameters():
                p.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize(("family", "scheme"), CASES)
def test_padded_row_equals_the_prompt_alone(family, scheme):
    model = _model(family, scheme)
    ids, mask = left_padded()
    got = logits(model, ids, attention_mask=mask)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = logits(model, ids[row:row + 1, real])
        torch.testing.assert_close(got[row, real], alone[0], **TOL)


@pytest.mark.parametrize(("family", "scheme"), CASES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_cached_generate_equals_a_full_pass(family, scheme, cache):
    model = _model(family, scheme)
    ids, mask = left_padded()
    out = greedy(model, ids, mask, new=6, cache_implementation=cache)
    full_mask = torch.cat([mask, torch.ones(2, 6, dtype=mask.dtype)], dim=1)
    full = logits(model, out.sequences, attention_mask=full_mask)  # [B, L + 6, V]
    L = ids.shape[1]
    torch.testing.assert_close(torch.stack(out.logits, 1), full[:, L - 1:-1], **TOL)
    assert torch.equal(out.sequences[:, L:], full[:, L - 1:-1].argmax(-1))


@pytest.mark.parametrize(("family", "scheme"), CASES)
def test_packed_row_equals_each_document_alone(family, scheme):
    model = _model(family, scheme)
    batch = packed()
    got = logits(model, batch["input_ids"], position_ids=batch["position_ids"])
    start = 0
    for d in DOCS:
        torch.testing.assert_close(got[:, start:start + len(d)], logits(model, torch.tensor([d])), **TOL)
        start += len(d)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("scheme", SWAPS)
def test_one_sft_step_on_a_packed_batch(scheme):
    model = _model("llama", scheme).train()
    batch = packed(return_position_ids=True)  # labels: -100 opens every document
    loss = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                 labels=batch["labels"]).loss
    loss.backward()
    packed_grads = _grads(model)
    assert packed_grads and all(torch.isfinite(g).all() for g in packed_grads.values())
    if scheme == "t5":
        assert packed_grads["posenc_scheme.rel.embedding.weight"].abs().max() > 0
    model.zero_grad()
    counts = [len(d) - 1 for d in DOCS]  # the tokens each document predicts
    total = sum(counts)
    alone = sum(model(input_ids=torch.tensor([d]), labels=torch.tensor([d])).loss * (n / total)
                for d, n in zip(DOCS, counts, strict=True))
    alone.backward()
    torch.testing.assert_close(loss, alone, **TOL)
    for name, g in _grads(model).items():
        torch.testing.assert_close(packed_grads[name], g, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("config", [
    llama_config(),
    llama_config(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 16}),
    llama_config(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 16}),
    GPTNeoXConfig(**{k: v for k, v in common().items() if k != "num_key_value_heads"},
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                   "partial_rotary_factor": 0.25}),
    Gemma3TextConfig(**common(head_dim=32, query_pre_attn_scalar=32, sliding_window=4,
                              layer_types=["sliding_attention", "full_attention"])),
], ids=["llama-default", "llama-llama3", "llama-yarn", "gpt_neox-partial", "gemma3-per-layer-type"])
def test_posencs_rope_equals_the_models_own(config):
    cls = {GPTNeoXConfig: GPTNeoXForCausalLM, Gemma3TextConfig: Gemma3ForCausalLM}.get(
        type(config), LlamaForCausalLM)
    ref, ours = pair(cls, config, scheme="rope")
    ids, mask = left_padded()
    got, want = logits(ours, ids, attention_mask=mask), logits(ref, ids, attention_mask=mask)
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], **TOL)
    a, b = greedy(ours, ids, mask), greedy(ref, ids, mask)
    assert torch.equal(a.sequences, b.sequences)


def test_a_scheme_object_is_shared_by_every_layer_and_trained():
    torch.manual_seed(0)
    t5 = posenc.T5Bias(4, bidirectional=False, num_buckets=8, max_distance=16)
    model = posenc.hf.use(LlamaForCausalLM(llama_config()), t5)
    assert model.posenc_scheme is t5
    assert all(layer.self_attn._posenc_options.scheme is t5 for layer in model.model.layers)
    names = [n for n, _ in model.named_parameters() if n.startswith("posenc_scheme.")]
    assert names == ["posenc_scheme.rel.embedding.weight"]
    assert "posenc_scheme.rel.embedding.weight" in model.state_dict()


def test_a_llama_with_alibi_learns():
    torch.manual_seed(0)
    model = posenc.hf.use(LlamaForCausalLM(LlamaConfig(**common())), "alibi").train()
    pattern = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79])
    rows = torch.stack([pattern.roll(-s).repeat(4) for s in range(8)])  # [8, 32]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model(input_ids=rows, labels=rows).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0], losses
    assert PAD == 0  # the pattern never uses the pad id


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_compiled_static_generate_with_alibi(family):
    # transformers' StaticCache (for Mistral its rolling sliding-window layers) under
    # torch.compile(fullgraph=True): the prefill and one decode graph, the eager tokens
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = _model(family, "alibi")
    ids, mask = left_padded()
    eager = greedy(model, ids, mask, new=6)
    counter = CompileCounter()
    forward = model.forward
    model.forward = torch.compile(forward, backend=counter, fullgraph=True)
    try:
        static = greedy(model, ids, mask, new=6, cache_implementation="static")
    finally:
        model.forward = forward
    assert counter.frame_count <= 2
    assert torch.equal(static.sequences, eager.sequences)
    torch.testing.assert_close(torch.stack(static.logits), torch.stack(eager.logits), **TOL)


def test_gradient_checkpointing_and_a_deep_copy_keep_the_scheme():
    model = _model("llama", "alibi").train()
    model.activation_checkpointing_enable()
    batch = packed()
    loss = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                 labels=batch["labels"]).loss
    loss.backward()
    twin = copy.deepcopy(model).eval()
    model.eval()
    ids, mask = left_padded()
    want = logits(model, ids, attention_mask=mask)
    torch.testing.assert_close(logits(twin, ids, attention_mask=mask), want)


@pytest.mark.parametrize("swaps", [["alibi", "alibi"], ["alibi", "t5"], ["rope", "nope", "alibi"]])
def test_swapping_twice_then_none_restores_the_models_rope(swaps):
    """Any number of swaps, then use(model): the model's own RoPE again, logits equal to
    transformers' own attention (a stand-in must never wrap another stand-in)."""
    ref, ours = pair(LlamaForCausalLM, llama_config())
    for scheme in swaps:
        posenc.hf.use(ours, scheme)
    posenc.hf.use(ours)
    ids, mask = left_padded()
    real = mask.bool()
    torch.testing.assert_close(logits(ours, ids, attention_mask=mask)[real],
                               logits(ref, ids, attention_mask=mask)[real], **TOL)
