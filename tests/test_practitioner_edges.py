"""The practitioner's re-run from the docs alone (issue 34, after tests/test_silent_edges.py):
the calls that still ended in an obscure error or a silent answer, each now right, refused
with the argument, the value and the fix, or warned at the caller's line.

a. a filled ``SinkCache`` given a new batch without ``reset()``; b. ``SinkCache.crop``;
c. ``SinkCache(num_layers=...)`` too small; d. several models sharing one config object;
e. ``[B, L, H, D]`` input: the layout hint of the positions / document_ids / attention_mask /
ALiBi head-count errors; f. the API page's ``generate`` call runs without a warning;
g. the integration writes posenc's cache through its protocol (``append``);
h. a T5 (learned) scheme survives ``save_pretrained`` / ``from_pretrained`` + ``use``.
"""

from __future__ import annotations

import ast
import copy
import re
import warnings
from pathlib import Path

import pytest
import torch

import posenc
import posenc.hf

pytest.importorskip("transformers")
from test_hf_adapter import TOL, llama_config, logits  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
S, W = 2, 6


def _llama(scheme: object = None, seed: int = 0, **options: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(copy.deepcopy(llama_config(initializer_range=0.2))).eval()
    return posenc.hf.use(model, scheme, **options)


def _generate(model: torch.nn.Module, cache: object, prompt: torch.Tensor, new: int = 3,
              **kwargs: object) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), cache=cache,
                              max_new_tokens=new, do_sample=False, pad_token_id=0, **kwargs)


# --------------------------------------------------------------------------- a. reuse


def test_a_filled_sink_cache_given_another_batch_says_call_reset():
    model = _llama()
    cache = posenc.hf.SinkCache(sinks=S, window=W, config=model.config)
    _generate(model, cache, torch.tensor([[5, 17, 33, 8, 71]]))  # holds 7 tokens
    wider = torch.tensor([[5, 17, 33, 8, 71, 9, 4, 40, 41, 42]] * 2)
    with pytest.raises(ValueError, match=r"holds 7 tokens from a batch of 1 rows, and this "
                                         r"batch has 2.*cache\.reset\(\) empties it"):
        _generate(model, cache, wider)  # was: k's batch mismatch deep in the rolling cache
    short = torch.tensor([[5, 17, 33], [4, 5, 6]])
    with pytest.raises(ValueError, match=r"holds 7 tokens from an earlier call, and generate "
                                         r"passed no new tokens.*cache\.reset\(\)"):
        _generate(model, cache, short)  # was: "cannot reshape tensor of 0 elements"
    cache.reset()  # the fix the messages name
    got = _generate(model, cache, wider)
    fresh = _generate(model, posenc.hf.SinkCache(sinks=S, window=W, config=model.config), wider)
    assert torch.equal(got, fresh)


# --------------------------------------------------------------------------- b. crop


def test_b_sink_cache_crop_is_refused_with_why_and_crop_0_is_a_no_op():
    model = _llama()
    cache = posenc.hf.SinkCache(sinks=S, window=W, config=model.config)
    _generate(model, cache, torch.tensor([[5, 17, 33, 8, 71]]))
    held = int(cache.get_seq_length())
    cache.crop(0)  # transformers' "nothing to undo"
    assert int(cache.get_seq_length()) == held
    with pytest.raises(ValueError, match=r"cannot crop\(-2\): a rolling cache \(sinks=2, "
                                         r"window=6\) overwrites its oldest window keys"):
        cache.crop(-2)  # was: AttributeError: 'SinkLayer' object has no attribute 'crop'
    assert not cache.is_croppable  # so assisted decoding refuses up front, in transformers
    assistant = _llama(seed=1)
    with pytest.raises(ValueError, match="can be cropped"):
        _generate(model, posenc.hf.SinkCache(sinks=S, window=W, config=model.config),
                  torch.tensor([[5, 17, 33]]), assistant_model=assistant)


# --------------------------------------------------------------------------- c. num_layers


