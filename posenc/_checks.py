"""Argument checks shared by the public API.

Every public function validates what it is given and raises a ``ValueError`` (or ``TypeError``
for a wrong type) whose message names the argument, the value received and what is allowed.
"""

from __future__ import annotations

import numbers
import os
import sys
import warnings
from types import FrameType

import torch
from torch import Tensor


def check_int(name: str, value: object, *, minimum: int | None = None, even: bool = False) -> int:
    """Return ``value`` as an ``int`` or raise: a bool or float is not an int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    if even and value % 2:
        raise ValueError(f"{name} must be even, got {value}")
    return value


INT64_MAX = 2**63 - 1


def check_window(name: str, value: object) -> int:
    """A sliding window: an int in ``[1, 2**63 - 1]`` (the masks compare int64 positions)."""
    value = check_int(name, value, minimum=1)
    if value > INT64_MAX:
        raise ValueError(
            f"{name} must be an int <= 2**63 - 1 (the masks compare int64 positions; any "
            f"window longer than the sequence means no window: pass None), got {value}"
        )
    return value


def check_sinks(window: int | None, sinks: object, *, owner: str = "") -> int | None:
    """StreamingLLM's ``sinks`` (Xiao et al., 2024): an int >= 0 that keeps the first positions
    visible beside a sliding ``window``, so a positive count needs a window (one message for
    ``attend``, ``MultiHeadAttention`` and ``KVCache``; ``owner`` prefixes it)."""
    if sinks is None:
        return None
    sinks = check_int("sinks", sinks, minimum=0)
    if window is None and sinks:
        raise ValueError(
            f"{owner}sinks={sinks} needs window=W too: sinks keep the first {sinks} positions "
            "visible beside a sliding window of W (without a window every earlier key is "
            "visible already)"
        )
    return sinks


def check_float(
    name: str, value: object, *, positive: bool = False, minimum: float | None = None
) -> float:
    """Return ``value`` as a finite ``float`` or raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_tensor(name: str, value: object, *, floating: bool = False, min_dim: int = 0) -> Tensor:
    """Raise unless ``value`` is a tensor (floating point if asked) with at least ``min_dim`` dims."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (float32, float16, bfloat16, float64), "
            f"got dtype {value.dtype}"
        )
    if value.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dims, got shape {tuple(value.shape)}"
        )
    return value


def is_compiling() -> bool:
    """True while ``torch.compile`` traces: value checks that need a host sync are skipped then
    (shape, dtype and type checks are static and stay), as transformers does."""
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


MAX_POSITION = 1 << 31
"""Positions must be below ``2**31`` (int32's range): RoPE's angles are reduced mod ``2 pi``
before they are rounded to float32 (``posenc.rope_angles``), so every position up to there
rotates exactly; ALiBi and T5 take position differences in int64."""


def check_positions(name: str, value: object) -> Tensor:
    """Raise unless ``value`` is an integer tensor of positions in ``[0, 2**31)``, shape [L] or
    [B, L]. The range check needs a host sync, so it is skipped while compiling."""
    return position_range(name, value)[0]


def position_range(name: str, value: object) -> tuple[Tensor, int, int]:
    """:func:`check_positions`, also returning the positions' minimum and maximum (read in
    the check's one host sync): ``(value, 0, -1)`` when empty, ``(value, 0, 0)`` while
    compiling (not read)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer positions, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.dim() not in (1, 2):
        raise ValueError(f"{name} must have shape [L] or [B, L], got shape {tuple(value.shape)}")
    if not value.numel():
        return value, 0, -1
    if is_compiling():
        return value, 0, 0
    if value.numel() == 1:  # a decode step's position: one read
        lo = hi = int(value)
    else:
        a, b = torch.aminmax(value)
        lo, hi = int(a), int(b)
    check_range(name, lo, hi)
    return value, lo, hi


def check_range(name: str, lo: int, hi: int) -> None:
    """Positions (their minimum ``lo``, maximum ``hi``) in ``[0, 2**31)``."""
    if lo < 0:
        raise ValueError(f"{name} must be >= 0, got a minimum of {lo}")
    if hi >= MAX_POSITION:
        raise ValueError(
            f"{name} must be < 2**31 = {MAX_POSITION} (int32's range; every position below "
            f"it rotates exactly), got a maximum of {hi}"
        )


def check_rows(
    name: str, value: object, B: int, L: int, *, labels: bool, like: Tensor | None = None
) -> Tensor:
    """``value`` ``[L]`` or ``[1 | B, L]``, an integer tensor: positions in ``[0, 2**31)``
    (``labels=False``) or document ids, labels of any integer value (``labels=True``).
    ``like``: the ``[B, H, L, head_dim]`` tensor the rows describe, named in a layout hint."""
    if labels:
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of integer ids, got {type(value).__name__}")
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor (document labels), got dtype {value.dtype}")
    else:
        value = check_positions(name, value)
    rows_ok = value.dim() == 1 or (value.dim() == 2 and (value.shape[0] == 1 or value.shape[0] == B))
    if not rows_ok or value.shape[-1] != L:
        hint = _document_ids_hint(value) if labels else ""
        if value.dim() <= 2:  # [L] or [B, L] rows for [B, L, H, D]
            hint = layout_hint(like, 1, value.shape[-1],
                               f"the {name}' {value.shape[-1]} entries", L) or hint
        raise ValueError(f"{name} must have shape [{L}] or [{B}, {L}], got {tuple(value.shape)}"
                         + (f". {hint}" if hint else ""))
    return value


_TRANSPOSE = ("pass q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2) and transpose the "
              "output back")


def layout_hint(like: Tensor | None, dim: int, n: int, what: str, read: int) -> str:
    """For ``q`` (``like``) given as ``[B, L, H, head_dim]`` where ``[B, H, L, head_dim]`` is
    read: when its ``dim`` (1: L, 2: H) holds ``n`` (``what``) and ``read`` (the size taken
    from the other one) differs, the transpose that fixes it; else ``""``. More tokens than
    heads "looks like" that layout; fewer (a decode step ``[B, 1, H, head_dim]``) "may be"."""
    if like is None or like.dim() != 4 or like.shape[dim] != n or n == read:
        return ""
    looks = "looks like" if like.shape[1] > like.shape[2] else "may be"
    return (
        f"q of shape {tuple(like.shape)} {looks} [B, L, H, head_dim] (its dim {dim} has "
        f"{what}); attend reads [B, H, L, head_dim]: {_TRANSPOSE}"
    )


def cache_mismatch(k: Tensor, cached: Tensor, held: int) -> str:
    """The refusal of new keys ``k`` that do not fit the ``cached`` keys (``held`` of them):
    a new batch (``cache.reset()``), or, where ``k``'s dim 2 has the cached heads and its dim 1
    does not, ``[B, L, H, head_dim]`` input (a decode step ``[B, 1, H, head_dim]``)."""
    heads = cached.shape[1]
    reset = (f"the cache holds {held} keys from earlier calls; cache.reset() empties it to "
             "start a new batch")
    head = (f"new k {tuple(k.shape)} does not match the cached keys {tuple(cached.shape)} "
            "(batch, heads and head_dim must agree): ")
    if k.dim() != 4 or k.shape[2] != heads or k.shape[1] == heads:
        return head + reset
    return head + (
        f"its dim 2 has the cached {heads} heads, so k may be [B, L, H, head_dim] (a decode "
        f"step [B, 1, H, head_dim]); the cache and attend read [B, H, L, head_dim]: "
        f"{_TRANSPOSE}. If it is a new batch instead, {reset}"
    )


MAX_BIAS_ELEMENTS = 1 << 31
"""The largest dense bias ``alibi_bias`` / ``T5RelativeBias`` build: ``2**31`` elements (8 GiB
in float32). Longer sequences need a bias computed per score (FlexAttention's ``score_mod``)."""


def check_bias_size(owner: str, heads: int, q_len: int, k_len: int) -> None:
    """Refuse a dense ``[heads, q_len, k_len]`` bias past ``MAX_BIAS_ELEMENTS``, before allocating."""
    n = heads * q_len * k_len
    if n > MAX_BIAS_ELEMENTS:
        raise ValueError(
            f"{owner}: a dense bias of {heads} x {q_len} x {k_len} = {n:.3g} elements exceeds "
            f"2**31 ({n * 4 / 2**30:.3g} GiB in float32); use posenc.alibi_score_mod with "
            "FlexAttention, or posenc.attend(..., backend='flex'), which never build it"
        )


def check_dtype(name: str, value: object) -> torch.dtype | None:
    """Raise unless ``value`` is None or a floating ``torch.dtype``."""
    if value is None:
        return None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError(f"{name} must be None or a floating torch.dtype, got {value!r}")
    return value


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``: a string such as ``"false"`` is truthy in Python and
    an int is ambiguous, so both are errors here."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be a bool (True or False), got {value!r} ({type(value).__name__})"
        )
    return value


