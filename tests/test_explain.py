"""posenc.explain against transformers 5.24: every rope type, every shipped family, each
inconsistency's field, the CLI on a config file, bad input."""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import logging
import subprocess
import sys
import warnings

import pytest
import torch

import posenc
from posenc.explain import RopeReport
from posenc.rope_families import FAMILY_NAMES, family

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

_ROTARY = {  # model_type -> (modeling module, rotary class) for the default rope type
    "llama": ("llama", "LlamaRotaryEmbedding"),
    "mistral": ("mistral", "MistralRotaryEmbedding"),
    "qwen2": ("qwen2", "Qwen2RotaryEmbedding"),
    "gemma3_text": ("gemma3", "Gemma3RotaryEmbedding"),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3RotaryEmbedding"),
    "phi3": ("phi3", "Phi3RotaryEmbedding"),
    "gpt_oss": ("gpt_oss", "GptOssRotaryEmbedding"),
    "qwen2_vl_text": ("qwen2_vl", "Qwen2VLRotaryEmbedding"),
}
_CLASSES = {
    "LlamaConfig": "llama", "MistralConfig": "mistral", "Qwen2Config": "qwen2",
    "Gemma3TextConfig": "gemma3", "DeepseekV3Config": "deepseek_v3", "Phi3Config": "phi3",
    "GptOssConfig": "gpt_oss", "Qwen2VLTextConfig": "qwen2_vl",
}  # fmt: skip


def _config_class(name: str):
    module = importlib.import_module(f"transformers.models.{_CLASSES[name]}.configuration_"
                                     f"{_CLASSES[name]}")  # fmt: skip
    return getattr(module, name)


def _hf(config, rope_type: str, seq_len: int | None, layer_type: str | None = None):
    """transformers' own (inv_freq, attention_factor) for one layer type of a config object."""
    kw = {} if layer_type is None else {"layer_type": layer_type}
    if rope_type != "default":
        return ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=seq_len, **kw)
    mod, cls = _ROTARY[config.model_type]
    rotary = getattr(importlib.import_module(f"transformers.models.{mod}.modeling_{mod}"), cls)
    return rotary.compute_default_rope_parameters(config, **kw)


def _same(report: RopeReport, config, seq_len: int | None) -> None:
    for r in (report, *report.layers):
        inv, attn = _hf(config, r.rope_type, seq_len, r.layer_type)
        torch.testing.assert_close(r.scaled_inv_freq, inv.float(), rtol=0, atol=0)
        assert r.attention_factor == pytest.approx(attn, rel=1e-12)


# ---------------------------------------------------------------------------- families


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_family_matches_transformers(name):
    fam = family(name)
    config = _config_class(fam["hf_class"])(**fam["config"])
    for context in (None, 3 * 65536):
        report = posenc.explain(fam["config"], context=context)
        _same(report, config, report.target_length)
        from_object = posenc.explain(config, context=context)
        torch.testing.assert_close(from_object.scaled_inv_freq, report.scaled_inv_freq)
        assert from_object.attention_factor == report.attention_factor
    assert fam["source"] and fam["name"]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_family_agrees_with_the_config_class_defaults(name):
    fam = family(name)
    cls = _config_class(fam["hf_class"])
    default = cls()
    for key in fam["agrees"]:
        ours = fam["config"][key]
        if key in ("rope_theta", "rope_local_base_freq"):
            theirs = cls.default_theta  # a dict {"global", "local"} where layer types differ
            if isinstance(theirs, dict):
                theirs = theirs["global" if key == "rope_theta" else "local"]
        elif key == "rope_scaling":
            theirs = {k: v for k, v in default.rope_parameters.items() if k != "rope_theta"}
        else:
            theirs = getattr(default, key)
        assert ours == theirs, (name, key, ours, theirs)


