"""posenc.lab.production: the chapter-10 laboratory against written-out references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.lab import production as prod
from posenc.lab.model import TransformerLM


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {s: TransformerLM(scheme=s, dim=32, num_layers=2, num_heads=4).eval()
            for s in ("rope", "alibi", "sinusoidal")}


def _tokens(B, L, seed=0):
    return torch.randint(0, 256, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("scheme", ["rope", "alibi", "sinusoidal"])
def test_forward_is_the_model_forward(models, scheme):
    x = _tokens(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(prod.forward(models[scheme], x), models[scheme](x))


@pytest.mark.parametrize("scheme", ["rope", "alibi", "sinusoidal"])
def test_packed_rows_equal_each_document_alone(models, scheme):
    m, a, b = models[scheme], _tokens(1, 5, 1), _tokens(1, 7, 2)
    ids = torch.tensor([[0] * 5 + [1] * 7])
    with torch.no_grad():
        packed = prod.forward(m, torch.cat([a, b], 1), document_ids=ids)
        torch.testing.assert_close(packed[:, 5:], m(b), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(packed[:, :5], m(a), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "sinusoidal"])
def test_left_padded_rows_equal_each_prompt_alone(models, scheme):
    m, p = models[scheme], _tokens(1, 6, 3)
    batch = torch.cat([torch.zeros(1, 4, dtype=torch.long), p], 1)
    mask = torch.tensor([[0] * 4 + [1] * 6])
    with torch.no_grad():
        out = prod.forward(m, batch, attention_mask=mask,
                           positions=posenc.positions_from_mask(mask))
        torch.testing.assert_close(out[:, 4:], m(p), atol=1e-5, rtol=1e-4)


def _pass_loss(model, x, **kw):
    logits = prod.forward(model, x, **kw)[:, :-1]
    return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(),
                           reduction="none").view(x.shape[0], -1)


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_stream_with_a_window_equals_the_windowed_pass(models, scheme):
    x = _tokens(2, 30, 4)
    with torch.no_grad():
        want = _pass_loss(models[scheme], x, window=8)
        for reposition in (False, True):  # a contiguous window: same offsets either way
            got = prod.stream(models[scheme], x, window=8, reposition=reposition)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        full = _pass_loss(models[scheme], x)
        torch.testing.assert_close(prod.stream(models[scheme], x, window=40), full,
                                   atol=1e-4, rtol=1e-4)


def test_stream_with_sinks_original_vs_cache_positions(models):
    """Before the first eviction both ways agree; after it the sinks are far (original
    positions) or near (positions in the cache), and the losses differ."""
    m, x = models["rope"], _tokens(1, 20, 5)
    with torch.no_grad():
        orig = prod.stream(m, x, window=6, sinks=2)
        moved = prod.stream(m, x, window=6, sinks=2, reposition=True)
    assert orig.shape == moved.shape == (1, 19)
    torch.testing.assert_close(orig[:, :7], moved[:, :7])  # nothing evicted yet
    assert (orig[:, 8:] - moved[:, 8:]).abs().max() > 1e-4


def test_stream_one_layer_against_a_written_out_reference():
    """One attention layer, sinks + window at positions in the cache, checked by hand."""
    torch.manual_seed(1)
    m = TransformerLM(scheme="rope", dim=16, num_layers=1, num_heads=2).eval()
    x = _tokens(1, 12, 6)
    sinks, window = 2, 4
    with torch.no_grad():
        got = prod.stream(m, x, window=window, sinks=sinks, reposition=True)
        want = []
        for t in range(11):  # the token at t sees sinks 0, 1 and the latest ones
            keep = list(range(t + 1)) if t < sinks + window else (
                list(range(sinks)) + list(range(t - window + 1, t + 1)))
            sub = x[:, keep]  # one layer: the keys depend on the kept tokens only
            logits = m(sub)[:, -1]  # positions 0 .. len(keep) - 1: positions in the cache
            want.append(F.cross_entropy(logits, x[:, t + 1]))
        torch.testing.assert_close(got[0], torch.stack(want), atol=1e-4, rtol=1e-4)


def test_rotate_by_composes():
    inv = posenc.rope_inv_freq(8)[0]
    k = torch.randn(2, 6, 8)
    a, d = torch.tensor([5, 9, 30, 2, 7, 100]), torch.tensor([-5, 3, -10, 0, 4, -50])
    at_a = posenc.apply_rope(k, *posenc.rope_cos_sin(a, inv))
    torch.testing.assert_close(prod.rotate_by(at_a, d, inv),
                               posenc.apply_rope(k, *posenc.rope_cos_sin(a + d, inv)),
                               atol=1e-5, rtol=1e-5)


def test_first_fit_and_causal_work():
    rows = prod.first_fit([5, 3, 4, 2, 6], 8)
    assert rows == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="row_len"):
        prod.first_fit([9], 8)
    assert prod.causal_work(16, 2, load_balance=True) == [68, 68]
    assert prod.causal_work(16, 2, load_balance=False) == [36, 100]


def test_bad_input(models):
    with pytest.raises(ValueError, match="window"):
        prod.stream(models["rope"], _tokens(1, 4), window=0)
    with pytest.raises(TypeError, match="TransformerLM"):
        prod.forward(torch.nn.Linear(2, 2), _tokens(1, 4))
    with pytest.raises(ValueError, match="one KVCache per block"):
        prod.forward(models["rope"], _tokens(1, 4), caches=[posenc.KVCache()])


def test_two_processes_equal_one():
    runs = prod.run_sharded(("rope", "alibi", "t5"), world_size=2)
    for name, parts in runs.items():
        ref = prod.sharded_reference(name)
        seen = torch.cat(parts["positions"]).sort().values
        assert torch.equal(seen, torch.arange(64))  # every position on exactly one rank
        for pos, out in zip(parts["positions"], parts["outputs"], strict=True):
            torch.testing.assert_close(out, ref[:, :, pos], atol=1e-5, rtol=1e-4)


def _stream_moving_every_key(model, x, *, window, sinks):
    """StreamingLLM's bookkeeping written out: after each step every kept key moves to its
    slot in the cache (RoPE keys re-rotated by their delta), the query sits at the next slot."""
    caches = [posenc.KVCache() for _ in model.blocks]
    size, logits = sinks + window, []
    for t in range(x.shape[1]):
        held = len(caches[0])
        pos = torch.tensor([held])
        logits.append(prod.forward(model, x[:, t:t + 1], positions=pos, caches=caches)[:, 0])
        if held + 1 < size:
            continue
        keep, delta = prod.streaming_keep(held + 1, sinks, window)
        for block, cache in zip(model.blocks, caches, strict=True):
            cache.evict(keep)
            rope = getattr(block.attn.scheme, "rotary", None)
            if rope is not None:
                cache.k = prod.rotate_by(cache.k, delta, rope.inv_freq)
            cache.positions = torch.arange(len(keep)).expand(x.shape[0], -1).clone()
    out = torch.stack(logits[:-1], dim=1)
    return F.cross_entropy(out.flatten(0, 1), x[:, 1:].flatten(),
                           reduction="none").view(x.shape[0], -1)


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_moving_only_the_sinks_equals_moving_every_key(models, scheme):
    """Positions in the cache: re-rotating the sinks alone (from a pristine copy, by the total
    shift) gives the offsets, hence the losses, of moving every kept key down each step."""
    x = _tokens(2, 40, 7)
    with torch.no_grad():
        got = prod.stream(models[scheme], x, window=6, sinks=3, reposition=True)
        want = _stream_moving_every_key(models[scheme], x, window=6, sinks=3)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_streaming_keep():
    keep, delta = prod.streaming_keep(10, 2, 5)  # the latest window - 1 and the sinks
    assert keep.tolist() == [0, 1, 6, 7, 8, 9]
    assert delta.tolist() == [0, 0, -4, -4, -4, -4]
    keep, delta = prod.streaming_keep(5, 2, 4)  # fits: nothing moves
    assert keep.tolist() == list(range(5)) and delta.tolist() == [0] * 5
    keep, delta = prod.streaming_keep(7, 0, 4)
    assert keep.tolist() == [4, 5, 6] and delta.tolist() == [-4, -4, -4]
    with pytest.raises(ValueError, match="window"):
        prod.streaming_keep(5, 1, 0)


def test_reposition_refuses_an_absolute_scheme(models):
    with pytest.raises(ValueError, match="relative scheme"):
        prod.stream(models["sinusoidal"], _tokens(1, 8), window=4, sinks=1, reposition=True)


def test_bf16_keys_drift_when_re_rotated_step_by_step():
    """Moving a bf16 key down one position at a time rounds at every step and drifts; one
    rotation from a pristine copy by the total shift rounds once."""
    gen = torch.Generator().manual_seed(0)
    inv = posenc.rope_inv_freq(16)[0]
    raw = torch.randn(4, 32, 16, generator=gen, dtype=torch.float64)
    start, one = torch.full((32,), 1000), torch.ones(32, dtype=torch.long)

    def exact(p):
        return posenc.apply_rope(raw, *posenc.rope_cos_sin(p, inv.double()))

    k = exact(start).to(torch.bfloat16)
    for _ in range(256):
        k = prod.rotate_by(k, -one, inv)
    want = exact(start - 256)
    drift = ((k.double() - want).norm() / want.norm()).item()
    once = prod.rotate_by(exact(start).to(torch.bfloat16), -256 * one, inv)
    single = ((once.double() - want).norm() / want.norm()).item()
    assert drift > 0.05 and single < 0.005, (drift, single)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "sinusoidal"])
def test_attention_weights_rebuild_the_forward(models, scheme):
    """Probabilities that sum to 1 over visible keys, 0 on future ones, and that give each
    layer's output: the last layer's, pushed through the head, gives forward's logits."""
    m, x = models[scheme], _tokens(2, 10, 8)
    with torch.no_grad():
        probs = prod.attention_weights(m, x)
        assert len(probs) == len(m.blocks)
        for p in probs:
            assert p.shape == (2, 4, 10, 10)
            torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, 10))
            assert (p.triu(1) == 0).all()
        # the first layer's output from the probabilities equals the attention module's
        blk = m.blocks[0]
        h = m.scheme.embed(m.embed(x), torch.arange(10))
        mha = blk.attn
        v = mha.qkv(blk.ln1(h)).split([32, 32, 32], dim=-1)[2]
        v = v.unflatten(-1, (4, 8)).transpose(1, 2)
        y = mha.proj((probs[0] @ v).transpose(1, 2).flatten(2))
        torch.testing.assert_close(y, prod._attention(mha, blk.ln1(h)), atol=1e-5, rtol=1e-4)