_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "meta")


def check_device(name: str, value: object, *, available: bool = False) -> torch.device | None:
    """Return ``value`` (None, a device string or a ``torch.device``) as a ``torch.device``.

    ``available=True`` also checks that a ``cuda``/``mps``/``xpu`` device exists on this machine.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            device = torch.device(value)
        except RuntimeError:
            raise ValueError(
                f"{name} must be a device such as 'cpu', 'cuda', 'cuda:1' or 'mps' "
                f"(types: {', '.join(_DEVICE_TYPES)}), got {value!r}"
            ) from None
    elif isinstance(value, torch.device):
        device = value
    else:
        raise TypeError(
            f"{name} must be None, a str or a torch.device, got {value!r} ({type(value).__name__})"
        )
    if available and device.type in ("cuda", "mps", "xpu"):
        if device.type == "mps":
            ok, count = torch.backends.mps.is_available(), 1
        else:
            backend = getattr(torch, device.type, None)  # torch.cuda or torch.xpu
            ok = backend is not None and backend.is_available()
            count = backend.device_count() if backend is not None and ok else 0
        if not ok or (device.index is not None and device.index >= count):
            raise ValueError(
                f"{name}={value!r} is not available on this machine ({device.type} devices: "
                f"{count if ok else 0}); use None to pick the best available device, or 'cpu'"
            )
    return device


def check_base(name: str, value: object) -> float:
    """A frequency base: finite and > 1 (``base ** (-2i/d)`` must shrink with ``i``)."""
    value = check_float(name, value)
    if value <= 1.0:
        raise ValueError(f"{name} must be > 1, got {value}")
    return value


def check_embed_positions(x: Tensor, offset: object, positions: object) -> Tensor:
    """The positions of ``x [B, L, D]``: ``offset + arange(L)``, or ``positions [L]`` / ``[B, L]``
    (``B`` may be 1), non-negative integers on ``x``'s device. Giving both is an error."""
    offset = check_int("offset", offset, minimum=0)
    B, L = x.shape[0], x.shape[1]
    if positions is None:
        return torch.arange(offset, offset + L, device=x.device)  # [L]
    if offset:
        raise ValueError(
            f"give positions or offset, not both: offset={offset} would be ignored "
            f"(add it to positions instead)"
        )
    positions = check_positions("positions", positions)
    rows = positions.shape[0]
    if positions.shape[-1] != L or (positions.dim() == 2 and rows != 1 and rows != B):
        raise ValueError(
            f"positions must have shape [{L}] or [{B}, {L}] to match x of shape {tuple(x.shape)}, "
            f"got {tuple(positions.shape)}"
        )
    return positions.to(x.device)


