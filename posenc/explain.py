"""A model's RoPE explained: which pairs turn, what its scaling does, what it cannot reach.

``explain(config)`` reads a transformers config (the object, its dict, a ``config.json`` path) or
a ``RotaryEmbedding`` and returns a :class:`RopeReport`: per rotary pair its frequency, its
wavelength in positions (``2*pi / theta_i``), the turns it completes within the training length,
what the scaling rule does to it (kept, interpolated, ramped between the two, or rescaled, with
the factor) and its values after scaling; the attention factor (YaRN's ``0.1 ln s + 1``,
DeepSeek's mscale ratio, LongRoPE's) and Llama 4's query temperature where the config has it;
the training and target lengths; partial rotary, DeepSeek's rope head dims, M-RoPE's sections,
one report per layer type (Gemma 3's local and global bases); and every inconsistency found,
each naming the field and the fix. Frequencies are ``posenc.rope_inv_freq``'s, which equal
transformers' ``ROPE_INIT_FUNCTIONS``. transformers is never imported.

Usage::

    import posenc
    report = posenc.explain("path/to/config.json", context=32768)
    print(report)                       # a table, one row per rotary pair
    report.plot(lang="zh")              # a labelled matplotlib figure
    report.turns < 1                    # pairs that never complete a turn in training
    report.attention_factor, report.issues

    from posenc.rope_families import family
    posenc.explain(family("llama3.1")["config"], context=8192)

From the shell: ``python -m posenc explain config.json --context 32768 [--plot fig.png]``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from ._checks import check_int
from .explain_issues import RopeIssue, config_issues, param_issues
from .explain_render import plot as render_plot
from .explain_render import render_text
from .rope import RotaryEmbedding
from .rope_config import _as_dict, rotary_kwargs_from_hf_config
from .rope_scaling import ROPE_TYPES, rope_inv_freq
from .temperature import llama4_attn_scale

TREATMENTS = ("kept", "interpolated", "ramped", "rescaled")
"""The treatments a scaling rule gives a pair. ``kept`` (frequency unchanged), ``interpolated``
(divided by the full factor), ``ramped`` (YaRN / Llama 3: between the two), ``rescaled`` (its own factor:
dynamic NTK's base change, LongRoPE's searched factors)."""
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")
_NEEDS_ORIGINAL = ("yarn", "llama3", "longrope")
__all__ = ["TREATMENTS", "RopeIssue", "RopeReport", "explain"]


@dataclass(frozen=True)
class RopeReport:
    """What a RoPE config does, pair by pair (tensors are float32 ``[pairs]``, pair ``i`` rotating
    at ``theta_i = base^(-2i / rotary_dim)`` before scaling).

    ``training_length`` is the trained length (``original_max_position_embeddings``, else
    ``max_position_embeddings``; for ``linear``, ``max_position_embeddings / factor``);
    ``reach`` the length the scaling is built for (``factor * training_length``, or
    ``max_position_embeddings`` for ``llama3`` and ``longrope``; ``None`` for ``dynamic``, which
    follows the sequence); ``target_length`` the ``context`` asked for, else
    the larger of ``max_position_embeddings`` and ``reach``. ``scaled_*`` are the values at the
    target length.

    Per pair (``[num_pairs]``): ``inv_freq`` (theta_i before scaling), ``wavelength``
    (``2*pi / theta_i`` positions), ``turns`` (full turns within ``training_length``; ``< 1``:
    the pair never completed a turn in training), ``scaled_inv_freq`` / ``scaled_wavelength`` /
    ``scaled_turns`` (after scaling, turns within ``target_length``), ``pair_factor``
    (``inv_freq / scaled_inv_freq``: 1 kept, ``factor`` interpolated) and ``treatment`` (one of
    ``TREATMENTS``). Scalars: ``attention_factor`` (multiplies cos and sin: YaRN's
    ``0.1 ln s + 1``, DeepSeek's mscale ratio, LongRoPE's), ``softmax_scale_factor``
    (DeepSeek: the softmax scale times ``mscale**2``), ``temperature_tuning`` /
    ``nope_query_scale`` (Llama 4's ``(floor_scale, attn_scale)`` and its NoPE query scale at
    the target's last position), ``qk_rope_head_dim`` / ``qk_nope_head_dim`` (DeepSeek's MLA),
    ``mrope_section`` (M-RoPE's temporal / height / width pairs), ``issues`` (each a
    ``RopeIssue``), ``layers`` (the reports of the other layer types).
    """

    model_type: str | None
    rope_type: str
    layer_type: str | None
    head_dim: int
    rotary_dim: int
    partial_rotary_factor: float
    base: float
    interleaved: bool
    factor: float | None
    training_length: int | None
    max_position_embeddings: int | None
    reach: int | None
    target_length: int | None
    inv_freq: Tensor
    scaled_inv_freq: Tensor
    wavelength: Tensor
    scaled_wavelength: Tensor
    turns: Tensor | None
    scaled_turns: Tensor | None
    pair_factor: Tensor
    treatment: tuple[str, ...]
    attention_factor: float
    temperature_tuning: tuple[float, float] | None = None
    nope_query_scale: float | None = None
    softmax_scale_factor: float | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    mrope_section: tuple[int, ...] | None = None
    issues: tuple[RopeIssue, ...] = ()
    layers: tuple[RopeReport, ...] = field(default=())

    @property
    def num_pairs(self) -> int:
        """The number of rotary pairs, ``rotary_dim // 2``."""
        return self.rotary_dim // 2

    def counts(self) -> dict[str, int]:
        """How many pairs get each treatment (keys: ``TREATMENTS``)."""
        return {t: self.treatment.count(t) for t in TREATMENTS}

    def to_table(self, lang: str = "en") -> str:
        """The readable table ``str(report)`` prints, in ``lang`` (``"en"`` or ``"zh"``)."""
        return render_text(self, lang)

    def __str__(self) -> str:
        return self.to_table("en")

    def plot(self, *, lang: str = "en", ax: Any = None) -> Any:
        """A matplotlib figure: each pair's wavelength before and after scaling (log scale)
        against the training and target lengths, coloured by treatment; labels in ``lang``.
        Draws into ``ax`` when given; returns the figure."""
        return render_plot(self, lang=lang, ax=ax)


