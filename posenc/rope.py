"""Rotary position embedding, RoPE (Su et al., 2024, "RoFormer", arXiv 2021), and xPos (Sun et al., 2023,
"A Length-Extrapolatable Transformer", arXiv 2212.10554).

Each pair of query/key channels is rotated by the angle ``pos * theta_i``, so the score
``(R_m q) . (R_n k) = q . R_{n-m} k`` depends on the positions only through ``n - m``.

Two channel layouts exist and the same weights give different results under them:

* ``interleaved=True``: pairs ``(0, 1), (2, 3), ...`` -- the RoFormer paper, Meta's LLaMA code,
  GPT-J. ``cos``/``sin`` repeat each angle twice: ``[t0, t0, t1, t1, ...]``.
* ``interleaved=False`` ("half"): pairs ``(i, i + d/2)`` -- GPT-NeoX and Hugging Face Llama, whose
  helper for it is called ``rotate_half``. ``cos``/``sin`` are ``[t0, t1, ..., t0, t1, ...]``.

``rope_permutation`` and ``convert_rope_weight`` move q/k projection weights between the two,
as checkpoint converters do.

This module (the encodings layer) checks arguments and holds the tables; the rotation itself
(float32 math, the analytic backward, the form for ``torch.compile``) is in
``posenc.rope_kernels``, the config reader behind ``from_hf_config`` in
``posenc.rope_config``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ._checks import (
    MAX_POSITION,
    check_dtype,
    check_float,
    check_int,
    check_tensor,
    is_compiling,
    position_range,
)
from .rope_angles import cos_sin_unchecked
from .rope_config import rotary_kwargs_from_hf_config
from .rope_kernels import _complex_rotate, _rope, _turn_every_two, _turn_half
from .rope_kernels import _Rope as _Rope  # re-exported: tests and benchmarks import these here
from .rope_kernels import _rope_compiled as _rope_compiled
from .rope_kernels import _rope_textbook as _rope_textbook
from .rope_kernels import _RopeCompiled as _RopeCompiled
from .rope_layout import check_positions_for, check_qk, check_rope_args, check_seq_dim, fit
from .rope_tables import TABLE_MAX as TABLE_MAX  # re-exported: posenc.rope.TABLE_MAX
from .rope_tables import RotaryTables, Tables


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {value!r} ({type(value).__name__})")
    return value


def _check_even_last_dim(name: str, x: object) -> Tensor:
    x = check_tensor(name, x, min_dim=1)
    if x.shape[-1] % 2:
        raise ValueError(f"{name}.shape[-1] must be even (channel pairs), got shape {tuple(x.shape)}")
    return x


def rope_cos_sin(
    positions: Tensor,
    inv_freq: Tensor,
    *,
    interleaved: bool = True,
    attention_factor: float = 1.0,
    dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of ``positions * inv_freq``, each ``[..., seq, rotary_dim]``.

    ``positions`` is ``[seq]`` or ``[B, seq]`` (integers in ``[0, 2**31)``); angles are float32,
    scaled by ``attention_factor`` (YaRN's attention factor sqrt(1/t), t its temperature) and
    cast to ``dtype`` at the end. Below position 512 the angle is the float32 product
    ``positions.float() * inv_freq``, transformers' value bit for bit; from there on it is
    reduced mod ``2 pi`` before rounding (``posenc.rope_angles.rope_angles``), so scores
    depend on ``n - m`` alone to float32 precision at any position below ``2**31``, where the
    float32 product drifts by up to ``position * 3e-8`` rad.
    """
    positions, lo, hi = position_range("positions", positions)  # 0, 0 while compiling
    check_tensor("inv_freq", inv_freq, floating=True)
    if inv_freq.dim() != 1 or inv_freq.numel() == 0:
        raise ValueError(f"inv_freq must be 1-D and non-empty, got shape {tuple(inv_freq.shape)}")
    if not bool(torch.isfinite(inv_freq).all()):
        raise ValueError(f"inv_freq must be finite, got {inv_freq.tolist()}")
    _check_bool("interleaved", interleaved)
    attention_factor = check_float("attention_factor", attention_factor, positive=True)
    dtype = check_dtype("dtype", dtype)
    known = positions.numel() and not is_compiling()  # the range read by the check
    cos, sin = cos_sin_unchecked(
        positions, inv_freq, interleaved=interleaved, attention_factor=attention_factor,
        max_position=hi if known else None, min_position=lo if known else None,
    )  # [..., seq, rd] float32
    return (cos, sin) if dtype is None else (cos.to(dtype), sin.to(dtype))


