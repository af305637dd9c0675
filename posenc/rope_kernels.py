"""The encodings layer: RoPE's rotation kernels, without checks (RoFormer, Su et al., 2021).

``x cos + turn(x) sin`` on the last dim, where ``turn`` is the 90-degree turn of each channel
pair: interleaved pairs ``(0, 1), (2, 3), ...`` (RoFormer, Meta's LLaMA, GPT-J) or half pairs
``(i, i + d/2)`` (GPT-NeoX, Hugging Face's ``rotate_half``).

Speed: the rotation is computed in float32 (float64 for float64 inputs) and written once in
the input's dtype. Interleaved float32 multiplies channel pairs as complex numbers (Meta's form,
one fused pass); otherwise one multiply and two ``addcmul`` on views of the pair halves. The
backward of a rotation is the rotation by minus the angle (the map is orthogonal up to the
scale ``cos^2 + sin^2``, and its transpose is the same map with ``-sin``), so a custom autograd
function saves only ``cos``/``sin`` and reuses the forward kernel. :func:`_rope` picks the form
per call: that autograd function; the textbook form when ``cos``/``sin`` need gradients; the
form written for ``torch.compile`` (issue 22, ``benchmarks/repro_compile_rope.py``); or no
graph at all.

The callers check the arguments (``posenc.rope``'s public functions, ``RotaryEmbedding``);
nothing here does. ``posenc.rope`` re-exports ``_rope_compiled``, ``_rope_textbook``,
``_Rope`` and ``_RopeCompiled``: monkeypatch them here, where :func:`_rope` looks them up.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._checks import is_compiling


def _turn_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dim (unchecked ``posenc.rope.rotate_half``)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _turn_every_two(x: Tensor) -> Tensor:
    """``(x0, x1), ... -> (-x1, x0), ...`` (unchecked ``posenc.rope.rotate_every_two``)."""
    x = x.unflatten(-1, (-1, 2))  # [..., d/2, 2]
    return torch.stack([-x[..., 1], x[..., 0]], dim=-1).flatten(-2)


def _as_complex(t: Tensor) -> Tensor:
    """``[..., d]`` real -> ``[..., d/2]`` complex view of the channel pairs (a copy if strides forbid)."""
    try:
        return torch.view_as_complex(t.unflatten(-1, (-1, 2)))
    except RuntimeError:
        return torch.view_as_complex(t.contiguous().unflatten(-1, (-1, 2)))


def _complex_rotate(x: Tensor, cis: Tensor) -> Tensor:
    """Interleaved float32/float64 ``x [..., L, d]`` times ``cis [..., L, d/2]``: one fused pass."""
    return torch.view_as_real(_as_complex(x) * cis).flatten(-2)


def _rotate_into(
    out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, cis: Tensor | None
) -> None:
    """``out = x * cos + turn(x) * sin`` (all channels rotate), math in float32/float64."""
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    if interleaved:
        if cis is None:
            cis = torch.complex(cos[..., 0::2].to(cdt), sin[..., 0::2].to(cdt))  # [..., L, rd/2]
        if x.dtype == cdt:
            try:  # out is fresh: a complex view fails only for an odd head_dim (partial rotary)
                torch.mul(_as_complex(x), cis, out=torch.view_as_complex(out.unflatten(-1, (-1, 2))))
                return
            except RuntimeError:
                pass
        xf = x.to(cdt, copy=True)  # [..., L, rd] fp16/bf16 -> float32: Meta's form, in place
        torch.view_as_complex(xf.unflatten(-1, (-1, 2))).mul_(cis)
        out.copy_(xf)  # one rounding to x's dtype
        return
    cos, sin = cos.to(cdt), sin.to(cdt)
    h = x.shape[-1] // 2
    s = sin[..., :h]  # both halves share the angles
    xa, xb, oa, ob = x[..., :h], x[..., h:], out[..., :h], out[..., h:]
    if x.dtype == cdt:  # in place on the output: x cos, then -/+ the other half times sin
        torch.mul(x, cos, out=out)
        oa.addcmul_(xb, s, value=-1)  # xa cos - xb sin
        ob.addcmul_(xa, s)  # xb cos + xa sin
    else:  # fp16 / bf16: x cos in float32, one rounding when written to out
        ya, yb = torch.mul(x, cos).chunk(2, dim=-1)  # [..., L, rd/2] float32 each
        torch.addcmul(ya, xb, s, value=-1, out=oa)
        torch.addcmul(yb, xa, s, out=ob)


def _rope_forward(
    x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, cis: Tensor | None = None
) -> Tensor:
    rd = cos.shape[-1]
    if interleaved and rd == x.shape[-1] and x.dtype in (torch.float32, torch.float64):
        if cis is None:
            cis = torch.complex(cos[..., 0::2].to(x.dtype), sin[..., 0::2].to(x.dtype))
        return _complex_rotate(x, cis)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [..., L, d]
    if rd < x.shape[-1]:  # partial rotary: the rest passes through
        out[..., rd:] = x[..., rd:]
        _rotate_into(out[..., :rd], x[..., :rd], cos, sin, interleaved, cis)
    else:
        _rotate_into(out, x, cos, sin, interleaved, cis)
    return out


class _Rope(torch.autograd.Function):
    """RoPE with an analytic backward: the gradient is the rotation by minus the angle."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, cis: Tensor | None
    ) -> Tensor:
        ctx.save_for_backward(cos, sin, cis)
        ctx.interleaved = interleaved
        return _rope_forward(x, cos, sin, interleaved, cis)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        cos, sin, cis = ctx.saved_tensors
        back = None if cis is None else cis.conj()
        return _Rope.apply(grad, cos, -sin, ctx.interleaved, back), None, None, None, None


