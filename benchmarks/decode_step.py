"""One decode step over a growing cache: posenc against the step written by hand.

``python benchmarks/decode_step.py [--cached 512] [--repeats 200] [--threads 2]``

One new token (``[B, H, 1, D]``) over ``--cached`` keys, RoPE, growing cache. Peers, timed
round-robin in one process (medians, ``_timing.medians``):

- ``hand``: rotate q and k with precomputed tables, ``torch.cat`` onto the cached k and v,
  ``scaled_dot_product_attention`` (no checks, no bookkeeping): the floor;
- ``posenc``: ``posenc.attend(q, k, v, RoPE, cache=KVCache())`` with default positions;
- ``posenc + positions``: the same with the step's positions given;
- ``posenc, padded``: after a left-padded prefill (the cache remembers padding, so every step
  masks the pads);
- ``posenc, rolling``: a rolling cache ``KVCache(max_len=4 + (T - 4), sinks=4, window=T - 4)``
  full after the prefill (every step attends over its ``T`` slots plus the new key under the
  window-and-sinks rule, then writes in place).

Before each call the growing caches get back the tensors they held after the prefill
(attribute assignments; the step's own tensors are freed inside the timing, as ``hand``'s
are), so every call sees ``--cached`` keys. Prints each median and its ratio to ``hand``.

On Linux the script re-executes itself with glibc's ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` at 256 MiB: by default glibc hands the step's freed 2 MiB tensors back
to the system and page-faults them in again on the next call, which made single calls swing up
to 5x from one run to the next (a peer's median went from 0.3x to 1.4x ``hand``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from _timing import medians

import posenc
from posenc.schemes import RoPE

_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def main() -> None:
    if sys.platform.startswith("linux") and any(os.environ.get(k) != v for k, v in _MALLOC.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_MALLOC})
    ap = argparse.ArgumentParser()
    ap.add_argument("--cached", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, H, D, T = 2, 8, 64, args.cached
    scheme = RoPE(D, interleaved=False)
    rot = scheme.rotary
    q1, k1, v1 = (torch.randn(B, H, 1, D) for _ in range(3))
    kp, vp = torch.randn(B, H, T, D), torch.randn(B, H, T, D)

    cos, sin = rot.cos_sin(torch.arange(T + 1))  # [T + 1, D] tables, as a hand-written loop keeps

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)

    def hand() -> torch.Tensor:
        c, s = cos[T:T + 1], sin[T:T + 1]
        q = q1 * c + rotate_half(q1) * s
        k = torch.cat([kp, k1 * c + rotate_half(k1) * s], dim=-2)
        v = torch.cat([vp, v1], dim=-2)
        return F.scaled_dot_product_attention(q, k, v)

    def cache_with(mask: torch.Tensor | None) -> posenc.KVCache:
        c = posenc.KVCache()
        pos = None if mask is None else posenc.positions_from_mask(mask)
        posenc.attend(torch.randn(B, H, T, D), kp, vp, scheme, cache=c, attention_mask=mask,
                      positions=pos)
        return c

    plain, given = cache_with(None), cache_with(None)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :T // 4] = 0
    padded = cache_with(mask)
    rolling = posenc.KVCache(max_len=T, sinks=4, window=T - 4)
    posenc.attend(torch.randn(B, H, T, D), kp, vp, scheme, cache=rolling)
    step_pos = torch.tensor([T])
    names = ("k", "v", "positions", "valid", "next_start", "seen")

    def step(cache: posenc.KVCache, **kw: object):
        held = {name: getattr(cache, name) for name in names}
        rewind = not cache.rolling

        def run() -> torch.Tensor:
            if rewind:  # the state after the prefill: T keys again
                for name, value in held.items():
                    setattr(cache, name, value)
            return posenc.attend(q1, k1, v1, scheme, cache=cache, **kw)
        return run

    with torch.no_grad():
        t = medians({"hand": hand, "posenc": step(plain), "posenc + positions":
                     step(given, positions=step_pos), "posenc, padded": step(padded),
                     "posenc, rolling": step(rolling)},
                    repeats=args.repeats, warmup=10)
    for name, sec in t.items():
        print(f"{name:20s} {sec * 1e6:8.1f} us   {sec / t['hand']:5.2f}x hand")


if __name__ == "__main__":
    main()
