"""Training, the weights cache, evaluation and the experiment runner, on tiny configs."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from posenc.lab import (
    TrainConfig,
    TrainedModel,
    build_model,
    cache_dir,
    evaluate,
    load_corpus,
    run_extrapolation,
    set_cache_dir,
    train_model,
)
from posenc.lab.evaluate import passkey_accuracy
from posenc.lab.train import lr_at

TINY = TrainConfig(scheme="rope", dim=32, num_layers=1, num_heads=2, mlp_ratio=2, train_len=16,
                   batch_size=8, steps=40, warmup=5, lr=1e-2)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv("POSENC_CACHE", raising=False)
    set_cache_dir(tmp_path / "cache")
    yield tmp_path / "cache"
    set_cache_dir(None)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def params(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_training_lowers_the_loss(corpus):
    trained = train_model(TINY, corpus=corpus, progress=False, cache=False)
    assert isinstance(trained, TrainedModel) and trained.config is TINY
    assert trained.train_len == TINY.train_len and trained.train_seconds > 0
    h = trained.history
    assert len(h) == TINY.steps and all(math.isfinite(x) for x in h)
    assert sum(h[-5:]) / 5 < sum(h[:5]) / 5 - 0.5
    assert h[0] == pytest.approx(math.log(256), abs=0.3)  # starts near uniform over bytes
    assert not trained.model.training and trained.from_cache is False
    # a result object, nothing set on the module; and it cannot be changed
    assert not {"history", "train_config", "from_cache", "train_seconds"} & set(vars(trained.model))
    with pytest.raises(AttributeError):
        trained.history = []


def test_determinism_for_a_fixed_seed(corpus):
    cfg = replace(TINY, steps=6)
    a = train_model(cfg, corpus=corpus, progress=False, cache=False)
    b = train_model(cfg, corpus=corpus, progress=False, cache=False)
    c = train_model(replace(cfg, seed=1), corpus=corpus, progress=False, cache=False)
    assert a.history == b.history
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k
    assert a.history != c.history


def test_cache_round_trip(cache, corpus):
    cfg = replace(TINY, steps=5, scheme="t5")
    a = train_model(cfg, corpus=corpus, progress=False)
    path = cfg.cache_path(corpus.sha256)
    assert path.is_file() and path.parent == cache and not list(cache.glob("*.tmp"))
    state = torch.load(path, weights_only=True)  # plain tensors and containers only
    assert state["key"] == cfg.key(corpus.sha256) and state["config"] == cfg.to_dict()
    assert path.stat().st_size < 200_000
    b = train_model(cfg, corpus=corpus, progress=False)
    assert b.from_cache and b.history == a.history and b.train_seconds == a.train_seconds
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k
    # a damaged file is replaced by a fresh training run
    path.write_bytes(b"not a checkpoint")
    c = train_model(cfg, corpus=corpus, progress=False)
    assert not c.from_cache and torch.load(path, weights_only=True)["key"] == state["key"]


def test_cache_key_is_the_full_config():
    sha = "0" * 64
    key = TINY.key(sha)
    for change in ({"steps": 41}, {"lr": 0.02}, {"seed": 1}, {"train_len": 32}, {"dim": 64},
                   {"scheme": "alibi"}, {"batch_size": 4}, {"weight_decay": 0.0},
                   {"scheme_options": {"base": 100.0}}):
        assert replace(TINY, **change).key(sha) != key, change
    assert TINY.key("1" * 64) != key
    # the learned table's size matters only to the learned scheme
    assert replace(TINY, max_len=999).key(sha) == key
    learned = replace(TINY, scheme="learned")
    assert replace(learned, max_len=999).key(sha) != learned.key(sha)
    assert replace(TINY, scheme="learned").model_config().max_len == 16 * TINY.train_len
    sin = replace(TINY, scheme="sinusoidal", scheme_options={"scale": True})
    assert sin.model_config().scheme_kwargs == {"scale": True}
    assert replace(TINY, scheme="t5").model_config().scheme_kwargs == {"max_distance": 17}


def test_cache_dir_setting_and_environment(monkeypatch, tmp_path):
    set_cache_dir(None)
    monkeypatch.delenv("POSENC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() in (tmp_path / "xdg" / "posenc", Path.home() / ".cache" / "posenc")
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "env"))
    assert cache_dir() == tmp_path / "env"
    set_cache_dir(tmp_path / "explicit")
    try:
        assert cache_dir() == tmp_path / "explicit"
    finally:
        set_cache_dir(None)


def test_lr_schedule():
    cfg = replace(TINY, steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_evaluate(corpus):
    model = build_model(replace(TINY, scheme="alibi"))
    out = evaluate(model, corpus.val, [8, 16, 48], train_len=16, num_tokens=480, batch_tokens=100)
    assert out[8].tail_loss is None and out[16].tail_loss is None
    r = out[48]
    assert r.per_position.shape == (48,) and r.num_windows == 10
    assert r.loss == pytest.approx(float(r.per_position.mean()), rel=1e-6)
    assert r.tail_loss == pytest.approx(float(r.per_position[16:].mean()), rel=1e-6)
    # a TrainedModel brings its own train_len
    wrapped = TrainedModel(model, TINY, 16, [], 0.0, from_cache=False)
    again = evaluate(wrapped, corpus.val, [48], num_tokens=480, batch_tokens=10_000)[48]
    torch.testing.assert_close(again.per_position, r.per_position)
    assert again.tail_loss == r.tail_loss
    with pytest.raises(ValueError, match="train_len"):
        evaluate(build_model(TINY), corpus.val, [8])
    assert 0.0 <= passkey_accuracy(model, 160, num=2) <= 1.0


def test_bad_config():
    with pytest.raises(ValueError, match="unknown scheme"):
        TrainConfig(scheme="absolute")
    with pytest.raises(TypeError, match="steps must be an int"):
        TrainConfig(steps=10.5)
    with pytest.raises(ValueError, match="max_len must be >= train_len"):
        TrainConfig(train_len=64, max_len=32)
    with pytest.raises(TypeError, match="TrainConfig"):
        train_model({"scheme": "rope"})


def test_run_extrapolation_json_shape(cache, corpus):
    ex = run_extrapolation(["alibi", "learned"], base=replace(TINY, steps=3), eval_lens=[16, 40],
                           seeds=[0, 1], progress=False, num_tokens=400, corpus=corpus)
    js = ex.to_json()
    assert js["corpus"]["sha256"] == corpus.sha256 and js["corpus"]["bytes"] == corpus.bytes
    assert set(js["results"]) == {"alibi", "learned"}
    assert set(js["results"]["alibi"]) == {"16", "40"}
    assert js["results"]["alibi"]["16"]["tail_loss"] is None
    vals = ex.values("learned", 40)
    assert js["results"]["learned"]["40"]["loss"] == pytest.approx(sum(vals) / 2)
    assert js["config"]["seeds"] == [0, 1] and js["config"]["eval_lens"] == [16, 40]
    assert "±" in ex.table() and ex.per_position("alibi", 40).shape == (40,)
    # warm cache: nothing is trained or evaluated again, and the numbers are the same
    lines = []
    again = run_extrapolation(["alibi", "learned"], base=replace(TINY, steps=3), eval_lens=[16, 40],
                              seeds=[0, 1], progress=False, num_tokens=400, corpus=corpus,
                              log=lines.append)
    assert len(lines) == 4 and all("loaded from cache" in line for line in lines)
    assert again.to_json() == js
    torch.testing.assert_close(again.per_position("learned", 40), ex.per_position("learned", 40))
    with pytest.raises(ValueError, match="unknown scheme"):
        run_extrapolation(["alibi", "bogus"], base=TINY, progress=False)
    with pytest.raises(ValueError, match="validation bytes"):
        run_extrapolation(["alibi"], base=TINY, eval_lens=[10**9], progress=False, corpus=corpus)


def test_parallel_workers_equal_a_sequential_run(tmp_path, monkeypatch, corpus):
    monkeypatch.delenv("POSENC_CACHE", raising=False)
    kwargs = {"base": replace(TINY, steps=4), "eval_lens": [16, 32], "progress": False,
              "num_tokens": 320, "corpus": corpus}
    set_cache_dir(tmp_path / "one")
    try:
        one = run_extrapolation(["alibi", "sinusoidal"], workers=1, **kwargs)
        set_cache_dir(tmp_path / "two")
        lines = []
        two = run_extrapolation(["alibi", "sinusoidal"], workers=2, log=lines.append, **kwargs)
    finally:
        set_cache_dir(None)
    assert two.to_json() == one.to_json()
    assert sorted(line.split()[0] for line in lines) == ["alibi", "sinusoidal"]
    assert len(list((tmp_path / "two").glob("lm-*.pt"))) == 2
