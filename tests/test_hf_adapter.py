"""posenc inside Hugging Face transformers (issue 27): ``posenc.hf.register`` and ``posenc.hf.use``.

This file: the API and its refusals, the import layering (``import posenc`` never imports
transformers; the adapter sits above attention), the three ways transformers switches a model
to ``attn_implementation="posenc"``, the splitting rule for packed ``position_ids`` (rows that
start mid-document and PoSE-style skips), the guard against the shared-config trap, and the
helpers the two other files use:

- ``test_hf_adapter_models.py``: each model family with its own RoPE (``scheme=None``) against
  transformers' own attention;
- ``test_hf_adapter_schemes.py``: ALiBi, T5 and NoPE (and posenc's RoPE) in place of the model's.

Every model is tiny and built from a config (hidden 64, 2 layers, a vocabulary of 96): no
download.
"""

from __future__ import annotations

import ast
import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_hf_llama_parity import PAD as PARITY_PAD
from test_hf_llama_parity import _left_padded  # the same PAD (asserted below)

import posenc
import posenc.hf

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    DataCollatorWithFlattening,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

ROOT = Path(__file__).resolve().parents[1]
VOCAB, PAD = 96, 0
assert PAD == PARITY_PAD, "left_padded pads with test_hf_llama_parity.PAD"
PROMPTS = ([5, 17, 33, 8], [71, 9, 23, 50, 11, 12, 13])  # lengths 4 and 7
DOCS = ([5, 17, 33, 8], [71, 9, 23, 50, 11], [40, 41, 42])  # packed by the collator
TOL = {"atol": 2e-5, "rtol": 2e-5}


def common(**over: object) -> dict:
    """The tiny shape every family shares: hidden 64, 4 query heads, 2 kv heads, 2 layers."""
    return {
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 64,
        "pad_token_id": PAD, "bos_token_id": 1, "eos_token_id": None, "tie_word_embeddings": False,
    } | over


def llama_config(**over: object) -> LlamaConfig:
    return LlamaConfig(**common(**over))


def assert_own_configs(ref: torch.nn.Module, ours: torch.nn.Module) -> None:
    """Two models compared must not share one config object: ``use`` switches the config's
    attention implementation, and a shared config would switch the reference too (the test
    would then compare posenc with itself)."""
    assert ref.config is not ours.config, (
        "the reference and the posenc model share one config object: build each from "
        "copy.deepcopy(config)"
    )
    assert ref.config._attn_implementation != ours.config._attn_implementation


def pair(cls: type, config: object, *, ref_impl: str = "sdpa", scheme: object = None,
         seed: int = 0, **options: object) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(reference, posenc)``: one weight draw, each model from its own deep copy of
    ``config``; the reference runs transformers' ``ref_impl``, the other ``posenc.hf.use``."""
    torch.manual_seed(seed)
    ref = cls(copy.deepcopy(config)).eval()
    ref.set_attn_implementation(ref_impl)
    ours = cls(copy.deepcopy(config)).eval()
    ours.load_state_dict(ref.state_dict())
    posenc.hf.use(ours, scheme, **options)
    assert_own_configs(ref, ours)
    return ref, ours


