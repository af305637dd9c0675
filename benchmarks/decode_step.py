"""The decode loop a user runs: posenc's caches against the step written by hand.

``python benchmarks/decode_step.py [--cached 512] [--steps 64] [--repeats 15] [--threads 1]``

One new token per step, RoPE (half layout), default positions, over a cache that starts with
``--cached`` keys and grows by one key every step (``--steps`` steps per timed loop). No
allocator settings, nothing restored between steps: each timed loop is ``--steps`` calls in a
row on one cache, as a generation loop makes them. Before each loop (not timed) every peer gets
a fresh cache holding the ``--cached`` keys. Loops are timed round-robin in one process and
the medians of ``loop time / steps`` (the thread's CPU time, ``time.thread_time``) are printed
with their ratio to ``hand``:

- ``hand``: rotate q and k with precomputed tables, ``torch.cat`` the new key and value onto
  the ones held, ``scaled_dot_product_attention`` (``enable_gqa`` for grouped-query heads);
  no checks, no bookkeeping: the floor;
- ``posenc, growing``: ``posenc.attend(q, k, v, RoPE, cache=KVCache())``;
- ``posenc, static``: the same with ``KVCache(max_len=cached + steps)`` (written in place, the
  unwritten slots masked: every step attends over all ``max_len`` slots);
- on the first shape also ``posenc, padded`` (a growing cache after a left-padded prefill: every
  step masks the pads it remembers) and ``posenc, rolling`` (``KVCache(max_len=cached,
  sinks=4, window=cached - 4)``, full from the start: every step attends over its slots plus
  the new key under the window-and-sinks rule).

Shapes: ``B=2, H=8, D=64``; a Llama-3-8B layer (``B=1, H=32, H_kv=8, D=128``); and a tiny one
(``B=1, H=1, D=16``, 32 keys) whose ``posenc - hand`` difference is the fixed cost per call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import posenc
from posenc.schemes import RoPE

Loop = Callable[[], Callable[[], object]]  # setup (not timed) -> the timed loop


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def peers(B: int, H: int, KV: int, D: int, T: int, steps: int, extra: bool) -> dict[str, Loop]:
    """Each peer's setup, which returns one timed loop of ``steps`` decode steps."""
    scheme = RoPE(D, interleaved=False)
    cos, sin = scheme.rotary.cos_sin(torch.arange(T + steps))  # the hand loop's tables
    q1, k1, v1 = torch.randn(B, H, 1, D), torch.randn(B, KV, 1, D), torch.randn(B, KV, 1, D)
    kp, vp = torch.randn(B, KV, T, D), torch.randn(B, KV, T, D)
    gqa = H != KV

    def hand() -> Callable[[], object]:
        def run() -> None:
            kc, vc = kp, vp
            for n in range(T, T + steps):
                c, s = cos[n:n + 1], sin[n:n + 1]
                q = q1 * c + _rotate_half(q1) * s
                kc = torch.cat([kc, k1 * c + _rotate_half(k1) * s], dim=-2)
                vc = torch.cat([vc, v1], dim=-2)
                F.scaled_dot_product_attention(q, kc, vc, enable_gqa=gqa)
        return run

    def posenc_loop(make: Callable[[], posenc.KVCache], mask: torch.Tensor | None = None) -> Loop:
        def setup() -> Callable[[], object]:
            cache = make()
            if mask is None:
                cache.update(kp, vp)  # the prefill's keys, stored as given
            else:  # a left-padded prefill through attend: the cache remembers the pads
                posenc.attend(torch.randn(B, H, T, D), kp, vp, scheme, cache=cache,
                              attention_mask=mask, positions=posenc.positions_from_mask(mask))

            def run() -> None:
                for _ in range(steps):
                    posenc.attend(q1, k1, v1, scheme, cache=cache)
            return run
        return setup

    loops: dict[str, Loop] = {
        "hand": hand,
        "posenc, growing": posenc_loop(posenc.KVCache),
        "posenc, static": posenc_loop(lambda: posenc.KVCache(max_len=T + steps)),
    }
    if extra:
        mask = torch.ones(B, T, dtype=torch.long)
        mask[-1, : T // 4] = 0
        loops["posenc, padded"] = posenc_loop(posenc.KVCache, mask)
        loops["posenc, rolling"] = posenc_loop(
            lambda: posenc.KVCache(max_len=T, sinks=4, window=T - 4))
    return loops


def per_step(loops: dict[str, Loop], steps: int, repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per step of each peer's loop, timed round-robin (setups not timed), in
    the calling thread's CPU time: with one torch thread every op runs in it, and a shared
    machine's other jobs do not count (wall-clock medians swung 5x on a loaded 2-core box)."""
    times: dict[str, list[float]] = {name: [] for name in loops}
    for i in range(warmup + repeats):
        for name, setup in loops.items():
            run = setup()
            t0 = time.thread_time()
            run()
            if i >= warmup:
                times[name].append((time.thread_time() - t0) / steps)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cached", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    T, steps = args.cached, args.steps
    shapes = [("B=2, H=8, D=64", (2, 8, 8, 64, T), True),
              ("Llama-8B layer: B=1, H=32, H_kv=8, D=128", (1, 32, 8, 128, T), False),
              ("tiny: B=1, H=1, D=16, 32 keys", (1, 1, 1, 16, 32), False)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {steps} steps per "
          f"loop, {args.repeats} loops each, medians per step")
    with torch.no_grad():
        for title, (B, H, KV, D, cached), extra in shapes:
            t = per_step(peers(B, H, KV, D, cached, steps, extra), steps, args.repeats)
            print(f"\n{title}, cache grows from {cached} keys")
            for name, sec in t.items():
                line = f"  {name:18s} {sec * 1e6:8.1f} us   {sec / t['hand']:5.2f}x hand"
                if cached < 64 and name != "hand":
                    line += f"   fixed cost {(sec - t['hand']) * 1e6:6.1f} us per call"
                print(line)


if __name__ == "__main__":
    main()
