"""posenc's attention inside a Hugging Face Llama, on left-padded batches (issue 15 §6).

A tiny random ``LlamaForCausalLM`` with grouped-query attention (4 query heads, 2 kv heads)
gets posenc as its attention: a function registered with transformers' ``AttentionInterface``
(and an ``AttentionMaskInterface`` entry that hands it the 2-D padding mask), and
``modeling_llama.apply_rotary_pos_emb`` patched to return q and k unrotated, so that posenc's
RoPE (built from the config by ``RotaryEmbedding.from_hf_config``'s keyword arguments, half
layout) does the rotation. Under ``generate`` HF's cache then holds unrotated keys and posenc
rotates every key by its own position (``key_positions`` from the mask) at each step.

Checked on a left-padded batch of two prompts of different lengths:

- the logits on the real tokens equal HF's own (``sdpa`` and ``eager``), and the short
  prompt's equal those of the prompt run alone;
- greedy ``generate`` with posenc's attention gives HF's own tokens and logits, and each row
  equals that row generated alone;
- batched greedy generation with a small posenc model (``posenc.MultiHeadAttention`` with GQA,
  ``attention_mask`` and a ``KVCache``, growing or static) equals each row generated alone, for
  RoPE, ALiBi and T5.

No download: the model is built from a ``LlamaConfig``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import posenc
from posenc.hf import rotary_kwargs_from_hf_config

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

IMPL = "posenc_test"
VOCAB, PAD = 96, 0
PROMPTS = ([5, 17, 33, 8, 61, 2, 44], [71, 9, 23, 50])  # lengths 7 and 4


def _config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=128,
        rope_theta=10000.0, pad_token_id=PAD, bos_token_id=1, eos_token_id=None,
        tie_word_embeddings=False,
    )


def _left_padded(prompts=PROMPTS) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, prompts))
    ids = torch.full((len(prompts), L), PAD, dtype=torch.long)
    mask = torch.zeros(len(prompts), L, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p)
        mask[i, L - len(p):] = 1
    return ids, mask


CALLS: list[dict] = []  # what the posenc attention function saw (the tests read it)


def posenc_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface: ``query [B, H, Lq, D]``, ``key/value [B, H_kv, T, D]``
    (unrotated: the cached keys too), ``attention_mask`` the 2-D ``[B, T]`` padding mask (from
    ``_mask_2d``) or None; returns ``([B, Lq, H, D], None)``."""
    Lq, T = query.shape[-2], key.shape[-2]
    assert scaling is None or abs(scaling - query.shape[-1] ** -0.5) < 1e-12  # posenc's scale
    assert dropout == 0.0
    positions = kwargs.get("position_ids")
    if positions is None:
        positions = (posenc.positions_from_mask(attention_mask)[:, -Lq:] if attention_mask is not None
                     else torch.arange(T - Lq, T, device=query.device))
    key_positions = None
    if T != Lq:  # decoding: HF's cache holds the earlier (unrotated) keys
        key_positions = (posenc.positions_from_mask(attention_mask) if attention_mask is not None
                         else torch.arange(T, device=query.device))
    CALLS.append({"Lq": Lq, "T": T, "H": query.shape[1], "H_kv": key.shape[1],
                  "mask": attention_mask is not None, "key_positions": key_positions is not None})
    out = posenc.attend(query, key, value, module.posenc_scheme, positions=positions,
                        key_positions=key_positions, attention_mask=attention_mask)  # [B, H, Lq, D]
    return out.transpose(1, 2).contiguous(), None


def _mask_2d(batch_size, q_length, kv_length, attention_mask=None, **kwargs):
    """The mask transformers builds for ``IMPL``: the 2-D padding mask itself (bool), or None."""
    return None if attention_mask is None else attention_mask[:, -kv_length:]


def _unrotated(q, k, cos, sin, unsqueeze_dim=1):
    return q, k


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: one thread (two threads on a busy 2-core machine wait on each other, 100x
    slower here); restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", autouse=True)