def left_padded(prompts=PROMPTS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[B, L]``, left-padded with ``PAD`` as ``generate`` wants."""
    return _left_padded(prompts)


def packed(docs=DOCS, **kwargs: object) -> dict:
    """One row from ``DataCollatorWithFlattening`` (restarting ``position_ids``, no mask)."""
    return DataCollatorWithFlattening(**kwargs)([{"input_ids": list(d)} for d in docs])


def logits(model: torch.nn.Module, ids: torch.Tensor, **kwargs: object) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).logits


def greedy(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, new: int = 6,
           **kwargs: object):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                              output_logits=True, return_dict_in_generate=True, pad_token_id=PAD,
                              **kwargs)


# --------------------------------------------------------------------------- imports and layers


def test_import_posenc_does_not_import_transformers():
    code = (
        "import sys, posenc, posenc.hf\n"
        "posenc.hf.register, posenc.hf.use  # the adapter loads, transformers still does not\n"
        "assert 'transformers' not in sys.modules, 'import posenc imported transformers'\n"
        "assert 'posenc.hf.install' in sys.modules and 'posenc.hf.forward' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_import_posenc_hf_imports_no_transformers():
    # a fresh interpreter: posenc.hf loads its adapter eagerly, and still not transformers
    code = ("import sys, posenc.hf\n"
            "assert 'transformers' not in sys.modules, 'import posenc.hf imported transformers'\n"
            "assert 'posenc.hf.forward' in sys.modules and 'posenc.hf.install' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def _library_imports(path: Path) -> set[str]:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_the_adapter_sits_above_attention():
    # no library module outside posenc.hf imports the adapter; the config reader (an encoding,
    # posenc.rope_config) imports nothing above it; transformers is imported inside functions
    # only; what transformers calls (hf/forward.py) sits on posenc.attention
    hf = ROOT / "posenc" / "hf"
    for path in sorted((ROOT / "posenc").glob("**/*.py")):
        if "lab" in path.relative_to(ROOT).parts or path.parent == hf:
            continue
        assert not {m for m in _library_imports(path) if m.startswith("posenc.hf")}, path
    config_imports = _library_imports(ROOT / "posenc" / "rope_config.py")
    assert not {m for m in config_imports if m.startswith(("posenc.attention", "posenc.schemes",
                                                          "posenc.hf", "transformers"))}
    for name in ("forward.py", "install.py", "adapter.py", "__init__.py"):
        tree = ast.parse((hf / name).read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not any("transformers" in ast.unparse(n) for n in top), name
    assert "posenc.attention" in _library_imports(hf / "forward.py")


def test_the_config_reader_is_still_exported():
    from posenc.hf import INTERLEAVED_MODEL_TYPES, rotary_kwargs_from_hf_config
    from posenc.hf.config import rotary_kwargs_from_hf_config as same

    assert rotary_kwargs_from_hf_config is same and "gptj" in INTERLEAVED_MODEL_TYPES
    import posenc.hf.adapter as adapter
    import posenc.hf.config as config
    import posenc.hf.forward as forward
    import posenc.rope_config as rope_config

    assert rope_config.rotary_kwargs_from_hf_config is same is config.rotary_kwargs_from_hf_config
    assert INTERLEAVED_MODEL_TYPES is rope_config.INTERLEAVED_MODEL_TYPES is config.INTERLEAVED_MODEL_TYPES
    assert adapter.use is posenc.hf.use and adapter.register is posenc.hf.register
    assert adapter.attention_forward is forward.attention_forward
    assert adapter.positions_mask is forward.positions_mask and adapter._fresh_rows is forward._fresh_rows
    assert {"register", "use", "rotary_kwargs_from_hf_config"} <= set(dir(posenc.hf))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        posenc.hf.nope  # noqa: B018


# --------------------------------------------------------------------------- switching a model


def test_register_then_from_config_from_pretrained_and_set_attn_implementation(tmp_path):
    assert posenc.hf.register() == "posenc"
    assert posenc.hf.register("posenc") == "posenc"  # again: harmless
    cfg = llama_config()
    torch.manual_seed(0)
    ref = LlamaForCausalLM(copy.deepcopy(cfg)).eval()
    ref.set_attn_implementation("sdpa")
    ids, mask = left_padded()
    want = logits(ref, ids, attention_mask=mask)[mask.bool()]

    built = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="posenc").eval()
    assert built.config._attn_implementation == "posenc"
    built.load_state_dict(ref.state_dict())
    torch.testing.assert_close(logits(built, ids, attention_mask=mask)[mask.bool()], want, **TOL)

    ref.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="posenc").eval()
    assert loaded.config._attn_implementation == "posenc"
    assert_own_configs(ref, loaded)
    torch.testing.assert_close(logits(loaded, ids, attention_mask=mask)[mask.bool()], want, **TOL)

    switched = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    switched.set_attn_implementation("posenc")
    torch.testing.assert_close(logits(switched, ids, attention_mask=mask)[mask.bool()], want, **TOL)


def test_use_returns_the_model_and_switches_back_and_forth():
    ref, ours = pair(LlamaForCausalLM, llama_config())
    ids, mask = left_padded()
    want = logits(ref, ids, attention_mask=mask)
    assert posenc.hf.use(ours, "alibi") is ours
    assert isinstance(ours.posenc_scheme, posenc.ALiBi)
    swapped = logits(ours, ids, attention_mask=mask)
    assert (swapped - want)[mask.bool()].abs().max() > 1e-3  # the rotary is gone
    posenc.hf.use(ours)  # scheme=None puts the model's own rotary back
    assert "posenc_scheme" not in dict(ours.named_children())
    torch.testing.assert_close(logits(ours, ids, attention_mask=mask)[mask.bool()],
                               want[mask.bool()], **TOL)


def test_another_name_and_backend():
    ref, ours = pair(LlamaForCausalLM, llama_config(), name="posenc_math", backend="math")
    assert ours.config._attn_implementation == "posenc_math"
    ids, mask = left_padded()
    torch.testing.assert_close(logits(ours, ids, attention_mask=mask)[mask.bool()],
                               logits(ref, ids, attention_mask=mask)[mask.bool()], **TOL)


def test_only_the_attention_registered_is_refused_not_silently_unpadded():
    # the review's first trap: an AttentionInterface entry without its mask function makes
    # transformers pass attention_mask=None, and padding would be ignored without a word
    from transformers import AttentionInterface

    from posenc.hf.adapter import attention_forward

    AttentionInterface.register("posenc_no_mask", attention_forward)
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config()).eval()
    model.set_attn_implementation("posenc_no_mask")
    ids, mask = left_padded()
    with pytest.raises(ValueError, match="attention_mask=None.*mask function"):
        model(ids, attention_mask=mask)


def test_attention_switched_away_after_a_swap_is_refused():
    torch.manual_seed(0)
    model = posenc.hf.use(LlamaForCausalLM(llama_config()).eval(), "alibi")
    model.set_attn_implementation("sdpa")  # would run with no positions at all
    with pytest.raises(ValueError, match="attention must stay posenc's, got attn_implementation='sdpa'"):
        model(torch.tensor([[5, 6, 7]]))


# --------------------------------------------------------------------------- the shared config


def test_the_shared_config_trap_is_caught():
    cfg = llama_config()
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).eval()
    ours = LlamaForCausalLM(cfg).eval()  # the same config object: the trap
    ref.set_attn_implementation("sdpa")
    posenc.hf.use(ours)
    assert ref.config._attn_implementation == "posenc"  # the reference was switched too
    with pytest.raises(AssertionError, match="share one config object"):
        assert_own_configs(ref, ours)
    a, b = pair(LlamaForCausalLM, cfg)  # the helper every comparison uses
    assert a.config._attn_implementation == "sdpa" and b.config._attn_implementation == "posenc"


# --------------------------------------------------------------------------- packed rows


def test_packed_rows_follow_flash_attentions_splitting_rule():
    from posenc.hf.adapter import _fresh_rows

    rows = torch.tensor([[3, 4, 5, 0, 1, 2, 0, 1], [0, 1, 2, 3, 10, 11, 12, 13]])
    got = _fresh_rows(rows, 2, 8, rows.device)
    assert got.documents is not None and got.positions is not None
    assert got.documents.tolist() == [[0, 0, 0, 1, 1, 1, 2, 2], [0, 0, 0, 0, 0, 0, 0, 0]]
    assert got.positions.tolist() == rows.tolist()
    assert got.cu_seqlens.tolist() == [0, 3, 6, 8, 16] and got.max_seqlen == 8
    assert not got.contiguous and not got.restart  # the second row skips 4 to 9
    # transformers' mask path splits the second row where it jumps: the rules differ there
    from transformers.masking_utils import find_packed_sequence_indices

    assert find_packed_sequence_indices(rows).tolist() == [[0, 0, 0, 1, 1, 1, 2, 2],
                                                           [0, 0, 0, 0, 1, 1, 1, 1]]
    one = _fresh_rows(rows[:1], 1, 8, rows.device)
    assert one.contiguous and not one.restart  # the first document counts from 3
    collated = _fresh_rows(torch.tensor([[0, 1, 2, 0, 1, 0]]), 1, 6, rows.device)
    assert collated.restart and collated.cu_seqlens.tolist() == [0, 3, 5, 6]
    plain = _fresh_rows(torch.arange(8)[None], 2, 8, rows.device)
    assert plain.positions is None and plain.documents is None  # attend's fast path
    assert _fresh_rows(torch.arange(3, 11)[None], 2, 8, rows.device).documents is None


def test_packed_rows_run_varlen_in_eager_mode_and_dense_when_compiled(monkeypatch):
    # eager: flash-attn's layout at sum n_i^2 (posenc.varlen); compiled: one dense mask, no
    # graph break; the two agree
    from torch._dynamo.testing import CompileCounter

    import posenc.varlen

    torch._dynamo.reset()
    calls = []
    real = posenc.varlen.attend_varlen
    monkeypatch.setattr(posenc.varlen, "attend_varlen", lambda *a, **k: calls.append(1) or real(*a, **k))
    for scheme in (None, "alibi"):
        _, ours = pair(LlamaForCausalLM, llama_config(), scheme=scheme)
        batch = packed()
        calls.clear()
        eager = logits(ours, batch["input_ids"], position_ids=batch["position_ids"])
        assert len(calls) == 2  # one per layer
        counter = CompileCounter()
        compiled = torch.compile(ours, backend=counter, fullgraph=True)
        with torch.no_grad():
            got = compiled(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        assert counter.frame_count == 1
        torch.testing.assert_close(got, eager, **TOL)


def test_a_row_that_starts_mid_document():
    # [3, 4, 5 | 0, 1, 2 | 0, 1]: the first document began in an earlier row
    ref, ours = pair(LlamaForCausalLM, llama_config())
    ids = torch.tensor([[5, 17, 33, 71, 9, 23, 40, 41]])
    pos = torch.tensor([[3, 4, 5, 0, 1, 2, 0, 1]])
    got = logits(ours, ids, position_ids=pos)
    for s, e in ((0, 3), (3, 6), (6, 8)):
        alone = logits(ref, ids[:, s:e], position_ids=pos[:, s:e])
        torch.testing.assert_close(got[:, s:e], alone, **TOL)
    # transformers' own sdpa agrees here (its mask path splits this row the same way)
    torch.testing.assert_close(got, logits(ref, ids, position_ids=pos, use_cache=False), **TOL)


def test_a_skip_inside_one_document_is_not_a_new_document():
    # PoSE: [0, 1, 2, 3, 10, 11, 12, 13] is one document with skipped positions
    ref, ours = pair(LlamaForCausalLM, llama_config())
    ids = torch.tensor([[5, 17, 33, 71, 9, 23, 40, 41]])
    pos = torch.tensor([[0, 1, 2, 3, 10, 11, 12, 13]])
    got = logits(ours, ids, position_ids=pos)
    one_document = logits(ref, ids, position_ids=pos, attention_mask=torch.ones_like(ids))
    torch.testing.assert_close(got, one_document, **TOL)
    split = logits(ref, ids, position_ids=pos, use_cache=False)  # transformers' mask path
    assert (got[:, 4:] - split[:, 4:]).abs().max() > 1e-3


def test_packing_holds_with_the_default_use_cache():
    # transformers' sdpa applies no document mask once a cache is passed (use_cache=True, the
    # forward's default): the documents would see each other. posenc splits them anyway.
    ref, ours = pair(LlamaForCausalLM, llama_config())
    batch = packed()
    got = logits(ours, batch["input_ids"], position_ids=batch["position_ids"])  # use_cache=True
    start = 0
    for d in DOCS:
        alone = logits(ref, torch.tensor([d]))
        torch.testing.assert_close(got[:, start:start + len(d)], alone, **TOL)
        start += len(d)
    leaky = logits(ref, batch["input_ids"], position_ids=batch["position_ids"])
    assert (leaky - got).abs().max() > 1e-3


# --------------------------------------------------------------------------- bad input


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(llama_config()).eval()


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda m: posenc.hf.use(object()), TypeError, r"model must be a transformers PreTrainedModel.*got object"),  # noqa: E501
    (lambda m: posenc.hf.use(m, "bogus"), ValueError, r"scheme must be None.*alibi, t5, nope, rope, got 'bogus'"),  # noqa: E501
    (lambda m: posenc.hf.use(m, "sinusoidal"), ValueError, r"got 'sinusoidal' \(sinusoidal and learned add to the token"),  # noqa: E501
    (lambda m: posenc.hf.use(m, 3), TypeError, r"scheme must be None, a name \(alibi, t5, nope, rope\) or a PositionScheme, got int"),  # noqa: E501
    (lambda m: posenc.hf.use(m, posenc.ALiBi), TypeError, r"got the class ALiBi; pass an instance, e.g. ALiBi\(num_heads\)"),  # noqa: E501
    (lambda m: posenc.hf.use(m, posenc.SinusoidalPE(64)), ValueError, r"scheme 'sinusoidal' adds positions to the token embeddings"),  # noqa: E501
    (lambda m: posenc.hf.use(m, "alibi", num_buckets=8), TypeError, r"use\(scheme='alibi'\) got unexpected options \['num_buckets'\]; scheme 'alibi' takes no scheme options"),  # noqa: E501
    (lambda m: posenc.hf.use(m, "t5", buckets=8), TypeError, r"unexpected options \['buckets'\]; scheme 't5' takes num_buckets, max_distance"),  # noqa: E501
    (lambda m: posenc.hf.use(m, posenc.ALiBi(3)), ValueError, r"bias for num_heads=3, but the model has num_attention_heads=\d+; build it with"),  # noqa: E501
    (lambda m: posenc.hf.use(m, posenc.RoPE(6)), ValueError, r"rotates head_dim=6, but the model's heads have head_dim=\d+; build it with RoPE"),  # noqa: E501
    (lambda m: posenc.hf.use(m, "rope", base=10.0), TypeError, r"scheme 'rope' got unexpected options \['base'\]; allowed: interleaved"),  # noqa: E501
    (lambda m: posenc.hf.use(m, None, num_buckets=8), TypeError, r"options \['num_buckets'\] for scheme=None; allowed: backend, name"),  # noqa: E501
    (lambda m: posenc.hf.use(m, posenc.ALiBi(4), backend="math", slopes=1), TypeError, r"options \['slopes'\] with a ready PositionScheme"),  # noqa: E501
    (lambda m: posenc.hf.use(m, backend="cuda"), ValueError, r"backend must be one of \('sdpa', 'math', 'flex'\), got 'cuda'"),  # noqa: E501
    (lambda m: posenc.hf.use(m, name="sdpa"), ValueError, r"name 'sdpa' is one of transformers' own attention implementations"),  # noqa: E501
    (lambda m: posenc.hf.register(3), TypeError, r"name must be a str, got 3 \(int\)"),
    (lambda m: posenc.hf.register(""), ValueError, r"name must be a plain non-empty name.*got ''"),
    (lambda m: posenc.hf.register("me/kernel"), ValueError, r"no '/'.*got 'me/kernel'"),
    (lambda m: posenc.hf.register("eager"), ValueError, r"name 'eager' is one of transformers' own"),
])
def test_bad_calls_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(_llama())


def test_a_swap_needs_a_rotary_to_replace():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=1, n_head=4)).eval()
    with pytest.raises(ValueError, match=r"scheme='alibi' replaces the model's rotary embedding, but "
                                         r"GPT2LMHeadModel has none.*use scheme=None"):
        posenc.hf.use(gpt2, "alibi")
    posenc.hf.use(gpt2)  # its own learned positions, posenc's attention: fine
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = (torch.arange(4) >= torch.tensor([[1], [0]])).long()
    ref = GPT2LMHeadModel(copy.deepcopy(gpt2.config)).eval()
    ref.load_state_dict(gpt2.state_dict())
    ref.set_attn_implementation("sdpa")
    # GPT-2 numbers a left-padded row from its first pad: compare the unpadded row
    torch.testing.assert_close(logits(gpt2, ids, attention_mask=mask)[1],
                               logits(ref, ids, attention_mask=mask)[1], **TOL)


def test_attention_function_refuses_what_it_cannot_place():
    from posenc.hf.adapter import attention_forward, positions_mask

    layer = _llama().model.layers[0].self_attn
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="attention_mask=None"):
        attention_forward(layer, q, k, k, None)
    # a bool 4-D mask is a who-sees-whom matrix (tests/test_silent_edges.py); a float one is not
    with pytest.raises(ValueError, match=r"its mask function did not make.*torch.float32 \(1, 1, 3, 5\)"):  # noqa: E501
        attention_forward(layer, q, k, k, torch.ones(1, 1, 3, 5))
    wrong = positions_mask(1, 3, 4, q_offset=1, attention_mask=torch.ones(1, 4))  # 4 key slots
    with pytest.raises(ValueError, match=r"handed posenc's attention 5 keys for 3 queries, but its mask "
                                         r"sizes describe 4 key slots.*refuses rather than guess"):
        attention_forward(layer, q, k, k, wrong)
    fresh = positions_mask(1, 3, 3)
    q3 = torch.randn(1, 4, 3, 16)
    k3 = torch.randn(1, 2, 3, 16)
    with pytest.raises(TypeError, match="position_ids must be an integer tensor, got Tensor torch.float32"):
        attention_forward(layer, q3, k3, k3, fresh, position_ids=torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"position_ids must have shape \[3\] or \[1, 3\] \(one position.*got \(3, 1, 3\)"):  # noqa: E501
        attention_forward(layer, q3, k3, k3, fresh, position_ids=torch.zeros(3, 1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="overlays a mask pattern of its own"):
        positions_mask(1, 3, 3, use_vmap=True)


def test_a_cache_that_hides_keys_is_refused():
    # transformers owns the cache; one whose keys its mask sizes do not describe (here: it
    # drops the oldest key but reports all of them) cannot give the keys' positions
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class Forgetful(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            k, v = super().update(key_states, value_states)
            return k[:, :, 1:], v[:, :, 1:]

    ref, ours = pair(LlamaForCausalLM, llama_config(), scheme="alibi")
    cache = DynamicCache(config=ours.config)
    cache.layers = [Forgetful() for _ in range(2)]
    with pytest.raises(ValueError, match="cannot tell the keys' positions"):
        ours(torch.tensor([[5, 6, 7]]), cache=cache)


def test_a_rope_instance_in_the_other_layout_warns():
    """RoPE(head_dim) defaults to interleaved pairs, Llama's weights to half-split ones: the
    probe measured 6e-3 off, silently; now a warning names the layout, and the right one is quiet."""
    import warnings

    model = _llama()
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    with pytest.warns(UserWarning, match=r"rotates interleaved pairs, but this model.s own RoPE"):
        posenc.hf.use(model, posenc.RoPE(head_dim))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        posenc.hf.use(model, posenc.RoPE(head_dim, interleaved=False))


def test_transformers_numbers_new_tokens_from_the_keys_held() -> None:
    """Chapter 11's eviction claim, against the installed transformers: without ``position_ids``
    a step after a cache that lost keys is placed at ``get_seq_length()`` (the keys held), not at
    the count of tokens seen; the caller must pass the true position."""
    from transformers import DynamicCache

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config()).eval()
    ids = torch.randint(2, VOCAB, (1, 12))
    nxt = torch.randint(2, VOCAB, (1, 1))
    with torch.no_grad():
        cache = DynamicCache()
        model(ids, cache=cache, use_cache=True)
        cache.crop(-4)  # the cache now holds 8 keys of the 12 tokens seen (the last 4 dropped)
        assert cache.get_seq_length() == 8
        states = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]

        def step(**kw: object) -> torch.Tensor:
            fresh = DynamicCache()
            for i, (k, v) in enumerate(states):
                fresh.update(k.clone(), v.clone(), i)
            return model(nxt, cache=fresh, use_cache=True, **kw).logits

        default = step()
        at_8 = step(position_ids=torch.tensor([[8]]))
        at_12 = step(position_ids=torch.tensor([[12]]))
    torch.testing.assert_close(default, at_8)  # numbered from the keys held
    assert (default - at_12).abs().max() > 1e-3  # not from the tokens seen


def test_own_rope_turns_by_the_forward_position_ids_not_the_mask():
    """README: with ``use(model)`` the model's own rotary turns q and k before attention, by the
    forward's ``position_ids``. A direct call on a left-padded row counts ``arange``: plain RoPE's
    scores do not notice the shift, a position-dependent rotary (dynamic NTK: it rescales once
    the batch reaches past ``max_position_embeddings``) does; ``cumsum(mask) - 1`` mends it for
    a one-row batch (with longer rows beside it, the batch's longest position scales every row,
    in transformers as here, whatever the positions)."""
    prompt = torch.tensor([[5, 17, 33, 8, 71, 9]])
    ids = torch.cat([torch.full((1, 6), PAD), prompt], dim=1)  # [1, 12]: 6 pads, then the prompt
    mask = (ids != PAD).long()
    counted = (mask.cumsum(-1) - 1).clamp(min=0)
    for rope, noticed in (({"rope_type": "default"}, False),
                          ({"rope_type": "dynamic", "factor": 2.0}, True)):
        config = llama_config(max_position_embeddings=8, initializer_range=0.2,
                              rope_parameters={**rope, "rope_theta": 10000.0})
        _, ours = pair(LlamaForCausalLM, config)
        alone = logits(ours, prompt)[0]
        direct = logits(ours, ids, attention_mask=mask)[0, 6:]
        assert ((direct - alone).abs().max() > 1e-3) == noticed
        torch.testing.assert_close(
            logits(ours, ids, attention_mask=mask, position_ids=counted)[0, 6:], alone, **TOL)
