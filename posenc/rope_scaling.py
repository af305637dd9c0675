"""RoPE inverse frequencies, plain and scaled, in Hugging Face ``rope_parameters`` form.

RoPE rotates channel pair ``i`` of a rotary dim ``d`` by ``pos * theta_i`` with
``theta_i = base^(-2i/d)`` (RoFormer, Su et al., 2024). Pair ``i`` turns once every
``2*pi / theta_i`` tokens: its *wavelength*. A model trained on ``L`` tokens has seen the short
wavelengths turn many times and the longest ones never complete a turn; every context-extension
method below is a rule for stretching some wavelengths and leaving others alone.

- ``linear``: position interpolation, every wavelength times ``factor``
  (Chen et al., 2023, "Extending Context Window of LLMs via Positional Interpolation";
  kaiokendev's SuperHOT).
- ``ntk``: NTK-aware scaling, change the base to ``base * factor^(d / (d - 2))`` so the slowest
  pair is interpolated by ``factor`` and the fastest is barely touched
  (bloc97, r/LocalLLaMA, 2023). Static; the name is ours, Hugging Face has no such type.
- ``dynamic``: the same base change, with the factor grown from the current sequence length
  (emozilla / bloc97, 2023). Unchanged up to ``max_position_embeddings``.
- ``yarn``: NTK-by-parts, a linear ramp between extrapolated fast pairs and interpolated slow
  pairs, plus the attention factor ``0.1 ln(factor) + 1`` (Peng et al., 2024, "YaRN"), which is
  ``sqrt(1/t)`` for the paper's softmax temperature ``t``: a factor above 1 is ``t < 1``.
- ``llama3``: the same by-parts idea with wavelength edges ``L / high_freq_factor`` and
  ``L / low_freq_factor`` (Llama Team, 2024, "The Llama 3 Herd of Models").
- ``longrope``: one searched rescale factor per pair, a short and a long set
  (Ding et al., 2024, "LongRoPE").

Everything equals ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` to float32 precision
(same operations in the same order), including the attention factor that multiplies cos/sin.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from ._checks import check_base, check_float, check_int, warn_caller

ROPE_TYPES = ("default", "linear", "dynamic", "ntk", "yarn", "llama3", "longrope")
"""The values ``scaling["rope_type"]`` may take, each described above (``"default"``, like
``scaling=None``, is plain RoPE). All but ``ntk`` are Hugging Face rope types of the same name."""
_COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "ntk": ("factor",),
    "dynamic": ("factor", "max_position_embeddings", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "max_position_embeddings",
             "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "llama3": ("factor", "original_max_position_embeddings", "max_position_embeddings",
               "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor", "factor", "attention_factor",
                 "original_max_position_embeddings", "max_position_embeddings"),
}  # fmt: skip
"""The keys ``scaling`` may hold for each rope type, besides ``rope_type``, ``type`` (its legacy
name), ``rope_theta`` (must equal ``base``) and ``partial_rotary_factor``. These are the required
and optional keys of transformers' ``RotaryEmbeddingConfigMixin._validate_<type>_rope_parameters``
(5.x), plus the lengths HF reads from the model config (``max_position_embeddings``; for
``dynamic``, ``original_max_position_embeddings`` as its alias). A key of another rope type is
accepted and ignored, as transformers does (generic code copies one config into another); a key
no rope type uses is an error, with a did-you-mean."""
_LENGTH_KEYS = ("max_position_embeddings", "original_max_position_embeddings")
_ALL_KEYS = tuple(dict.fromkeys((*_COMMON_KEYS, *(k for ks in ROPE_KEYS.values() for k in ks))))



class RopeWavelengths(NamedTuple):
    wavelength: Tensor  # [rotary_dim // 2] tokens per full turn of each pair, 2*pi / inv_freq
    turns: Tensor  # [rotary_dim // 2] full turns within context_len tokens


def rope_inv_freq(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling: Mapping | None = None,
    seq_len: int | None = None,
) -> tuple[Tensor, float]:
    """Inverse frequencies in float32 and the attention factor that multiplies cos and sin.

    ``scaling`` is a Hugging Face ``rope_parameters`` dict (``rope_type`` or legacy ``type``),
    plus ``max_position_embeddings``, which HF keeps on the model config. A key of another rope
    type is ignored, as in HF; one that no rope type uses (see ``ROPE_KEYS``) is a ``ValueError``
    with a did-you-mean. ``seq_len`` (the
    current sequence length) matters for ``dynamic`` and ``longrope`` only; ``None`` means the
    original length, as in HF. Returns ``(inv_freq [rotary_dim // 2], attention_factor)``.
    """
    head_dim = check_int("head_dim", head_dim, minimum=2)
    base = check_base("base", base)
    if seq_len is not None:
        seq_len = check_int("seq_len", seq_len, minimum=1)
    if scaling is not None and not isinstance(scaling, Mapping):
        raise TypeError(
            f"scaling must be None or a dict of rope parameters, got {type(scaling).__name__}"
        )
    s = dict(scaling or {})
    rope_type = _rope_type(s)
    unknown = sorted(k for k in s if k not in _ALL_KEYS)
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(str(k), _ALL_KEYS, n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        allowed = (*_COMMON_KEYS, *ROPE_KEYS[rope_type])
        raise ValueError(
            f"scaling has unknown key(s) {', '.join(hints)}; keys rope_type {rope_type!r} uses: "
            f"{', '.join(allowed)} (keys of the other rope types are accepted and ignored)"
        )
    ignored = sorted(k for k in s if k not in (*_COMMON_KEYS, *ROPE_KEYS[rope_type], *_LENGTH_KEYS))
    if ignored:  # transformers accepts and ignores them too (with a warning); lengths are quiet
        warn_caller(
            f"scaling keys {ignored} are not used by rope_type {rope_type!r} and are ignored"
        )
    theta = s.get("rope_theta")
    if theta is not None and check_float("scaling['rope_theta']", theta) != base:
        raise ValueError(
            f"scaling['rope_theta']={s['rope_theta']} differs from base={base}; pass the base "
            f"once, as base=..."
        )
    dim = _rotary_dim(head_dim, s)
    return _SCALERS[rope_type](s, rope_type, base, dim, seq_len)


def rope_wavelengths(
    head_dim: int, *, base: float = 10000.0, scaling: Mapping | None = None, context_len: int
) -> RopeWavelengths:
    """Per channel pair: wavelength ``2*pi / inv_freq`` (tokens) and full turns in ``context_len``.

    Frequencies are those used for a ``context_len``-token sequence (``seq_len=context_len``,
    which matters for ``dynamic`` and ``longrope``). A pair with ``turns < 1`` never completes a
    rotation inside the context; those are the pairs every scaling method treats differently.
    """
    context_len = check_int("context_len", context_len, minimum=1)
    inv_freq, _ = rope_inv_freq(head_dim, base=base, scaling=scaling, seq_len=context_len)
    return RopeWavelengths(2 * math.pi / inv_freq, context_len * inv_freq / (2 * math.pi))


def rope_switch_len(scaling: Mapping | None) -> int | None:
    """The trained length past which ``rope_inv_freq`` depends on ``seq_len``, or ``None``.

    ``dynamic``: ``max_position_embeddings`` (frequencies change for ``seq_len`` above it);
    ``longrope``: ``original_max_position_embeddings`` (long factors above it, short ones up to
    it). Every other type ignores ``seq_len``.
    """
    s = dict(scaling or {})
    t = _rope_type(s)
    return _dynamic_len(s, t) if t == "dynamic" else _original_len(s, t) if t == "longrope" else None


# ---------------------------------------------------------------------------- key reading


def _rope_type(s: dict) -> str:
    rope_type, legacy = s.get("rope_type"), s.get("type")
    for key, value in (("rope_type", rope_type), ("type", legacy)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"scaling[{key!r}] must be a str, got {value!r}")
    if rope_type is not None and legacy is not None and rope_type != legacy:
        raise ValueError(
            f"scaling['rope_type']={rope_type!r} and scaling['type']={legacy!r} disagree; "
            f"give one ('type' is the legacy name)"
        )
    rope_type = rope_type or legacy or "default"
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"scaling['rope_type'] must be one of {list(ROPE_TYPES)}, got {rope_type!r}"
        )
    return rope_type


def _rotary_dim(head_dim: int, s: dict) -> int:
    p = s.get("partial_rotary_factor")
    p = 1.0 if p is None else check_float("scaling['partial_rotary_factor']", p, positive=True)
    if p > 1.0:
        raise ValueError(f"scaling['partial_rotary_factor'] must be in (0, 1], got {p}")
    dim = int(head_dim * p)  # HF: int(head_dim * partial_rotary_factor)
    if dim < 2 or dim % 2:
        raise ValueError(
            f"head_dim * partial_rotary_factor must be an even int >= 2, got "
            f"head_dim={head_dim}, partial_rotary_factor={p} -> rotary_dim={dim}"
        )
    return dim


def _num(s: dict, key: str, rope_type: str, *, minimum: float | None = None) -> float | None:
    """``scaling[key]`` as a float, ``None`` if absent; ``minimum`` is inclusive."""
    if s.get(key) is None:
        return None
    v = check_float(f"scaling[{key!r}]", s[key])
    if minimum is not None and v < minimum:
        raise ValueError(
            f"scaling[{key!r}] must be >= {minimum} for rope_type {rope_type!r}, got {v}"
        )
    return v


def _required(v: float | None, key: str, rope_type: str) -> float:
    if v is None:
        raise ValueError(f"scaling[{key!r}] is required for rope_type {rope_type!r}")
    return v


def _length(s: dict, key: str, rope_type: str) -> int | None:
    if s.get(key) is None:
        return None
    return check_int(f"scaling[{key!r}] (rope_type {rope_type!r})", s[key], minimum=1)


def _original_len(s: dict, rope_type: str) -> int:
    """yarn / llama3 / longrope: HF fills a missing original length from max_position_embeddings."""
    n = _length(s, "original_max_position_embeddings", rope_type)
    n = n if n is not None else _length(s, "max_position_embeddings", rope_type)
    return int(_required(n, "original_max_position_embeddings", rope_type))


def _factor_or_ratio(s: dict, rope_type: str, original: int) -> float:
    """yarn / longrope: a missing factor is max_position_embeddings / original (Phi-3, DeepSeek)."""
    factor = _num(s, "factor", rope_type, minimum=1.0)
    if factor is not None:
        return factor
    max_len = _length(s, "max_position_embeddings", rope_type)
    if max_len is None:
        raise ValueError(
            f"scaling['factor'] is required for rope_type {rope_type!r} "
            f"(or scaling['max_position_embeddings'] to derive it from)"
        )
    factor = max_len / original
    if factor < 1.0:
        raise ValueError(
            f"scaling['max_position_embeddings']={max_len} must be >= "
            f"scaling['original_max_position_embeddings']={original} for rope_type {rope_type!r}"
        )
    return factor


def _plain(base: float, dim: int) -> Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # [dim//2]


def _no_dim_2(dim: int, rope_type: str) -> None:
    if dim < 4:
        raise ValueError(f"rope_type {rope_type!r} needs rotary_dim >= 4 (d / (d - 2)), got {dim}")


# ---------------------------------------------------------------------------- one per type


def _default(s: dict, t: str, base: float, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    return _plain(base, dim), 1.0


def _linear(s: dict, t: str, base: float, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    factor = _required(_num(s, "factor", t, minimum=1.0), "factor", t)
    return _plain(base, dim) / factor, 1.0  # positions / factor == inv_freq / factor


def _ntk(s: dict, t: str, base: float, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    factor = _required(_num(s, "factor", t, minimum=1.0), "factor", t)
    _no_dim_2(dim, t)
    return _plain(base * factor ** (dim / (dim - 2)), dim), 1.0


def _dynamic_len(s: dict, t: str) -> int:
    """dynamic: HF scales from config.max_position_embeddings (the trained length for this type)."""
    max_len = _length(s, "max_position_embeddings", t)
    orig = _length(s, "original_max_position_embeddings", t)
    if max_len is not None and orig is not None and max_len != orig:
        raise ValueError(
            f"scaling['max_position_embeddings']={max_len} and "
            f"scaling['original_max_position_embeddings']={orig} disagree for rope_type 'dynamic' "
            f"(HF uses max_position_embeddings as the trained length); give one"
        )
    return int(_required(max_len or orig, "max_position_embeddings", t))


def _dynamic(s: dict, t: str, base: float, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    factor = _required(_num(s, "factor", t, minimum=1.0), "factor", t)
    _no_dim_2(dim, t)
    L = _dynamic_len(s, t)
    seq = L if seq_len is None else max(seq_len, L)  # no change up to the trained length
    return _plain(base * ((factor * seq / L) - (factor - 1)) ** (dim / (dim - 2)), dim), 1.0


def _yarn(s: dict, t: str, base: float, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    L = _original_len(s, t)
    factor = _factor_or_ratio(s, t, L)
    attention_factor = _num(s, "attention_factor", t)
    if attention_factor is not None and attention_factor <= 0:
        raise ValueError(f"scaling['attention_factor'] must be > 0, got {attention_factor}")
    mscale, mscale_all_dim = _num(s, "mscale", t), _num(s, "mscale_all_dim", t)
    beta_fast = _num(s, "beta_fast", t) or 32.0  # HF: `or`, so 0 / None mean the default
    beta_slow = _num(s, "beta_slow", t) or 1.0
    if beta_fast < 0 or beta_slow <= 0 or beta_fast < beta_slow:
        raise ValueError(
            f"scaling['beta_fast']={beta_fast} and scaling['beta_slow']={beta_slow} must satisfy "
            f"beta_fast >= beta_slow > 0 for rope_type 'yarn'"
        )
    truncate = s.get("truncate", True)  # HF: a stored None means no truncation
    if truncate is not None and not isinstance(truncate, bool):
        raise TypeError(f"scaling['truncate'] must be a bool, got {truncate!r}")

    def mscale_of(scale: float, m: float = 1.0) -> float:  # YaRN's sqrt(1/t) = 0.1 ln(s) + 1
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:  # DeepSeek
            attention_factor = mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim)
        else:
            attention_factor = mscale_of(factor)

    def pair_index(turns: float) -> float:  # the pair that makes `turns` turns within L tokens
        return (dim * math.log(L / (turns * 2 * math.pi))) / (2 * math.log(base))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)  # HF clamps with dim - 1, not dim // 2 - 1
    if low == high:
        high += 0.001

    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)  # [dim//2]
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: fast pairs kept (extrapolated), 0: slow pairs interpolated
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def _llama3(s: dict, t: str, base: float, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    factor = _required(_num(s, "factor", t, minimum=1.0), "factor", t)
    low = _required(_num(s, "low_freq_factor", t), "low_freq_factor", t)
    high = _required(_num(s, "high_freq_factor", t), "high_freq_factor", t)
    if not 0 < low < high:
        raise ValueError(
            f"scaling['low_freq_factor']={low} and scaling['high_freq_factor']={high} must satisfy "
            f"0 < low_freq_factor < high_freq_factor for rope_type 'llama3'"
        )
    L = _original_len(s, t)
    inv_freq = _plain(base, dim)
    wavelen = 2 * math.pi / inv_freq  # [dim//2]
    # long wavelengths (> L / low): interpolate by factor; short (< L / high): keep
    scaled = torch.where(wavelen > L / low, inv_freq / factor, inv_freq)
    smooth = (L / wavelen - low) / (high - low)  # 1 at the short edge, 0 at the long edge
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= L / high) & (wavelen <= L / low)
    return torch.where(medium, smoothed, scaled), 1.0


def _factor_list(s: dict, key: str, t: str, n: int) -> list[float]:
    v = s.get(key)
    if v is None:
        raise ValueError(f"scaling[{key!r}] is required for rope_type {t!r}")
    if not isinstance(v, (list, tuple)) or not all(
        isinstance(x, numbers.Real) and not isinstance(x, bool) for x in v
    ):
        raise TypeError(f"scaling[{key!r}] must be a list of numbers, got {v!r}")
    if len(v) != n:
        raise ValueError(
            f"scaling[{key!r}] must have length rotary_dim // 2 = {n} for rope_type {t!r}, "
            f"got {len(v)}"
        )
    if not all(0 < x < math.inf for x in v):
        raise ValueError(f"scaling[{key!r}] must hold finite numbers > 0, got {v!r}")
    return [float(x) for x in v]


def _longrope(s: dict, t: str, base: float, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    short = _factor_list(s, "short_factor", t, dim // 2)
    long = _factor_list(s, "long_factor", t, dim // 2)
    L = _original_len(s, t)
    if L < 2:
        raise ValueError(
            f"scaling['original_max_position_embeddings'] must be >= 2 for 'longrope', got {L}"
        )
    attention_factor = _num(s, "attention_factor", t)
    if attention_factor is not None and attention_factor <= 0:
        raise ValueError(f"scaling['attention_factor'] must be > 0, got {attention_factor}")
    if attention_factor is None:
        factor = _factor_or_ratio(s, t, L)
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(L))
    ext = torch.tensor(long if seq_len and seq_len > L else short, dtype=torch.float32)
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * base**exponent), float(attention_factor)


_SCALERS = {
    "default": _default, "linear": _linear, "dynamic": _dynamic, "ntk": _ntk,
    "yarn": _yarn, "llama3": _llama3, "longrope": _longrope,
}  # fmt: skip
