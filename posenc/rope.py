"""Rotary position embedding, RoPE (Su et al., 2021, "RoFormer").

Each pair of query/key channels is rotated by the angle ``pos * theta_i``, so the score
``(R_m q) . (R_n k) = q . R_{n-m} k`` depends on the positions only through ``n - m``.

Two channel layouts exist and the same weights give different results under them:

* ``interleaved=True``: pairs ``(0, 1), (2, 3), ...`` -- the RoFormer paper, Meta's LLaMA code,
  GPT-J. ``cos``/``sin`` repeat each angle twice: ``[t0, t0, t1, t1, ...]``.
* ``interleaved=False`` ("half"): pairs ``(i, i + d/2)`` -- GPT-NeoX and Hugging Face Llama, whose
  helper for it is called ``rotate_half``. ``cos``/``sin`` are ``[t0, t1, ..., t0, t1, ...]``.

``rope_permutation`` and ``convert_rope_weight`` move q/k projection weights between the two,
as checkpoint converters do.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ._checks import check_dtype, check_float, check_int, check_positions, check_tensor
from .rope_scaling import rope_inv_freq, rope_switch_len


def rope_cos_sin(
    positions: Tensor,
    inv_freq: Tensor,
    *,
    interleaved: bool = True,
    attention_factor: float = 1.0,
    dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of ``positions * inv_freq``, each ``[..., seq, rotary_dim]``.

    ``positions`` is ``[seq]`` or ``[B, seq]`` (integers); angles are float32, scaled by
    ``attention_factor`` (YaRN's temperature) and cast to ``dtype`` at the end.
    """
    check_positions("positions", positions)
    check_tensor("inv_freq", inv_freq, floating=True)
    if inv_freq.dim() != 1 or inv_freq.numel() == 0:
        raise ValueError(f"inv_freq must be 1-D and non-empty, got shape {tuple(inv_freq.shape)}")
    attention_factor = check_float("attention_factor", attention_factor, positive=True)
    dtype = check_dtype("dtype", dtype)
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device, torch.float32)
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)  # [..., seq, rd]: t0 t0 t1 t1 ...
    else:
        angles = torch.cat([angles, angles], dim=-1)  # [..., seq, rd]: t0 t1 ... t0 t1 ...
    cos, sin = angles.cos() * attention_factor, angles.sin() * attention_factor
    return (cos, sin) if dtype is None else (cos.to(dtype), sin.to(dtype))


def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dim: the 90-degree turn of the half layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rotate_every_two(x: Tensor) -> Tensor:
    """``(x0, x1), (x2, x3), ... -> (-x1, x0), (-x3, x2), ...``: the turn of the interleaved layout.

    (The source article calls this ``rotate_half``; Hugging Face uses that name for the *half*
    layout above.)
    """
    x = x.unflatten(-1, (-1, 2))  # [..., d/2, 2]
    return torch.stack([-x[..., 1], x[..., 0]], dim=-1).flatten(-2)