def test_c_sink_cache_with_too_few_layers_names_num_layers_and_the_layer():
    model = _llama()
    assert model.config.num_hidden_layers == 2
    cache = posenc.hf.SinkCache(sinks=S, window=W, num_layers=1)
    with pytest.raises(ValueError, match=r"SinkCache\(num_layers=1\) holds layers 0 \.\. 0, but "
                                         r"the model wrote layer_idx=1.*config=model\.config"):
        _generate(model, cache, torch.tensor([[5, 17, 33]]))  # was: IndexError
    _generate(model, posenc.hf.SinkCache(sinks=S, window=W, num_layers=2),
              torch.tensor([[5, 17, 33]]))


# --------------------------------------------------------------------------- d. shared config


def test_d_models_sharing_one_config_are_named_as_such_not_as_a_reload():
    config = llama_config()
    torch.manual_seed(0)
    a, b = LlamaForCausalLM(config).eval(), LlamaForCausalLM(config).eval()
    posenc.hf.use(a, "alibi")
    ids = torch.tensor([[5, 17, 33]])
    with pytest.raises(ValueError, match=r"set by posenc\.hf\.use on another model that shares "
                                         r"this config object.*copy\.deepcopy\(config\).*"
                                         r"posenc\.hf\.use\(model, 'alibi'\)") as err:
        logits(b, ids)
    assert "save_pretrained" not in str(err.value)
    with pytest.warns(UserWarning, match=r"another model that shares this config object") as got:
        posenc.hf.use(b)
    assert got[0].filename == __file__
    assert "save_pretrained" not in str(got[0].message)


# --------------------------------------------------------------------------- e. layout hints

X = torch.randn(2, 10, 4, 16)  # [B, L, H, D]: 10 tokens, 4 heads
HINT = r"looks like \[B, L, H, head_dim\] \(its dim {}.*q\.transpose\(1, 2\)"


@pytest.mark.parametrize("what,dim,kwargs", [
    ("positions' 10 entries", 1, {"positions": torch.arange(10)}),
    ("document_ids' 10 entries", 1, {"document_ids": torch.zeros(2, 10, dtype=torch.long)}),
    ("attention_mask's 10 columns", 1, {"attention_mask": torch.ones(2, 10, dtype=torch.bool)}),
    ("attention_mask's 10 columns", 1,
     {"attention_mask": torch.ones(2, 1, 10, 10, dtype=torch.bool)}),
    ("scheme's 4 heads", 2, {"scheme": posenc.ALiBi(4)}),
])
def test_e_b_l_h_d_input_gets_the_transpose_in_each_shape_error(what, dim, kwargs):
    scheme = kwargs.pop("scheme", None)
    with pytest.raises(ValueError, match=HINT.format(dim) + "|" + re.escape(what)) as err:
        posenc.attend(X, X, X, scheme, **kwargs)
    assert what in str(err.value) and "q.transpose(1, 2)" in str(err.value)
    t = X.transpose(1, 2)  # the fix runs
    assert posenc.attend(t, t, t, scheme, **kwargs).shape == t.shape


def test_e_hint_is_hedged_where_the_shape_cannot_tell_and_absent_where_it_says_nothing():
    # fewer entries than q's dim 2, equal to its dim 1: a wrong length, or [B, L, H, D] with
    # fewer tokens than heads (a decode step [B, 1, H, D]); the shape cannot tell, so the
    # hint says "may be" (it said nothing before the wrong-call probe, item G)
    q = torch.randn(1, 4, 5, 16)
    for kwargs in ({"positions": torch.arange(4)}, {"attention_mask": torch.ones(1, 4)},
                   {"document_ids": torch.zeros(1, 4, dtype=torch.long)}):
        with pytest.raises(ValueError, match=r"may be \[B, L, H, head_dim\] \(its dim 1"):
            posenc.attend(q, q, q, None, **kwargs)
    for kwargs in ({"positions": torch.arange(3)}, {"attention_mask": torch.ones(1, 6)}):
        with pytest.raises(ValueError) as err:  # fits neither dim: nothing of the layout
            posenc.attend(q, q, q, None, **kwargs)
        assert "transpose" not in str(err.value)
    with pytest.raises(ValueError) as err:
        posenc.attend(q, q, q, posenc.ALiBi(8))
    assert "transpose" not in str(err.value)