def _rope_textbook(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """``x cos + turn(x) sin`` with plain autograd: used when cos/sin need gradients."""
    rd = cos.shape[-1]
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    xr = x[..., :rd].to(cdt)
    turn = _turn_every_two(xr) if interleaved else _turn_half(xr)
    y = (xr * cos.to(cdt) + turn * sin.to(cdt)).to(x.dtype)
    return torch.cat([y, x[..., rd:]], dim=-1) if rd < x.shape[-1] else y


def _rotate_tables(x: Tensor, cos: Tensor, sin_signed: Tensor, interleaved: bool) -> Tensor:
    """``x cos + turn(x) sin_signed`` for ``x [..., L, rd]``, where ``turn`` swaps the two
    channels of each pair (interleaved: ``(x0, x1) -> (x1, x0)``; half: the two halves) and
    ``sin_signed`` carries the signs (``[-s0, s0, -s1, s1, ...]`` / ``[-s, s]``). Math in
    float32 (float64 for float64 ``x``), the result in ``x``'s dtype. One pointwise expression,
    so Inductor chooses the output's memory layout: a result built with ``torch.stack`` would be
    fixed to the contiguous one, and the attention output then needs one more copy."""
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    xr = x.to(cdt)
    if interleaved:
        turn = xr.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    else:
        turn = xr.roll(x.shape[-1] // 2, dims=-1)
    return (xr * cos + turn * sin_signed).to(x.dtype)


class _RopeCompiled(torch.autograd.Function):
    """The rotation under ``torch.compile`` with its analytic backward (the same rotation by
    minus the angle), which Dynamo traces into the graph. Derived by autograd instead, the
    backward of the channel swap becomes a scatter into zeros that Inductor runs with a branch
    per element."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin_signed: Tensor, interleaved: bool) -> Tensor:
        ctx.save_for_backward(cos, sin_signed)
        ctx.interleaved = interleaved
        return _rotate_tables(x, cos, sin_signed, interleaved)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        cos, sin_signed = ctx.saved_tensors
        return _rotate_tables(grad, cos, -sin_signed, ctx.interleaved), None, None, None


def _rope_compiled(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """The rotation as written for ``torch.compile`` (issue 22; the cause and the numbers are
    in ``benchmarks/repro_compile_rope.py``). The tables are rebuilt from one angle per pair
    with ``torch.stack`` / ``torch.cat``, which Inductor lowers on CPU to a kernel that writes
    them into a buffer once. Left as plain pointwise ops (``repeat_interleave``, ``cos``) they
    are inlined into every consumer, and ``sin``/``cos`` are recomputed for every batch row and
    head, forward and backward, in a scalar loop: Inductor's CPU heuristic keeps a reused
    ``exp`` or ``log`` in a buffer, not ``sin``/``cos``."""
    rd = cos.shape[-1]
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    if interleaved:
        c, s = cos[..., 0::2].to(cdt), sin[..., 0::2].to(cdt)  # [..., L, rd/2]
        full_cos = torch.stack([c, c], dim=-1).flatten(-2)  # [..., L, rd]: c0 c0 c1 c1 ...
        sin_signed = torch.stack([-s, s], dim=-1).flatten(-2)  # -s0 s0 -s1 s1 ...
    else:
        c, s = cos[..., : rd // 2].to(cdt), sin[..., : rd // 2].to(cdt)
        full_cos, sin_signed = torch.cat([c, c], dim=-1), torch.cat([-s, s], dim=-1)
    y = _RopeCompiled.apply(x[..., :rd], full_cos, sin_signed, interleaved)
    return torch.cat([y, x[..., rd:]], dim=-1) if rd < x.shape[-1] else y


def _rope(
    x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, cis: Tensor | None = None
) -> Tensor:
    """The rotation without checks: autograd function, textbook form, or no graph at all.
    While compiling, :func:`_rope_compiled` (complex arithmetic has no code generation in
    Inductor), or the textbook form when ``cos``/``sin`` need gradients."""
    if is_compiling():
        if cos.requires_grad or sin.requires_grad:  # tables that learn: every entry gets its grad
            return _rope_textbook(x, cos, sin, interleaved)
        return _rope_compiled(x, cos, sin, interleaved)
    if torch.is_grad_enabled():
        if cos.requires_grad or sin.requires_grad:
            return _rope_textbook(x, cos, sin, interleaved)
        if x.requires_grad:
            return _Rope.apply(x, cos, sin, interleaved, cis)
    return _rope_forward(x, cos, sin, interleaved, cis)
