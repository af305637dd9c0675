"""Attention over packed sequences in flash-attn's varlen layout, at a cost of ``sum n_i**2``.

FlashAttention-2 (Dao, 2023) runs a batch of sequences of different lengths without padding:
``q [total, H, D]`` and ``k, v [total, H_kv, D]`` hold ``N`` sequences one after another, and
``cu_seqlens [N + 1]`` (``[0, n_1, n_1 + n_2, ..., total]``) says where each begins. Every
sequence attends only to itself, so the work is ``sum n_i**2``, where one dense mask over the
packed row costs ``total**2`` (``posenc.attend(..., document_ids=...)`` takes this path itself
when nothing else needs the mask: eager ``sdpa``, no cache, restarting positions).
:func:`attend_varlen` takes that layout with any position scheme.

Positions restart at 0 in each sequence. Pass the queries and keys *unrotated*: the scheme's
``rotate`` hook turns each token by its position within its sequence
(:func:`~posenc.positions.packed_positions`), and ALiBi's and T5's biases come from the same
positions. (flash-attn's own callers rotate before the call; with posenc the scheme does it.)

Which path runs (``_varlen_path`` decides, from the arguments alone):

- ``"flash-attn"``: ``flash_attn_varlen_func`` when ``import flash_attn`` works, ``q`` is a
  CUDA tensor in float16 or bfloat16, ``backend="sdpa"``, ``v``'s head size equals ``q``'s,
  the head size is a multiple of 8 up to 256, and the scheme has no bias (NoPE; RoPE, whose
  ``rotate`` runs first) or is ALiBi (the kernel adds the bias from ``alibi_slopes``);
  ``window`` becomes its ``window_size`` and ``scale`` its ``softmax_scale``.
- ``"sdpa"`` otherwise (the exact path, every scheme, every device): the sequences are grouped
  by length and each distinct length ``n`` runs one batched SDPA call on ``[N_n, H, n, D]``
  (``N_n`` sequences of that length): with ``is_causal`` when there is no bias and no window,
  else with the scheme's ``[1, H, n, n]`` mask, which ALiBi and T5 cache as for a single
  sequence. The work is ``sum n_i**2``, the number of calls the number of distinct lengths, and
  no ``[total, total]`` tensor is ever built.
- ``"math"``: the same groups through the written-out ``softmax(q k^T * scale + b) v``
  (``backend="math"``; teaching and tests).
- ``"flex"``: FlexAttention over the packed row with document ids
  (``posenc.attend(..., document_ids=..., backend="flex")``), whose block mask skips the tiles
  between documents (``backend="flex"``).

The grouped paths read the lengths on the host (a sync, and Python ints that
``torch.compile`` specialises on: a graph break); call them outside a ``fullgraph`` region, or
use flash-attn with ``max_seqlen``, which reads nothing back while compiling.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ._checks import (
    check_bool,
    check_dropout,
    check_float,
    check_int,
    check_tensor,
    check_window,
    is_compiling,
    warn_caller,
)
from .backends import (
    BACKENDS,
    PLAIN,
    RuleFacts,
    Softmax,
    chunks_pay,
    run_by_rule,
    sdpa,
    sdpa_causal_chunks,
    square_mask,
)
from .backends import math as written_out
from .masks import Visibility
from .positions import _document_ids_hint, document_ids_from_lengths, packed_positions
from .schemes import ALiBi, PositionScheme, _check_scheme

_flash: list[Callable | None] = []  # [flash_attn_varlen_func or None], filled on first use


def _flash_varlen() -> Callable | None:
    """flash-attn's ``flash_attn_varlen_func``, or None where it is not installed (or fails to
    load: a build for another torch warns once and is not used)."""
    if not _flash:
        fn = None
        try:  # an optional dependency: imported by name, so no type checker needs it
            fn = importlib.import_module("flash_attn").flash_attn_varlen_func
        except ImportError as err:
            if not isinstance(err, ModuleNotFoundError) or err.name != "flash_attn":
                warn_caller(
                    f"flash_attn is installed but does not load ({err}); attend_varlen uses SDPA"
                )
        _flash.append(fn)
    return _flash[0]


def _flash_alibi(scheme: PositionScheme) -> bool:
    """True for ALiBi as posenc defines it (a subclass that changes the bias is not)."""
    cls = type(scheme)
    return (isinstance(scheme, ALiBi) and cls.bias is ALiBi.bias
            and cls.position_bias is ALiBi.position_bias)


def _varlen_path(
    scheme: PositionScheme | None, *, backend: str = "sdpa", device_type: str = "cpu",
    dtype: torch.dtype = torch.float32, head_dim: int = 64, v_head_dim: int | None = None,
    flash_attn: bool | None = None,
) -> str:
    """The path :func:`attend_varlen` takes: ``"flash-attn"``, ``"sdpa"``, ``"math"`` or ``"flex"``.

    ``"flash-attn"`` needs all of: ``flash_attn`` (default: whether ``import flash_attn``
    works here), ``backend="sdpa"``, ``device_type="cuda"``, ``dtype`` float16 or bfloat16,
    ``head_dim`` a multiple of 8 up to 256 and ``v_head_dim`` (default ``head_dim``) equal to
    it, and a scheme without a bias or ALiBi. Otherwise it is ``backend`` itself (``"sdpa"``:
    the grouped exact path). A pure function of its arguments, so the decision is testable
    without a GPU.
    """
    if backend != "sdpa":
        return backend
    scheme = scheme if scheme is not None else PositionScheme()
    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    fits = (
        device_type == "cuda" and dtype in (torch.float16, torch.bfloat16)
        and head_dim % 8 == 0 and 0 < head_dim <= 256 and v_head_dim == head_dim
        and (not scheme.has_bias or _flash_alibi(scheme))
    )
    if fits and flash_attn is None:  # imported only when it could run
        flash_attn = _flash_varlen() is not None
    return "flash-attn" if fits and flash_attn else "sdpa"


@dataclass(frozen=True)
class VarlenOptions:
    """The options of one varlen call that travel together: what a query sees (``causal``,
    ``window``), the factor on the scores (``scale``), ``dropout_p`` and the ``backend``."""

    causal: bool
    window: int | None
    scale: float | None
    dropout_p: float
    backend: str = "sdpa"


def attend_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: PositionScheme | None = None,
    *,
    cu_seqlens: Tensor,
    max_seqlen: int | None = None,
    causal: bool = True,
    window: int | None = None,
    scale: float | None = None,
    backend: str = "sdpa",
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention of packed sequences in flash-attn's varlen layout; returns ``[total, H, Dv]``.

    ``q [total, H, D]``, ``k [total, H_kv, D]``, ``v [total, H_kv, Dv]``: ``N`` sequences one
    after another, sequence ``i`` the rows ``cu_seqlens[i]:cu_seqlens[i + 1]`` (each attends
    only to itself). ``H % H_kv == 0`` (grouped-query attention: query head ``h`` reads kv head
    ``h // (H / H_kv)``). ``cu_seqlens [N + 1]``: an integer tensor (int32 as flash-attn
    takes, or int64) starting at 0, non-decreasing (a repeated offset is an empty sequence),
    ending at ``total``; :func:`~posenc.positions.cu_seqlens` makes it from document ids (and
    an ``attention_mask``). ``max_seqlen``: the longest sequence (default: read from
    ``cu_seqlens``); a value below the longest is refused, a larger one is allowed. The offsets
    are checked on the host (one sync per call) except while compiling, where the flash-attn
    path given ``max_seqlen`` reads nothing back and the grouped paths read the lengths.

    Positions restart at 0 in every sequence: ``q`` and ``k`` come unrotated and the scheme
    rotates them (RoPE) or biases the scores (ALiBi, T5) by the positions within each sequence.
    ``causal``: a query sees the keys at its position and before; ``window=W``: keys ``n``
    with ``m - W < n <= m`` (without ``causal``, ``|m - n| < W``). ``scale``: the factor on
    ``q k^T`` (default ``1 / sqrt(D)``; Gemma's ``query_pre_attn_scalar``, MLA's mscale).
    ``backend``: ``"sdpa"`` (flash-attn where it runs, else SDPA grouped by length),
    ``"math"`` or ``"flex"``; see the module's text for which path runs when. ``dropout_p``
    drops attention weights as in ``posenc.attend``.

    This equals ``posenc.attend(q.transpose(0, 1)[None], ..., document_ids=ids)[0]
    .transpose(0, 1)`` with ``ids = document_ids_from_lengths(cu_seqlens.diff())``, at
    ``sum n_i**2`` cost instead of ``total**2``. An empty batch (``total == 0``) gives an empty
    ``[0, H, Dv]``.

    Raises:
        TypeError: q, k, v not floating tensors of one dtype; ``cu_seqlens`` not an integer
            tensor; ``scheme``, ``causal``, ``window``, ``max_seqlen`` or ``scale`` of the wrong
            type.
        ValueError: q, k, v not in the ``[total, H, D]`` layout (a 4-D ``[B, H, L, D]`` is named
            as such), on different devices, with different ``total`` or head sizes, or ``H``
            not a multiple of ``H_kv``; ``cu_seqlens`` not 1-D, not starting at 0, decreasing or
            not ending at ``total``; ``max_seqlen`` below the longest sequence; ``scale`` not
            > 0; an unknown ``backend``; a scheme built for another head count.
    """
    _check_layout(q, k, v)
    scheme, causal, window, dropout_p = _check_options(scheme, backend, causal, window, dropout_p)
    _check_scheme(scheme, q.shape[1])
    if scale is not None:
        scale = check_float("scale", scale, positive=True)
    cu, lengths = _check_cu_seqlens(cu_seqlens, q.shape[0], q.device)  # lengths: None compiling
    if max_seqlen is not None:
        max_seqlen = check_int("max_seqlen", max_seqlen, minimum=0)
        if lengths and max_seqlen < max(lengths):
            raise ValueError(
                f"max_seqlen must be at least the longest sequence in cu_seqlens, {max(lengths)}, "
                f"got {max_seqlen}"
            )
    if q.shape[0] == 0:
        return v.new_zeros(0, q.shape[1], v.shape[-1])
    path = _varlen_path(
        scheme, backend=backend, device_type=q.device.type, dtype=q.dtype, head_dim=q.shape[-1],
        v_head_dim=v.shape[-1],
    )
    opts = VarlenOptions(causal, window, scale, dropout_p, backend)
    if path == "flash-attn":  # no host read of the offsets when max_seqlen is given
        if max_seqlen is None:
            max_seqlen = max(lengths) if lengths is not None else int(cu.diff().max())
        q, k = _rotate(q, k, scheme, cu)
        return _flash_path(q, k, v, scheme, cu, max_seqlen, opts)
    if lengths is None:
        lengths = cu.diff().tolist()  # the grouped paths need them as ints
    if path == "flex":
        return _flex(q, k, v, scheme, lengths, opts)
    q, k = _rotate(q, k, scheme, cu)
    return _grouped(q, k, v, scheme, lengths, opts, math_=path == "math")