def _register():
    AttentionInterface.register(IMPL, posenc_attention)
    AttentionMaskInterface.register(IMPL, _mask_2d)
    yield
    AttentionInterface._global_mapping.pop(IMPL, None)
    AttentionMaskInterface._global_mapping.pop(IMPL, None)


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(_config()).eval()
    with torch.no_grad():  # a random init with visible weights, so errors show in the logits
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    scheme = posenc.RoPE(**rotary_kwargs_from_hf_config(model.config))
    assert not scheme.rotary.interleaved  # Llama rotates halves
    assert str(scheme.rotary) == str(posenc.RotaryEmbedding.from_hf_config(model.config))
    for layer in model.model.layers:
        layer.self_attn.posenc_scheme = scheme
    return model


def _logits(model, impl: str, ids, mask, posenc_rope: bool, **kw) -> torch.Tensor:
    model.set_attn_implementation(impl)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        if posenc_rope:
            mp.setattr(modeling_llama, "apply_rotary_pos_emb", _unrotated)
        return model(input_ids=ids, attention_mask=mask, **kw).logits


@pytest.mark.parametrize("reference", ["sdpa", "eager"])
def test_left_padded_logits_equal_hf(llama, reference: str) -> None:
    ids, mask = _left_padded()
    pos = posenc.positions_from_mask(mask)  # [B, L], counts from each row's first real token
    hf = _logits(llama, reference, ids, mask, False, position_ids=pos)
    CALLS.clear()
    ours = _logits(llama, IMPL, ids, mask, True, position_ids=pos)
    assert len(CALLS) == 2 and all(c["H"] == 4 and c["H_kv"] == 2 and c["mask"] for c in CALLS)
    real = mask.bool()
    torch.testing.assert_close(ours[real], hf[real], atol=2e-5, rtol=1e-5)
    # the short prompt, alone and unpadded, gives the same logits on its tokens
    alone = _logits(llama, IMPL, torch.tensor([PROMPTS[1]]), None, True)
    torch.testing.assert_close(ours[1][real[1]], alone[0], atol=2e-5, rtol=1e-5)
    # without the patch HF's rotation and posenc's both act: the logits move, so the patch matters
    twice = _logits(llama, IMPL, ids, mask, False, position_ids=pos)
    assert (twice[real] - hf[real]).abs().max() > 1e-2


def test_positions_from_mask_is_what_generate_uses(llama) -> None:
    if not hasattr(llama, "_prepare_position_ids_for_generation"):  # private, transformers 5.x
        pytest.skip("this transformers has no _prepare_position_ids_for_generation")
    ids, mask = _left_padded()
    theirs = llama._prepare_position_ids_for_generation(ids, {"attention_mask": mask})
    ours = posenc.positions_from_mask(mask)
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real])  # padded slots differ (0 vs 1): masked


def _generate(model, impl: str, ids, mask, posenc_rope: bool, n: int = 6):
    model.set_attn_implementation(impl)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        if posenc_rope:
            mp.setattr(modeling_llama, "apply_rotary_pos_emb", _unrotated)
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=PAD,
            return_dict_in_generate=True, output_logits=True,
        )
    return out.sequences, torch.stack(out.logits, 1)  # [B, L + n], [B, n, vocab]


def test_padded_generate_with_posenc_equals_hf_generate(llama) -> None:
    ids, mask = _left_padded()
    L = ids.shape[1]
    hf_seq, hf_logits = _generate(llama, "sdpa", ids, mask, False)
    CALLS.clear()
    seq, logits = _generate(llama, IMPL, ids, mask, True)
    assert any(c["key_positions"] and c["Lq"] == 1 and c["T"] > L for c in CALLS)  # decode steps
    assert torch.equal(seq, hf_seq), (seq, hf_seq)
    torch.testing.assert_close(logits, hf_logits, atol=5e-5, rtol=1e-5)
    # each row alone (no padding) gives the same new tokens
    for i, p in enumerate(PROMPTS):
        alone, _ = _generate(llama, IMPL, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long), True)
        assert alone[0, len(p):].tolist() == seq[i, L:].tolist(), i
    assert seq[0, L:].tolist() != seq[1, L:].tolist()  # the rows are not trivially alike


