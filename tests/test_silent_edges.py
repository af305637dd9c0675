"""The practitioner's seven silent edges (issue 34; reviews/2026-12-07-practitioner.md, "Silent
wrong answers found today"): each plausible call is now right, refused or warned. One test per
numbered item; the name says which.

Models are tiny transformers Llamas built from a config (test_hf_adapter's helpers): no download.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import posenc
import posenc.hf

transformers = pytest.importorskip("transformers")
from test_hf_adapter import DOCS, TOL, llama_config, logits, packed  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402


def _llama(scheme: object = None, seed: int = 0, **options: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(copy.deepcopy(llama_config(initializer_range=0.2))).eval()
    return posenc.hf.use(model, scheme, **options)


def _alone(model: torch.nn.Module) -> torch.Tensor:
    """Each of DOCS run alone, one after another: ``[1, sum(len), V]``."""
    return torch.cat([logits(model, torch.tensor([d])) for d in DOCS], dim=1)


# --------------------------------------------------------------------------- 1. saved scheme


def test_1_saved_scheme_is_recorded_and_a_reload_refuses_until_use(tmp_path):
    model = _llama("t5", num_buckets=16)
    ids = torch.tensor([[5, 17, 33, 8, 71, 9]])
    before = logits(model, ids)
    assert model.config.posenc == {"scheme": "t5", "options": {"num_buckets": 16},
                                   "backend": "sdpa"}
    model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="posenc").eval()
    assert loaded.config.posenc["scheme"] == "t5"
    with pytest.raises(ValueError, match=r"posenc\.hf\.use\(model, 't5', num_buckets=16\)"):
        logits(loaded, ids)  # was: RoPE on T5-trained weights, silently
    posenc.hf.use(loaded, loaded.config.posenc["scheme"], **loaded.config.posenc["options"])
    from safetensors.torch import load_file  # the T5 bias is learned: load its saved weights

    saved = {k: v for k, v in load_file(tmp_path / "model.safetensors").items()
             if k.startswith("posenc_scheme.")}
    assert saved, "the scheme's weights are in the checkpoint"
    loaded.load_state_dict(saved, strict=False)
    torch.testing.assert_close(logits(loaded, ids), before, **TOL)


def test_1_saved_alibi_reloads_to_the_same_logits_and_use_none_clears_it(tmp_path):
    model = _llama("alibi")
    ids = torch.tensor([[5, 17, 33, 8, 71, 9]])
    before = logits(model, ids)
    model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="posenc").eval()
    with pytest.raises(ValueError, match=r"call posenc\.hf\.use\(model, 'alibi'\)"):
        logits(loaded, ids)
    posenc.hf.use(loaded, "alibi")
    torch.testing.assert_close(logits(loaded, ids), before, **TOL)
    posenc.hf.use(loaded)  # back to the model's RoPE: nothing recorded
    assert not hasattr(loaded.config, "posenc")
    logits(loaded, ids)


def test_1_a_plain_reload_asks_for_posenc_attention(tmp_path):
    """``use`` writes ``attn_implementation: "posenc"`` beside the record: a plain
    ``from_pretrained(path)`` loads with posenc's attention where it is registered (and its
    first forward names the ``use`` call), and refuses loudly where it is not (a fresh
    process without posenc): the model's own RoPE never runs the ALiBi weights unasked."""
    import json
    import subprocess
    import sys

    model = _llama("alibi")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["attn_implementation"] == "posenc"
    loaded = LlamaForCausalLM.from_pretrained(tmp_path).eval()  # registered in this process
    assert loaded.config._attn_implementation == "posenc"
    with pytest.raises(ValueError, match=r"call posenc\.hf\.use\(model, 'alibi'\)"):
        logits(loaded, torch.tensor([[5, 17, 33]]))
    fresh = ("import transformers\n"
             "try:\n"
             f"    transformers.LlamaForCausalLM.from_pretrained({str(tmp_path)!r})\n"
             "except ValueError as err:\n"
             "    print('refused:', 'posenc' in str(err))\n")
    out = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True,
                         timeout=120)
    assert "refused: True" in out.stdout, out.stdout + out.stderr
    posenc.hf.use(model)  # back to the model's own RoPE: nothing recorded, any attention loads
    assert not hasattr(model.config, "attn_implementation")
    assert not hasattr(model.config, "posenc")


