"""The frames an explorable figure is built from, and the checks of what a chapter hands in.

:class:`Frame` is one setting of the control (its label, its value, the data of every trace);
the private checkers below turn tensors, arrays and lists into JSON-safe lists and refuse, with a
``TypeError`` or ``ValueError`` that names the argument, anything plotly would draw wrongly or
drop silently (tests/test_bad_input_explore.py). :mod:`posenc.lab.explore` re-exports the public
names; the figures that use the checks are in :mod:`posenc.lab.explore_figures`.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Frame", "power_label"]


@dataclass
class Frame:
    """One setting of the control: its label, its value and the data of every trace.

    ``traces`` holds one mapping per trace with the arrays that change (``"y"``, and ``"x"``
    when it changes too); 1-D tensors (any dtype but complex, any device with data, with or
    without grad), arrays and lists of numbers are accepted and stored as lists of floats.
    ``label`` is a str (the control's tick); ``value`` a str, an int or a finite float (numpy
    scalars become Python numbers; a tensor needs ``.item()``); ``title`` a str or None.
    Labels and values must be distinct across the frames of one figure."""

    label: str
    value: float | int | str
    traces: Sequence[Mapping[str, Any]]
    title: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.label, str):
            raise TypeError(f"Frame label must be a str (the control's tick), got "
                            f"{self.label!r}")
        self.value = _frame_value(self.value, self.label)
        if self.title is not None and not isinstance(self.title, str):
            raise TypeError(f"Frame {self.label!r}: title must be a str or None, got "
                            f"{self.title!r}")
        if isinstance(self.traces, (str, bytes, Mapping)) or not isinstance(self.traces,
                                                                            Sequence):
            raise TypeError(f"Frame {self.label!r}: traces must be a list of dicts (one per "
                            f"trace, e.g. [{{'y': ...}}]), got a {type(self.traces).__name__}")
        for i, trace in enumerate(self.traces):
            if not isinstance(trace, Mapping):
                raise TypeError(f"Frame {self.label!r}: traces[{i}] must be a dict such as "
                                f"{{'y': ...}}, got a {type(trace).__name__}")


def _frame_value(value: Any, label: str) -> float | int | str:
    """A frame's control value as a JSON-safe Python value: a str, an int or a finite float
    (numpy scalars become Python numbers; a tensor must be turned into one with ``.item()``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = ": pass .item()" if hasattr(value, "detach") else ""
        raise TypeError(f"Frame {label!r}: value must be a number or a str, got "
                        f"{_short(value)} (a {type(value).__name__}){hint}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if not math.isfinite(float(value)):
        raise ValueError(f"Frame {label!r}: value must be finite (the page's JSON cannot hold "
                         f"it), got {value!r}")
    return float(value)


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_label(value: float) -> str:
    """A short control label for a power of ten or a multiple of one: ``1e4`` -> ``10⁴``,
    ``5e5`` -> ``5·10⁵`` (short enough for six labels on a 390 px phone)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"power_label needs a number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"power_label needs a positive finite number, got {value!r}")
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = value / 10**exponent
    if not math.isclose(mantissa, round(mantissa), rel_tol=1e-9):
        return f"{value:g}"
    power = "10" + str(exponent).translate(_SUPERSCRIPT)
    return power if round(mantissa) == 1 else f"{round(mantissa)}·{power}"


def _plain(values: Any, what: str, ndim: int) -> Any:
    """A tensor or an array as nested lists, checked: real, on a device with data, ``ndim``-D.
    Other sequences are returned as they are (their items are checked by the caller)."""
    shape = "1-D" if ndim == 1 else "2-D [len(y), len(x)]"
    if hasattr(values, "detach"):  # a torch tensor, on any device, of any dtype
        if values.is_complex():
            raise TypeError(f"{what} must be real, got a complex tensor ({values.dtype})")
        if values.device.type == "meta":
            raise ValueError(f"{what} is a tensor on the meta device (no data to plot)")
        if values.dim() != ndim:
            raise ValueError(f"{what} must be {shape}, got a {values.dim()}-D tensor of shape "
                             f"{list(values.shape)}")
        return values.detach().cpu().double().tolist()
    if hasattr(values, "tolist") and hasattr(values, "ndim"):  # a numpy array
        if "complex" in str(getattr(values, "dtype", "")):
            raise TypeError(f"{what} must be real, got a complex array ({values.dtype})")
        if values.ndim != ndim:
            raise ValueError(f"{what} must be {shape}, got a {values.ndim}-D array of shape "
                             f"{list(values.shape)}")
        return values.tolist()
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise TypeError(f"{what} must be a list, a tensor or an array of numbers, got a "
                        f"{type(values).__name__}: {_short(values)}")
    return values


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(v: Any, what: str) -> float:
    if isinstance(v, numbers.Real):
        return float(v)
    if isinstance(v, numbers.Complex):
        raise TypeError(f"{what} must be real, got {v!r}")
    raise TypeError(f"{what} must hold numbers, got {_short(v)} (a {type(v).__name__})")


def _floats(values: Any, digits: int, what: str = "data") -> list[float]:
    """A 1-D tensor, array or sequence as a list of finite floats rounded to ``digits``
    significant digits (JSON stays small; the frames are checked against posenc to that
    precision). ``what`` names the argument in an error."""
    values = _plain(values, what, 1)
    out = []
    for i, v in enumerate(values):
        v = _number(v, f"{what}[{i}]")
        if not math.isfinite(v):
            raise ValueError(f"{what} must be finite, got {v!r} at index {i}")
        out.append(float(f"{v:.{digits}g}"))
    if not out:
        raise ValueError(f"{what} is empty: give at least one value")
    return out


def _text(value: Any, argument: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {_short(value)}")
    return value


def _flag(value: Any, argument: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be True or False, got {value!r}")
    return value


def _integer(value: Any, argument: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{argument} must be an int, got {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{argument} must be in {low}..{high}, got {number}")
    return number


def _range(value: Any, argument: str, log: bool = False,
           increasing: bool = False) -> list[float] | None:
    """An axis or colour range: two finite numbers (both > 0 on a log axis)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) \
            or len(value) != 2:
        raise ValueError(f"{argument} must be two numbers (low, high), got {_short(value)}")
    lo, hi = (_number(v, argument) for v in value)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo == hi:
        raise ValueError(f"{argument} must be two different finite numbers, got "
                         f"{_short(value)}")
    if increasing and lo > hi:
        raise ValueError(f"{argument} must be (low, high) with low < high, got "
                         f"{_short(value)}")
    if log and min(lo, hi) <= 0:
        raise ValueError(f"{argument} is on a log axis: both ends must be > 0, got "
                         f"{_short(value)}")
    return [lo, hi]


def _check_frames(frames: Any, function: str) -> list[Frame]:
    """``frames``: a non-empty list of :class:`Frame`, with distinct labels and values."""
    if isinstance(frames, (str, bytes, Mapping, Frame)) or not isinstance(frames, Sequence):
        raise TypeError(f"{function}: frames must be a list of explore.Frame, got a "
                        f"{type(frames).__name__}")
    if not frames:
        raise ValueError(f"{function}: frames is empty; give at least one explore.Frame")
    for i, frame in enumerate(frames):
        if not isinstance(frame, Frame):
            raise TypeError(f"{function}: frames[{i}] must be an explore.Frame, got a "
                            f"{type(frame).__name__}")
    for attribute in ("label", "value"):
        seen: dict[Any, int] = {}
        for i, frame in enumerate(frames):
            key = getattr(frame, attribute)
            if key in seen:
                raise ValueError(f"{function}: frames[{seen[key]}] and frames[{i}] have the "
                                 f"same {attribute} {key!r}; a {attribute} can appear only once "
                                 f"(not twice) on the control")
            seen[key] = i
    return list(frames)


def _check_static(static: Any) -> list[dict[str, Any]]:
    if isinstance(static, (str, bytes, Mapping)) or not isinstance(static, Sequence):
        raise TypeError(f"static must be a list of Plotly trace dicts, got a "
                        f"{type(static).__name__}")
    out = []
    for i, trace in enumerate(static):
        if not isinstance(trace, Mapping):
            raise TypeError(f"static[{i}] must be a Plotly trace dict, got a "
                            f"{type(trace).__name__}")
        try:
            json.dumps(trace, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise TypeError(f"static[{i}] must hold plain lists of finite numbers and str "
                            f"(a tensor or an array: pass .tolist()): {err}") from None
        out.append(dict(trace))
    return out


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"name must be a non-empty str (the figure's id in the page), got "
                        f"{name!r}")
    return name


def _matrix(values: Any, digits: int, what: str = "z") -> list[list[float | None]]:
    """A 2-D tensor, array or nested sequence as rows of floats; ``-inf``, NaN and ``None``
    (masked or blank cells) become ``None``, which Plotly leaves undrawn (the masked colour
    shows through); ``+inf`` is refused."""
    values = _plain(values, what, 2)
    rows = []
    for r, row in enumerate(values):
        if isinstance(row, (str, bytes, Mapping)) or not isinstance(row, Sequence):
            raise ValueError(f"{what} must be 2-D [len(y), len(x)], got row {r} = "
                             f"{_short(row)}")
        out: list[float | None] = []
        for c, v in enumerate(row):
            if v is None:
                out.append(None)
                continue
            if isinstance(v, Sequence) and not isinstance(v, str):
                raise ValueError(f"{what} must be 2-D [len(y), len(x)], got a list at "
                                 f"[{r}][{c}] (3-D?)")
            v = _number(v, f"{what}[{r}][{c}]")
            if math.isnan(v) or v == -math.inf:
                out.append(None)
            elif math.isinf(v):
                raise ValueError(f"{what} may hold -inf or NaN (masked cells), not {v!r} (at "
                                 f"[{r}][{c}])")
            else:
                out.append(float(f"{v:.{digits}g}"))
        rows.append(out)
    return rows


def _ticktext(axis: str, given: Sequence[Sequence[str]], frames: Sequence[Frame],
              values: Sequence[float]) -> list[list[str]]:
    """Per-frame tick labels of one heatmap axis, checked: one label per axis value."""
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Sequence):
        raise TypeError(f"{axis}ticktext must be a list (one list of labels per frame), got "
                        f"{_short(given)}")
    if len(given) != len(frames):
        raise ValueError(f"{axis}ticktext must hold one list per frame ({len(frames)}), got "
                         f"{len(given)}")
    out = []
    for frame, texts in zip(frames, given, strict=True):
        if isinstance(texts, (str, bytes, Mapping)) or not isinstance(texts, Sequence) \
                or len(texts) != len(values):
            raise ValueError(f"frame {frame.label!r}: {axis}ticktext must hold one label per "
                             f"{axis} value ({len(values)})")
        out.append([str(t) for t in texts])
    return out
