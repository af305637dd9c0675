"""posenc.hf.extend_context: a config transformers accepts without a warning, with transformers'
own frequencies; a model's scaling kept, never replaced; bad requests refused."""

from __future__ import annotations

import io
import json
import logging

import pytest
import torch

import posenc
from posenc.hf import extend_context
from posenc.rope_families import family

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402


class _Log:
    """Everything transformers logs at WARNING or above while the block runs."""

    def __enter__(self) -> io.StringIO:
        transformers.utils.logging.warning_once.cache_clear()  # a repeated warning counts too
        self.buf = io.StringIO()
        self.handler = logging.StreamHandler(self.buf)
        self.handler.setLevel(logging.WARNING)
        self.logger = logging.getLogger("transformers")
        self.logger.addHandler(self.handler)
        return self.buf

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)


def _build(cls, cfg: dict):
    """The dict through transformers' own constructor, with nothing logged."""
    with _Log() as log:
        config = cls(**json.loads(json.dumps(cfg)))
    assert log.getvalue() == "", log.getvalue()
    return config


def _check(config, length: int, layer_type: str | None = None) -> None:
    params = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
    kw = {} if layer_type is None else {"layer_type": layer_type}
    inv, attn = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, seq_len=length, **kw)
    report = posenc.explain(config, context=length)
    if layer_type is not None:
        report = next(r for r in (report, *report.layers) if r.layer_type == layer_type)
    torch.testing.assert_close(report.scaled_inv_freq, inv.float(), rtol=0, atol=0)
    assert report.attention_factor == pytest.approx(attn, rel=1e-12)
    assert not [i for i in report.issues if i.field == "context"], report.issues


_TINY = {"hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 256,
         "rope_theta": 5000.0}  # fmt: skip


@pytest.mark.parametrize("method", ["yarn", "llama3", "linear", "dynamic"])
@pytest.mark.parametrize("as_object", [True, False])
def test_round_trip_through_transformers(method, as_object):
    base = transformers.LlamaConfig(**_TINY) if as_object else dict(_TINY)
    with _Log() as log:
        longer = extend_context(base, 1024, method=method)
    assert log.getvalue() == ""
    assert type(longer) is type(base)
    config = longer if as_object else _build(transformers.LlamaConfig, longer)
    params = config.rope_parameters
    assert params["rope_type"] == method and params["rope_theta"] == 5000.0
    assert params["factor"] == 4.0
    if method in ("yarn", "llama3"):
        assert params["original_max_position_embeddings"] == 256
        assert config.max_position_embeddings == 1024
    if method == "dynamic":  # transformers' dynamic rule scales from max_position_embeddings
        assert config.max_position_embeddings == 256
    _check(config, 1024)
    rebuilt = _build(transformers.LlamaConfig, config.to_dict())
    _check(rebuilt, 1024)
    if as_object:
        assert base.rope_parameters == {"rope_theta": 5000.0, "rope_type": "default"}


def test_yarn_options_survive():
    longer = extend_context(dict(_TINY), 2048, beta_fast=16.0, beta_slow=2.0, truncate=False)
    config = _build(transformers.LlamaConfig, longer)
    assert config.rope_parameters["beta_fast"] == 16.0
    assert config.rope_parameters["truncate"] is False
    _check(config, 2048)


def test_llama31_keeps_llama3():
    cfg = family("llama3.1")["config"]
    longer = extend_context(cfg, 262144)
    scaling = longer["rope_scaling"]
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 32.0
    assert scaling["original_max_position_embeddings"] == 8192
    assert (scaling["low_freq_factor"], scaling["high_freq_factor"]) == (1.0, 4.0)
    assert longer["rope_theta"] == 500000.0 and longer["max_position_embeddings"] == 262144
    assert cfg["rope_scaling"]["factor"] == 8.0  # the input is untouched
    config = _build(transformers.LlamaConfig, longer)
    assert config.rope_parameters["rope_theta"] == 500000.0
    _check(config, 262144)
    v5 = transformers.LlamaConfig(**cfg)
    out = extend_context(v5, 262144, method="llama3")
    assert out.rope_parameters["rope_theta"] == 500000.0 and out.rope_parameters["factor"] == 32
    with pytest.raises(ValueError, match="'llama3'.*keeps a model's scaling"):
        extend_context(cfg, 262144, method="linear")
    with pytest.raises(ValueError, match="'llama3'"):
        extend_context(v5, 262144, method="yarn")


