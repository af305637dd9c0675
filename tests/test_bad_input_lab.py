"""Every public name of posenc.lab refuses wrong calls with a clear error naming the argument."""
# ruff: noqa: E501  (one case per line reads best as a table)

from __future__ import annotations

import pytest
import torch

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

NET = TransformerLM(scheme="rope", dim=32, num_heads=2, num_layers=1)
TOK = torch.randint(0, 256, (1, 8))
VAL = torch.zeros(400, dtype=torch.uint8)
FT = {"task": "lm", "length": 32, "steps": 2, "batch_size": 2, "lr": 1e-3, "warmup": 0,
      "min_lr_ratio": 0.1, "weight_decay": 0.1, "grad_clip": 1.0, "seed": 0}

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
