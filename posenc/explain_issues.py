"""The inconsistencies ``posenc.explain`` looks for in a RoPE config, each a :class:`RopeIssue`
naming the field and the fix. The rules are transformers 5.24's own (its
``RotaryEmbeddingConfigMixin._validate_<type>_rope_parameters`` in ``modeling_rope_utils.py``,
read, not imported), plus what transformers fills in silently (a missing
``original_max_position_embeddings``, a missing ``rope_theta``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .rope_scaling import ROPE_KEYS

_NEEDS_ORIGINAL = ("yarn", "llama3", "longrope")
_NUMERIC = ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim",
            "low_freq_factor", "high_freq_factor")


@dataclass(frozen=True)
class RopeIssue:
    """One inconsistency: the config ``field`` at fault, what is wrong, and the fix.
    ``blocking``: posenc cannot compute the scaled frequencies with it (the report's scaled
    values are NaN; transformers warns and computes something anyway)."""

    field: str
    message: str
    fix: str
    blocking: bool = False

    def __str__(self) -> str:
        return f"{self.field}: {self.message}. Fix: {self.fix}"


def config_issues(cfg: Mapping) -> list[RopeIssue]:
    out = []
    new, old = cfg.get("rope_parameters"), cfg.get("rope_scaling")
    if new and old and new != old:
        out.append(RopeIssue(
            "rope_scaling", "the config has both rope_parameters and rope_scaling, and they "
            "differ (transformers 5 reads rope_scaling first and replaces rope_parameters)",
            "keep one: rope_parameters (transformers 5) or rope_scaling (4.x)"))  # fmt: skip
    p = new or old or {}
    if not _theta_given(cfg, p):
        out.append(RopeIssue(
            "rope_theta", "the config gives no rope_theta: posenc reads 10000 (transformers' "
            "RotaryEmbeddingConfigMixin.default_theta), but some model classes default "
            "otherwise (Gemma 3: 1e6 global and 1e4 local; gpt-oss: 150000; Qwen2.5-VL: 1e6)",
            "write the model's base explicitly: rope_parameters['rope_theta']"))  # fmt: skip
    top = cfg.get("rope_theta")
    inner = p.get("rope_theta") if isinstance(p, Mapping) else None
    if top is not None and inner is not None and float(top) != float(inner):
        out.append(RopeIssue(
            "rope_theta", f"rope_theta={top} and rope_parameters['rope_theta']={inner} differ "
            "(transformers uses the one in rope_parameters)",
            f"give one base: rope_parameters['rope_theta']={inner} or remove it"))  # fmt: skip
    return out


def _theta_given(cfg: Mapping, p: Any) -> bool:
    if cfg.get("rope_theta") is not None or cfg.get("rotary_emb_base") is not None:
        return True
    if not isinstance(p, Mapping):
        return False
    nested = [v for v in p.values() if isinstance(v, Mapping)]
    if nested and len(nested) == len([v for v in p.values() if v is not None]):
        return all(v.get("rope_theta") is not None for v in nested)
    return p.get("rope_theta") is not None


def param_issues(cfg: Mapping, p: dict[str, Any], rope_type: str) -> list[RopeIssue]:
    """transformers 5.24's RotaryEmbeddingConfigMixin._validate_<type>_rope_parameters rules."""
    out: list[RopeIssue] = []
    max_len = cfg.get("max_position_embeddings")
    allowed = set(ROPE_KEYS.get(rope_type, ())) | {"rope_type", "rope_theta",
                                                    "partial_rotary_factor"}
    unknown = sorted(k for k in p if k not in allowed)
    if unknown:
        out.append(RopeIssue(
            f"rope_parameters[{unknown[0]!r}]", f"keys {unknown} are not used by rope_type "
            f"{rope_type!r} (transformers warns 'Unrecognized keys')",
            "remove them, or use the rope_type they belong to"))  # fmt: skip
        for k in unknown:
            p.pop(k)
    for k in _NUMERIC:
        v = p.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            out.append(RopeIssue(f"rope_parameters[{k!r}]", f"must be a number, got {v!r} "
                                 f"({type(v).__name__})", "write it as a JSON number",
                                 blocking=True))
            p.pop(k)
    att = p.get("attention_factor")
    if att is not None and att <= 0:
        out.append(RopeIssue("rope_parameters['attention_factor']", f"must be > 0, got {att} "
                             "(transformers warns)", "remove it to use the rule's default",
                             blocking=True))
    factor = p.get("factor")
    if rope_type in ("linear", "dynamic", "yarn", "llama3") and (
        not isinstance(factor, (int, float)) or factor < 1
    ):
        out.append(RopeIssue("rope_parameters['factor']", f"factor must be a number >= 1 for "
                             f"rope_type {rope_type!r}, got {factor!r}",
                             "set the ratio of the target length to the trained length",
                             blocking=True))
    if rope_type in _NEEDS_ORIGINAL:
        out += _original_issues(cfg, p, rope_type, max_len)
    if rope_type == "llama3":
        lo, hi = p.get("low_freq_factor"), p.get("high_freq_factor")
        if lo is not None and hi is not None and hi <= lo:
            out.append(RopeIssue("rope_parameters['high_freq_factor']",
                                 f"high_freq_factor={hi} must exceed low_freq_factor={lo}",
                                 "Llama 3.1 uses low_freq_factor=1.0, high_freq_factor=4.0",
                                 blocking=True))
    if rope_type == "yarn" and (p.get("beta_fast") or 32) < (p.get("beta_slow") or 1):
        out.append(RopeIssue("rope_parameters['beta_fast']",
                             "beta_fast must be greater than beta_slow",
                             "YaRN's defaults are beta_fast=32, beta_slow=1", blocking=True))
    if rope_type == "longrope":
        out += _longrope_issues(cfg, p)
    return out