@pytest.mark.parametrize("asked", [None, "t5", "rope"])
def test_1_reloaded_model_switched_to_another_scheme_warns(tmp_path, asked):
    # a practitioner's probe: use(reloaded) with another scheme than the one its weights
    # were trained with ran silently (4.5 off); now it is said, and the same scheme is not
    model = _llama("alibi")
    model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="posenc").eval()
    said = r"records posenc scheme 'alibi'.*posenc\.hf\.use\(model, 'alibi'\)"
    with pytest.warns(UserWarning, match=said) as got:
        posenc.hf.use(loaded, asked)
    assert got[0].filename == __file__  # at the caller's line
    again = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="posenc").eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        posenc.hf.use(again, "alibi")  # as trained: nothing to say
        posenc.hf.use(again)  # a switch within the process is deliberate


# --------------------------------------------------------------------------- 2. all-ones mask


@pytest.mark.parametrize("scheme", [None, "alibi"])
def test_2_restarting_position_ids_with_an_all_ones_mask_give_the_documents_alone(scheme):
    # transformers' FlashAttention path drops an all-ones mask and splits by position_ids
    model = _llama(scheme)
    batch = packed()
    ids, pos = batch["input_ids"], batch["position_ids"]
    got = logits(model, ids, position_ids=pos, attention_mask=torch.ones_like(ids))
    torch.testing.assert_close(got, _alone(model), **TOL)
    torch.testing.assert_close(got, logits(model, ids, position_ids=pos), **TOL)


# --------------------------------------------------------------------------- 3. cu_seq_lens


