"""posenc.lab.long_context: scaling configs, zero-shot copies, fine-tuning with a cache, passkey grid."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import rope_inv_freq
from posenc.lab import TrainConfig, TrainedModel, build_model, load_corpus, set_cache_dir
from posenc.lab.data import passkey_min_length
from posenc.lab.long_context import (
    YARN_REFERENCE_LEN,
    fine_tune,
    passkey_grid,
    rope_modules,
    rope_scaling_config,
    with_rope_scaling,
    yarn_betas,
)
from posenc.lab.model import ModelConfig, TransformerLM

TINY = TrainConfig(scheme="rope", dim=32, num_layers=1, num_heads=2, mlp_ratio=2, train_len=16,
                   batch_size=4, steps=5, warmup=1, lr=1e-2)
HEAD_DIM = TINY.dim // TINY.num_heads


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv("POSENC_CACHE", raising=False)
    set_cache_dir(tmp_path / "cache")
    yield tmp_path / "cache"
    set_cache_dir(None)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def tiny_model() -> TrainedModel:
    """An untrained network wrapped as train_model would return it."""
    return TrainedModel(build_model(TINY).eval(), TINY, TINY.train_len, [], 0.0, from_cache=False)


def tokens(n: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 256, (batch, n), generator=torch.Generator().manual_seed(n))


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------- configs


@pytest.mark.parametrize("rope_type", ["linear", "ntk", "dynamic", "yarn", "llama3"])
def test_configs_are_valid_hf_dicts(rope_type):
    cfg = rope_scaling_config(rope_type, 4, 64)
    assert cfg["rope_type"] == rope_type and cfg["factor"] == 4.0
    inv, _ = rope_inv_freq(128, scaling=cfg, seq_len=256)
    assert inv.shape == (64,) and torch.isfinite(inv).all()
    if rope_type == "dynamic":
        assert cfg["max_position_embeddings"] == 64
    if rope_type in ("yarn", "llama3"):
        assert cfg["original_max_position_embeddings"] == 64
        assert cfg["max_position_embeddings"] == 256


def test_config_values_and_overrides():
    plain, _ = rope_inv_freq(16)
    lin, _ = rope_inv_freq(16, scaling=rope_scaling_config("linear", 4, 64))
    torch.testing.assert_close(lin, plain / 4)
    assert rope_scaling_config("default", 1, 64) is None
    y = rope_scaling_config("yarn", 8, 64, beta_fast=4.0, attention_factor=1.0)
    assert y["beta_fast"] == 4.0 and y["attention_factor"] == 1.0
    l3 = rope_scaling_config("llama3", 8, 8192)
    assert (l3["low_freq_factor"], l3["high_freq_factor"]) == (1.0, 4.0)
    f = [1.0] * 8
    lr = rope_scaling_config("longrope", 4, 64, short_factor=f, long_factor=[4.0] * 8)
    inv, _ = rope_inv_freq(16, scaling=lr, seq_len=65)
    torch.testing.assert_close(inv, plain / 4)


@pytest.mark.parametrize(
    ("args", "kwargs", "err"),
    [
        (("bogus", 2, 64), {}, ValueError),
        ((None, 2, 64), {}, ValueError),
        (("linear", 0.5, 64), {}, ValueError),
        (("linear", 2, 0), {}, ValueError),
        (("linear", "2", 64), {}, TypeError),
        (("linear", 2, 64.0), {}, TypeError),
        (("longrope", 2, 64), {}, ValueError),
        (("default", 1, 64), {"beta_fast": 3}, ValueError),
    ],
)
def test_config_bad_input(args, kwargs, err):
    with pytest.raises(err):
        rope_scaling_config(*args, **kwargs)


def test_yarn_betas():
    assert yarn_betas(YARN_REFERENCE_LEN) == {"beta_fast": 32.0, "beta_slow": 1.0}
    b = yarn_betas(64)
    assert b["beta_fast"] == pytest.approx(0.5) and b["beta_slow"] == pytest.approx(1 / 64)
    # the same share of pairs falls on each side of the ramp: pair index at beta, as a share
    def share(length, beta, d=128, base=10000.0):
        return math.log(length / (2 * math.pi * beta)) / math.log(base)

    assert share(64, b["beta_fast"]) == pytest.approx(share(4096, 32.0))
    with pytest.raises(ValueError):
        yarn_betas(0)
    with pytest.raises(ValueError):
        yarn_betas(64, beta_fast=-1.0)
    with pytest.raises(TypeError):
        yarn_betas(64.0)


# --------------------------------------------------------------------- zero shot


def test_with_rope_scaling_copies_and_leaves_the_original_alone():
    trained = tiny_model()
    model = trained.model
    x = tokens(40)
    before = model(x)
    w = weights(model)
    cfg = rope_scaling_config("ntk", 4, TINY.train_len)
    result = with_rope_scaling(trained, cfg)
    assert isinstance(result, TrainedModel) and result.config is TINY
    assert result.train_len == TINY.train_len and result.model is not model
    scaled = result.model
    assert isinstance(with_rope_scaling(model, cfg), TransformerLM)  # bare in, bare out
    assert "rope_scaling" not in vars(scaled)  # nothing set on the module
    torch.testing.assert_close(model(x), before)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, w[k])
        torch.testing.assert_close(scaled.state_dict()[k], v)
    assert not torch.allclose(scaled(x), before)
    # one scheme shared by every block, as in the original
    assert len(rope_modules(scaled)) == 1
    rot = rope_modules(scaled)[0].rotary
    inv, _ = rope_inv_freq(HEAD_DIM, scaling=cfg)
    torch.testing.assert_close(rot.inv_freq, inv)
    assert all(b.attn.scheme is scaled.scheme for b in scaled.blocks)


def test_identity_scalings_change_nothing():
    model = tiny_model().model
    x = tokens(40)
    ref = model(x)
    for cfg in (None, rope_scaling_config("linear", 1, 16), rope_scaling_config("yarn", 1, 16),
                rope_scaling_config("dynamic", 4, 64)):  # dynamic: unchanged up to its length
        torch.testing.assert_close(with_rope_scaling(model, cfg)(x), ref)


def test_linear_scaling_is_position_interpolation():
    """PI with factor s at positions s*k equals the original model at positions k."""
    model = tiny_model().model
    x = tokens(24)
    s = 4
    scaled = with_rope_scaling(model, rope_scaling_config("linear", s, 16))
    pos = torch.arange(24)
    torch.testing.assert_close(scaled(x, positions=s * pos), model(x, positions=pos),
                               rtol=1e-4, atol=1e-4)


def test_with_rope_scaling_keeps_partial_rotary_and_base():
    cfg = ModelConfig(scheme="rope", dim=32, num_layers=1, num_heads=2,
                      scheme_kwargs={"partial_rotary_factor": 0.5, "base": 500.0})
    model = TransformerLM(cfg)
    scaled = with_rope_scaling(model, {"rope_type": "linear", "factor": 2.0})
    rot = rope_modules(scaled)[0].rotary
    assert rot.rotary_dim == 8 and rot.base == 500.0
    plain, _ = rope_inv_freq(16, base=500.0, scaling={"partial_rotary_factor": 0.5})
    torch.testing.assert_close(rot.inv_freq, plain / 2)


def test_with_rope_scaling_bad_input():
    with pytest.raises(ValueError, match="no RoPE"):
        with_rope_scaling(TransformerLM(scheme="alibi", dim=32, num_heads=2, num_layers=1), None)
    with pytest.raises(TypeError):
        with_rope_scaling("model", None)
    with pytest.raises(TypeError):
        with_rope_scaling(tiny_model(), "linear")
    with pytest.raises(ValueError):
        with_rope_scaling(tiny_model(), {"rope_type": "linear"})  # factor missing


# --------------------------------------------------------------------- fine-tuning


def test_fine_tune_trains_a_copy_and_caches_it(cache, corpus):
    model = tiny_model()
    w = weights(model.model)
    a = fine_tune(model, length=32, steps=4, corpus=corpus, device="cpu")
    assert isinstance(a, TrainedModel) and a.train_len == 32 and a.config.length == 32
    assert len(a.history) == 4 and all(math.isfinite(h) for h in a.history)
    assert a.from_cache is False and not a.model.training
    assert a.config.batch_size == TINY.batch_size * TINY.train_len // 32
    for k, v in model.model.state_dict().items():
        torch.testing.assert_close(v, w[k])  # the original is untouched
    assert any(not torch.equal(v, w[k]) for k, v in a.model.state_dict().items())
    assert len(list(cache.glob("ft-lm-32-*.pt"))) == 1
    b = fine_tune(model, length=32, steps=4, corpus=corpus, device="cpu")
    assert b.from_cache is True and b.history == a.history
    for k, v in a.model.state_dict().items():
        torch.testing.assert_close(b.model.state_dict()[k], v)
    # the bare network starts from the same weights: the same cache entry
    bare = fine_tune(model.model, length=32, steps=4, batch_size=a.config.batch_size, corpus=corpus,
                     device="cpu")
    assert bare.from_cache is True and bare.history == a.history
    # another scaling is another starting point: another cache entry
    scaled = with_rope_scaling(model, rope_scaling_config("linear", 2, 16))
    c = fine_tune(scaled, length=32, steps=4, corpus=corpus, device="cpu")
    assert c.from_cache is False and len(list(cache.glob("ft-lm-32-*.pt"))) == 2
    assert rope_modules(c.model)[0].rotary.scaling["rope_type"] == "linear"


def test_fine_tune_is_deterministic_without_cache(corpus):
    model = tiny_model()
    a = fine_tune(model, length=16, steps=3, corpus=corpus, cache=False, device="cpu")
    b = fine_tune(model, length=16, steps=3, corpus=corpus, cache=False, device="cpu")
    assert a.history == b.history


def test_fine_tune_passkey(cache):
    n = passkey_min_length() + 8
    p = fine_tune(tiny_model(), task="passkey", length=n, steps=3, batch_size=2, device="cpu")
    assert len(p.history) == 3 and all(math.isfinite(h) for h in p.history)
    assert list(cache.glob(f"ft-passkey-{n}-*.pt"))


@pytest.mark.parametrize(
    ("kwargs", "err"),
    [
        ({"length": 32, "steps": 0}, ValueError),
        ({"length": 1, "steps": 2}, ValueError),
        ({"length": 32, "steps": 2, "task": "copy"}, ValueError),
        ({"length": 32, "steps": 2, "task": "passkey"}, ValueError),  # too short for a passkey
        ({"length": 32, "steps": 2, "lr": 0.0}, ValueError),
        ({"length": 32.0, "steps": 2}, TypeError),
        ({"length": 32, "steps": 2, "batch_size": 0}, ValueError),
    ],
)
def test_fine_tune_bad_input(kwargs, err):
    with pytest.raises(err):
        fine_tune(tiny_model(), cache=False, **kwargs)


def test_fine_tune_needs_a_transformer_lm():
    with pytest.raises(TypeError):
        fine_tune(torch.nn.Linear(2, 2), length=8, steps=1)


# --------------------------------------------------------------------- passkey grid


def test_passkey_grid_shape_and_range():
    n = passkey_min_length()
    g = passkey_grid(tiny_model(), [n, n + 20], [0.0, 0.5, 1.0], num=2)
    assert g.shape == (3, 2) and ((g >= 0) & (g <= 1)).all()
    with pytest.raises(ValueError):
        passkey_grid(tiny_model(), [n - 1], [0.5])
    with pytest.raises(ValueError):
        passkey_grid(tiny_model(), [n], [1.5])
    with pytest.raises(ValueError):
        passkey_grid(tiny_model(), [], [0.5])