# ---- a small posenc model: batched padded greedy decoding equals each row alone ------------


class TinyLM(nn.Module):
    """Token embedding, pre-norm blocks of ``posenc.MultiHeadAttention`` (GQA) and an MLP."""

    def __init__(self, scheme: str, *, dim: int = 32, heads: int = 4, kv_heads: int = 2, layers: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, dim)
        self.scheme = posenc.make_scheme(scheme, dim=dim, num_heads=heads)
        if scheme == "t5":
            with torch.no_grad():
                self.scheme.rel.embedding.weight.normal_(0.0, 1.0)
        self.attn = nn.ModuleList(
            posenc.MultiHeadAttention(dim, heads, num_kv_heads=kv_heads, scheme=self.scheme)
            for _ in range(layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2 * layers))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)) for _ in range(layers)
        )
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids, *, positions, caches, attention_mask):
        x = self.embed(ids)
        for i, (attn, mlp) in enumerate(zip(self.attn, self.mlps, strict=True)):
            x = x + attn(self.norms[2 * i](x), positions=positions, cache=caches[i],
                         attention_mask=attention_mask)
            x = x + mlp(self.norms[2 * i + 1](x))
        return self.head(x)

    @torch.no_grad()
    def generate(self, ids, mask, n: int, max_len: int | None = None):
        """Greedy: prefill the left-padded ``ids`` with ``mask``, then ``n`` one-token steps,
        positions from the mask as transformers' ``generate`` builds them."""
        caches = [posenc.KVCache(max_len=max_len) for _ in self.attn]
        pos = posenc.positions_from_mask(mask)  # [B, L]
        logits = self(ids, positions=pos, caches=caches, attention_mask=mask)[:, -1]
        out, steps = [], []
        for _ in range(n):
            nxt = logits.argmax(-1, keepdim=True)  # [B, 1]
            out.append(nxt)
            steps.append(logits)
            mask = torch.cat([mask, torch.ones_like(nxt)], 1)
            pos = pos[:, -1:] + 1
            logits = self(nxt, positions=pos, caches=caches, attention_mask=mask)[:, -1]
        return torch.cat(out, 1), torch.stack(steps, 1)  # [B, n], [B, n, vocab]


@pytest.mark.parametrize("static", [False, True], ids=["growing-cache", "static-cache"])
@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5"])
def test_posenc_batched_padded_generation_equals_each_row_alone(scheme: str, static: bool) -> None:
    model = TinyLM(scheme).eval()
    ids, mask = _left_padded()
    n = 8
    max_len = ids.shape[1] + n if static else None
    tokens, logits = model.generate(ids, mask, n, max_len)
    for i, p in enumerate(PROMPTS):
        one = torch.tensor([p])
        alone, alone_logits = model.generate(one, torch.ones_like(one), n,
                                             len(p) + n if static else None)
        assert alone[0].tolist() == tokens[i].tolist(), (scheme, i)
        torch.testing.assert_close(logits[i], alone_logits[0], atol=1e-5, rtol=1e-5)
    assert tokens[0].tolist() != tokens[1].tolist()  # the rows are not trivially alike
    # the mask matters: with the padding visible the short row's logits move
    _, seen_pad = model.generate(ids, torch.ones_like(mask), n, max_len)
    assert (seen_pad[1] - logits[1]).abs().max() > 1e-3
    # and one full pass over prompt + generated tokens gives the decode steps' logits
    full_ids = torch.cat([ids, tokens], 1)
    full_mask = torch.cat([mask, torch.ones_like(tokens)], 1)
    with torch.no_grad():
        full = model(full_ids, positions=posenc.positions_from_mask(full_mask),
                     caches=[None] * len(model.attn), attention_mask=full_mask)
    L = ids.shape[1]
    torch.testing.assert_close(full[:, L - 1:L - 1 + n], logits, atol=1e-5, rtol=1e-5)
