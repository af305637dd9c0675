"""Packed documents: the varlen path vs a dense document mask vs a per-document loop.

    python benchmarks/varlen.py [--len 4096] [--docs 8 32] [--heads 8] [--head-dim 64]
                                [--repeats 10] [--threads 2] [--backward]

One packed row of ``--len`` tokens split into ``--docs`` documents of uneven lengths (drawn
once with a fixed seed; every document at least ``len / (4 * docs)`` tokens), causal, float32,
forward only (``--backward``: forward + backward), for RoPE and ALiBi. Columns, timed
round-robin in one run (medians, ``_timing.medians``):

- ``varlen``: ``posenc.varlen.attend_varlen`` on ``[total, H, D]`` with ``cu_seqlens`` (on a
  CPU, and without flash-attn, the documents grouped by length, one SDPA call per length);
- ``dense``: ``posenc.attend(..., document_ids=...)`` with an all-real ``attention_mask``, which
  keeps it on one ``[1, 1, L, L]`` mask (plus the bias for ALiBi) over the whole row (without
  the mask, since issue 33, ``attend`` takes varlen's grouped path: ``benchmarks/documents.py``);
- ``loop``: ``posenc.attend`` on each document alone, one call per document (the fast path:
  SDPA's ``is_causal`` or the scheme's cached mask), outputs concatenated;
- ``causal``: ``posenc.attend`` on the whole row as one sequence (no documents: a different,
  wrong answer for packing, timed as the cost floor the issue measured against).

The outputs of ``varlen``, ``dense`` and ``loop`` are checked equal before timing. Ratios are
"x causal" (time over the ``causal`` column: higher is slower) and varlen's speed-up over dense,
for wall time and, on a second line, for the process's CPU time (both threads' work, without the
waiting that a loaded machine adds to the wall time), taken from the same calls.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from _timing import medians

from posenc import ALiBi, RoPE, attend, cu_seqlens, document_ids_from_lengths
from posenc.varlen import attend_varlen


def doc_lengths(total: int, docs: int, seed: int = 0) -> list[int]:
    """``docs`` uneven lengths summing to ``total``, each at least ``total // (4 * docs)``."""
    g = torch.Generator().manual_seed(seed)
    floor = max(1, total // (4 * docs))
    w = torch.rand(docs, generator=g)
    extra = (w / w.sum() * (total - floor * docs)).floor().long()
    extra[0] += total - floor * docs - int(extra.sum())
    return (extra + floor).tolist()


def cpu_recorder(cpu: dict[Callable, list[float]]) -> Callable[[Callable[[], object]], float]:
    """A ``medians`` timer: returns one call's wall time, appends its CPU time to ``cpu[fn]``."""

    def timer(fn: Callable[[], object]) -> float:
        w, c = time.perf_counter(), time.process_time()
        fn()
        cpu[fn].append(time.process_time() - c)
        return time.perf_counter() - w

    return timer


def row(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1)[None]  # [total, H, D] -> [1, H, total, D]


def variants(q, k, v, scheme, lens: list[int]) -> dict:
    """The four columns as calls returning ``[total, H, D]``."""
    ids = document_ids_from_lengths(lens)  # [L]
    cu, max_len = cu_seqlens(ids)
    starts = cu[:-1].tolist()
    return {
        "varlen": lambda: attend_varlen(q, k, v, scheme, cu_seqlens=cu, max_seqlen=max_len),
        "dense": lambda: attend(row(q), row(k), row(v), scheme, document_ids=ids[None],
                                attention_mask=torch.ones(1, len(ids), dtype=torch.bool))[0]
        .transpose(0, 1),
        "loop": lambda: torch.cat([
            attend(row(q[s:s + n]), row(k[s:s + n]), row(v[s:s + n]), scheme)[0].transpose(0, 1)
            for s, n in zip(starts, lens, strict=True)
        ]),
        "causal": lambda: attend(row(q), row(k), row(v), scheme)[0].transpose(0, 1),
    }


def table(args, docs: int, schemes: dict) -> None:
    L, H, D = args.len, args.heads, args.head_dim
    lens = doc_lengths(L, docs)
    print(f"\nL = {L}, {docs} documents (lengths {min(lens)}..{max(lens)}, "
          f"{len(set(lens))} distinct), H={H}, Dh={D}, float32, causal, "
          f"{'forward + backward' if args.backward else 'forward'}, median of {args.repeats}")
    print(f"{'scheme':>7} {'varlen ms':>10} {'dense ms':>10} {'loop ms':>10} {'causal ms':>10}"
          f" {'varlen x':>9} {'dense x':>8} {'loop x':>7} {'dense/varlen':>13}")
    for name, scheme in schemes.items():
        torch.manual_seed(0)
        q, k, v = (torch.randn(L, H, D, requires_grad=args.backward) for _ in range(3))
        calls = variants(q, k, v, scheme, lens)
        with torch.no_grad():
            ref = calls["dense"]()
            torch.testing.assert_close(calls["varlen"](), ref, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(calls["loop"](), ref, atol=1e-5, rtol=1e-5)
        fns = calls
        if args.backward:
            fns = {n: (lambda f=f: f().sum().backward()) for n, f in calls.items()}
        cpu: dict[Callable, list[float]] = {f: [] for f in fns.values()}

        with torch.set_grad_enabled(args.backward):
            wall = medians(fns, repeats=args.repeats, warmup=1, timer=cpu_recorder(cpu))
        cpu_t = {n: statistics.median(cpu[f][-args.repeats:]) for n, f in fns.items()}
        for label, t in ((name, wall), ("  (CPU)", cpu_t)):
            c = t["causal"]
            print(f"{label:>7} {t['varlen'] * 1e3:>10.1f} {t['dense'] * 1e3:>10.1f} "
                  f"{t['loop'] * 1e3:>10.1f} {c * 1e3:>10.1f} {t['varlen'] / c:>8.2f}x "
                  f"{t['dense'] / c:>7.2f}x {t['loop'] / c:>6.2f}x {t['dense'] / t['varlen']:>12.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--len", type=int, default=4096)
    ap.add_argument("--docs", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backward", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    schemes = {"rope": RoPE(args.head_dim), "alibi": ALiBi(args.heads)}
    for docs in args.docs:
        table(args, docs, schemes)


if __name__ == "__main__":
    main()