@pytest.mark.parametrize("kwargs", [{"positions": torch.arange(3)},
                                    {"attention_mask": torch.ones(2, 3)},
                                    {"scheme": posenc.ALiBi(4)}])
def test_e_fewer_tokens_than_heads_gets_the_hint_too(kwargs):
    # a prober's calls: [B, L=3, H=4, D] (L < H) got no hint, only dim 1 > dim 2 did
    q = torch.randn(2, 3, 4, 16)
    scheme = kwargs.pop("scheme", None)
    with pytest.raises(ValueError, match=r"q of shape \(2, 3, 4, 16\) may be \[B, L, H, "
                                         r"head_dim\].*q\.transpose\(1, 2\)"):
        posenc.attend(q, q, q, scheme, **kwargs)
    t = q.transpose(1, 2)
    assert posenc.attend(t, t, t, scheme, **kwargs).shape == t.shape


def test_e_decode_step_in_b_l_h_d_layout_names_the_layout_and_the_reset():
    # a prober's call: a decode step [B, 1, H, D] after a [B, H, L, D] prefill read as a new
    # batch ("cache.reset()") only; with k's dim 2 equal to the cached heads, both are said
    cache = posenc.KVCache()
    q = torch.randn(2, 4, 6, 16)
    posenc.attend(q, q, q, cache=cache)
    step = torch.randn(2, 1, 4, 16)
    with pytest.raises(ValueError, match=r"new k \(2, 1, 4, 16\) does not match the cached keys "
                                         r"\(2, 4, 6, 16\).*its dim 2 has the cached 4 heads, "
                                         r"so k may be \[B, L, H, head_dim\].*q\.transpose\(1, "
                                         r"2\).*new batch instead.*cache\.reset\(\)"):
        posenc.attend(step, step, step, cache=cache)
    with pytest.raises(ValueError, match=r"positions' 1 entries.*q\.transpose\(1, 2\)"):
        posenc.attend(step, step, step, cache=cache, positions=torch.tensor([6]))
    other = torch.randn(3, 4, 1, 16)  # a new batch, the layout right: the reset alone
    with pytest.raises(ValueError, match=r"cache\.reset\(\)") as err:
        posenc.attend(other, other, other, cache=cache)
    assert "transpose" not in str(err.value)
    t = step.transpose(1, 2)  # the fix runs
    assert posenc.attend(t, t, t, cache=cache).shape == t.shape


# --------------------------------------------------------------------------- f. the API page


def _page_snippet(page: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if "SinkCache(sinks=4, window=1020)" in b]
    assert len(found) == 1, f"{page}: one python block shows SinkCache in generate"
    return found[0]


def test_f_api_page_generate_call_runs_without_a_warning():
    snippet = _page_snippet(ROOT / "book" / "api.md")
    zh = ROOT / "book" / "zh" / "api.md"
    if zh.exists():
        assert _page_snippet(zh) == snippet, "both editions show the same code"
    assert "past_key_values" not in snippet  # transformers 5.24: a FutureWarning, use cache=
    torch.manual_seed(0)
    model = LlamaForCausalLM(copy.deepcopy(llama_config(initializer_range=0.2))).eval()
    ids = torch.tensor([[5, 17, 33, 8, 71]])
    scope = {"model": model, "ids": ids}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")
        exec(compile(snippet, "book/api.md", "exec"), scope)  # noqa: S102
    assert scope["out"].shape == (1, 5 + 64)
    assert isinstance(scope["cache"], type(posenc.hf.SinkCache()))


# --------------------------------------------------------------------------- g. protocol


def test_g_the_integration_reads_no_private_member_of_posencs_cache():
    # KVCache's protocol (append, ...) is what an integration calls; _update is the cache's own
    for path in sorted((ROOT / "posenc" / "hf").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        private = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                   and n.attr in {"_update", "_s", "_check_new", "_flush", "_written"}}
        assert not private, f"{path.name} reads {sorted(private)} of posenc's KVCache"


