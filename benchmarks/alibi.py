"""Bias attention (ALiBi, T5) through posenc.attend vs SDPA with a precomputed 4-D mask vs Flex.

    python benchmarks/alibi.py [--lens 1024 4096] [--heads 8] [--repeats 5] [--eval-len 1024]

Kernel table: causal, batch 1, head_dim 64, float32, forward only (no_grad). Rows, timed
round-robin in one run (medians): ``posenc.attend`` with ALiBi and with T5 (the mask cached in
the scheme after the first call, as in a model's every layer and step), the floor they aim at
(SDPA given a precomputed ``[1, H, L, L]`` float mask, = 1.00x), FlexAttention with
``alibi_score_mod`` (compiled once per shape before timing), and ``alibi_bias`` alone (building
the ``[H, L, L]`` bias), and for reference SDPA's ``is_causal`` without any bias (NoPE: the CPU
kernel skips the future keys, which a float mask does not let it do). Peak memory is the
kernel's high-water mark of resident memory during one call (VmHWM, reset through
/proc/self/clear_refs), so it counts SDPA's own allocations.

Eval table: chapter 6's model shape (dim 64, 2 blocks of ``posenc.MultiHeadAttention`` + MLP,
4 heads), batch 8 x ``--eval-len`` tokens, forward only, one thread; tokens/s relative to NoPE.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from _timing import medians
from torch import nn

from posenc import ALiBi, MultiHeadAttention, alibi_bias, attend, make_scheme


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


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, scheme) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads, scheme=scheme)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def kernel_table(args) -> None:
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, causal, B=1, "
          f"H={args.heads}, Dh={args.head_dim}, float32, forward, median of {args.repeats}")
    print(f"{'L':>6} {'variant':>23} {'ms':>9} {'x SDPA 4-D':>11} {'peak MiB':>9}")
    alibi, t5 = ALiBi(args.heads), make_scheme("t5", num_heads=args.heads)
    for L in args.lens:
        q, k, v = torch.randn(3, 1, args.heads, L, args.head_dim).unbind(0)
        mask = alibi.attn_mask(L, L).clone()  # [1, H, L, L], precomputed once
        run = {
            "SDPA + 4-D mask": lambda q=q, k=k, v=v, m=mask: F.scaled_dot_product_attention(
                q, k, v, attn_mask=m
            ),
            "SDPA is_causal, no bias": lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True
            ),
            "posenc.attend ALiBi": lambda q=q, k=k, v=v: attend(q, k, v, alibi),
            "posenc.attend T5": lambda q=q, k=k, v=v: attend(q, k, v, t5),
            "Flex alibi_score_mod": lambda q=q, k=k, v=v: attend(q, k, v, alibi, backend="flex"),
            "alibi_bias alone": lambda L=L: alibi_bias(args.heads, L),
        }
        with torch.no_grad():
            torch.testing.assert_close(run["posenc.attend ALiBi"](), run["SDPA + 4-D mask"]())
            torch.testing.assert_close(  # compiles Flex for this shape
                run["Flex alibi_score_mod"](), run["SDPA + 4-D mask"](), atol=1e-4, rtol=1e-4
            )
            t = medians(run, repeats=args.repeats, warmup=1)
            mem = {name: peak_extra_bytes(fn) for name, fn in run.items()}
        base = t["SDPA + 4-D mask"]
        for name in run:
            print(f"{L:>6} {name:>23} {t[name] * 1e3:>9.1f} {t[name] / base:>10.2f}x "
                  f"{mem[name] / 2**20:>9.1f}")
        cached = args.heads * L * L * 4 / 2**20
        print(f"{L:>6} {'(mask held by scheme)':>23} {'':>9} {'':>11} {cached:>9.0f}")
        del mask


def eval_table(args) -> None:
    torch.set_num_threads(1)
    dim, heads, B, L = 64, 4, 8, args.eval_len
    torch.manual_seed(0)
    x = torch.randn(B, L, dim)
    fns = {}
    for name in ("nope", "rope", "alibi", "t5"):
        scheme = make_scheme(name, dim=dim, num_heads=heads, causal=True)
        model = nn.Sequential(Block(dim, heads, scheme), Block(dim, heads, scheme)).eval()
        fns[name] = lambda model=model: model(x)
    with torch.no_grad():
        t = medians(fns, repeats=args.repeats, warmup=1)
    print(f"\nmodel eval: dim {dim}, 2 blocks, {heads} heads, batch {B} x {L}, 1 thread, "
          f"forward, median of {args.repeats}")
    print(f"{'scheme':>8} {'tok/s':>10} {'x NoPE':>8}")
    for name in fns:
        print(f"{name:>8} {B * L / t[name]:>10,.0f} {t[name] / t['nope']:>7.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-len", type=int, default=1024)
    args = ap.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("peak memory is read from /proc: run this on Linux")
    torch.manual_seed(0)
    kernel_table(args)
    eval_table(args)


if __name__ == "__main__":
    main()
