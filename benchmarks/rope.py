"""apply_rope vs the memory bound and the usual formulations, as ratios from one run.

    python benchmarks/rope.py [--repeats 30]

Shape [1, 32, 2048, 128] float32 on 2 threads. Baselines:
  copy      x.clone(): reads and writes the tensor once, the memory bound;
  textbook  angles recomputed every call, then torch.stack / flatten over interleaved pairs
            (the style of the source article and many tutorials);
  cat       Hugging Face's x * cos + rotate_half(x) * sin, rotate_half built with torch.cat.
"""

from __future__ import annotations

import argparse

import torch
from _timing import medians

from posenc import apply_rope, rope_cos_sin, rope_inv_freq, rotate_half


def textbook_rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    L, d = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)  # [d/2]
    angles = torch.arange(L, dtype=torch.float32)[:, None] * inv_freq  # [L, d/2]
    sin, cos = angles.sin(), angles.cos()
    x1, x2 = x[..., 0::2], x[..., 1::2]  # [B, H, L, d/2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(1, 32, 2048, 128)
    inv_freq, _ = rope_inv_freq(128)
    pos = torch.arange(2048)
    ci, si = rope_cos_sin(pos, inv_freq, interleaved=True)
    ch, sh = rope_cos_sin(pos, inv_freq, interleaved=False)
    torch.testing.assert_close(apply_rope(x, ci, si, interleaved=True), textbook_rope(x))
    torch.testing.assert_close(apply_rope(x, ch, sh, interleaved=False), x * ch + rotate_half(x) * sh)
    t = medians(
        {
            "copy": lambda: x.clone(),
            "interleaved": lambda: apply_rope(x, ci, si, interleaved=True),
            "half": lambda: apply_rope(x, ch, sh, interleaved=False),
            "textbook": lambda: textbook_rope(x),
            "cat": lambda: x * ch + rotate_half(x) * sh,
        },
        repeats=args.repeats,
    )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, x {tuple(x.shape)} float32, "
          f"median of {args.repeats}")
    for name, sec in t.items():
        print(f"  {name:12s} {sec * 1e3:8.2f} ms")
    print("ratios (lower is better for the first two, higher for the rest):")
    rows = [
        ("interleaved / copy", t["interleaved"] / t["copy"], "<= 1.5"),
        ("half / copy", t["half"] / t["copy"], "<= 2.5"),
        ("textbook / interleaved", t["textbook"] / t["interleaved"], ">= 2.5"),
        ("textbook / half", t["textbook"] / t["half"], ">= 2.5"),
        ("cat / half", t["cat"] / t["half"], "> 1"),
    ]
    for name, r, target in rows:
        print(f"  {name:24s} {r:6.2f}x   target {target}")


if __name__ == "__main__":
    main()