@pytest.mark.parametrize("name", ["qwen2.5", "gpt-oss", "deepseek-v3"])
def test_yarn_families_widen_their_yarn(name):
    fam = family(name)
    cfg = fam["config"]
    before = dict(cfg["rope_scaling"])
    trained = before["original_max_position_embeddings"]
    longer = extend_context(cfg, trained * 64)
    after = longer["rope_scaling"]
    assert _type(after) == "yarn" and after["factor"] == 64.0
    assert after["original_max_position_embeddings"] == trained
    kept = {k: v for k, v in before.items() if k not in ("factor", "type", "rope_type")}
    assert {k: after[k] for k in kept} == kept
    cls = {"qwen2.5": transformers.Qwen2Config, "gpt-oss": transformers.GptOssConfig,
           "deepseek-v3": transformers.DeepseekV3Config}[name]  # fmt: skip
    config = _build(cls, longer)
    assert config.rope_parameters["rope_theta"] == cfg["rope_theta"]
    _check(config, trained * 64)


def _type(p: dict) -> str:
    return p.get("rope_type") or p.get("type")


def test_per_layer_types_survive():
    gemma = transformers.Gemma3TextConfig(**family("gemma3")["config"])
    before = json.loads(json.dumps(gemma.rope_parameters))
    longer = extend_context(gemma, 262144)
    params = longer.rope_parameters
    assert params["sliding_attention"] == before["sliding_attention"]  # unscaled: left alone
    full = params["full_attention"]
    assert full["rope_type"] == "linear" and full["factor"] == 16.0
    assert full["rope_theta"] == 1_000_000.0 and longer.max_position_embeddings == 262144
    _check(longer, 262144, "full_attention")
    both = extend_context(gemma, 262144, layer_types=["full_attention", "sliding_attention"])
    assert both.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0


def test_longrope_needs_its_factors():
    phi = family("phi3.5-mini")["config"]
    with pytest.raises(ValueError, match="short_factor"):
        extend_context(phi, 262144)
    n = 48
    longer = extend_context(phi, 262144, short_factor=[1.0] * n, long_factor=[2.0] * n)
    assert longer["original_max_position_embeddings"] == 4096
    assert longer["rope_scaling"]["long_factor"] == [2.0] * n
    with pytest.raises(ValueError, match="short_factor"):
        extend_context(dict(_TINY), 1024, method="longrope")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"length": 128}, ValueError, "length must be >= the trained length 256"),
    ({"length": -5}, ValueError, "length"),
    ({"length": 1024.0}, TypeError, "length"),
    ({"length": 1024, "method": "ntk"}, ValueError, r"method must be one of \['yarn'"),
    ({"length": 1024, "method": "yarn", "factor": 2.0}, ValueError, "allowed"),
    ({"length": 1024, "method": "linear", "beta_fast": 2.0}, ValueError, "'linear'"),
    ({"length": 1024, "layer_types": ["full_attention"]}, ValueError, "layer_types"),
])  # fmt: skip
def test_bad_requests(kwargs, error, match):
    with pytest.raises(error, match=match):
        extend_context(dict(_TINY), **kwargs)


def test_bad_config_type():
    with pytest.raises(TypeError, match="config must be"):
        extend_context(42, 1024)
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        extend_context({**_TINY, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, 1024)


# Found by an outside probe (helper explainprobe): each of these once returned a config that
# transformers warns about, or narrowed a model's own scaling without a word.


def test_an_already_scaled_window_is_never_narrowed():
    llama3 = {**_TINY, "max_position_embeddings": 2048, "rope_parameters": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256, "rope_theta": 500000.0}}  # fmt: skip
    with pytest.raises(ValueError, match=r"below the 2048 positions .*'llama3' .*factor 8.0"):
        extend_context(llama3, 1024)
    assert extend_context(llama3, 2048)["rope_parameters"] == llama3["rope_parameters"]
    linear = {**_TINY, "max_position_embeddings": 1024,
              "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5000.0}}
    with pytest.raises(ValueError, match="below the 1024 positions"):
        extend_context(linear, 512)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"beta_fast": "x"}, TypeError, "beta_fast must be a real number"),
    ({"beta_fast": 1.0, "beta_slow": 32.0}, ValueError, "beta_fast must be greater"),
    ({"attention_factor": -1.0}, ValueError, "attention_factor must be > 0"),
    ({"truncate": "no"}, TypeError, "truncate must be a bool"),
    ({"method": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 1.0}, ValueError,
     "high_freq_factor"),
    ({"method": "longrope", "short_factor": [1.0] * 31, "long_factor": [2.0] * 31}, ValueError,
     "has 31 factors"),
    ({"method": "longrope", "short_factor": ["1"] * 32, "long_factor": [2.0] * 32}, TypeError,
     "short_factor must be a list of numbers"),
])  # fmt: skip
def test_options_transformers_would_warn_about_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        extend_context(dict(_TINY), 1024, **kwargs)


def test_longrope_writes_its_factor_so_transformers_does_not_warn():
    longer = extend_context(dict(_TINY), 1024, method="longrope", short_factor=[1.0] * 16,
                            long_factor=[2.0] * 16)
    assert longer["rope_parameters"]["factor"] == 4.0
    config = _build(transformers.LlamaConfig, longer)
    _check(config, 1024)
