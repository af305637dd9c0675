"""The frequencies and cached cos/sin tables behind :class:`posenc.rope.RotaryEmbedding`.

One concern apart from rotating queries and keys: which inverse frequencies hold for a call
(``dynamic`` and ``longrope`` switch them with the sequence length, by Hugging Face's rules),
and the float32 cos/sin tables, with the angles of :mod:`posenc.rope_angles` (exact at any
position below ``2**31``): one of positions ``0 .. n - 1`` that grows on demand up to
``TABLE_MAX``, and past it a window of at least ``WINDOW`` positions from where the call starts,
rebuilt when a call leaves it (a decode loop at position ``10**6`` rebuilds it once every
``WINDOW`` steps and slices it in between).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ._checks import is_compiling
from .rope_angles import cos_sin_unchecked
from .rope_scaling import rope_inv_freq, rope_switch_len

TABLE_MAX = 1 << 17
"""The cos/sin table from position 0 grows to at most this many positions; past it calls use a
window table (``WINDOW``), or angles computed per call when one call spans more than this."""

WINDOW = 1 << 12
"""The fewest positions a window table past ``TABLE_MAX`` holds."""


class Tables(NamedTuple):
    """cos/sin tables of positions ``start .. start + n - 1``."""

    cos: Tensor  # [n, rd] float32
    sin: Tensor  # [n, rd]
    cis: Tensor | None  # [n, rd/2] complex64: cos + i sin per pair (interleaved layout)
    sin_signed: Tensor | None  # [n, rd]: [-sin, sin], x cos + roll(x) * it rotates (half layout)
    start: int


class RotaryTables(nn.Module):
    """Inverse frequencies, attention factor and cached float32 tables for one RoPE setting.

    ``scaling`` is a checked Hugging Face ``rope_parameters`` dict (partial rotary folded in);
    ``exact_angles`` chooses :func:`posenc.rope_angles.rope_angles`'s ``exact``.
    Buffers (not saved in a ``state_dict``): ``inv_freq [rd/2]`` and the table from position 0:
    ``cos_cached`` / ``sin_cached [n, rd]``, ``cis_cached [n, rd/2]`` complex64 (interleaved:
    Meta's ``freqs_cis``), ``sin_signed_cached [n, rd]`` (half).
    """

    inv_freq: Tensor  # [rd/2]
    cos_cached: Tensor  # [n, rd]
    sin_cached: Tensor  # [n, rd]
    cis_cached: Tensor  # [n, rd/2] complex64
    sin_signed_cached: Tensor  # [n, rd]

    def __init__(
        self, head_dim: int, *, base: float, interleaved: bool, scaling: Mapping, exact_angles: bool
    ) -> None:
        super().__init__()
        self.head_dim, self.base, self.interleaved = head_dim, base, interleaved
        self.exact_angles = exact_angles
        self.scaling = dict(scaling)
        # every key is checked now, not at the first forward
        inv_freq, self.attention_factor = rope_inv_freq(head_dim, base=base, scaling=self.scaling)
        self.rope_type = self.scaling.get("rope_type") or self.scaling.get("type") or "default"
        self.original_len = rope_switch_len(self.scaling)  # None for the static types
        self.freq_len = self.original_len  # the seq_len inv_freq is computed for
        self.rotary_dim = rd = 2 * inv_freq.numel()
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rd/2]
        self.register_buffer("cos_cached", torch.empty(0, rd), persistent=False)  # [n, rd]
        self.register_buffer("sin_cached", torch.empty(0, rd), persistent=False)
        self.register_buffer("cis_cached", torch.empty(0, rd // 2, dtype=torch.complex64),
                             persistent=False)  # fmt: skip
        self.register_buffer("sin_signed_cached", torch.empty(0, rd), persistent=False)
        self._window: Tables | None = None  # past TABLE_MAX; not a buffer: rebuilt on a new device

    def _freq_len_for(self, seq_len: int) -> int:
        """The ``seq_len`` inv_freq must be computed for after a call of ``seq_len`` (HF rules);
        only called for the types that switch (``original_len`` is set)."""
        L, cur = self.original_len, self.freq_len
        assert L is not None and cur is not None
        if self.rope_type == "longrope":
            return L + 1 if seq_len > L else L  # any length > L selects the long factors
        if self.rope_type == "dynamic":
            if seq_len > cur:
                return seq_len  # grow: rescale for the new length
            if seq_len < L:
                return L  # shorter than the trained length: back to the original frequencies
        return cur  # static types, or dynamic between L and the longest length seen

    def _update_freq(self, seq_len: int) -> None:
        """``dynamic`` / ``longrope``: the frequencies for a call of ``seq_len`` (HF's rules)."""
        if self.original_len is None:
            return
        freq_len = self._freq_len_for(seq_len)
        if freq_len != self.freq_len:
            inv_freq, self.attention_factor = rope_inv_freq(
                self.head_dim, base=self.base, scaling=self.scaling, seq_len=freq_len
            )
            self.inv_freq = inv_freq.to(self.inv_freq.device)
            self.freq_len = freq_len
            self.cos_cached = self.cos_cached[:0]  # stale: rebuilt on demand
            self._window = None

    def _build(self, start: int, n: int, device: torch.device) -> Tables:
        """The tables of positions ``start .. start + n - 1``."""
        cos, sin = cos_sin_unchecked(
            torch.arange(start, start + n, device=device), self.inv_freq.to(device),
            interleaved=self.interleaved, attention_factor=self.attention_factor,
            exact=self.exact_angles, max_position=start + n - 1, min_position=start,
        )  # [n, rd] float32
        if self.interleaved:
            return Tables(cos, sin, torch.complex(cos[:, 0::2], sin[:, 0::2]), None, start)
        s = sin[:, : self.rotary_dim // 2]
        return Tables(cos, sin, None, torch.cat([-s, s], dim=-1), start)

    def _refresh(self, seq_len: int, device: torch.device) -> None:
        """Frequencies for ``seq_len``, then the table from 0 covering ``seq_len`` positions."""
        self._update_freq(seq_len)
        cached = self.cos_cached
        if seq_len > cached.shape[0] or cached.device != device:
            t = self._build(0, max(seq_len, min(2 * cached.shape[0], TABLE_MAX), 64), device)
            self.cos_cached, self.sin_cached = t.cos, t.sin
            if t.cis is not None:
                self.cis_cached = t.cis
            if t.sin_signed is not None:
                self.sin_signed_cached = t.sin_signed

    def _covering(self, lo: int, end: int, device: torch.device) -> Tables | None:
        """Tables whose rows hold positions ``lo .. end - 1`` (frequencies updated for ``end``):
        the table from 0 up to ``TABLE_MAX``, a window past it, None for a longer span."""
        if end <= TABLE_MAX:
            self._refresh(end, device)
            cis = self.cis_cached if self.interleaved else None
            signed = None if self.interleaved else self.sin_signed_cached
            return Tables(self.cos_cached, self.sin_cached, cis, signed, 0)
        self._update_freq(end)
        if end - lo > TABLE_MAX:
            return None
        w = self._window
        if w is None or w.cos.device != device or lo < w.start or end > w.start + w.cos.shape[0]:
            w = self._window = self._build(lo, max(WINDOW, end - lo), device)
        return w

    def _direct(self, positions: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """cos, sin (and cis) computed from ``positions`` without a table: the same ops that
        fill the tables, so the values are equal. Used while compiling (no host sync, no buffer
        growth) and for one call that spans more than ``TABLE_MAX`` positions past it."""
        cos, sin = cos_sin_unchecked(
            positions, self.inv_freq, interleaved=self.interleaved,
            attention_factor=self.attention_factor, exact=self.exact_angles,
        )  # [..., L, rd]
        cis = None
        if self.interleaved and not is_compiling():
            cis = torch.complex(cos[..., 0::2], sin[..., 0::2])
        return cos, sin, cis

    def _lookup(self, positions: Tensor, lo: int, hi: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """cos, sin, cis ``[..., L, rd]`` for ``positions`` from ``lo`` to ``hi``."""
        if is_compiling():
            return self._direct(positions)
        t = self._covering(lo, hi + 1, positions.device)
        if t is None:
            return self._direct(positions)
        idx = positions if t.start == 0 else positions - t.start
        return t.cos[idx], t.sin[idx], None if t.cis is None else t.cis[idx]
