"""Every public name of posenc.lab refuses wrong calls with a clear error naming the argument."""
# ruff: noqa: E501  (one case per line reads best as a table)

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.lab import (
    Corpus,
    EvalResult,
    Extrapolation,
    FineTuneConfig,
    ModelConfig,
    TrainConfig,
    TrainedModel,
    TransformerLM,
    build_model,
    cache_dir,
    evaluate,
    fine_tune,
    fine_tune_many,
    load_corpus,
    make_passkey,
    passkey_grid,
    rope_scaling_config,
    run_extrapolation,
    set_cache_dir,
    train_model,
    with_rope_scaling,
    yarn_betas,
)
from posenc.lab.serving import (
    PagedKVCache,
    attend_sharded,
    kvcache_step_reference,
    merge_partials,
    paged_attend,
    partial_attention,
    rebase_cache,
    shift_rotated_keys,
    tree_positions_and_mask,
)

NET = TransformerLM(scheme="rope", dim=32, num_heads=2, num_layers=1)
TOK = torch.randint(0, 256, (1, 8))
VAL = torch.zeros(400, dtype=torch.uint8)
X4 = torch.randn(1, 2, 4, 8)  # [B, H, L, Dh]
ROPE = posenc.RotaryEmbedding(8)
PAGED = PagedKVCache(4, 2, 2, 8)
PAGED.add_row()
FLASH = torch.randn(1, 1, 2, 8)  # flash-attn's [B, L, H, D]
FT = {"task": "lm", "length": 32, "steps": 2, "batch_size": 2, "lr": 1e-3, "warmup": 0,
      "min_lr_ratio": 0.1, "weight_decay": 0.1, "grad_clip": 1.0, "seed": 0}


def _cache_at(start: int, *, dim: int) -> posenc.KVCache:
    """A KVCache holding 4 keys of head_dim ``dim`` at positions ``start ..``."""
    cache, x = posenc.KVCache(), torch.randn(1, 2, 4, dim)
    posenc.attend(x, x, x, cache=cache, positions=torch.arange(start, start + 4))
    return cache