# ---------------------------------------------- what chapter 10 says transformers 5.24 does

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("layer_kind", ["static", "dynamic"])
def test_transformers_sliding_window_cache_shifts_keys_without_rotating(layer_kind):
    """The sliding-window cache layers keep the latest keys, in order, exactly as given: the
    slots move, the rotation (done before caching, at the original position) never changes."""
    from transformers.cache_utils import DynamicSlidingWindowLayer, StaticSlidingWindowLayer

    window = 4
    layer = (StaticSlidingWindowLayer(max_cache_len=16, sliding_window=window)
             if layer_kind == "static" else DynamicSlidingWindowLayer(sliding_window=window))
    keys = torch.randn(1, 2, 9, 8, generator=torch.Generator().manual_seed(0))
    for t in range(9):
        layer.update(keys[:, :, t:t + 1], keys[:, :, t:t + 1].clone())
    held = layer.keys.shape[-2]
    assert held in (window - 1, window)
    assert torch.equal(layer.keys, keys[:, :, 9 - held:])  # the latest, bit for bit


def test_transformers_cache_slots_are_not_positions():
    """A static cache writes slots from its own counter (``cumulative_length``), whatever the
    positions: after a left-padded prefill of 5 slots the last position is 1."""
    from transformers import LlamaConfig, LlamaModel, StaticCache

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4)
    llama = LlamaModel(cfg).eval()
    mask = torch.tensor([[0, 0, 0, 1, 1]])
    pos = posenc.positions_from_mask(mask)
    cache = StaticCache(config=cfg, max_cache_len=16)
    with torch.no_grad():
        llama(torch.tensor([[0, 0, 0, 3, 4]]), attention_mask=mask, position_ids=pos,
              cache=cache, use_cache=True)
    assert int(cache.layers[0].cumulative_length) == 5  # the next slot
    assert pos[0, -1].item() == 1  # the last position