def explain(config: Any, *, context: int | None = None) -> RopeReport:
    """Explain a model's RoPE: a :class:`RopeReport` (see the module docstring).

    ``config``: a transformers config object (anything with ``to_dict()``), its dict (a
    ``config.json``, 4.x ``rope_scaling`` or 5.x ``rope_parameters`` form; a multimodal config's
    ``text_config`` is read), a path to a ``config.json``, or a ``posenc.RotaryEmbedding``.
    ``context``: the length you want to run at (positions); default the larger of the
    config's ``max_position_embeddings`` and what its scaling reaches. Several layer types
    (Gemma 3) give one report per type: the first (``full_attention`` where present) is
    returned, the others in ``report.layers``.
    """
    if context is not None:
        context = check_int("context", context, minimum=1)
    if isinstance(config, RotaryEmbedding):
        return _from_module(config, context)
    cfg = _read(config)
    issues = config_issues(cfg)
    layer_params = _layer_params(cfg)
    reports = [_explain_layer(cfg, lt, p, context, issues) for lt, p in layer_params]
    first, rest = reports[0], tuple(reports[1:])
    return replace(first, layers=rest)


# ---------------------------------------------------------------------------- reading


def _read(config: Any) -> dict[str, Any]:
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not os.path.isfile(path):
            raise ValueError(f"config path {path!r} is not a file (give a config.json)")
        with open(path, encoding="utf-8") as f:
            try:
                config = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"config file {path!r} is not valid JSON: {e}") from None
        if not isinstance(config, dict):
            raise ValueError(f"config file {path!r} must hold a JSON object")
    if isinstance(config, type):
        raise TypeError(
            f"config must be a config instance, got the class {config.__name__}: pass "
            f"{config.__name__}(...) or {config.__name__}.from_pretrained(...)"
        )
    if not isinstance(config, Mapping) and not callable(getattr(config, "to_dict", None)):
        raise TypeError(
            "config must be a transformers config (with to_dict()), its dict, a config.json "
            f"path or a posenc.RotaryEmbedding, got {type(config).__name__}"
        )
    cfg = _as_dict(config)
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and not _has_rope(cfg):
        cfg = {**dict(text), "model_type": text.get("model_type", cfg.get("model_type"))}
    return cfg


def _has_rope(cfg: Mapping) -> bool:
    return any(cfg.get(k) is not None for k in ("rope_parameters", "rope_scaling", "rope_theta"))