def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dim: the 90-degree turn of the half layout."""
    return _turn_half(_check_even_last_dim("x", x))


def rotate_every_two(x: Tensor) -> Tensor:
    """``(x0, x1), (x2, x3), ... -> (-x1, x0), (-x3, x2), ...``: the turn of the interleaved layout.

    (The source article calls this ``rotate_half``; Hugging Face uses that name for the *half*
    layout above.)
    """
    return _turn_every_two(_check_even_last_dim("x", x))


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = True) -> Tensor:
    """Rotate ``x [..., seq, head_dim]`` by ``cos``/``sin`` (from ``rope_cos_sin``).

    ``cos``/``sin`` are ``[seq, rotary_dim]``, have ``x``'s rank with leading dims equal to
    ``x``'s or 1 (``[B, 1, seq, rotary_dim]`` for ``x [B, H, seq, head_dim]``), or a lower rank
    whose leading dims are all 1 (``[1, seq, rotary_dim]``, what transformers' Pixtral passes:
    it broadcasts exactly); a ``[B, seq, rotary_dim]`` table with ``B > 1`` against a 4-D ``x``
    is refused, since it would broadcast over the heads. When ``rotary_dim < head_dim`` only the
    first ``rotary_dim`` channels rotate
    (partial rotary, as GPT-NeoX and Phi). The math is float32 (float64 for float64 ``x``); the
    result has ``x``'s dtype and shape. Differentiable; when only ``x`` needs a gradient the
    backward is the same rotation by minus the angle (no activations saved).

    A rotation turns both channels of a pair by one angle, so ``cos``/``sin`` are expected to
    repeat each pair's value (channels ``2i, 2i + 1`` interleaved, ``i, i + rotary_dim / 2``
    half), as ``rope_cos_sin``, xPos's scaled tables and transformers' tables do. The fast paths
    read one value per pair (the first channel of it); tables that need a gradient take the
    textbook form ``x * cos + turn(x) * sin`` channel by channel instead.
    """
    _check_bool("interleaved", interleaved)
    check_rope_args(x, cos, sin)
    return _rope(x, cos, sin, interleaved)


def rope_permutation(rotary_dim: int, *, to: str = "half") -> Tensor:
    """Channel permutation between the layouts: ``x_half = x_interleaved[..., perm]``.

    ``to="half"`` gives ``[0, 2, 4, ..., 1, 3, 5, ...]``; ``to="interleaved"`` its inverse.
    """
    rotary_dim = check_int("rotary_dim", rotary_dim, minimum=2, even=True)
    perm = torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)])
    if to == "half":
        return perm
    if to == "interleaved":
        return torch.argsort(perm)
    raise ValueError(f"to must be 'half' or 'interleaved', got {to!r}")


def convert_rope_weight(
    weight: Tensor, num_heads: int, *, to: str = "half", rotary_dim: int | None = None
) -> Tensor:
    """Permute a q or k projection ``weight [num_heads * head_dim, in]`` (or its bias) so that a
    model using the other RoPE layout gives the same attention scores.

    This is what Hugging Face's LLaMA converter does to Meta's (interleaved) checkpoints.
    """
    check_tensor("weight", weight, min_dim=1)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    if weight.shape[0] % num_heads:
        raise ValueError(
            f"weight.shape[0]={weight.shape[0]} is not divisible by num_heads={num_heads}"
        )
    head_dim = weight.shape[0] // num_heads
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    rotary_dim = check_int("rotary_dim", rotary_dim, minimum=2, even=True)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
    perm = torch.cat([rope_permutation(rotary_dim, to=to), torch.arange(rotary_dim, head_dim)])
    w = weight.unflatten(0, (num_heads, head_dim))  # [H, Dh, ...]
    return w[:, perm.to(weight.device)].flatten(0, 1)


class RotaryEmbedding(RotaryTables):
    """Rotates queries and keys by their positions, scaled or not: ``[B, H, L, head_dim]`` by
    default, ``[B, L, H, head_dim]`` with ``seq_dim=-3``.

    ``seq_dim`` names the sequence dimension of ``q`` and ``k``; it is never guessed from their
    shapes. ``-2`` (the default) reads them as ``[..., H, L, head_dim]`` (PyTorch's SDPA,
    Hugging Face); ``-3`` as ``[..., L, H, head_dim]`` (torchtune's
    ``RotaryPositionalEmbeddings``, flash-attn, Meta's LLaMA code), and the output keeps that
    layout. The head count is the other dimension before ``head_dim``. A ``[B, L, H, head_dim]``
    tensor given to a module with the default ``seq_dim=-2`` is rotated by its head index: build
    it with ``seq_dim=-3``. With fewer kv heads than query heads that is an error; with as many,
    the shapes cannot tell, so pass ``positions`` to have the layout checked (``positions``
    whose ``L`` matches dim 1, not the sequence dim, is an error naming ``seq_dim=-3``).

    ``forward(q, k, positions=None, offset=0)``: positions default to ``offset + arange(L)``;
    pass ``positions [L]`` or ``[B, L]`` for per-sequence ids (left padding, KV caches), not
    both. Positions are integers in ``[0, 2**31)``, and the rotation depends on them exactly:
    scores depend on ``n - m`` alone to float32 precision at any position (the angles are
    reduced mod ``2 pi`` before rounding from position 512 on, see
    ``posenc.rope_angles.rope_angles``; below it they are transformers' float32 products,
    bit for bit). ``exact_angles=False`` takes the float32 product at every position instead,
    as transformers, Meta's LLaMA code and torchtune do: their cos/sin bit for bit (rotated q, k
    to float32 rounding: the same products added in another order), and their drift (up to
    ``position * 3e-8`` rad: a relative score error of 1e-2 at position ``10**6``);
    ``from_hf_config`` chooses it by default. q and k may differ in their head count
    (grouped-query attention), nothing else. ``cos``/``sin``, times the attention factor (YaRN's
    sqrt(1/t)), are cached in float32 (and, for the interleaved layout, as one complex table):
    from position 0, growing on demand up to ``TABLE_MAX`` positions, and past that a window of
    ``WINDOW`` (4096) positions from where a call starts, which a decode loop rebuilds once every
    4096 steps. With an int ``offset`` the call slices a table: no index kernel, no host
    synchronisation.

    ``scaling`` is a Hugging Face ``rope_parameters`` dict (see ``rope_inv_freq``), checked here
    at construction; ``partial_rotary_factor`` may be given as the argument or as its key. Two
    types change their frequencies with each call's ``seq_len = max(positions) + 1`` (the whole
    batch), exactly as HF's ``LlamaRotaryEmbedding`` with ``dynamic_rope_update``:

    * ``dynamic`` (NTK by length, emozilla / bloc97 2023): frequencies follow the longest
      ``seq_len`` seen once it exceeds ``max_position_embeddings``, and return to the originals
      when a call is shorter than that length (a new, short prompt);
    * ``longrope`` (Ding et al., 2024): ``long_factor`` while
      ``seq_len > original_max_position_embeddings``, ``short_factor`` otherwise.

    KV-cache pitfall: a key is rotated once, when it is written to the cache. When the
    frequencies change later (``dynamic`` growing past the trained length, ``longrope`` crossing
    it), new queries are rotated under the new frequencies and the cached keys stay under the
    old ones, so ``q . k`` no longer depends on ``n - m`` alone and incremental decoding differs
    from a full forward pass. Hugging Face does the same. Fixes: cache keys *before* rotation and
    rotate all of them with ``cos_sin(arange(seq_len))`` at each step, or use a static type
    (``linear``, ``ntk``, ``yarn``, ``llama3``).

    xPos (Sun et al. 2023), ``xpos_scale_base`` set (512 in the paper): queries are also
    multiplied and keys divided by ``zeta_i ** ((n - c) / xpos_scale_base)`` with
    ``zeta_i = (2i + 0.4 r) / (1.4 r)`` for rotating pair ``i`` of ``r = rotary_dim`` channels,
    so the score of a query at ``m`` and a key at ``n`` gains the factor
    ``zeta_i ** ((m - n) / xpos_scale_base)``: it decays with the distance ``m - n``, faster for
    the low-index (fast-rotating) pairs. The centre ``c`` cancels in every score; it only keeps
    the factors near 1. It is ``L // 2`` of the *current* call (``L = q.shape[seq_dim]``,
    positions taken as given, offset included), exactly rotary-embedding-torch's ``get_scale``
    (its ``use_xpos=True``) but never a centre cached from an earlier, longer call. Under a KV
    cache each call therefore has its own centre and a cached key's factor no longer cancels a
    new query's: pass the same ``xpos_centre=`` (an int, e.g. 0) to the prefill and every decode
    step, and incremental decoding gives the scores of the full pass.
    """

    xpos_zeta: Tensor  # [rd/2]

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        interleaved: bool = True,
        scaling: Mapping | None = None,
        partial_rotary_factor: float = 1.0,
        xpos_scale_base: float | None = None,
        seq_dim: int = -2,
        exact_angles: bool = True,
    ) -> None:
        head_dim = check_int("head_dim", head_dim, minimum=2)
        base = check_float("base", base, positive=True)
        interleaved = _check_bool("interleaved", interleaved)
        if scaling is not None and not isinstance(scaling, Mapping):
            raise TypeError(f"scaling must be None or a dict, got {type(scaling).__name__}")
        scaling = dict(scaling or {})
        p = check_float("partial_rotary_factor", partial_rotary_factor, positive=True)
        given = scaling.get("partial_rotary_factor")
        if p != 1.0 and given is not None and given != p:
            raise ValueError(
                f"partial_rotary_factor={p} and scaling['partial_rotary_factor']={given} "
                f"disagree; give one"
            )
        if p != 1.0:
            scaling["partial_rotary_factor"] = p
        if xpos_scale_base is not None:
            xpos_scale_base = check_float("xpos_scale_base", xpos_scale_base, positive=True)
        seq_dim = check_seq_dim(seq_dim)
        exact_angles = _check_bool("exact_angles", exact_angles)
        super().__init__(
            head_dim, base=base, interleaved=interleaved, scaling=scaling, exact_angles=exact_angles
        )
        self.xpos_scale_base = xpos_scale_base
        self.seq_dim = seq_dim
        rd = self.rotary_dim
        zeta = (torch.arange(0, rd, 2, dtype=torch.float32) + 0.4 * rd) / (1.4 * rd)  # [rd/2]
        self.register_buffer("xpos_zeta", zeta, persistent=False)

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos``/``sin`` for ``positions [L]`` or ``[B, L]``, each ``[..., L, rotary_dim]`` float32.

        Updates the frequencies of ``dynamic`` / ``longrope`` for ``seq_len = max(positions) + 1``
        first; empty positions change nothing.
        """
        positions, lo, hi = position_range("positions", positions)
        if positions.numel() == 0:
            return rope_cos_sin(
                positions, self.inv_freq, interleaved=self.interleaved,
                attention_factor=self.attention_factor,
            )
        cos, sin, _ = self._lookup(positions, lo, hi)
        return cos, sin

    def _xpos(self, positions: Tensor, centre: int) -> Tensor:
        """xPos scale ``zeta ** ((positions - centre) / scale_base)``, ``[..., L, rd]`` float32
        (the difference taken in int64, exact at any position)."""
        assert self.xpos_scale_base is not None
        power = (positions.to(torch.int64) - centre).to(torch.float32) / self.xpos_scale_base
        s = self.xpos_zeta.to(positions.device) ** power[..., None]  # [..., L, rd/2]
        return s.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat([s, s], dim=-1)

    def _rotate(
        self, x: Tensor, cos: Tensor, sin: Tensor, cis: Tensor | None, scale: Tensor | None,
        *, key: bool,
    ) -> Tensor:
        """``x`` rotated by tables ``[L, rd]`` / ``[B, L, rd]``; xPos: queries times ``scale``,
        keys divided by it."""
        s = self.seq_dim
        cos, sin = fit(cos, x, s), fit(sin, x, s)
        if scale is None:
            return _rope(x, cos, sin, self.interleaved, None if cis is None else fit(cis, x, s))
        scale = fit(scale, x, s)
        if key:
            return _rope(x, cos / scale, sin / scale, self.interleaved)
        return _rope(x, cos * scale, sin * scale, self.interleaved)

    def _decode_fast(self, q: Tensor, k: Tensor, t: Tables, a: int, b: int) -> tuple[Tensor, Tensor] | None:
        """The decode fast path on rows ``a .. b - 1`` of tables ``t``: slices and the fewest
        kernels; None where it does not apply."""
        if not (
            self.xpos_scale_base is None
            and self.rotary_dim == self.head_dim and q.dtype == k.dtype == torch.float32
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
        ):  # fmt: skip
            return None
        if t.cis is not None:  # interleaved: one complex multiply each
            cis = fit(t.cis[a:b], q, self.seq_dim)  # [L, rd/2]
            return _complex_rotate(q, cis), _complex_rotate(k, cis)
        if q.numel() + k.numel() > 1 << 16 or t.sin_signed is None:  # small: 3 kernels beat 3 passes
            return None
        c, ss = fit(t.cos[a:b], q, self.seq_dim), fit(t.sin_signed[a:b], q, self.seq_dim)
        h = self.rotary_dim // 2  # roll(h) turns [xa, xb] into [xb, xa]
        return torch.addcmul(q * c, q.roll(h, -1), ss), torch.addcmul(k * c, k.roll(h, -1), ss)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        positions: Tensor | None = None,
        offset: int = 0,
        *,
        key_positions: Tensor | None = None,
        xpos_centre: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Rotate ``q`` and ``k``; returns the rotated ``(q, k)``, same shapes, dtypes and layout.

        Layout (the class's ``seq_dim``): ``q [..., Hq, L, head_dim]`` and ``k [..., Hk, L,
        head_dim]`` by default (``seq_dim=-2``); ``q [..., L, Hq, head_dim]`` and ``k [..., L,
        Hk, head_dim]`` for a module built with ``seq_dim=-3`` (torchtune, flash-attn). ``Hq``
        and ``Hk`` may differ (grouped-query attention); only the first ``rotary_dim``
        channels rotate.

        ``positions`` (``[L]``, or ``[B, L]`` for ``q [B, Hq, L, head_dim]`` /
        ``[B, L, Hq, head_dim]``; integers in ``[0, 2**31)``) or ``offset`` (an int: positions
        ``offset + arange(L)``), not both. ``key_positions`` (``[Lk]`` or ``[B, Lk]``): the keys'
        own positions, when they are not the queries' (keys gathered from other shards); ``k``
        may then have another length. The cos/sin tables are float32 and grow to the largest
        position (up to ``TABLE_MAX``; past it a window table; one call spanning more than
        ``TABLE_MAX`` positions past it computes its angles directly, the same numbers).
        ``xpos_centre`` (xPos only): the centre of the scale, ``L // 2`` of the queries when
        None.

        Under ``torch.compile`` the angles are computed from the positions (no table, no host
        sync), and ``dynamic`` / ``longrope`` keep the frequencies they have: run one eager call
        at the target length first if they must switch.

        Raises:
            TypeError: ``q`` or ``k`` is not a floating-point tensor, ``positions`` not an
                integer tensor, ``offset`` or ``xpos_centre`` not an int.
            ValueError: ``q`` or ``k`` does not end in ``head_dim``; they differ in ``L`` (the
                dim ``seq_dim``, without ``key_positions``) or in a dim other than the head
                count; ``positions`` has the wrong shape, a negative entry or one ``>= 2**31``;
                ``offset`` is negative or given with ``positions``; ``xpos_centre`` without
                xPos. Each message says which dimension is the sequence and how ``seq_dim``
                changes it.
        """
        q, k = check_qk(q, k, self.head_dim, self.seq_dim, own_keys=key_positions is not None)
        if type(offset) is not int or offset < 0:
            offset = check_int("offset", offset, minimum=0)
        if xpos_centre is not None:
            xpos_centre = check_int("xpos_centre", xpos_centre)
            if self.xpos_scale_base is None:
                raise ValueError("xpos_centre is given but xpos_scale_base is None (xPos is off)")
        if positions is not None and offset:
            raise ValueError(
                f"give positions or offset, not both (got offset={offset} with positions); "
                "add the offset to the positions"
            )
        seq = q.shape[self.seq_dim]
        centre = seq // 2 if xpos_centre is None else xpos_centre
        if key_positions is not None:
            if positions is None:
                positions = torch.arange(offset, offset + seq, device=q.device)  # [Lq]
            return (self._one(q, positions, centre, name="positions"),
                    self._one(k, key_positions, centre, name="key_positions"))  # fmt: skip
        end = offset + seq
        if positions is None and end > MAX_POSITION:
            raise ValueError(
                f"offset + L must be <= 2**31 = {MAX_POSITION} (positions are below it), got "
                f"{offset} + {seq}"
            )
        if positions is None and seq == 0:  # nothing to rotate; no frequency update
            return q.clone(), k.clone()
        t, lo, hi, rows = None, offset, end - 1, positions is None  # rows: a slice of a table
        if positions is not None:
            positions, lo, hi = check_positions_for(positions, q, self.seq_dim, "positions")
            if hi < 0:
                return q.clone(), k.clone()
            rows = seq == 1 and lo == hi  # one position for every row (a decode step)
            offset, end = lo, lo + 1
        if rows and not is_compiling():
            t = self._covering(offset, end, q.device)
        if t is not None:  # table rows: no index kernel, no host sync
            a, b = offset - t.start, end - t.start
            fast = self._decode_fast(q, k, t, a, b)
            if fast is not None:
                return fast
            cos, sin, cis = t.cos[a:b], t.sin[a:b], None if t.cis is None else t.cis[a:b]  # [L, rd]
        else:
            if positions is None:  # compiling, or one call longer than TABLE_MAX past it
                positions = torch.arange(offset, end, device=q.device)  # [L]
                positions, lo, hi = check_positions_for(positions, q, self.seq_dim, "positions")
            cos, sin, cis = self._lookup(positions, lo, hi)  # [..., L, rd]
        scale = None
        if self.xpos_scale_base is not None:
            where = positions if positions is not None else torch.arange(offset, end, device=q.device)
            scale = self._xpos(where, centre)  # [..., L, rd]
        return (self._rotate(q, cos, sin, cis, scale, key=False),
                self._rotate(k, cos, sin, cis, scale, key=True))  # fmt: skip

    def _one(self, x: Tensor, positions: Tensor, centre: int, *, name: str) -> Tensor:
        """Rotate one of q / k by its own ``positions`` (xPos: keys divide by the scale)."""
        positions, lo, hi = check_positions_for(positions, x, self.seq_dim, name)
        if hi < 0:
            return x.clone()
        cos, sin, cis = self._lookup(positions, lo, hi)  # [..., L, rd]
        scale = None if self.xpos_scale_base is None else self._xpos(positions, centre)
        return self._rotate(x, cos, sin, cis, scale, key=name == "key_positions")

    def extra_repr(self) -> str:  # the angle mode is a precision, not a setting: not shown
        xpos = "" if self.xpos_scale_base is None else f", xpos_scale_base={self.xpos_scale_base}"
        layout = "" if self.seq_dim == -2 else f", seq_dim={self.seq_dim}"
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"interleaved={self.interleaved}, rope_type={self.rope_type!r}, "
            f"attention_factor={self.attention_factor}{xpos}{layout}"
        )

    @classmethod
    def from_hf_config(
        cls,
        config: object,
        *,
        layer_type: str | None = None,
        interleaved: bool | None = None,
        exact_angles: bool = False,
    ) -> RotaryEmbedding:
        """The rotary embedding of a Hugging Face model: ``config`` is its ``PretrainedConfig``
        or ``config.json`` dict. ``rope_theta``, ``rope_parameters``/``rope_scaling``, the
        lengths, ``partial_rotary_factor``, ``head_dim`` and the layout are read as
        ``posenc.hf.rotary_kwargs_from_hf_config`` documents.

        ``exact_angles=False`` (the default here): the angles are transformers' float32
        products at every position, so the module gives the model's own cos/sin tables bit for
        bit (rotated q, k to float32 rounding), long positions included (where transformers'
        angles drift by up to ``position * 3e-8`` rad). ``exact_angles=True``: angles reduced
        mod ``2 pi``, scores that depend on the offset alone (see the class doc)."""
        kwargs = rotary_kwargs_from_hf_config(config, layer_type=layer_type, interleaved=interleaved)
        return cls(**kwargs, exact_angles=_check_bool("exact_angles", exact_angles))
