"""One decode step over a growing cache: posenc against the step written by hand.

``python benchmarks/decode_step.py [--cached 512] [--repeats 200] [--threads 2]``

One new token (``[B, H, 1, D]``) over ``--cached`` keys, RoPE, growing cache. Peers, timed
round-robin in one process (medians, ``_timing.medians``):

- ``hand``: rotate q and k with precomputed tables, ``torch.cat`` onto the cached k and v,
  ``scaled_dot_product_attention`` (no checks, no bookkeeping): the floor;
- ``posenc``: ``posenc.attend(q, k, v, RoPE, cache=KVCache())`` with default positions;
- ``posenc + positions``: the same with the step's positions given;
- ``posenc, padded``: after a left-padded prefill (the cache remembers padding, so every step
  takes the masked path).

The caches are cropped back to ``--cached`` keys after every call (``KVCache.crop``), so every
call sees the same length. Prints each median and its ratio to ``hand``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _timing import medians

import posenc
from posenc.schemes import RoPE


def main() -> None:
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
    step_pos = torch.tensor([T])

    def step(cache: posenc.KVCache, **kw: object):
        def run() -> torch.Tensor:
            out = posenc.attend(q1, k1, v1, scheme, cache=cache, **kw)
            cache.crop(T)
            return out
        return run

    with torch.no_grad():
        t = medians({"hand": hand, "posenc": step(plain), "posenc + positions":
                     step(given, positions=step_pos), "posenc, padded": step(padded)},
                    repeats=args.repeats, warmup=10)
    for name, sec in t.items():
        print(f"{name:20s} {sec * 1e6:8.1f} us   {sec / t['hand']:5.2f}x hand")


if __name__ == "__main__":
    main()
