"""TransformerLM: shapes, causality, tied embeddings, one shared scheme, KV-cache decoding."""

from __future__ import annotations

import pytest
import torch

from posenc.attention import KVCache
from posenc.lab.model import ModelConfig, TransformerLM, scheme_kwargs
from posenc.schemes import SCHEMES

SMALL = {"dim": 32, "num_layers": 2, "num_heads": 4, "mlp_ratio": 2}


def small(scheme: str, **kw) -> TransformerLM:
    torch.manual_seed(0)
    cfg = ModelConfig(scheme=scheme, max_len=64, scheme_kwargs=scheme_kwargs(scheme, train_len=16),
                      **{**SMALL, **kw})
    return TransformerLM(cfg).eval()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_shapes_and_finite(scheme):
    model = small(scheme)
    tokens = torch.randint(0, 256, (3, 20))
    logits = model(tokens)
    assert logits.shape == (3, 20, 256) and torch.isfinite(logits).all()
    loss = model.loss(tokens, tokens)
    assert loss.shape == () and loss.item() > 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_causal(scheme):
    model = small(scheme)
    tokens = torch.randint(0, 256, (2, 24))
    changed = tokens.clone()
    changed[:, 15:] = torch.randint(0, 256, (2, 9))
    torch.testing.assert_close(model(tokens)[:, :15], model(changed)[:, :15])
    assert not torch.allclose(model(tokens)[:, 15:], model(changed)[:, 15:])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_kv_cache_decoding_equals_full_forward(scheme):
    model = small(scheme)
    tokens = torch.randint(0, 256, (2, 12))
    full = model(tokens)
    caches = [KVCache() for _ in model.blocks]
    parts = [model(tokens[:, :5], caches=caches)]
    parts += [model(tokens[:, i : i + 1], caches=caches) for i in range(5, 12)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-4, atol=1e-5)
    out = model.generate(tokens[:, :4], 3)
    assert out.shape == (2, 7) and torch.equal(out[:, :4], tokens[:, :4])


def test_tied_embeddings_and_one_shared_scheme():
    model = small("t5")
    assert all(block.attn.scheme is model.scheme for block in model.blocks)
    # the output layer is the token embedding: no other [vocab, dim] matrix
    vocab_mats = [n for n, p in model.named_parameters() if p.shape == (256, 32)]
    assert vocab_mats == ["embed.weight"]
    # the shared T5 table is counted once
    assert model.num_parameters == sum(p.numel() for p in set(model.parameters()))


def test_nothing_but_the_scheme_differs():
    shapes = {}
    for scheme in SCHEMES:
        model = small(scheme)
        shapes[scheme] = {n: p.shape for n, p in model.named_parameters() if "scheme." not in n}
    assert all(s == shapes["nope"] for s in shapes.values())


def test_learned_needs_max_len_and_refuses_past_it():
    with pytest.raises(ValueError, match="max_len"):
        ModelConfig(scheme="learned")
    model = small("learned")
    with pytest.raises(ValueError, match="max_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_scheme_kwargs_fair_settings():
    assert scheme_kwargs("t5", train_len=64) == {"max_distance": 64}
    assert scheme_kwargs("sinusoidal", train_len=64) == {"scale": False}
    assert scheme_kwargs("rope", train_len=64) == {}
    model = small("t5")
    assert model.scheme.rel.max_distance == 16 + 1  # at least num_buckets // 2 + 1


def test_bad_input():
    with pytest.raises(ValueError, match="unknown scheme 'xpos'"):
        ModelConfig(scheme="xpos")
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(dim=30, num_heads=4)
    with pytest.raises(TypeError, match="num_layers must be an int"):
        ModelConfig(num_layers=2.0)
    model = small("rope")
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.rand(1, 4))
    with pytest.raises(TypeError, match="either a ModelConfig or keyword"):
        TransformerLM(ModelConfig(), dim=32)
    with pytest.raises(ValueError, match="one KVCache per block"):
        model(torch.zeros(1, 4, dtype=torch.long), caches=[KVCache()])


def test_the_model_takes_a_padded_and_a_packed_batch():
    """Issue 15 through the lab model: a left-padded batch and a packed row give the logits of
    each sequence alone."""
    import posenc

    for scheme in ("rope", "alibi", "sinusoidal"):
        torch.manual_seed(0)
        model = TransformerLM(scheme=scheme, dim=32, num_heads=4, num_layers=2, vocab_size=30).eval()
        a, b = torch.randint(1, 30, (1, 7)), torch.randint(1, 30, (1, 4))
        with torch.no_grad():
            batch = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], 1)])
            mask = torch.tensor([[1] * 7, [0] * 3 + [1] * 4])
            out = model(batch, positions=posenc.positions_from_mask(mask), attention_mask=mask)
            torch.testing.assert_close(out[0], model(a)[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out[1, 3:], model(b)[0], atol=1e-5, rtol=1e-5)
            row = torch.cat([a, b], 1)
            docs = torch.tensor([[0] * 7 + [1] * 4])
            out = model(row, document_ids=docs)
            torch.testing.assert_close(out[:, 7:], model(b), atol=1e-5, rtol=1e-5)