def test_family_reports_read_as_documented():
    llama = posenc.explain(family("llama3.1")["config"], context=8192)
    assert (llama.training_length, llama.reach, llama.factor) == (8192, 131072, 8.0)
    never = [i for i in range(llama.num_pairs) if llama.turns[i] < 1]  # wavelength > 8192
    assert never == [i for i, t in enumerate(llama.treatment) if t == "interpolated"]
    assert set(llama.treatment) == {"kept", "ramped", "interpolated"}
    gemma = posenc.explain(family("gemma3")["config"])
    assert (gemma.layer_type, gemma.base, gemma.rope_type) == ("full_attention", 1e6, "linear")
    (local,) = gemma.layers
    assert (local.layer_type, local.base, local.rope_type) == ("sliding_attention", 1e4, "default")
    ds = posenc.explain(family("deepseek-v3")["config"])
    assert (ds.head_dim, ds.qk_rope_head_dim, ds.qk_nope_head_dim, ds.interleaved) == (
        64, 64, 128, True)
    assert ds.softmax_scale_factor == pytest.approx((0.1 * torch.log(torch.tensor(40.0)).item()
                                                     + 1) ** 2)  # fmt: skip
    vl = posenc.explain(family("qwen2-vl")["config"])
    assert vl.mrope_section == (16, 24, 24) and sum(vl.mrope_section) == vl.num_pairs
    oss = posenc.explain(family("gpt-oss")["config"])
    assert oss.attention_factor == pytest.approx(0.1 * torch.log(torch.tensor(32.0)).item() + 1)


# ---------------------------------------------------------------------------- every rope type

_TINY = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
         "max_position_embeddings": 1024, "rope_theta": 5000.0}  # fmt: skip
_TYPES = {
    "default": {},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    "yarn_attn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                  "attention_factor": 0.9, "beta_fast": 16.0, "beta_slow": 2.0},
    "yarn_mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                    "mscale": 0.707, "mscale_all_dim": 1.0},
    "yarn_no_truncate": {"rope_type": "yarn", "factor": 4.0, "truncate": False,
                         "original_max_position_embeddings": 256},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
    "longrope": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 256,
                 "short_factor": [1.0 + i / 16 for i in range(16)],
                 "long_factor": [1.0 + i for i in range(16)]},
    "partial": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                "partial_rotary_factor": 0.5},
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(_TYPES))
@pytest.mark.parametrize("context", [None, 200, 1024, 3000])
def test_every_rope_type_matches_rope_init_functions(kind, context):
    params = {**_TYPES[kind], "rope_theta": 5000.0}
    cfg = {**_TINY, "rope_parameters": params}
    if kind == "partial":
        cfg["partial_rotary_factor"] = params.pop("partial_rotary_factor")
    config = transformers.LlamaConfig(**cfg)
    report = posenc.explain(cfg, context=context)
    _same(report, config, report.target_length)
    assert report.rotary_dim == (16 if kind == "partial" else 32)
    assert len(report.treatment) == report.num_pairs == report.wavelength.numel()
    torch.testing.assert_close(report.wavelength * report.inv_freq,
                               torch.full_like(report.inv_freq, 2 * torch.pi))


def test_per_layer_type_matches_transformers():
    cfg = transformers.Gemma3TextConfig(
        head_dim=32, hidden_size=64, num_attention_heads=2, num_hidden_layers=6,
        max_position_embeddings=2048, rope_theta=100000.0, rope_local_base_freq=1000.0,
        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 512})  # fmt: skip
    report = posenc.explain(cfg)
    assert [report.layer_type] + [r.layer_type for r in report.layers] == [
        "full_attention", "sliding_attention"]
    assert (report.base, report.layers[0].base) == (100000.0, 1000.0)
    _same(report, cfg, report.target_length)


def test_treatments_follow_the_rules():
    yarn = posenc.explain({**_TINY, "rope_parameters": _TYPES["yarn"]})
    assert yarn.treatment[0] == "kept" and yarn.treatment[-1] == "interpolated"
    assert "ramped" in yarn.treatment
    lin = posenc.explain({**_TINY, "rope_parameters": _TYPES["linear"]})
    assert set(lin.treatment) == {"interpolated"} and lin.training_length == 256
    dyn = posenc.explain({**_TINY, "rope_parameters": _TYPES["dynamic"]}, context=4096)
    assert dyn.treatment[0] == "kept" and "rescaled" in dyn.treatment and dyn.reach is None
    plain = posenc.explain(_TINY)
    assert set(plain.treatment) == {"kept"} and plain.factor is None


