"""Extend a transformers model's context by editing its RoPE config, the way transformers reads it.

``extend_context(config, length, method=...)`` returns a copy of the config (same type: a
transformers config object or a dict) whose ``rope_parameters`` reach ``length`` positions:

* the trained length becomes ``original_max_position_embeddings`` (yarn, llama3, longrope), the
  factor is ``length / trained``, ``max_position_embeddings`` becomes ``length``, so transformers
  5.24 validates it without a warning and its ``ROPE_INIT_FUNCTIONS`` give the frequencies and
  the attention factor ``posenc.explain`` reports;
* a config that already carries a scaling keeps its rope type: its window is widened (Llama 3.1's
  ``llama3`` stays ``llama3`` with a new factor, its original 8192 kept as the trained length),
  and asking for another method is refused with the reason -- never a silent replacement;
* ``rope_theta`` and every other field under ``rope_parameters`` survive, per layer type where
  the model has several (only the layer types that carry a scaling are widened; with none, all);
* refused with a ``ValueError`` naming the argument: a length below the trained one, an unknown
  method or option, LongRoPE without new ``short_factor`` / ``long_factor`` options (its factors
  are searched for one window: a Phi-3 config's own are not stretched to another).

``dynamic`` keeps ``max_position_embeddings`` at the trained length (transformers' dynamic rule
reads it as the length it starts scaling from) and sets ``factor = length / trained``.

Usage::

    from posenc.hf import extend_context
    longer = extend_context(config, 32768)                    # YaRN from the trained length
    longer = extend_context(llama31_config, 262144)           # llama3 stays llama3, factor 32
    posenc.explain(longer)                                    # before / after, pair by pair

Never imports transformers itself: a config object is rebuilt with ``type(config).from_dict``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .._checks import check_bool, check_float, check_int
from ..explain_issues import param_issues

METHODS = ("yarn", "llama3", "linear", "dynamic", "longrope")
"""The rope types ``extend_context`` writes (``longrope`` needs ``short_factor`` and
``long_factor`` options, one per rotary pair)."""
OPTIONS: dict[str, tuple[str, ...]] = {
    "yarn": ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"),
    "llama3": ("low_freq_factor", "high_freq_factor"),
    "linear": (),
    "dynamic": (),
    "longrope": ("short_factor", "long_factor", "attention_factor"),
}  # fmt: skip
"""The options each method accepts (``**options``), besides ``layer_types``: the layer types to
widen when the config has RoPE per layer type."""
_ORIGINAL = ("yarn", "llama3", "longrope")
_POSITIVE = ("beta_fast", "beta_slow", "attention_factor", "low_freq_factor", "high_freq_factor")
_REAL = ("mscale", "mscale_all_dim")


def extend_context(config: Any, length: int, method: str | None = None, **options: Any) -> Any:
    """A copy of ``config`` whose RoPE reaches ``length`` positions (see the module docstring).

    ``method``: ``None`` (default) keeps the config's own scaling, or uses ``"yarn"`` when it has
    none; ``"yarn"``, ``"llama3"`` (``low_freq_factor`` 1, ``high_freq_factor`` 4 unless given),
    ``"linear"``, ``"dynamic"``, or ``"longrope"`` (with its factors). ``options`` are the rope
    type's own keys (``OPTIONS``). Returns the same type as ``config``.
    """
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)} or None, got {method!r}")
    length = check_int("length", length, minimum=1)
    layer_types = options.pop("layer_types", None)
    cfg, rebuild = _to_dict(config)
    key = "rope_parameters" if cfg.get("rope_parameters") else (
        "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters")
    params = copy.deepcopy(cfg.get(key) or {})
    nested = bool(params) and all(isinstance(v, Mapping) or v is None for v in params.values())
    groups = {k: v for k, v in params.items() if v is not None} if nested else {None: params}
    chosen = _choose_layers(groups, layer_types)
    trained = None
    for name in chosen:
        t, groups[name] = _extend_one(cfg, groups[name], length, method, options, name)
        trained = t if trained is None else trained
        _check_result(cfg, groups[name], name)
    new = {**params, **{k: v for k, v in groups.items() if k is not None}} if nested else groups[None]
    out = copy.deepcopy(cfg)
    out[key] = new
    if _rope_type(new if not nested else groups[chosen[0]]) != "dynamic" and length > (trained or 0):
        out["max_position_embeddings"] = length
    if out.get("original_max_position_embeddings") is not None and trained is not None:
        out["original_max_position_embeddings"] = trained  # Phi-3 keeps it at the top level
    return rebuild(out)


def _check_options(options: Mapping[str, Any]) -> None:
    """Refuse option values transformers would warn about or fail on."""
    for k, v in options.items():
        if k in _POSITIVE:
            check_float(k, v, positive=True)
        elif k in _REAL:
            check_float(k, v)
        elif k == "truncate":
            check_bool(k, v)
        elif k in ("short_factor", "long_factor") and not (
            isinstance(v, (list, tuple)) and v
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
        ):
            raise TypeError(f"{k} must be a list of numbers, one per rotary pair, got {v!r}")


def _check_result(cfg: Mapping, p: Mapping, name: Any) -> None:
    """Refuse a result ``posenc.explain`` finds blocking (transformers would warn): beta_fast
    <= beta_slow, high_freq_factor <= low_freq_factor, LongRoPE factors of the wrong length."""
    rope_type = _rope_type(p)
    clean = {k: v for k, v in p.items() if k not in ("type", "mrope_section", "mrope_interleaved")}
    clean["rope_type"] = rope_type
    one = {k: v for k, v in cfg.items() if k not in ("rope_parameters", "rope_scaling")}
    one["max_position_embeddings"] = None  # the window check is extend_context's own
    bad = [i for i in param_issues(one, clean, rope_type) if i.blocking]
    if bad:
        where = "" if name is None else f" (layer type {name!r})"
        raise ValueError(f"extend_context would write a RoPE config transformers warns "
                         f"about{where}: " + "; ".join(map(str, bad)))


def _to_dict(config: Any) -> tuple[dict[str, Any], Any]:
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config)), lambda d: d
    if callable(getattr(config, "to_dict", None)) and callable(getattr(type(config), "from_dict",
                                                                       None)):
        return copy.deepcopy(config.to_dict()), type(config).from_dict
    raise TypeError(
        f"config must be a transformers config (with to_dict/from_dict) or a dict, got "
        f"{type(config).__name__}"
    )


def _rope_type(p: Mapping) -> str:
    t = p.get("rope_type") or p.get("type") or "default"
    return "default" if t == "mrope" else str(t)


def _choose_layers(groups: dict, layer_types: Any) -> list:
    if layer_types is not None:
        if isinstance(layer_types, str) or not all(k in groups for k in layer_types):
            raise ValueError(
                f"layer_types must be a list of the config's layer types {sorted(map(str, groups))},"
                f" got {layer_types!r}"
            )
        return list(layer_types)
    scaled = [k for k, v in groups.items() if _rope_type(v) != "default"]
    return scaled or list(groups)


def _trained(cfg: Mapping, p: Mapping, rope_type: str) -> int:
    """The length the model was trained at, as transformers reads it for this rope type."""
    top = cfg.get("original_max_position_embeddings")
    if rope_type in _ORIGINAL:
        n = top if top is not None else p.get("original_max_position_embeddings")
        if n is None:
            raise ValueError(
                f"config's rope_type {rope_type!r} has no original_max_position_embeddings: the "
                "trained length is unknown; set it before extending"
            )
        return int(n)
    max_len = cfg.get("max_position_embeddings")
    if max_len is None:
        raise ValueError("config['max_position_embeddings'] is required to know the trained length")
    if rope_type == "linear":
        return int(round(max_len / float(p.get("factor") or 1.0)))
    return int(max_len)


def _extend_one(
    cfg: Mapping, p: dict, length: int, method: str | None, options: dict, name: Any
) -> tuple[int, dict]:
    have = _rope_type(p)
    where = "" if name is None else f" (layer type {name!r})"
    if have != "default" and method is not None and method != have:
        raise ValueError(
            f"method={method!r} would replace the config's own rope_type {have!r}{where}; "
            f"extend_context keeps a model's scaling: pass method={have!r} (or None) to widen "
            f"its window"
        )
    use = method or (have if have != "default" else "yarn")
    unknown = sorted(set(options) - set(OPTIONS[use]))
    if unknown:
        raise ValueError(
            f"options {unknown} are not used by method {use!r}; allowed: "
            f"{list(OPTIONS[use]) + ['layer_types']}"
        )
    _check_options(options)
    trained = _trained(cfg, p, have)
    if length < trained:
        raise ValueError(
            f"length must be >= the trained length {trained}{where}, got {length}"
        )
    old = p.get("factor")
    if have not in ("default", "longrope") and isinstance(old, (int, float)) and (
        length < old * trained
    ):
        raise ValueError(
            f"length {length} is below the {int(old * trained)} positions the config's own "
            f"{have!r} scaling already reaches{where} (factor {old} x trained length "
            f"{trained}); narrowing it would change the frequencies the model was tuned with: "
            f"use the config as it is, or pass length >= {int(old * trained)}"
        )
    if use == "longrope" and not all(options.get(k) for k in ("short_factor", "long_factor")):
        raise ValueError(
            "method 'longrope' needs short_factor= and long_factor= options (one per rotary "
            "pair), searched for the new length: LongRoPE's factors fit one window, so a "
            "config's own factors are not reused for another"
        )
    out = dict(p)
    out.pop("type", None)
    out["rope_type"] = use
    out.update(options)
    factor = length / trained
    if use == "llama3":
        out.setdefault("low_freq_factor", 1.0)
        out.setdefault("high_freq_factor", 4.0)
    out["factor"] = float(factor)  # longrope too: without it transformers 5.24 warns
    if use in _ORIGINAL:
        out["original_max_position_embeddings"] = trained
    else:
        out.pop("original_max_position_embeddings", None)
    return trained, out