def _check_options(
    scheme: object, backend: object, causal: object, window: object, dropout_p: object
) -> tuple[PositionScheme, bool, int | None, float]:
    """``(scheme or NoPE, causal, window, dropout_p)``, checked as ``posenc.attend`` checks them."""
    checked = _check_scheme(scheme)
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dropout_p = check_dropout("dropout_p", dropout_p)
    return (
        checked,
        check_bool("causal", causal),
        None if window is None else check_window("window", window),
        dropout_p,
    )


def _check_layout(q: Tensor, k: Tensor, v: Tensor) -> None:
    """q ``[total, H, D]``, k ``[total, H_kv, D]``, v ``[total, H_kv, Dv]``: one dtype, one device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
        if t.dim() == 4:
            raise ValueError(
                f"{name} must have flash-attn's varlen layout [total, H, D] (the sequences one "
                f"after another), got the 4-D shape {tuple(t.shape)}, e.g. [B, H, L, D]: call "
                "posenc.attend(q, k, v, scheme, document_ids=...) for that layout, or flatten "
                "it (q.transpose(1, 2).reshape(-1, H, D) from [B, H, L, D]) and give cu_seqlens"
            )
        if t.dim() != 3:
            raise ValueError(
                f"{name} must have flash-attn's varlen layout [total, H, D], got shape {tuple(t.shape)}"
            )
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    total, H, D = q.shape
    if k.shape[0] != total or v.shape[:2] != k.shape[:2] or k.shape[-1] != D:
        raise ValueError(
            "q, k, v must be [total, H, D], [total, H_kv, D], [total, H_kv, Dv] (one total, k "
            f"with q's head size), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(
            f"q has {H} heads and k/v have {k.shape[1]}: the query heads must be a multiple of "
            "the kv heads (grouped-query attention)"
        )


def _check_cu_seqlens(
    cu_seqlens: object, total: int, device: torch.device
) -> tuple[Tensor, list[int] | None]:
    """``(cu_seqlens as int32 on device, the sequence lengths as ints)``, checked; while
    compiling the values are neither checked nor read (lengths None)."""
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(
            "cu_seqlens must be a torch.Tensor of offsets (int32, as flash-attn takes), e.g. "
            f"torch.tensor([0, 5, 8], dtype=torch.int32), got {type(cu_seqlens).__name__}"
        )
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
        raise TypeError(
            f"cu_seqlens must be an integer tensor (int32 or int64), got dtype {cu_seqlens.dtype}"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() == 0:
        hint = " (a [B, L] tensor looks like document_ids: posenc.cu_seqlens(document_ids) " \
               "gives the offsets)" if cu_seqlens.dim() == 2 else ""
        raise ValueError(
            "cu_seqlens must be 1-D [N + 1], the offsets [0, n_1, n_1 + n_2, ..., total], got "
            f"shape {tuple(cu_seqlens.shape)}{hint}"
        )
    if total >= 2**31:
        raise ValueError(f"q must hold fewer than 2**31 tokens (int32 offsets), got total={total}")
    cu = cu_seqlens.to(device, torch.int32)
    if is_compiling():
        return cu, None
    cpu = cu_seqlens.detach().to("cpu", torch.long)
    _check_offsets(cpu, total)
    return cu, cpu.diff().tolist()


def _check_offsets(cu: Tensor, total: int) -> None:
    """Values of ``cu [N + 1]`` (int64, on the CPU): from 0 to ``total``, never decreasing. The
    likely mistakes (lengths, document ids or position ids in its place) are named."""
    if cu.numel() <= 12:
        shown = str(cu.tolist())
    else:
        shown = f"[{', '.join(map(str, cu[:6].tolist()))}, ..., {', '.join(map(str, cu[-3:].tolist()))}]"
    step = cu.diff()
    if int(cu[0]) != 0:
        hint = ""
        if int(cu.sum()) == total and bool((cu >= 0).all()):
            hint = ("; these look like the lengths (they sum to total = q.shape[0] = "
                    f"{total}): the offsets are torch.cat([n.new_zeros(1), n.cumsum(0)])")
        raise ValueError(
            f"cu_seqlens must start at 0 (offsets [0, n_1, n_1 + n_2, ..., total]), got {shown}{hint}"
        )
    if bool((step < 0).any()):
        i = int((step < 0).nonzero()[0, 0])
        hint = _document_ids_hint(cu)
        hint = f". {hint[:-1]}, and posenc.cu_seqlens(document_ids) the offsets" if hint else ""
        raise ValueError(
            f"cu_seqlens must not decrease (the offsets of sequences one after another), got "
            f"{int(cu[i])} then {int(cu[i + 1])} at index {i + 1}: {shown}{hint}"
        )
    if int(cu[-1]) != total:
        hint = ""
        if cu.numel() == total and total > 1:
            hint = ("; it has one entry per token and looks like document ids: "
                    "posenc.cu_seqlens(document_ids) gives the offsets")
        raise ValueError(
            f"cu_seqlens must end at total = q.shape[0] = {total} (every token in one sequence), "
            f"got {int(cu[-1])}: {shown}{hint}"
        )


def _positions(cu: Tensor, total: int) -> Tensor:
    """``[total]`` int64: each token's position within its sequence (0, 1, ... per sequence),
    on the device, with no host read (a repeated offset, an empty sequence, is skipped)."""
    cu = cu.long()
    t = torch.arange(total, device=cu.device)  # [total]
    seq = torch.searchsorted(cu[1:], t, right=True)  # [total]: the sequence holding each token
    return t - cu[seq]


def _rotate(q: Tensor, k: Tensor, scheme: PositionScheme, cu: Tensor) -> tuple[Tensor, Tensor]:
    """The scheme's ``rotate`` hook at the positions within each sequence (``[total, H, D]``)."""
    if type(scheme).rotate is PositionScheme.rotate:  # NoPE, the bias and embed schemes
        return q, k
    pos = _positions(cu, q.shape[0])[None]  # [1, total]
    q4, k4 = scheme.rotate(q.transpose(0, 1)[None], k.transpose(0, 1)[None], pos)  # [1, H, total, D]
    return q4[0].transpose(0, 1), k4[0].transpose(0, 1)  # [total, H, D]