def test_llama4_temperature_tuning():
    cfg = {**_TINY, "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1}
    r = posenc.explain(cfg, context=65536)
    want = posenc.llama4_attn_scale(torch.tensor([65535])).item()
    assert r.temperature_tuning == (8192.0, 0.1) and r.nope_query_scale == pytest.approx(want)


def test_rotary_embedding_input():
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    module = posenc.RotaryEmbedding(64, base=5000.0, scaling=scaling)
    r = posenc.explain(module)
    torch.testing.assert_close(r.scaled_inv_freq, module.inv_freq)
    assert r.attention_factor == module.attention_factor
    assert (r.training_length, r.reach) == (256, 1024)


# ---------------------------------------------------------------------------- inconsistencies


def _fields(cfg, **kw) -> list[str]:
    return [i.field for i in posenc.explain(cfg, **kw).issues]


def _yarn(factor, max_len, original):
    return {**_TINY, "max_position_embeddings": max_len,
            "rope_parameters": {"rope_type": "yarn", "factor": factor,
                                "original_max_position_embeddings": original}}  # fmt: skip


def _transformers_warns(cfg) -> bool:
    return "does not match the ratio" in _transformers_log(transformers.LlamaConfig, cfg)[1]


@pytest.mark.parametrize(("factor", "max_len", "original"),
                         [(4.0, 1024, 256), (4.0, 2048, 256), (8.0, 1024, 256), (4.0, 256, 256),
                          (2.0, 1000, 300)])  # fmt: skip
def test_yarn_factor_rule_is_transformers_rule(factor, max_len, original):
    cfg = _yarn(factor, max_len, original)
    flagged = "max_position_embeddings" in _fields(cfg)
    assert flagged == _transformers_warns(cfg)


def test_each_inconsistency_names_its_field():
    cases = {
        "max_position_embeddings": _yarn(4.0, 2048, 256),
        "rope_parameters['original_max_position_embeddings']": {
            **_TINY, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
        "context": ({**_TINY, "rope_parameters": _TYPES["yarn"]}, 5000),
        "rope_parameters['short_factor']": {**_TINY, "rope_parameters": {
            **_TYPES["longrope"], "short_factor": [1.0] * 3}},
        "rope_parameters['factor']": {**_TINY, "rope_parameters": {
            k: v for k, v in _TYPES["longrope"].items() if k != "factor"}},
        "rope_theta": {**_TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 1.5e4}},
        "rope_parameters['beta_fast']": {**_TINY, "rope_parameters": {
            **_TYPES["yarn"], "beta_fast": 1.0, "beta_slow": 4.0}},
        "rope_parameters['high_freq_factor']": {**_TINY, "rope_parameters": {
            **_TYPES["llama3"], "high_freq_factor": 0.5}},
        "rope_parameters['mscale']": {**_TINY, "rope_parameters": {
            "rope_type": "linear", "factor": 2.0, "mscale": 1.0}},
        "rope_scaling": {**_TINY, "rope_parameters": _TYPES["linear"],
                         "rope_scaling": _TYPES["yarn"]},
    }  # fmt: skip
    for field, case in cases.items():
        cfg, context = case if isinstance(case, tuple) else (case, None)
        report = posenc.explain(cfg, context=context)
        issues = [i for i in report.issues if i.field == field]
        assert issues, (field, report.issues)
        assert issues[0].fix and field.split("'")[-2 if "'" in field else 0] in str(issues[0])
        assert field in str(report)
    llama3 = {**_TINY, "max_position_embeddings": 256, "rope_parameters": _TYPES["llama3"]}
    assert "rope_parameters['original_max_position_embeddings']" in _fields(llama3)
    consistent = [_yarn(4.0, 1024, 256), {**_TINY, "rope_parameters": _TYPES["llama3"]}, _TINY]
    assert all(not posenc.explain(c).issues for c in consistent)


def test_missing_theta_and_unknown_type():
    no_theta = {k: v for k, v in _TINY.items() if k != "rope_theta"}
    r = posenc.explain(no_theta)
    assert r.base == 10000.0 and [i.field for i in r.issues] == ["rope_theta"]
    assert "default_theta" in r.issues[0].message
    with pytest.raises(ValueError, match=r"\['rope_type'\] must be one of .*'proportional'"):
        posenc.explain({**_TINY, "rope_parameters": {"rope_type": "proportional"}})
    short = posenc.explain(_TINY, context=4096)
    assert "training length (no scaling)" in short.issues[0].message


def test_wrong_factor_list_is_reported_not_computed():
    cfg = {**_TINY, "rope_parameters": {**_TYPES["longrope"], "long_factor": [1.0] * 5}}
    r = posenc.explain(cfg, context=4096)
    assert "rope_parameters['long_factor']" in [i.field for i in r.issues if i.blocking]
    assert torch.isnan(r.scaled_inv_freq).all()
    beta = posenc.explain({**_TINY, "rope_parameters": {**_TYPES["yarn"], "beta_fast": 1.0,
                                                        "beta_slow": 4.0}})  # fmt: skip
    assert [i.blocking for i in beta.issues] == [True] and torch.isnan(beta.scaled_inv_freq).all()
    assert not any(i.blocking for i in posenc.explain(_yarn(4.0, 2048, 256)).issues)


# ---------------------------------------------------------------------------- output, CLI, input


def test_table_and_figure_in_both_languages():
    report = posenc.explain(family("qwen2.5")["config"])
    en, zh = str(report), report.to_table("zh")
    assert "wavelength" in en and "interpolated" in en and "pair" in en
    assert "波长" in zh and "内插" in zh
    assert len(en.splitlines()) == len(zh.splitlines())
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    fig = report.plot(lang="en")
    ax = fig.axes[0]
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title() and ax.get_yscale() == "log"
    assert "波长" in report.plot(lang="zh").axes[0].get_ylabel()
    with pytest.raises(ValueError, match="lang"):
        report.to_table("fr")


def test_report_is_frozen():
    report = posenc.explain(_TINY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.base = 1.0  # type: ignore[misc]


def test_cli_on_a_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(family("llama3.1")["config"]))
    run = [sys.executable, "-m", "posenc", "explain", str(path), "--context", "200000"]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == posenc.explain(str(path), context=200000).to_table("en")
    assert "context" in proc.stdout and "llama3" in proc.stdout


def test_cli_bad_config_is_one_line(tmp_path, capsys):
    from posenc.lab.cli import main

    assert main(["explain", str(tmp_path / "no.json")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "not a file" in err


def test_cli_plot_and_language(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from posenc.lab.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(family("gpt-oss")["config"]))
    with warnings.catch_warnings(record=True) as caught:  # the Chinese text in a CJK font
        warnings.simplefilter("always")
        assert main(["explain", str(path), "--plot", str(tmp_path / "f.png"), "--lang", "zh"]) == 0
    assert (tmp_path / "f.png").stat().st_size > 0 and "波长" in capsys.readouterr().out
    assert not [w for w in caught if "missing from font" in str(w.message)]
    with pytest.raises(SystemExit):
        main(["explain", str(path), "--context", "-3"])


@pytest.mark.parametrize(("config", "context", "error", "match"), [
    (42, None, TypeError, "config must be"),
    ([1, 2], None, TypeError, "config must be"),
    (_TINY, -1, ValueError, "context"),
    (_TINY, 0, ValueError, "context"),
    (_TINY, 2.5, TypeError, "context"),
    ("/no/such/config.json", None, ValueError, "not a file"),
])  # fmt: skip
def test_bad_input(config, context, error, match):
    with pytest.raises(error, match=match):
        posenc.explain(config, context=context)


def test_labels_have_the_same_keys_and_fields_in_both_languages():
    import string

    from posenc.explain_render import LABELS

    def fields(text: str) -> list[str]:
        return sorted(f for _, f, _, _ in string.Formatter().parse(text) if f is not None)

    assert LABELS["en"].keys() == LABELS["zh"].keys()
    assert all(fields(LABELS["en"][k]) == fields(LABELS["zh"][k]) for k in LABELS["en"])


def test_multimodal_configs_read_their_text_config():
    vl = posenc.explain(transformers.Qwen2VLConfig(
        text_config={"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}))
    assert vl.mrope_section == (16, 24, 24) and vl.base == 1e6
    gemma = posenc.explain(transformers.Gemma3Config())
    assert [gemma.layer_type, gemma.layers[0].layer_type] == ["full_attention",
                                                              "sliding_attention"]
    llama4 = posenc.explain(transformers.Llama4Config(), context=65536)
    assert llama4.temperature_tuning == (8192.0, 0.1) and llama4.interleaved
    assert llama4.nope_query_scale == pytest.approx(
        posenc.llama4_attn_scale(torch.tensor([65535])).item())


# Found by an outside probe (helper explainprobe).


def test_a_config_class_instead_of_an_instance_is_named():
    with pytest.raises(TypeError, match=r"got the class LlamaConfig: pass LlamaConfig\(\.\.\.\)"):
        posenc.explain(transformers.LlamaConfig)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("beta_fast", "32", "must be a number"),
    ("attention_factor", -1.0, "must be > 0"),
])  # fmt: skip
def test_bad_yarn_values_are_issues_not_crashes(key, value, match):
    cfg = {**_TINY, "max_position_embeddings": 1024, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
        "rope_theta": 10000.0, key: value}}  # fmt: skip
    report = posenc.explain(cfg)
    bad = [i for i in report.issues if i.field == f"rope_parameters[{key!r}]"]
    assert bad and bad[0].blocking and match in bad[0].message, report.issues
    assert torch.isnan(report.scaled_inv_freq).all()


@pytest.mark.parametrize(("name", "match"), [
    ("f.foo", "extension must be one of"),
    ("no/such/folder/f.png", "does not exist"),
])  # fmt: skip
def test_cli_bad_plot_path_is_one_line_before_any_work(tmp_path, capsys, name, match):
    pytest.importorskip("matplotlib")
    from posenc.lab.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(family("gpt-oss")["config"]))
    assert main(["explain", str(path), "--plot", str(tmp_path / name)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--plot" in err and match in err


def _transformers_log(cls, cfg) -> tuple[object, str]:
    """The config transformers builds from ``cfg`` and everything it logs while doing so."""
    transformers.utils.logging.warning_once.cache_clear()  # else a repeated warning is silent
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        built = cls(**json.loads(json.dumps(cfg)))
    finally:
        logger.removeHandler(handler)
    return built, buf.getvalue()


def test_the_your_model_pages_claims_about_transformers():
    """book/your_model.ipynb states two things transformers does, which its cells (that never
    import transformers) cannot check: Phi-3.5's config gives no ``factor``, and transformers
    derives 32 and logs a warning; a hand-written YaRN config without
    ``original_max_position_embeddings`` gets ``max_position_embeddings`` in its place, and
    transformers logs nothing. Both against the installed transformers."""
    phi, log = _transformers_log(transformers.Phi3Config, family("phi3.5-mini")["config"])
    assert "factor" not in {k for k, v in phi.rope_parameters.items() if v is not None}
    assert "Please set the `factor` field" in log
    _, factor = ROPE_INIT_FUNCTIONS["longrope"](phi, None, 131072)  # attention factor of 32
    assert abs(factor - (1 + torch.log(torch.tensor(32.0)) / torch.log(torch.tensor(4096.0)))
               .sqrt().item()) < 1e-6  # fmt: skip
    mine = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
            "max_position_embeddings": 16384, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}  # fmt: skip
    yarn, log = _transformers_log(transformers.LlamaConfig, mine)
    assert log == ""
    assert yarn.rope_parameters["original_max_position_embeddings"] == 16384
    assert [i.field for i in posenc.explain(mine).issues] == [
        "rope_parameters['original_max_position_embeddings']"]


def test_a_context_within_the_rules_own_reach_asks_for_max_position_embeddings():
    # practitioner probe: a llama3 config whose window was left at the trained length was told
    # to call extend_context(config, 32768), which refuses (the rule already reaches 65536)
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 8192,
           "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "rope_theta": 500000.0,
                               "original_max_position_embeddings": 8192}}
    fixes = {i.field: i.fix for i in posenc.explain(cfg, context=32768).issues}
    assert fixes["context"] == (
        "the llama3 frequencies already reach 65536 positions: raise max_position_embeddings "
        "to 32768")
    far = {i.field: i.fix for i in posenc.explain(cfg, context=100000).issues}
    assert far["context"].startswith("extend the config first")