def _layer_params(cfg: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """``[(layer_type, rope dict)]``: one entry unless the config has per-layer-type RoPE."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise TypeError(f"config['rope_parameters'] must be a dict, got {type(params).__name__}")
    if params and all(isinstance(v, Mapping) or v is None for v in params.values()):
        order = sorted(params, key=lambda k: (k != "full_attention", k))
        return [(k, dict(params[k])) for k in order if params[k] is not None]
    if cfg.get("rope_local_base_freq") is not None:  # Gemma 3, transformers 4.x form
        glob = {**dict(params), "rope_theta": cfg.get("rope_theta", 1_000_000.0)}
        local = {"rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}
        return [("full_attention", glob), ("sliding_attention", local)]
    return [(None, dict(params))]


def _rope_type(p: Mapping) -> str:
    t = p.get("rope_type") or p.get("type") or "default"
    return "default" if t == "mrope" else str(t)


# ---------------------------------------------------------------------------- one layer type


def _explain_layer(
    cfg: dict[str, Any], layer_type: str | None, params: dict[str, Any], context: int | None,
    config_issues: list[RopeIssue],
) -> RopeReport:
    mrope = params.get("mrope_section")
    rope_type = _rope_type(params)
    if rope_type not in ROPE_TYPES or rope_type == "ntk":
        where = "" if layer_type is None else f"[{layer_type!r}]"
        raise ValueError(
            f"config['rope_parameters']{where}['rope_type'] must be one of "
            f"{[t for t in ROPE_TYPES if t != 'ntk']} (transformers' names), got {rope_type!r}"
        )
    clean = {k: v for k, v in params.items() if k not in _MROPE_KEYS}
    clean["rope_type"] = rope_type
    clean.pop("type", None)
    issues = list(config_issues) + param_issues(cfg, clean, rope_type)
    one = {k: v for k, v in cfg.items() if k not in ("rope_parameters", "rope_scaling")}
    one["rope_parameters"] = clean
    if cfg.get("qk_rope_head_dim") is not None:  # DeepSeek: RoPE runs on the rope head dims
        one["head_dim"] = cfg["qk_rope_head_dim"]
    one.pop("rope_local_base_freq", None)
    kw = rotary_kwargs_from_hf_config(one)
    scaling = kw["scaling"] or {}
    scaling = {**scaling, "partial_rotary_factor": kw["partial_rotary_factor"]}
    factor = _factor(scaling, rope_type)
    trained = _trained(cfg, scaling, rope_type, factor)
    max_len = cfg.get("max_position_embeddings")
    reach = _reach(rope_type, trained, factor, max_len)
    target = context if context is not None else max(
        [n for n in (max_len, reach, trained) if n is not None], default=None)
    if context is not None and reach is not None and context > reach:
        issues.append(_beyond_reach(context, reach, rope_type, factor, trained))
    plain, _ = rope_inv_freq(kw["head_dim"], base=kw["base"],
                             scaling={"partial_rotary_factor": kw["partial_rotary_factor"]})
    if any(i.blocking for i in issues):  # reported; posenc computes no values for it
        scaled, attn = torch.full_like(plain, math.nan), math.nan
    else:
        scaled, attn = rope_inv_freq(kw["head_dim"], base=kw["base"], scaling=scaling,
                                     seq_len=target)  # fmt: skip
    pair_factor = plain / scaled
    two_pi = 2 * math.pi
    return RopeReport(
        model_type=cfg.get("model_type"), rope_type=rope_type, layer_type=layer_type,
        head_dim=kw["head_dim"], rotary_dim=2 * plain.numel(),
        partial_rotary_factor=kw["partial_rotary_factor"], base=kw["base"],
        interleaved=kw["interleaved"], factor=factor, training_length=trained,
        max_position_embeddings=max_len, reach=reach, target_length=target,
        inv_freq=plain, scaled_inv_freq=scaled, wavelength=two_pi / plain,
        scaled_wavelength=two_pi / scaled,
        turns=None if trained is None else trained * plain / two_pi,
        scaled_turns=None if target is None else target * scaled / two_pi,
        pair_factor=pair_factor, treatment=_treatments(pair_factor, rope_type, factor),
        attention_factor=float(attn), **_temperature(cfg, target),
        softmax_scale_factor=_deepseek_softmax(cfg, clean, factor),
        qk_rope_head_dim=cfg.get("qk_rope_head_dim"), qk_nope_head_dim=cfg.get("qk_nope_head_dim"),
        mrope_section=None if mrope is None else tuple(int(x) for x in mrope),
        issues=tuple(issues),
    )  # fmt: skip


def _from_module(module: Any, context: int | None) -> RopeReport:
    """A ``RotaryEmbedding``: its own head_dim, base, layout and scaling dict."""
    cfg = {"head_dim": module.head_dim, "rope_theta": module.base,
           "rope_parameters": dict(module.scaling),
           "rope_interleave": module.interleaved}  # fmt: skip
    params = cfg["rope_parameters"]
    n = params.pop("max_position_embeddings", None) or params.get(
        "original_max_position_embeddings")
    if n is not None:  # the module's own length: its trained one when nothing else is given
        cfg["max_position_embeddings"] = n
    cfg["rope_parameters"].pop("rope_theta", None)
    return explain(cfg, context=context)


def _factor(scaling: Mapping, rope_type: str) -> float | None:
    if rope_type == "default":
        return None
    f = scaling.get("factor")
    if f is None and rope_type in ("yarn", "longrope"):
        orig, top = scaling.get("original_max_position_embeddings"), scaling.get(
            "max_position_embeddings")
        return None if not orig or not top else top / orig
    return None if f is None else float(f)


def _trained(cfg: Mapping, scaling: Mapping, rope_type: str, factor: float | None) -> int | None:
    orig = scaling.get("original_max_position_embeddings")
    if rope_type in _NEEDS_ORIGINAL and orig:
        return int(orig)
    max_len = cfg.get("max_position_embeddings")
    if max_len is None:
        return None
    if rope_type == "linear" and factor:
        return int(round(max_len / factor))
    return int(max_len)


def _reach(rope_type: str, trained: int | None, factor: float | None, max_len: Any) -> int | None:
    if rope_type == "dynamic" or trained is None:
        return None
    if rope_type in ("longrope", "llama3") and max_len:  # built for the config's window
        return int(max_len)
    if rope_type == "default" or factor is None:
        return trained
    return int(round(trained * factor))


def _treatments(pair_factor: Tensor, rope_type: str, factor: float | None) -> tuple[str, ...]:
    out = []
    for r in pair_factor.tolist():
        if not math.isfinite(r):
            out.append("rescaled")
        elif abs(r - 1.0) <= 1e-4:
            out.append("kept")
        elif factor is not None and abs(r - factor) <= 1e-4 * factor:
            out.append("interpolated")
        elif rope_type in ("yarn", "llama3"):
            out.append("ramped")
        else:
            out.append("rescaled")
    return tuple(out)


def _deepseek_softmax(cfg: Mapping, p: Mapping, factor: float | None) -> float | None:
    """DeepSeek V2/V3 multiply the softmax scale by ``mscale**2`` with ``mscale = 0.1 *
    mscale_all_dim * ln(factor) + 1`` (transformers' DeepseekV3Attention), besides YaRN."""
    m = p.get("mscale_all_dim")
    if not str(cfg.get("model_type", "")).startswith("deepseek") or not m or not factor:
        return None
    mscale = 1.0 if factor <= 1 else 0.1 * float(m) * math.log(factor) + 1.0
    return mscale * mscale


def _temperature(cfg: Mapping, target: int | None) -> dict[str, Any]:
    """Llama 4's attention temperature tuning (its NoPE layers' query scale)."""
    if not cfg.get("attn_temperature_tuning"):
        return {}
    floor, scale = float(cfg.get("floor_scale", 8192.0)), float(cfg.get("attn_scale", 0.1))
    q = None
    if target is not None:
        q = float(llama4_attn_scale(torch.tensor([target - 1]), floor_scale=floor,
                                    attn_scale=scale)[0])  # fmt: skip
    return {"temperature_tuning": (floor, scale), "nope_query_scale": q}


def _beyond_reach(context: int, reach: int, rope_type: str, factor: float | None,
                  trained: int | None) -> RopeIssue:
    """The issue for a context past what the config reaches, and its fix: where the rule's own
    frequencies already stretch that far (llama3 / longrope with the window left short), only
    ``max_position_embeddings`` needs raising; otherwise the config needs extending."""
    what = "the training length (no scaling)" if rope_type == "default" else (
        "what this scaling reaches")
    stretched = int(factor * trained) if factor and trained else None  # the rule's own reach
    fix = (f"the {rope_type} frequencies already reach {stretched} positions: raise "
           f"max_position_embeddings to {context}" if stretched and context <= stretched
           else f"extend the config first, e.g. posenc.hf.extend_context(config, {context}), "
           f"or stay within {reach} positions")
    return RopeIssue("context", f"{context} positions are beyond {what} ({reach})", fix)