def _flash_path(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme, cu: Tensor, max_seqlen: int,
    opts: VarlenOptions,
) -> Tensor:
    """flash-attn's varlen kernel on rotated ``q, k``; ALiBi through its ``alibi_slopes``."""
    causal, window, scale, dropout_p = opts.causal, opts.window, opts.scale, opts.dropout_p
    fn = _flash_varlen()
    assert fn is not None
    reach = -1 if window is None else min(window - 1, max(max_seqlen, 1))  # keys back (and ahead)
    right = 0 if causal else reach
    slopes = scheme.slopes.to(q.device, torch.float32) if isinstance(scheme, ALiBi) else None
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))  # rotated: transposed
    return fn(
        q, k, v, cu, cu, max_seqlen, max_seqlen, dropout_p=dropout_p, softmax_scale=scale,
        causal=causal, window_size=(reach, right),
        alibi_slopes=slopes,
    )


def _flex(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme, lengths: list[int],
    opts: VarlenOptions,
) -> Tensor:
    """FlexAttention over the packed row with document ids (its block mask skips the tiles
    between documents). ``scale`` multiplies ``q`` by ``scale * sqrt(D)`` first: ``rotate`` is
    linear in ``q``, so the scores are ``q k^T * scale`` plus the bias."""
    causal, window, scale, dropout_p = opts.causal, opts.window, opts.scale, opts.dropout_p
    if scale is not None:
        q = q * (scale * math.sqrt(q.shape[-1]))
    doc = document_ids_from_lengths(torch.tensor(lengths, device=q.device))[None]  # [1, total]
    pos = packed_positions(doc)  # [1, total]
    q4, k4 = scheme.rotate(q.transpose(0, 1)[None], k.transpose(0, 1)[None], pos)  # [1, H, total, D]
    total = q.shape[0]
    rule = Visibility(
        q_pos=pos, k_pos=pos, q_slot=torch.arange(total, device=q.device), causal=causal,
        by_position=False, window=window, key_valid=None, q_doc=doc, k_doc=doc,
    )  # attend's rule for these documents: every row sees its own key
    out = run_by_rule(q4, k4, v.transpose(0, 1)[None], scheme, rule, Softmax(dropout_p=dropout_p)
                      if dropout_p else PLAIN, "flex", RuleFacts(index_bias=True, may_be_empty=False))
    return out[0].transpose(0, 1)  # [total, H, Dv]