@pytest.mark.parametrize("scheme", [None, "alibi"])
def test_3_cu_seq_lens_without_position_ids_mark_the_documents(scheme):
    model = _llama(scheme)
    batch = packed(return_flash_attn_kwargs=True, return_position_ids=False)
    assert "position_ids" not in batch
    kw = {k: batch[k] for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")}
    got = logits(model, batch["input_ids"], **kw)  # was: one document, silently
    torch.testing.assert_close(got, _alone(model), **TOL)


def test_3_cu_seq_lens_that_disagree_with_position_ids_or_padding_are_refused():
    model = _llama("alibi")
    batch = packed(return_flash_attn_kwargs=True)
    ids, pos = batch["input_ids"], batch["position_ids"]
    wrong = torch.tensor([0, 2, ids.shape[1]])  # position_ids restart at 4 and 9, not at 2
    with pytest.raises(ValueError, match="inside one of the documents cu_seq_lens_q/k mark"):
        logits(model, ids, position_ids=pos, cu_seq_lens_q=wrong, cu_seq_lens_k=wrong)
    cu = batch["cu_seq_lens_q"]
    mask = torch.ones_like(ids)
    mask[:, -1] = 0
    with pytest.raises(ValueError, match="a padding attention_mask"):
        logits(model, ids, attention_mask=mask, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    with pytest.raises(ValueError, match="same increasing offsets"):
        logits(model, ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu[:-1])
    agreed = logits(model, ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    torch.testing.assert_close(agreed, _alone(model), **TOL)


# --------------------------------------------------------------------------- 4. reuse w/o reset


@pytest.mark.parametrize("max_len", [None, 24])
def test_4_filled_cache_reused_for_a_new_batch_says_call_reset(max_len):
    rope = posenc.RoPE(16)
    q = torch.randn(2, 4, 5, 16)
    ones = torch.ones(2, 5)
    cache = posenc.KVCache(max_len)
    posenc.attend(q, q, q, rope, cache=cache, attention_mask=ones)
    # with the new batch's mask: the error names the cache, not the mask
    with pytest.raises(ValueError, match=r"the cache holds 5 tokens.*call reset\(\)"):
        posenc.attend(q, q, q, rope, cache=cache, attention_mask=ones)
    # with the new batch's positions (restarting below what the cache reached): a warning
    with pytest.warns(UserWarning, match=r"holds 5 tokens: a new batch.*call reset\(\)"):
        posenc.attend(q, q, q, rope, cache=cache, positions=torch.arange(5))
    # another batch size: an error that names reset()
    cache.reset()
    posenc.attend(q, q, q, rope, cache=cache)
    q3 = torch.randn(3, 4, 5, 16)
    with pytest.raises(ValueError, match=r"reset\(\)"):
        posenc.attend(q3, q3, q3, rope, cache=cache)
    # after reset() the same calls are a fresh batch, silently and rightly
    cache.reset()
    fresh = posenc.attend(q, q, q, rope, cache=cache, attention_mask=ones)
    torch.testing.assert_close(fresh, posenc.attend(q, q, q, rope, attention_mask=ones))
    # what stays undetectable: same batch size, no mask, no positions (the cache continues)


# --------------------------------------------------------------------------- 5. streaming_keep


@pytest.mark.parametrize("rule", [False, True])
def test_5_streaming_keep_window_is_attends_window(rule):
    # evict with streaming_keep(len, S, W) before each token: the stream equals one pass under
    # attend(window=W, sinks=S), whether or not the rule is given again (was: W + 1 keys)
    S, W, L = 2, 4, 14
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, L, 16, generator=g) for _ in range(3))
    rope = posenc.RoPE(16)
    want = posenc.attend(q, k, v, rope, window=W, sinks=S)
    cache = posenc.KVCache()
    got = []
    for t in range(L):
        keep, _ = posenc.streaming_keep(len(cache), S, W)
        if len(keep) < len(cache):
            cache.evict(keep)
        assert len(cache) <= S + W - 1
        sl = slice(t, t + 1)
        extra = {"window": W, "sinks": S} if rule else {}
        got.append(posenc.attend(q[:, :, sl], k[:, :, sl], v[:, :, sl], rope, cache=cache,
                                 positions=torch.tensor([t]), **extra))
    torch.testing.assert_close(torch.cat(got, 2), want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- 8. streaming, trees


def _streaming_mask(T: int, sinks: int, window: int) -> torch.Tensor:
    """``[1, 1, T, T]`` bool: query m sees key n when n <= m and (n < sinks or n > m - window)."""
    m, n = torch.arange(T)[:, None], torch.arange(T)[None]
    return ((n <= m) & ((n < sinks) | (n > m - window)))[None, None]


@pytest.mark.parametrize("scheme", [None, "alibi", "rope"])
def test_8_sink_cache_generate_equals_a_full_pass_under_sinks_and_window(scheme):
    model = _llama(scheme)
    S, W, prompt = 2, 6, torch.tensor([[5, 17, 33, 8, 71]])
    cache = posenc.hf.SinkCache(sinks=S, window=W, config=model.config)
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                             cache=cache, max_new_tokens=4 * W, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    seq = out.sequences
    T, P = seq.shape[1], prompt.shape[1]
    assert T == P + 4 * W
    assert cache.layers[0].kv.k.shape[-2] == S + W + 1  # fixed memory: S + W slots + scratch
    assert cache.get_seq_length() == T - 1
    # the reference: one full pass, each query sees the first S keys and the last W
    full = logits(model, seq, attention_mask=_streaming_mask(T, S, W),
                  position_ids=torch.arange(T)[None])
    torch.testing.assert_close(torch.stack(out.logits, 1), full[:, P - 1:-1], **TOL)
    assert torch.equal(seq[:, P:], full[:, P - 1:-1].argmax(-1))
    # and posenc's own rolling decode, layer by layer, holds the same keys
    kv = cache.layers[1].kv
    assert kv.positions is not None and int(kv.positions[0, :S].max()) == S - 1


@pytest.mark.parametrize("scheme", [None, "alibi"])
def test_8_tree_mask_through_the_adapter_equals_each_branch_alone(scheme):
    from transformers import DynamicCache

    model = _llama(scheme)
    prefix, a, b = [5, 17, 33], [40, 41], [60, 61]
    tree = [a[0], b[0], a[1], b[1]]  # depth 1 then depth 2
    parent = {2: 0, 3: 1}  # a[1] under a[0], b[1] under b[0]
    n, t = len(prefix), len(tree)
    sees = torch.zeros(t, n + t, dtype=torch.bool)
    sees[:, :n] = True
    for i in range(t):
        sees[i, n + i] = True
        if i in parent:
            sees[i, n + parent[i]] = True
    pos = torch.tensor([[n, n, n + 1, n + 1]])
    alone_a = logits(model, torch.tensor([prefix + a]))[:, n:]
    alone_b = logits(model, torch.tensor([prefix + b]))[:, n:]
    # one pass over prefix + tree
    full = torch.zeros(n + t, n + t, dtype=torch.bool)
    full[:n, :n] = torch.ones(n, n).tril().bool()
    full[n:] = sees
    got = logits(model, torch.tensor([prefix + tree]), attention_mask=full[None, None],
                 position_ids=torch.cat([torch.arange(n)[None], pos], -1))
    torch.testing.assert_close(got[:, n:][:, [0, 2]], alone_a, **TOL)
    torch.testing.assert_close(got[:, n:][:, [1, 3]], alone_b, **TOL)
    # the tree as one step over a cached prefix
    cache = DynamicCache(config=model.config)
    logits(model, torch.tensor([prefix]), cache=cache)
    step = logits(model, torch.tensor([tree]), attention_mask=sees[None, None],
                  position_ids=pos, cache=cache)
    torch.testing.assert_close(step[:, [0, 2]], alone_a, **TOL)
    torch.testing.assert_close(step[:, [1, 3]], alone_b, **TOL)


# --------------------------------------------------------------------------- 6/7. [B, L, H, D]

B_, L_, H_, D_ = 2, 10, 4, 16


def test_6_rotary_embedding_refuses_b_l_h_d_once_positions_are_given():
    x = torch.randn(B_, L_, H_, D_)  # [B, L, H, D] with as many kv heads as query heads
    pos = torch.arange(L_).expand(B_, L_)
    with pytest.raises(ValueError, match=r"seq_dim=-3"):
        posenc.RotaryEmbedding(D_)(x, x, positions=pos)
    # the fix the message names, and the transpose, agree
    q3, _ = posenc.RotaryEmbedding(D_, seq_dim=-3)(x, x, positions=pos)
    q2, _ = posenc.RotaryEmbedding(D_)(x.transpose(1, 2), x.transpose(1, 2), positions=pos)
    torch.testing.assert_close(q3, q2.transpose(1, 2))


def test_7_attend_refuses_b_l_h_d_once_positions_are_given_and_names_gqa_layouts():
    x = torch.randn(B_, L_, H_, D_)
    pos = torch.arange(L_).expand(B_, L_)
    with pytest.raises(ValueError, match=r"looks like \[B, L, H, head_dim\].*q\.transpose\(1, 2\)"):
        posenc.attend(x, x, x, posenc.RoPE(D_), positions=pos)
    kv = x[:, :, :2]  # grouped-query keys in the same layout
    with pytest.raises(ValueError, match=r"flash-attn's layout\) with 4 query heads and 2 kv"):
        posenc.attend(x, kv, kv, posenc.RoPE(D_))
    t = x.transpose(1, 2)
    fixed = posenc.attend(t, t, t, posenc.RoPE(D_), positions=pos)  # the transpose runs
    assert fixed.shape == (B_, H_, L_, D_)


def test_7b_cu_seqlens_given_as_document_ids_is_named():
    cu, _ = posenc.cu_seqlens(posenc.document_ids_from_lengths([5, 3, 7, 2])[None])
    q = torch.randn(1, 4, 17, 16)
    with pytest.raises(ValueError, match=r"looks like cu_seqlens.*document_ids_from_lengths.*"
                                         r"cu_seqlens="):
        posenc.attend(q, q, q, None, document_ids=cu)


def test_8_sink_cache_in_a_model_posenc_does_not_run_refuses():
    # practitioner probe: generate(cache=SinkCache(...)) on a model never use()-d ran
    # transformers' own attention over the new keys alone (7.9 off), silently
    torch.manual_seed(0)
    model = LlamaForCausalLM(copy.deepcopy(llama_config(initializer_range=0.2))).eval()
    prompt = torch.tensor([[5, 17, 33, 8, 71, 9]])
    with pytest.raises(ValueError, match=r"not posenc's.*posenc\.hf\.use\(model\)"):
        model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                       cache=posenc.hf.SinkCache(2, 4), max_new_tokens=8)


def test_use_again_with_the_scheme_in_force_keeps_a_trained_t5_bias():
    """``use(model, "t5")`` twice used to build a fresh bias the second time, dropping the
    trained one without a word; now the scheme in force is kept (a new backend too), and only
    another scheme or other options build anew."""
    model = _llama("t5", num_buckets=16)
    with torch.no_grad():
        for p in model.posenc_scheme.parameters():
            p.normal_(0, 1.0)  # "trained"
    ids = torch.tensor([[5, 17, 33, 8, 71, 9]])
    trained = logits(model, ids)
    bias = model.posenc_scheme
    for options in ({"num_buckets": 16}, {"num_buckets": 16, "backend": "math"}):
        posenc.hf.use(model, "t5", **options)
        assert model.posenc_scheme is bias
        torch.testing.assert_close(logits(model, ids), trained, **TOL)
    with pytest.warns(UserWarning, match=r"replaces the model's scheme 't5'"):
        posenc.hf.use(model, "t5", num_buckets=8)  # other options: a new bias, as asked
    assert model.posenc_scheme is not bias


# --------------------------------------------------------------------------- use() again (issue 34)


def _trained_t5(**options: object) -> torch.nn.Module:
    model = _llama("t5", **options)
    with torch.no_grad():
        for p in model.posenc_scheme.parameters():
            p.normal_(0, 1.0)  # "trained"
    return model


@pytest.mark.parametrize("again", [{"num_buckets": 32}, {"max_distance": 128},
                                   {"num_buckets": 32, "max_distance": 128}])
def test_use_again_with_default_options_spelled_out_keeps_the_trained_t5_bias(again):
    # a prober's call: use(m, "t5") then use(m, "t5", num_buckets=32), T5's default, built a
    # fresh bias ({} != {"num_buckets": 32}); the defaults come from T5RelativeBias itself
    model = _trained_t5()
    ids = torch.tensor([[5, 17, 33, 8, 71, 9]])
    trained, bias = logits(model, ids), model.posenc_scheme
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the scheme in force is kept: nothing to say
        posenc.hf.use(model, "t5", **again)
    assert model.posenc_scheme is bias
    torch.testing.assert_close(logits(model, ids), trained, **TOL)


@pytest.mark.parametrize("switch", [(), ("alibi",), ("t5", ), ("rope",)],
                         ids=["own_rope", "alibi", "t5_other_options", "rope"])
def test_use_that_drops_a_learned_scheme_warns_at_the_callers_line(switch):
    # a prober's call: use(m) or use(m, "alibi") after a trained T5 discarded its weights
    # without a word (a later use(m, "t5") started fresh)
    model = _trained_t5(num_buckets=16)
    with pytest.warns(UserWarning, match=r"replaces the model's scheme 't5' "
                                         r"\(model\.posenc_scheme\), which holds 64 learned "
                                         r"parameters.*model\.posenc_scheme\.state_dict\(\) "
                                         r"before switching") as got:
        posenc.hf.use(model, *switch)  # "t5" alone: num_buckets=32, another bias
    assert got[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "t5" again put a (fresh, learned) table in force
        posenc.hf.use(model, "alibi")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        posenc.hf.use(model, "nope")  # nothing learned to lose (ALiBi, NoPE, own RoPE)
        posenc.hf.use(model)


def test_named_rope_with_the_other_layout_warns_at_the_callers_line():
    # a prober's call: use(m, "rope", interleaved=True) on a Llama (half-split weights) ran
    # silently 0.0073 off; the ready-object call already warned
    model = _llama()
    with pytest.warns(UserWarning, match=r"interleaved=True rotates interleaved pairs, but "
                                         r"this model's own RoPE rotates half-split ones.*"
                                         r"leave interleaved out") as got:
        posenc.hf.use(model, "rope", interleaved=True)
    assert got[0].filename == __file__
    with pytest.warns(UserWarning, match=r"rotates interleaved pairs.*half-split") as got:
        posenc.hf.use(model, posenc.RoPE(16))  # the ready object's warning: the caller's line
    assert got[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        posenc.hf.use(model, "rope", interleaved=False)  # the config's layout


@pytest.mark.parametrize("rope,said", [
    ({"rope_type": "default", "rope_theta": 500000.0}, r"base=500000\.0"),
    ({"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}, r"'linear'"),
], ids=["theta", "linear_scaling"])
def test_ready_rope_with_other_frequencies_than_the_config_warns(rope, said):
    # a prober's call: use(m, RoPE(16, interleaved=False)) on a rope_theta=500000 model (0.0035
    # off) or a linear factor-4 one (0.0054 off) ran silently: only head_dim and layout were
    # compared
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(rope_parameters=rope)).eval()
    with pytest.warns(UserWarning, match=r"scheme 'rope' rotates with base=10000\.0.*model's "
                                         rf"own RoPE uses.*{said}.*posenc\.hf\.use\(model, "
                                         r"'rope'\)") as got:
        posenc.hf.use(model, posenc.RoPE(16, interleaved=False))
    assert got[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kwargs = posenc.hf.rotary_kwargs_from_hf_config(model.config)
        posenc.hf.use(model, posenc.RoPE(kwargs.pop("head_dim"), **kwargs))  # the config's


@pytest.mark.parametrize("cache", ["dynamic", "sink"])
def test_hand_decode_loop_with_the_prompts_mask_each_step_is_refused(cache):
    # a prober's loop: the prompt's 2-D attention_mask passed unchanged at every step (shorter
    # than cached + new keys); positions_mask padded it with False, so the step's own token
    # counted as padding (0.36-0.64 off; stock sdpa is off too). A static cache's unwritten
    # slots past the tokens so far stay padded (generate's static/sliding runs: test_hf_*)
    model = _llama()
    ids = torch.tensor([[5, 17, 33, 8, 71], [4, 9, 23, 50, 11]])
    mask = torch.ones_like(ids)

    def kv() -> object:
        if cache == "sink":
            return posenc.hf.SinkCache(sinks=2, window=4, config=model.config)
        return transformers.DynamicCache(config=model.config)

    grown = kv()
    with torch.no_grad():
        out = model(ids, attention_mask=mask, cache=grown)
        step = out.logits[:, -1:].argmax(-1)
        right = model(step, attention_mask=torch.cat([mask, mask[:, :1]], -1), cache=grown)
        stale = kv()
        model(ids, attention_mask=mask, cache=stale)
        with pytest.raises(ValueError, match=r"attention_mask has 5 columns, but this step's "
                                             r"queries are token 5 of the sequence.*\[B, 6\].*"
                                             r"grow it by one column per step as generate "
                                             r"does"):
            model(step, attention_mask=mask, cache=stale)
        full = model(torch.cat([ids, step], -1)).logits[:, -1]
    if cache == "dynamic":  # the grown mask is the answer of the whole sequence
        torch.testing.assert_close(right.logits[:, -1], full, **TOL)