def _document_ids_hint(value: object) -> str:
    """A sentence naming the likely mistake when ``value``, refused as ``document_ids``, looks
    like another description of a packed batch; ``""`` when it looks like neither.

    - ``cu_seqlens`` (1-D, starting at 0, strictly increasing: FlashAttention's offsets): name
      :func:`document_ids_from_lengths` and the varlen layout;
    - ``position_ids`` (runs counting up by 1 that restart at the smallest value, at least one
      restart and one step up): name :func:`document_ids_from_positions`.

    The sentence starts with a capital and ends with a full stop; append it to an error's own
    text (``f"{message}. {hint}"``). Meant for the error path only: it reads values (a host
    sync) and returns ``""`` while compiling or for anything but a 1-D or 2-D integer tensor.
    """
    if not isinstance(value, Tensor) or is_compiling() or value.dim() not in (1, 2):
        return ""
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        return ""
    if value.shape[-1] < 2:
        return ""
    x = value.detach().to(torch.long)  # [L] or [B, L]
    step = x[..., 1:] - x[..., :-1]  # [..., L - 1]
    if x.dim() == 1 and int(x[0]) == 0 and bool((step > 0).all()):
        return (
            f"It looks like cu_seqlens (FlashAttention's offsets [0, n_1, n_1 + n_2, ...], here "
            f"{len(x) - 1} sequence(s), {int(x[-1])} tokens in all): "
            "posenc.document_ids_from_lengths(cu_seqlens.diff()) gives the document ids, or "
            "pass cu_seqlens= with q, k, v in the [total, H, D] layout"
        ) + "."
    lo = int(x.min())
    restart = step != 1  # [..., L - 1]
    if lo >= 0 and bool(restart.any()) and bool((~restart).any()) and bool((x[..., 1:][restart] == lo).all()):
        return (
            f"It looks like position_ids (runs counting up by 1 that restart at {lo}): "
            "posenc.document_ids_from_positions(position_ids) gives the document ids."
        )
    return ""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBRARIES = ("torch", "transformers")
"""Packages whose frames stand between the caller and posenc (``nn.Module.__call__``,
transformers' ``generate`` and model code): :func:`warn_caller` looks past them too."""


def _library_dirs() -> tuple[str, ...]:
    dirs = [_PACKAGE]
    for name in _LIBRARIES:
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str):
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` at the first frame outside ``posenc`` (and outside torch and
    transformers, whose module calls and ``generate`` sit between): the caller's line, however
    deep in the library the warning is given."""
    frame: FrameType | None = sys._getframe(1)
    level = 2  # warn_caller's caller
    skipped = _library_dirs()
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skipped):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def check_dropout(name: str, value: object) -> float:
    """A probability of dropping an attention weight: a real number in ``[0, 1]``."""
    value = check_float(name, value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value