def test_g_in_cache_layout_runs_through_append(monkeypatch):
    calls = []
    append = posenc.KVCache.append

    def spy(self, *args, **kwargs):
        calls.append(len(args))
        return append(self, *args, **kwargs)

    monkeypatch.setattr(posenc.KVCache, "append", spy)
    model = _llama("rope")
    cache = posenc.hf.SinkCache(sinks=S, window=W, config=model.config, positions="in_cache")
    _generate(model, cache, torch.tensor([[5, 17, 33]]), new=2)
    assert calls, "attend_in_cache writes through KVCache.append"


# --------------------------------------------------------------------------- h. T5 reload


def _t5_saved(tmp_path: Path, **save: object) -> tuple[torch.Tensor, torch.Tensor]:
    model = _llama("t5", num_buckets=16)
    with torch.no_grad():  # a trained bias, not the fresh one use() would build again
        for p in model.posenc_scheme.parameters():
            p.normal_(0.0, 1.0)
    ids = torch.tensor([[5, 17, 33, 8, 71, 9, 40, 41]])
    model.save_pretrained(tmp_path, **save)
    return ids, logits(model, ids)


@pytest.mark.parametrize("save", [{}, {"max_shard_size": "20KB"}], ids=["one_file", "sharded"])
def test_h_t5_reload_restores_the_saved_bias_weights(tmp_path, save):
    ids, before = _t5_saved(tmp_path, **save)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="posenc").eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        posenc.hf.use(loaded, "t5", num_buckets=16)  # the call the refusal names, no more
    torch.testing.assert_close(logits(loaded, ids), before, **TOL)


def test_h_t5_reload_without_readable_weights_warns_with_the_loading_call(tmp_path):
    ids, before = _t5_saved(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="posenc").eval()
    loaded.config._name_or_path = str(tmp_path / "elsewhere")  # a checkpoint posenc cannot read
    with pytest.warns(UserWarning, match=r"posenc_scheme\.\* weights.*starts fresh.*"
                                         r"load_state_dict\(.*strict=False\)") as got:
        posenc.hf.use(loaded, "t5", num_buckets=16)
    assert got[0].filename == __file__
    assert not torch.allclose(logits(loaded, ids), before, **TOL)  # what the warning says
    from safetensors.torch import load_file  # the call it names restores them

    saved = load_file(tmp_path / "model.safetensors")
    loaded.load_state_dict({k: v for k, v in saved.items() if k.startswith("posenc_scheme.")},
                           strict=False)
    torch.testing.assert_close(logits(loaded, ids), before, **TOL)


def test_h_t5_reload_with_other_options_warns_and_restores_nothing(tmp_path):
    _t5_saved(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="posenc").eval()
    with pytest.warns(UserWarning, match=r"records posenc scheme 't5'.*asked for scheme 't5' "
                                         r"with options \{'num_buckets': 32\}.*"
                                         r"posenc\.hf\.use\(model, 't5', num_buckets=16\)"):
        posenc.hf.use(loaded, "t5", num_buckets=32)


def test_a_same_batch_size_prompt_that_restarts_the_positions_says_call_reset():
    # a prompt of the same batch size, shorter than what the cache holds: generate reads its
    # tail as new tokens at the cache's next slot, with positions from the mask that restart
    model = _llama()
    cache = posenc.hf.SinkCache(sinks=S, window=W, config=model.config)
    _generate(model, cache, torch.tensor([[5, 17, 33, 8, 71]]))  # holds 7 tokens
    for prompt in ([[5, 17, 33, 9]], [[5, 17, 33, 9, 4, 5, 6]]):  # was: 4 ran, off silently
        with pytest.raises(ValueError, match=r"holds 7 tokens from rows whose keys stop at "
                                             r"positions \[6\] \(a continuation starts at "
                                             r"\[7\]\).*not a continuation.*cache\.reset\(\)"):
            _generate(model, cache, torch.tensor(prompt))
    cache.reset()
    prompt = torch.tensor([[5, 17, 33, 9]])
    fresh = posenc.hf.SinkCache(sinks=S, window=W, config=model.config)
    seq = _generate(model, cache, prompt)
    assert torch.equal(seq, _generate(model, fresh, prompt))
    # a true continuation (the sequence so far plus new tokens) still runs
    _generate(model, cache, torch.cat([seq, torch.tensor([[12, 13]])], dim=-1))