def _check_rope_args(x: Tensor, cos: Tensor, sin: Tensor) -> int:
    check_tensor("x", x, floating=True, min_dim=2)
    check_tensor("cos", cos, floating=True, min_dim=2)
    check_tensor("sin", sin, floating=True, min_dim=2)
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    rotary_dim = cos.shape[-1]
    if rotary_dim % 2 or rotary_dim > x.shape[-1]:
        raise ValueError(
            f"cos.shape[-1] (rotary_dim) must be even and <= x.shape[-1]={x.shape[-1]}, got {rotary_dim}"
        )
    if cos.shape[-2] != x.shape[-2]:
        raise ValueError(
            f"cos/sin cover {cos.shape[-2]} positions but x has seq length {x.shape[-2]} "
            f"(x shape {tuple(x.shape)}, cos shape {tuple(cos.shape)})"
        )
    try:
        torch.broadcast_shapes(x.shape[:-1], cos.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} do not broadcast against x of shape {tuple(x.shape)}"
        ) from None
    return rotary_dim


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = True) -> Tensor:
    """Rotate ``x [..., seq, head_dim]`` by ``cos``/``sin [..., seq, rotary_dim]``.

    When ``rotary_dim < head_dim`` only the first ``rotary_dim`` channels rotate (partial
    rotary, as GPT-NeoX and Phi). The result has ``x``'s dtype; ``cos``/``sin`` are cast to it.
    """
    rd = _check_rope_args(x, cos, sin)
    if rd < x.shape[-1]:
        rotated = apply_rope(x[..., :rd], cos, sin, interleaved=interleaved)
        return torch.cat([rotated, x[..., rd:]], dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if interleaved:
        if x.dtype in (torch.float32, torch.float64):
            # one fused pass: each pair is a complex number, multiplied by e^{i*theta} (Meta's form)
            rot = torch.complex(cos[..., 0::2], sin[..., 0::2])  # [..., seq, d/2]
            xc = torch.view_as_complex(x.contiguous().unflatten(-1, (-1, 2)))  # [..., seq, d/2]
            return torch.view_as_real(xc * rot).flatten(-2)
        return x * cos + rotate_every_two(x) * sin
    h = rd // 2
    s = sin[..., :h]  # both halves of the half layout share the angles
    out = x * cos  # [..., seq, d]
    o, xv = out.unflatten(-1, (2, h)), x.unflatten(-1, (2, h))  # [..., seq, 2, d/2] views
    o[..., 0, :].addcmul_(xv[..., 1, :], s, value=-1)  # x1 cos - x2 sin
    o[..., 1, :].addcmul_(xv[..., 0, :], s)  # x2 cos + x1 sin
    return out


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


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys ``[B, H, L, head_dim]`` by their positions, scaled or not.

    ``forward(q, k, positions=None, offset=0)``: positions default to ``offset + arange(L)``;
    pass ``positions [L]`` or ``[B, L]`` for per-sequence ids (left padding, KV caches).
    ``cos``/``sin``, times the attention factor (YaRN's temperature), are cached in float32 and
    the cache grows on demand.

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
    """

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        interleaved: bool = True,
        scaling: Mapping | None = None,
        partial_rotary_factor: float = 1.0,
    ) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim, minimum=2)
        self.base = check_float("base", base, positive=True)
        self.interleaved = bool(interleaved)
        if scaling is not None and not isinstance(scaling, Mapping):
            raise TypeError(f"scaling must be None or a dict, got {type(scaling).__name__}")
        self.scaling = dict(scaling or {})
        p = check_float("partial_rotary_factor", partial_rotary_factor, positive=True)
        given = self.scaling.get("partial_rotary_factor")
        if p != 1.0 and given is not None and given != p:
            raise ValueError(
                f"partial_rotary_factor={p} and scaling['partial_rotary_factor']={given} "
                f"disagree; give one"
            )
        if p != 1.0:
            self.scaling["partial_rotary_factor"] = p
        # every key is checked now, not at the first forward
        inv_freq, self.attention_factor = rope_inv_freq(head_dim, base=base, scaling=self.scaling)
        self.rope_type = self.scaling.get("rope_type") or self.scaling.get("type") or "default"
        self.original_len = rope_switch_len(self.scaling)  # None for the static types
        self.freq_len = self.original_len  # the seq_len inv_freq is computed for
        self.rotary_dim = 2 * inv_freq.numel()
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rd/2]
        self.register_buffer("cos_cached", torch.empty(0, self.rotary_dim), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0, self.rotary_dim), persistent=False)

    def _freq_len_for(self, seq_len: int) -> int | None:
        """The ``seq_len`` inv_freq must be computed for after a call of ``seq_len`` (HF rules)."""
        L, cur = self.original_len, self.freq_len
        if self.rope_type == "longrope":
            return L + 1 if seq_len > L else L  # any length > L selects the long factors
        if self.rope_type == "dynamic":
            if seq_len > cur:
                return seq_len  # grow: rescale for the new length
            if seq_len < L:
                return L  # shorter than the trained length: back to the original frequencies
        return cur  # static types, or dynamic between L and the longest length seen

    def _refresh(self, seq_len: int, device: torch.device) -> None:
        freq_len = self._freq_len_for(seq_len)
        if freq_len != self.freq_len:
            inv_freq, self.attention_factor = rope_inv_freq(
                self.head_dim, base=self.base, scaling=self.scaling, seq_len=freq_len
            )
            self.inv_freq = inv_freq.to(self.inv_freq.device)
            self.freq_len = freq_len
            self.cos_cached = self.cos_cached[:0]  # stale: rebuilt below
        if seq_len > self.cos_cached.shape[0] or self.cos_cached.device != device:
            n = max(seq_len, 2 * self.cos_cached.shape[0], 64)
            self.cos_cached, self.sin_cached = rope_cos_sin(
                torch.arange(n, device=device), self.inv_freq.to(device),
                interleaved=self.interleaved, attention_factor=self.attention_factor,
            )  # [n, rd] float32

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos``/``sin`` for ``positions [L]`` or ``[B, L]``, each ``[..., L, rotary_dim]`` float32.

        Updates the frequencies of ``dynamic`` / ``longrope`` for ``seq_len = max(positions) + 1``
        first; empty positions change nothing.
        """
        check_positions("positions", positions)
        if positions.numel() == 0:
            return rope_cos_sin(
                positions, self.inv_freq, interleaved=self.interleaved,
                attention_factor=self.attention_factor,
            )
        self._refresh(int(positions.max()) + 1, positions.device)
        return self.cos_cached[positions], self.sin_cached[positions]

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None, offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        check_tensor("q", q, floating=True, min_dim=2)
        check_tensor("k", k, floating=True, min_dim=2)
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(
                f"q and k must end in head_dim={self.head_dim}, got {tuple(q.shape)} and {tuple(k.shape)}"
            )
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(
                f"q and k must have the same seq length here, got {q.shape[-2]} and {k.shape[-2]}; "
                "rotate cached keys when they are written, then pass only the new ones"
            )
        offset = check_int("offset", offset, minimum=0)
        seq = q.shape[-2]
        if positions is None:
            positions = torch.arange(offset, offset + seq, device=q.device)  # [L]
        check_positions("positions", positions)
        if positions.shape[-1] != seq:
            raise ValueError(f"positions must have {seq} entries per row, got shape {tuple(positions.shape)}")
        cos, sin = self.cos_sin(positions.to(q.device))  # [L, rd] or [B, L, rd]
        if cos.dim() == 3 and q.dim() == 4:
            cos, sin = cos[:, None], sin[:, None]  # [B, 1, L, rd]: broadcast over heads
        return (
            apply_rope(q, cos, sin, interleaved=self.interleaved),
            apply_rope(k, cos, sin, interleaved=self.interleaved),
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"interleaved={self.interleaved}, rope_type={self.rope_type!r}, "
            f"attention_factor={self.attention_factor}"
        )

    @classmethod
    def from_hf_config(
        cls, config: object, *, layer_type: str | None = None, interleaved: bool | None = None
    ) -> RotaryEmbedding:
        """The rotary embedding of a Hugging Face model: ``config`` is its ``PretrainedConfig``
        or ``config.json`` dict. ``rope_theta``, ``rope_parameters``/``rope_scaling``, the
        lengths, ``partial_rotary_factor``, ``head_dim`` and the layout are read as
        ``posenc.hf.rotary_kwargs_from_hf_config`` documents."""
        from .hf import rotary_kwargs_from_hf_config

        kwargs = rotary_kwargs_from_hf_config(config, layer_type=layer_type, interleaved=interleaved)
        return cls(**kwargs)