def test_transformers_gpt_oss_sink_logit_is_a_score_that_is_dropped():
    """gpt-oss's per-head sink: one more logit in the softmax, belonging to no token, dropped
    after normalising, so the weights on the real keys sum to less than 1."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=gen) for _ in range(3))
    module = torch.nn.Module()
    module.sinks = torch.nn.Parameter(torch.tensor([0.5, 3.0]))
    module.num_key_value_groups = 1
    module.eval()
    out, weights = eager_attention_forward(module, q, k, v, None, scaling=8**-0.5)
    scores = q @ k.transpose(-1, -2) * 8**-0.5  # [1, 2, 5, 5]
    sink = module.sinks.detach()[None, :, None, None].expand(1, 2, 5, 1)
    want = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    torch.testing.assert_close(weights, want)
    torch.testing.assert_close(out, (want @ v).transpose(1, 2))
    assert (weights.sum(-1) < 1).all()


@pytest.fixture(scope="module")
def sharp():
    """A RoPE model whose attention is sharp (query/key weights x6): score errors show in the
    loss, as in a trained model."""
    torch.manual_seed(0)
    m = TransformerLM(scheme="rope", dim=32, num_layers=2, num_heads=2).eval()
    with torch.no_grad():
        for block in m.blocks:
            block.attn.qkv.weight.mul_(6)
    return m


def test_stream_at_a_large_offset_drifts_only_with_float32_product_angles(sharp):
    """"Only offsets matter" holds in exact arithmetic: a stream whose positions start at 10**6
    loses the same as one from 0 with posenc's exact angles, and not with the float32 products
    transformers forms (the drift grows with the offset)."""
    x = _tokens(2, 24, 3)
    naive = prod.with_angles(sharp, exact=False)
    with torch.no_grad():
        at0 = prod.stream(sharp, x, window=6, sinks=2)
        torch.testing.assert_close(prod.stream(naive, x, window=6, sinks=2), at0)  # < 512: same
        drift = {}
        for offset in (10**5, 10**6, 4 * 10**6):
            exact = prod.stream(sharp, x, window=6, sinks=2, offset=offset)
            assert (exact - at0).abs().max() < 1e-5
            drift[offset] = (prod.stream(naive, x, window=6, sinks=2, offset=offset)
                             - at0).abs().max().item()
    assert drift[10**5] < drift[10**6] < drift[4 * 10**6] and drift[10**6] > 1e-4


def test_with_angles_is_a_copy():
    m = TransformerLM(scheme="rope", dim=16, num_layers=1, num_heads=2)
    naive = prod.with_angles(m, exact=False)
    assert naive is not m and not naive.blocks[0].attn.scheme.rotary.exact_angles
    assert m.blocks[0].attn.scheme.rotary.exact_angles  # the original is untouched
    assert prod.with_angles(TransformerLM(scheme="alibi", dim=16, num_layers=1, num_heads=2),
                            exact=False).scheme.name == "alibi"


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_rebasing_every_step_is_streamingllm(models, scheme):
    """A bulk rebase after every eviction puts the sinks at 0.. and the window right after
    them: StreamingLLM's positions in the cache, from any offset."""
    x = _tokens(2, 24, 8)
    with torch.no_grad():
        want = prod.stream(models[scheme], x, window=6, sinks=2, reposition=True)
        for offset in (0, 10**6):
            got = prod.stream(models[scheme], x, window=6, sinks=2, rebase_every=1, offset=offset)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rebasing_a_window_changes_nothing(sharp):
    """Without sinks the window moves as a whole: a rebase every 3 steps leaves every offset,
    hence every loss, as it was."""
    x = _tokens(1, 24, 9)
    with torch.no_grad():
        torch.testing.assert_close(prod.stream(sharp, x, window=6, rebase_every=3),
                                   prod.stream(sharp, x, window=6), atol=1e-5, rtol=1e-5)


def test_stream_refuses_bad_offsets_and_rebases(models):
    x = _tokens(1, 8)
    with pytest.raises(ValueError, match="offset must be an int >= 0"):
        prod.stream(models["rope"], x, window=4, offset=-1)
    with pytest.raises(ValueError, match="not both"):
        prod.stream(models["rope"], x, window=4, reposition=True, rebase_every=2)
    with pytest.raises(ValueError, match="rebase_every needs a relative scheme"):
        prod.stream(models["sinusoidal"], x, window=4, rebase_every=2)
