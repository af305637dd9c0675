"""Positions moved at serving time (chapter 11): cached rotated keys shifted by one more
rotation, llama.cpp's context shift, and a speculative draft tree's positions and mask.

:func:`shift_rotated_keys` moves cached keys to other positions (prefix caching at another
offset), :func:`rebase_cache` moves a whole cache down to small positions, and
:func:`tree_positions_and_mask` gives a draft tree the positions and the who-sees-whom mask
:func:`~posenc.attention.attend` takes. :mod:`posenc.lab.serving` re-exports these names.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

import posenc
from posenc._checks import check_int, check_tensor
from posenc.cache import KVCache
from posenc.rope import RotaryEmbedding
from posenc.schemes import RoPE

from .serving_checks import _check_head_dim, _rotary

__all__ = ["shift_rotated_keys", "rebase_cache", "tree_positions_and_mask"]


def shift_rotated_keys(k: Tensor, shift: int | Tensor, rope: RotaryEmbedding | RoPE) -> Tensor:
    """Keys ``k [..., T, Dh]`` rotated at positions ``p`` -> the same keys rotated at
    ``p + shift`` (``shift`` an int or ``[T]``, any sign), by one more rotation: RoPE's
    rotations compose, ``R(s) R(p) = R(p + s)``.

    Prefix caching (vLLM's automatic prefix caching, SGLang's RadixAttention) reuses cached keys
    of a chunk only where it sits at the same absolute positions; the same chunk at another
    offset (a document moved in a prompt) needs this rotation, or its scores with later
    queries are wrong. The angle is ``|shift| * theta`` from posenc's exact angles, without
    the attention factor (it is in the keys already); partial rotary turns only the rotary
    channels. xPos (a per-position scale) is refused; for ``dynamic`` / ``longrope`` scaling
    the frequencies must be those the keys were rotated with, and ``k`` must end in ``rope``'s
    ``head_dim`` (another head_dim, odd included, is refused: its frequencies would turn the
    wrong channels).
    """
    rotary = _rotary(rope)
    check_tensor("k", k, floating=True, min_dim=2)
    _check_head_dim("k", k, rotary, "rope")
    T = k.shape[-2]
    if isinstance(shift, Tensor):
        if shift.is_floating_point() or shift.is_complex() or shift.dtype == torch.bool:
            raise TypeError(f"shift must be an int or an integer tensor, got {shift.dtype}")
        if shift.dim() != 1 or shift.shape[0] != T:
            raise ValueError(f"shift must be an int or have shape [T={T}] (T is dim -2 of k "
                             f"[..., T, head_dim], shape {tuple(k.shape)}), got "
                             f"{tuple(shift.shape)}")
        delta = shift.to(k.device, torch.long)
    else:
        n = check_int("shift", shift)
        if abs(n) >= 2**31:  # posenc's positions stay below 2**31 (a tensor shift is checked so)
            raise ValueError(f"shift must be between -(2**31 - 1) and 2**31 - 1, got {n}")
        delta = torch.full((T,), n, dtype=torch.long, device=k.device)
    inv = rotary.inv_freq.to(k.device)
    cos, sin = posenc.rope_cos_sin(delta.abs(), inv, interleaved=rotary.interleaved)  # [T, rd]
    sin = sin * delta.sign()[:, None].to(sin.dtype)  # a backward turn: sin negated
    return posenc.apply_rope(k, cos, sin, interleaved=rotary.interleaved)


def rebase_cache(cache: KVCache, rope: RotaryEmbedding | RoPE | None, *, keep: int = 0) -> int:
    """llama.cpp's context shift: move the cached keys down to small positions, each by one
    rotation (``rope`` None: a bias scheme, only the stored positions move). The first ``keep``
    keys (the sinks, llama.cpp's ``n_keep``) go to positions ``0 .. keep - 1``; the rest (the
    window) move as a whole by ``d``, so that they follow the sinks without a gap. Returns
    ``d``, the distance the window (and the next query) moves down.

    ``keep`` at or past the cache's length (a stream that has not filled its sinks yet): every
    cached key is a sink and goes to ``0 .. T - 1``, and ``d`` is the next query's move, so it
    still follows them without a gap (``d = 0`` on a stream that started at 0: nothing moves),
    as llama.cpp clamps ``n_keep`` to the tokens it holds. An empty cache returns 0.

    Done once every ``R`` tokens after eviction, it keeps every position below
    ``keep + window + R`` on an endless stream, so RoPE's angles stay small; each key takes one
    rounding per rebase (a drift that grows with the number of rebases, not with the position).
    The window's relative offsets, and so its scores with the next query, are unchanged. A
    rebase cannot undo rounding a key already carries (a key rotated at position ``10**6`` with
    float32-product angles keeps that error); it keeps positions small from the start. Only a
    growing cache whose rows agree on their positions (one stream) is rebased, and its keys
    must end in ``rope``'s ``head_dim``.
    """
    if not isinstance(cache, KVCache) or cache.static:
        raise TypeError(f"cache must be a growing posenc.KVCache, got "
                        f"{'a static KVCache' if isinstance(cache, KVCache) else type(cache).__name__}")
    keep = check_int("keep", keep, minimum=0)
    rotary = None if rope is None else _rotary(rope)
    if cache.k is None or cache.positions is None or not len(cache):
        return 0
    if rotary is not None:
        _check_head_dim("the cached keys", cache.k, rotary, "rope")
    pos = cache.positions  # [B, T]
    if not bool((pos == pos[:1]).all()):
        raise ValueError("rebase_cache: the rows hold different positions; rebase one stream "
                         "(rows that agree) at a time")
    T = pos.shape[1]
    keep = min(keep, T)  # past the length: every key a sink
    nxt = int(pos[0, keep]) if keep < T else int(pos[0, -1]) + 1  # the window's (or query's) start
    d = nxt - keep  # the window's move
    shift = torch.cat([torch.arange(keep, device=pos.device) - pos[0, :keep],
                       torch.full((T - keep,), -d, device=pos.device)])  # [T]
    if bool(shift.any()):
        if rotary is not None:
            cache.k = shift_rotated_keys(cache.k, shift, rotary)
        cache.positions = pos + shift
        cache._recompute_next()
    return d


def tree_positions_and_mask(parents: Sequence[int], *, prefix: int = 0) -> tuple[Tensor, Tensor]:
    """A speculative-decoding draft tree (SpecInfer, Medusa, EAGLE): node ``i`` continues node
    ``parents[i]`` (``-1``: the last token of the prefix; parents come before children).

    Returns ``positions [N]`` int64, ``prefix + depth`` (siblings share a position: they are
    alternatives for the same place), and ``mask [N, prefix + N]`` bool, who sees whom: every
    node sees the whole prefix, its ancestors and itself, never a sibling's branch. Passed to
    :func:`~posenc.attention.attend` as ``attention_mask=mask[None]`` with
    ``positions=positions``, verifying the tree in one call equals decoding each root-to-leaf
    path alone after the prefix.
    """
    if isinstance(parents, Tensor):
        parents = parents.tolist()
    if isinstance(parents, (str, bytes)) or not isinstance(parents, Sequence):
        raise TypeError(f"parents must be a list of ints (one parent per node), got "
                        f"{type(parents).__name__}")
    prefix = check_int("prefix", prefix, minimum=0)
    N = len(parents)
    depth = torch.zeros(N, dtype=torch.long)
    mask = torch.zeros(N, prefix + N, dtype=torch.bool)
    mask[:, :prefix] = True
    for i, p in enumerate(parents):
        p = check_int(f"parents[{i}]", p, minimum=-1)
        if p >= i:
            raise ValueError(f"parents[{i}] must be -1 or an earlier node (< {i}), got {p}: a "
                             "parent comes before its children")
        mask[i, prefix + i] = True
        if p >= 0:
            depth[i] = depth[p] + 1
            mask[i, prefix:] |= mask[p, prefix:]
    return prefix + depth, mask
