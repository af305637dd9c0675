"""ALiBi attention: SDPA with an [H, L, L] bias vs FlexAttention with a score_mod.

    python benchmarks/alibi.py [--lens 1024 4096] [--heads 8] [--repeats 5]

Causal attention, batch 1, head_dim 64, float32, 2 threads, forward only (no_grad). For each
length it prints the median time and the peak extra resident memory of one call. Peak memory is
read from the kernel (VmHWM, reset through /proc/self/clear_refs), so it counts every
allocation, including the ones PyTorch makes inside SDPA. FlexAttention is compiled once per shape
before timing; its score_mod computes -m_h (i - j) inside the kernel, so no [L, L] tensor exists.
"""

from __future__ import annotations

import argparse
import sys

import torch
from _timing import medians

from posenc import ALiBi, attend


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def peak_extra_bytes(fn) -> int:
    """Peak resident memory during ``fn()`` above what was resident before it (Linux only)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    fn()
    return _status("VmHWM") - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("peak memory is read from /proc: run this on Linux")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    scheme = ALiBi(args.heads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, causal, B=1, "
          f"H={args.heads}, Dh={args.head_dim}, float32, median of {args.repeats}")
    print(f"{'L':>6} {'backend':>8} {'ms':>10} {'peak MiB':>10} {'[H,L,L] MiB':>12}")
    for L in args.lens:
        q, k, v = torch.randn(3, 1, args.heads, L, args.head_dim).unbind(0)
        run = {
            "sdpa": lambda q=q, k=k, v=v: attend(q, k, v, scheme),
            "flex": lambda q=q, k=k, v=v: attend(q, k, v, scheme, backend="flex"),
        }
        with torch.no_grad():
            torch.testing.assert_close(run["flex"](), run["sdpa"](), atol=1e-4, rtol=1e-4)  # compiles
            t = medians(run, repeats=args.repeats, warmup=1)
            mem = {name: peak_extra_bytes(fn) for name, fn in run.items()}
        hll = args.heads * L * L * 4 / 2**20
        for name in run:
            print(f"{L:>6} {name:>8} {t[name] * 1e3:>10.1f} {mem[name] / 2**20:>10.1f} {hll:>12.0f}")
        flex_mem = mem["flex"] / 2**20
        mem_ratio = f"{mem['sdpa'] / mem['flex']:.1f}x" if flex_mem >= 1 else "flex < 1 MiB"
        print(f"{L:>6} {'sdpa/flex':>8} {t['sdpa'] / t['flex']:>9.2f}x {mem_ratio:>10}")


if __name__ == "__main__":
    main()