CASES = [
    ("TransformerLM", lambda: NET(TOK.float()), TypeError, "tokens"),
    ("TransformerLM", lambda: NET(torch.full((1, 4), 300)), ValueError, "tokens"),
    ("TransformerLM", lambda: NET([1, 2, 3]), TypeError, "tokens"),
    ("TransformerLM", lambda: NET(TOK, positions=torch.arange(8).float()), TypeError, "positions"),
    ("TransformerLM", lambda: NET(TOK, positions=torch.arange(5)), ValueError, "positions"),
    ("TransformerLM", lambda: TransformerLM(scheme="rope", dim=32, num_heads=2, bogus=1), TypeError, "bogus"),
    ("ModelConfig", lambda: ModelConfig(scheme="rope", dim=0), ValueError, "dim"),
    ("ModelConfig", lambda: ModelConfig(scheme="r"), ValueError, "scheme"),
    ("ModelConfig", lambda: ModelConfig(scheme="rope", dropout=0.1), TypeError, "dropout"),
    ("Corpus", lambda: Corpus(train=[1], val=VAL, sha256="0" * 64, bytes=1, files=()), TypeError, "train"),
    ("Corpus", lambda: Corpus(train=VAL, val=VAL.float(), sha256="0" * 64, bytes=1, files=()), TypeError, "val"),
    ("Corpus", lambda: Corpus(train=VAL, val=VAL, sha256="x", bytes=1, files=()), ValueError, "sha256"),
    ("load_corpus", lambda: load_corpus("os"), TypeError, "modules"),
    ("load_corpus", lambda: load_corpus([]), ValueError, "modules"),
    ("load_corpus", lambda: load_corpus(["nosuchmodule"]), ValueError, "modules"),
    ("load_corpus", lambda: load_corpus(root=5), TypeError, "root"),
    ("make_passkey", lambda: make_passkey(3), ValueError, "length"),
    ("make_passkey", lambda: make_passkey(200, depth=2.0), ValueError, "depth"),
    ("make_passkey", lambda: make_passkey(200, seed=-1), ValueError, "seed"),
    ("TrainConfig", lambda: TrainConfig(lr=0), ValueError, "lr"),
    ("TrainConfig", lambda: TrainConfig(dim=1.5), TypeError, "dim"),
    ("TrainConfig", lambda: TrainConfig(scheme="absolute"), ValueError, "scheme"),
    ("TrainConfig", lambda: TrainConfig(bogus=1), TypeError, "bogus"),
    ("TrainedModel", lambda: TrainedModel("m", TrainConfig(), 64, [], 0.0, False), TypeError, "model"),
    ("TrainedModel", lambda: TrainedModel(NET, TrainConfig(), 0, [], 0.0, False), ValueError, "train_len"),
    ("TrainedModel", lambda: TrainedModel(NET, TrainConfig(), 64, (1.0,), 0.0, False), TypeError, "history"),
    ("train_model", lambda: train_model({"scheme": "rope"}), TypeError, "config"),
    ("train_model", lambda: train_model(TrainConfig(), device="tpu"), ValueError, "device"),
    ("train_model", lambda: train_model(TrainConfig(), threads=0), ValueError, "threads"),
    ("train_model", lambda: train_model(TrainConfig(), corpus="x"), TypeError, "corpus"),
    ("build_model", lambda: build_model("rope"), TypeError, "config"),
    ("build_model", lambda: build_model({"scheme": "rope"}), TypeError, "config"),
    ("build_model", lambda: build_model(None), TypeError, "config"),
    ("evaluate", lambda: evaluate(NET, [1, 2, 3], [8], train_len=8), TypeError, "data"),
    ("evaluate", lambda: evaluate(NET, VAL, "8", train_len=8), TypeError, "lengths"),
    ("evaluate", lambda: evaluate("m", VAL, [8], train_len=8), TypeError, "model"),
    ("evaluate", lambda: evaluate(NET, VAL, [8]), ValueError, "train_len"),
    ("evaluate", lambda: evaluate(NET, VAL, [0], train_len=8), ValueError, "length"),
    ("EvalResult", lambda: EvalResult(0, 1, 1.0, None, torch.zeros(1)), ValueError, "length"),
    ("EvalResult", lambda: EvalResult(4, 0, 1.0, None, torch.zeros(4)), ValueError, "train_len"),
    ("EvalResult", lambda: EvalResult(4, 1, 1.0, None, torch.zeros(3)), ValueError, "per_position"),
    ("run_extrapolation", lambda: run_extrapolation("rope"), TypeError, "schemes"),
    ("run_extrapolation", lambda: run_extrapolation(["rope"], base={"x": 1}), TypeError, "base"),
    ("run_extrapolation", lambda: run_extrapolation(["rope"], eval_lens="64"), TypeError, "eval_lens"),
    ("run_extrapolation", lambda: run_extrapolation(["rope"], device="gpu0"), ValueError, "device"),
    ("run_extrapolation", lambda: run_extrapolation(["r"]), ValueError, "scheme"),
    ("Extrapolation", lambda: Extrapolation(config=[], corpus={}, evals={}, train_seconds={}), TypeError, "config"),
    ("Extrapolation", lambda: Extrapolation(config={}, corpus=None, evals={}, train_seconds={}), TypeError, "corpus"),
    ("Extrapolation", lambda: Extrapolation(config={}, corpus={}, evals=[], train_seconds={}), TypeError, "evals"),
    ("FineTuneConfig", lambda: FineTuneConfig(**{**FT, "task": "copy"}), ValueError, "task"),
    ("FineTuneConfig", lambda: FineTuneConfig(**{**FT, "steps": 0}), ValueError, "steps"),
    ("FineTuneConfig", lambda: FineTuneConfig(**{**FT, "lr": 0.0}), ValueError, "lr"),
    ("fine_tune", lambda: fine_tune(torch.nn.Linear(2, 2), length=8, steps=1), TypeError, "model"),
    ("fine_tune", lambda: fine_tune(NET, length=32, steps=0, cache=False), ValueError, "steps"),
    ("fine_tune", lambda: fine_tune(NET, length=32.0, steps=1, cache=False), TypeError, "length"),
    ("fine_tune", lambda: fine_tune(NET, length=32, steps=1, task="copy", cache=False), ValueError, "task"),
    ("fine_tune", lambda: fine_tune(NET, length=32, steps=1, device="tpu", cache=False), ValueError, "device"),
    ("fine_tune_many", lambda: fine_tune_many({"model": NET}), TypeError, "jobs"),
    ("fine_tune_many", lambda: fine_tune_many([NET]), TypeError, "jobs[0]"),
    ("fine_tune_many", lambda: fine_tune_many([{"model": NET, "lenght": 3}]), ValueError, "lenght"),
    ("passkey_grid", lambda: passkey_grid(NET, [200], "0.5"), TypeError, "depths"),
    ("passkey_grid", lambda: passkey_grid(NET, 200, [0.5]), TypeError, "lengths"),
    ("passkey_grid", lambda: passkey_grid(None, [200], [0.5]), TypeError, "model"),
    ("passkey_grid", lambda: passkey_grid(NET, [200], [1.5]), ValueError, "depths"),
    ("rope_scaling_config", lambda: rope_scaling_config("linear", 0.5, 64), ValueError, "factor"),
    ("rope_scaling_config", lambda: rope_scaling_config("lin", 2, 64), ValueError, "rope_type"),
    ("rope_scaling_config", lambda: rope_scaling_config("linear", 2, 0), ValueError, "original_len"),
    ("with_rope_scaling", lambda: with_rope_scaling("model", None), TypeError, "model"),
    ("with_rope_scaling", lambda: with_rope_scaling(NET, "linear"), TypeError, "scaling"),
    ("with_rope_scaling", lambda: with_rope_scaling(TransformerLM(scheme="alibi", dim=32, num_heads=2), None),
     ValueError, "RoPE"),
    ("yarn_betas", lambda: yarn_betas(0), ValueError, "original_len"),
    ("yarn_betas", lambda: yarn_betas(64, beta_fast=-1), ValueError, "beta_fast"),
    ("yarn_betas", lambda: yarn_betas("64"), TypeError, "original_len"),
    ("set_cache_dir", lambda: set_cache_dir(5), TypeError, "path"),
    ("set_cache_dir", lambda: set_cache_dir(["a"]), TypeError, "path"),
    ("set_cache_dir", lambda: set_cache_dir(b"x"), TypeError, "path"),
    ("cache_dir", lambda: cache_dir(1), TypeError, "argument"),
    ("cache_dir", lambda: cache_dir("x"), TypeError, "argument"),
    ("cache_dir", lambda: cache_dir(path="x"), TypeError, "path"),
    # chapter 11: posenc.lab.serving
    ("PagedKVCache", lambda: PagedKVCache(0, 4, 2, 8), ValueError, "num_blocks must be an int >= 1"),
    ("PagedKVCache", lambda: PagedKVCache(3, 4, 2, 8, block_order=[0, 0, 1]), ValueError, "a permutation of 0..2"),
    ("PagedKVCache", lambda: PAGED.append(0, torch.randn(3, 2, 8), torch.randn(3, 2, 8), torch.arange(2)), ValueError, "k must have shape [heads=2, L, head_dim=8]"),
    ("PagedKVCache", lambda: PAGED.gather(5), ValueError, "row must be one of the 1 rows"),
    ("PagedKVCache", lambda: PAGED.slot_mapping(0, 99), ValueError, "out of blocks"),
    ("paged_attend", lambda: paged_attend(X4, X4, X4, "cache", [0], positions=torch.arange(4)[None]), TypeError, "cache must be a PagedKVCache"),
    ("paged_attend", lambda: paged_attend(X4, X4, X4, PAGED, [0, 1], positions=torch.arange(4)[None]), ValueError, "rows must list one cache row per batch row"),
    ("paged_attend", lambda: paged_attend(X4, X4, X4, PAGED, [0], positions=torch.arange(4)), ValueError, "positions must have shape [B=1, L=4]"),
    ("shift_rotated_keys", lambda: shift_rotated_keys(X4, 3, 10000.0), TypeError, "rope must be a posenc.RotaryEmbedding or a posenc.RoPE scheme"),
    ("shift_rotated_keys", lambda: shift_rotated_keys(X4, 1.5, ROPE), TypeError, "shift must be an int"),
    ("shift_rotated_keys", lambda: shift_rotated_keys(X4, torch.arange(3), ROPE), ValueError, "shift must be an int or have shape [T=4]"),
    ("shift_rotated_keys", lambda: shift_rotated_keys(X4, 2, posenc.RotaryEmbedding(8, xpos_scale_base=512)), ValueError, "xPos scales keys by their position"),
    ("kvcache_step_reference", lambda: kvcache_step_reference(X4[0], X4, X4), ValueError, "q must be 4-D"),
    ("kvcache_step_reference", lambda: kvcache_step_reference(FLASH, torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8), FLASH, FLASH, cache_seqlens=4), ValueError, "cache_seqlens + Lnew must fit the cache's 4 slots"),
    ("kvcache_step_reference", lambda: kvcache_step_reference(FLASH, torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8), FLASH, None), ValueError, "give k and v together"),
    ("kvcache_step_reference", lambda: kvcache_step_reference(FLASH, torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8), rotary_cos=torch.ones(4, 4), rotary_sin=torch.ones(4, 4)), ValueError, "rotate the new k: give k and v"),
    ("partial_attention", lambda: partial_attention(X4, X4, X4, torch.arange(3), torch.arange(4)), ValueError, "q_pos must be [Lq=4]"),
    ("partial_attention", lambda: partial_attention(X4, X4, X4, torch.arange(4).float(), torch.arange(4)), TypeError, "q_pos"),
    ("partial_attention", lambda: partial_attention(X4, torch.randn(1, 3, 4, 8), X4, torch.arange(4), torch.arange(4)), ValueError, "H % H_kv == 0"),
    ("merge_partials", lambda: merge_partials(torch.zeros(2, 3), torch.zeros(2)), TypeError, "lists of tensors"),
    ("merge_partials", lambda: merge_partials([], []), ValueError, "one tensor per block"),
    ("merge_partials", lambda: merge_partials([torch.zeros(2, 3)], [torch.zeros(3)]), ValueError, "do not fit"),
    ("attend_sharded", lambda: attend_sharded(X4, X4, X4, shards=0), ValueError, "shards must be an int >= 1"),
    ("attend_sharded", lambda: attend_sharded(X4, X4, X4, shards=3), ValueError, "seq_len=4 must be divisible by world_size = 3"),
    ("attend_sharded", lambda: attend_sharded(X4, X4, X4, "rope", shards=2), TypeError, "scheme must be a PositionScheme"),
    ("attend_sharded", lambda: attend_sharded(X4, X4, X4, shards=2, load_balance=1), TypeError, "load_balance must be a bool"),
    ("rebase_cache", lambda: rebase_cache(posenc.KVCache(max_len=4), ROPE), TypeError, "a static KVCache"),
    ("rebase_cache", lambda: rebase_cache(posenc.KVCache(), ROPE, keep=-1), ValueError, "keep must be an int >= 0"),
    ("rebase_cache", lambda: rebase_cache(posenc.KVCache(), "rope"), TypeError, "rope must be a posenc.RotaryEmbedding"),
    ("tree_positions_and_mask", lambda: tree_positions_and_mask([-1, 1]), ValueError, "parents[1] must be -1 or an earlier node"),
    ("tree_positions_and_mask", lambda: tree_positions_and_mask([-2]), ValueError, "parents[0] must be an int >= -1"),
    ("tree_positions_and_mask", lambda: tree_positions_and_mask("01"), TypeError, "parents must be a list of ints"),
    ("tree_positions_and_mask", lambda: tree_positions_and_mask([-1], prefix=-1), ValueError, "prefix must be an int >= 0"),
    # the wrong-call probe's findings (a silent answer, a leaked RuntimeError, an unclear message)
    ("shift_rotated_keys", lambda: shift_rotated_keys(torch.randn(1, 2, 4, 16), 3, ROPE), ValueError, "k must end in rope's head_dim=8"),
    ("shift_rotated_keys", lambda: shift_rotated_keys(torch.randn(1, 2, 4, 7), 3, ROPE), ValueError, "k must end in rope's head_dim=8"),
    ("rebase_cache", lambda: rebase_cache(_cache_at(100, dim=16), ROPE, keep=1), ValueError, "the cached keys must end in rope's head_dim=8"),
    ("paged_attend", lambda: paged_attend(torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8), PAGED, [0, 0], positions=torch.zeros(2, 1, dtype=torch.long)), ValueError, "rows must name each cache row at most once"),
    ("paged_attend", lambda: paged_attend(X4, X4, X4, PAGED, torch.tensor([0.0]), positions=torch.arange(4)[None]), TypeError, "rows must be a list of ints or a 1-D integer tensor"),
    ("paged_attend", lambda: paged_attend(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), PAGED, [0], positions=torch.arange(4)[None]), ValueError, "posenc's layout is [B, H, L, head_dim]"),
    ("PagedKVCache", lambda: PagedKVCache(4, 2, 2, 8, dtype=torch.long), TypeError, "dtype must be a floating torch.dtype"),
    ("PagedKVCache", lambda: PAGED.append(0, torch.randn(2, 1, 8, dtype=torch.float64), torch.randn(2, 1, 8, dtype=torch.float64), torch.arange(1)), ValueError, "k is torch.float64 on cpu, the cache holds torch.float32"),
    ("kvcache_step_reference", lambda: kvcache_step_reference(FLASH.double(), torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8)), TypeError, "q, k_cache, v_cache must share one dtype"),
    ("kvcache_step_reference", lambda: kvcache_step_reference(FLASH, torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8), cache_seqlens=1, alibi_slopes=torch.ones(3)), ValueError, "alibi_slopes must have shape [H=2] or [B=1, H=2]"),
    ("partial_attention", lambda: partial_attention(X4, X4, X4, torch.arange(4), torch.arange(4), posenc.ALiBi(4)), ValueError, "scheme 'alibi' has a bias for 4 heads but q has 2 heads"),
    ("partial_attention", lambda: partial_attention(X4, X4, X4, torch.arange(4), torch.arange(4), posenc.RotaryEmbedding), TypeError, "got the class RotaryEmbedding"),
    ("partial_attention", lambda: partial_attention(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.arange(4), torch.arange(4)), ValueError, "posenc's layout is [B, H, L, head_dim]"),
    ("attend_sharded", lambda: attend_sharded(X4, X4, X4, posenc.RoPE, shards=2), TypeError, "got the class RoPE; pass an instance"),
]


@pytest.mark.parametrize(("name", "call", "error", "needle"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input(name, call, error, needle):
    with pytest.raises(error) as exc:
        call()
    assert needle in str(exc.value), (name, str(exc.value))


def test_every_public_lab_name_has_three_cases():
    import posenc.lab

    counts = {n: sum(c[0] == n for c in CASES) for n in posenc.lab.__all__ if n != "plot"}
    assert all(v >= 3 for v in counts.values()), {n: v for n, v in counts.items() if v < 3}