def _original_issues(cfg: Mapping, p: dict, rope_type: str, max_len: Any) -> list[RopeIssue]:
    out = []
    orig = cfg.get("original_max_position_embeddings") or p.get(
        "original_max_position_embeddings")
    if orig is None:
        out.append(RopeIssue(
            "rope_parameters['original_max_position_embeddings']",
            f"missing for rope_type {rope_type!r}: transformers fills it with "
            f"max_position_embeddings={max_len}, so the trained length is taken to be the "
            "extended one and the frequencies are computed for the wrong length",
            "set it to the length the model was trained at"))  # fmt: skip
        return out
    factor = p.get("factor")
    if rope_type == "yarn" and max_len and isinstance(factor, (int, float)):
        implicit = max_len / orig
        if implicit != factor and implicit != 1:
            out.append(RopeIssue(
                "max_position_embeddings",
                f"rope_parameters['factor']={factor} does not match max_position_embeddings / "
                f"original_max_position_embeddings = {max_len} / {orig} = {implicit:g} "
                "(transformers warns and uses the explicit factor)",
                f"set max_position_embeddings={int(factor * orig)} (factor x original), or "
                f"factor={implicit:g}"))  # fmt: skip
    if rope_type == "llama3" and max_len and orig >= max_len:
        out.append(RopeIssue(
            "rope_parameters['original_max_position_embeddings']",
            f"original_max_position_embeddings={orig} must be less than "
            f"max_position_embeddings={max_len} (transformers warns)",
            f"set max_position_embeddings to the extended length, factor x {orig}"))
    return out


def _longrope_issues(cfg: Mapping, p: dict) -> list[RopeIssue]:
    out = []
    head = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // max(
        int(cfg.get("num_attention_heads") or 1), 1))
    partial = p.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0
    n = int(head * partial) // 2
    for key in ("short_factor", "long_factor"):
        v = p.get(key)
        if not isinstance(v, (list, tuple)):
            out.append(RopeIssue(f"rope_parameters[{key!r}]", f"missing or not a list (got "
                                 f"{type(v).__name__}); LongRoPE needs one factor per pair",
                                 f"give {n} factors, one per rotary pair", blocking=True))
        elif len(v) != n:
            out.append(RopeIssue(f"rope_parameters[{key!r}]", f"has {len(v)} factors, but "
                                 f"rotary_dim // 2 = {n}", f"give exactly {n} factors",
                                 blocking=True))
    if p.get("factor") is None:
        out.append(RopeIssue(
            "rope_parameters['factor']", "missing: transformers derives it from "
            "max_position_embeddings / original_max_position_embeddings and warns",
            "set factor = max_position_embeddings / original_max_position_embeddings"))
    return out