def attend_documents(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme, document_ids: Tensor | None,
    causal: bool, window: int | None, scale: float | None,
) -> Tensor:
    """``attend``'s ``"documents"`` path: rotated ``q [B, H, L, D]``, ``k``, ``v`` whose rows
    hold documents (``document_ids [B, L]``, each one contiguous run, positions restarting in
    each) attended each alone, as :func:`attend_varlen`'s grouped path: one SDPA call per
    distinct length; ``[B, H, L, Dv]``. Reads the run lengths on the host (eager only)."""
    assert document_ids is not None
    B, L = document_ids.shape
    new = torch.ones(B, L, dtype=torch.bool, device=q.device)  # [B, L]: a run starts here
    new[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    starts = new.flatten().nonzero().flatten().tolist() + [B * L]  # one host read
    lengths = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    qf, kf, vf = (t.transpose(1, 2).reshape(B * L, t.shape[1], t.shape[-1]) for t in (q, k, v))
    opts = VarlenOptions(causal, window, scale, 0.0)
    out = _grouped(qf, kf, vf, scheme, lengths, opts, math_=False)
    return out.unflatten(0, (B, L)).transpose(1, 2)  # [B, H, L, Dv]


def _groups(lengths: list[int]) -> dict[int, list[int]]:
    """Length ``n`` -> the starts of its sequences, in order (empty sequences left out)."""
    groups: dict[int, list[int]] = {}
    start = 0
    for n in lengths:
        if n:
            groups.setdefault(n, []).append(start)
        start += n
    return groups


def _rows(starts: list[int], n: int, device: torch.device) -> slice | Tensor:
    """The rows of the sequences of length ``n`` at ``starts``: a slice when they lie back to
    back (a view, no copy), else an index ``[N_n * n]``."""
    s0, N = starts[0], len(starts)
    if starts == list(range(s0, s0 + N * n, n)):
        return slice(s0, s0 + N * n)
    return (torch.tensor(starts, device=device)[:, None] + torch.arange(n, device=device)).reshape(-1)


def _group_mask(
    scheme: PositionScheme, n: int, causal: bool, window: int | None, dtype: torch.dtype,
    device: torch.device,
) -> Tensor | None:
    """What one sequence of length ``n`` (positions ``0..n-1``) sees: the scheme's float mask
    ``[1, H, n, n]`` (bias, ``-inf`` where hidden), a bool ``[n, n]`` (no bias, a window), or
    None (no bias, no window: ``is_causal`` or nothing)."""
    if window is not None and window >= n:
        window = None  # the whole sequence fits in the window
    mask = square_mask(scheme, n, causal, dtype, device) if scheme.has_bias else None
    if window is None:
        return mask if mask is not None or not causal else None
    i = torch.arange(n, device=device)[:, None]  # [n, 1] query positions
    j = torch.arange(n, device=device)[None, :]  # [1, n] key positions
    seen = (i - j < window) & ((j <= i) if causal else (j - i < window))  # [n, n]
    return seen if mask is None else mask.masked_fill(~seen, float("-inf"))


def _grouped(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme, lengths: list[int],
    opts: VarlenOptions, math_: bool,
) -> Tensor:
    """The exact path: one batched attention call per distinct length, ``[N_n, H, n, D]``,
    written into the output rows of its sequences (every row belongs to one sequence)."""
    causal, window, scale, dropout_p = opts.causal, opts.window, opts.scale, opts.dropout_p
    total, H = q.shape[0], q.shape[1]
    out = q.new_empty(total, H, v.shape[-1])  # [total, H, Dv]
    for n, starts in _groups(lengths).items():
        rows = _rows(starts, n, q.device)
        qg, kg, vg = (t[rows].unflatten(0, (-1, n)).transpose(1, 2) for t in (q, k, v))  # [N_n, H, n, D]
        mask = _group_mask(scheme, n, causal, window, torch.float32 if math_ else q.dtype, q.device)
        got = _attend_group(qg, kg, vg, mask, causal, Softmax(scale, dropout_p=dropout_p), math_)
        got = got.transpose(1, 2).reshape(-1, H, got.shape[-1])  # [N_n * n, H, Dv]
        if isinstance(rows, slice):
            out[rows] = got
        else:
            out.index_copy_(0, rows, got)
    return out


def _attend_group(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, softmax: Softmax,
    math_: bool,
) -> Tensor:
    """One group ``[N, H, n, D]`` under its mask (bool: who sees whom; float: the scheme's bias
    with ``-inf`` where hidden; None: ``is_causal`` or nothing), written out or on SDPA. A long
    causal float mask on one CPU thread runs in blocks of queries (``sdpa_causal_chunks``)."""
    if math_:
        n = q.shape[-2]
        if causal and mask is None:
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        bias = None if mask is None or mask.dtype == torch.bool else mask
        allowed = mask if bias is None else None
        return written_out(q, k, v, bias, allowed, softmax)  # [N, H, n, Dv]
    if causal and mask is not None and chunks_pay(q):
        return sdpa_causal_chunks(q, k, v, mask, softmax.dropout_p, softmax.scale)
    return sdpa(q, k, v, mask, softmax.dropout_p, is_causal=causal and mask is None,
                scale=softmax.scale)