# --------------------------------------------------------------------------- wrong-call probe


def test_left_padding_warning_of_a_rolling_cache_points_at_the_callers_line():
    # was raised inside posenc (rolling_cache.py, a fixed stacklevel): now warn_caller, through
    # attend and through a transformers model's generate alike
    q = torch.randn(2, 4, 5, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    with pytest.warns(UserWarning, match=r"rows \[1\] start with padding") as got:
        posenc.attend(q, q, q, cache=posenc.KVCache(6, sinks=2, window=4), attention_mask=mask)
    assert got[0].filename == __file__
    model = _llama()
    prompt = torch.tensor([[5, 17, 33, 8, 71], [0, 0, 33, 8, 71]])
    with pytest.warns(UserWarning, match=r"rows \[1\] start with padding") as got:
        with torch.no_grad():
            model.generate(prompt, attention_mask=(prompt != 0).long(), max_new_tokens=2,
                           cache=posenc.hf.SinkCache(sinks=S, window=W, config=model.config),
                           do_sample=False, pad_token_id=0)
    assert {w.filename for w in got} == {__file__}


def test_sink_cache_reuse_message_names_the_positions_it_holds():
    # was "holds 15 tokens from rows that reached positions [15]": it keeps sinks + window of
    # them, and the last key it holds is at position 14
    model = _llama()
    cache = posenc.hf.SinkCache(sinks=2, window=4, config=model.config)
    _generate(model, cache, torch.tensor([[5, 17, 33, 8, 71, 9, 4, 40, 41, 42, 43, 44]]), new=4)
    with pytest.raises(ValueError, match=r"holds 6 of the 15 tokens it was given from rows "
                                         r"whose keys stop at positions \[14\] \(a continuation "
                                         r"starts at \[15\]\).*stop at \[10\]"):
        _generate(model, cache, torch.tensor([[5, 17, 33, 8, 71, 9, 4, 40, 41, 42, 43]]))


def test_decode_step_in_the_wrong_layout_names_it_through_the_mask_too():
    """A decode step ``[B, 1, H, D]`` over a cache with a 2-D mask grown by one column: the
    mask's columns less the cached keys fit q's dim 1, so the refusal names the transpose."""
    H, D = 4, 16
    cache = posenc.KVCache()
    x = torch.randn(2, H, 6, D)
    posenc.attend(x, x, x, posenc.RoPE(D), cache=cache, attention_mask=torch.ones(2, 6))
    step = torch.randn(2, 1, H, D)  # [B, L=1, H, D]
    with pytest.raises(ValueError, match=r"may be \[B, L, H, head_dim\].*7 columns less 6 cached"):
        posenc.attend(step, step, step, posenc.RoPE(D), cache=cache,
                      attention_mask=torch.ones(2, 7))


def test_a_correct_step_with_a_wrong_mask_width_gets_no_layout_hint():
    """The hint over a cache is for a ``[B, 1, H, D]`` step; a correct ``[B, H, L, D]`` call whose
    mask is as wide as the cached keys plus H is not told to transpose (probe of the hint)."""
    cache = posenc.KVCache()
    x = torch.randn(2, 4, 5, 16)
    posenc.attend(x, x, x, posenc.RoPE(16), cache=cache, attention_mask=torch.ones(2, 5))
    for L in (1, 3):
        q = torch.randn(2, 4, L, 16)
        with pytest.raises(ValueError) as err:
            posenc.attend(q, q, q, posenc.RoPE(16), cache=cache, attention_mask=torch.ones(2, 9))
        assert "transpose" not in str(err.value)
