"""Why the compiled RoPE attention layer was slower than eager on CPU (issue 22 §3).

    python benchmarks/repro_compile_rope.py [--repeats 60] [--threads 1] [--rounds 2]

1. The rotation alone: q and k ``[8, 4, 256, 32]`` (interleaved pairs, transposed views of one
   ``qkv`` matmul as in ``MultiHeadAttention``; angles ``position * inv_freq`` computed in the
   graph, as posenc does under ``torch.compile``), forward + backward, compiled by Inductor in
   three forms, timed round-robin with the eager complex multiply posenc uses outside compile:

   * ``textbook``: ``x * cos + turn(x) * sin``, full-width ``cos``/``sin`` and
     ``turn(x) = stack([-x1, x0])`` -- posenc's compiled form before issue 22 (no posenc code);
   * ``tables``: the same, but the full-width ``cos``/``sin`` are built with ``torch.stack``
     from one angle per pair (no posenc code) -- isolates torch's heuristic, below;
   * ``posenc``: ``posenc.rope_kernels._rope_compiled`` as shipped: those tables, the channel
     swap as a flip, and its analytic backward (the rotation by minus the angle) in an
     ``autograd.Function`` that Dynamo traces into the graph.

   For each form: over how many elements Inductor's generated C++ evaluates ``sin``/``cos``
   (the trip count of the loop nests that call them, forward and backward kernels) and
   whether those loops are vectorised.
2. The layer: ``posenc.MultiHeadAttention(128, 4, scheme="rope")`` on ``[8, 256, 128]``,
   forward + backward, eager vs ``torch.compile(fullgraph=True)``, with posenc's compiled
   rotation replaced by the textbook one (``--form textbook``: the code before the fix) and as
   shipped (``--form posenc``), each in its own process (the form is fixed when Dynamo
   traces), ``--rounds`` times alternately. Each ratio is compiled / eager from one process,
   timed round-robin; wall and CPU (``time.thread_time``) medians, the load average with each.

Cause, torch's: Inductor inlines a pointwise producer into each consumer unless a heuristic
keeps it in a buffer. On CPU a reused node is kept when it contains ``exp``, ``log``,
``sigmoid`` or ``tanh`` (``StorageBox.should_realize_on_reuse`` in ``torch/_inductor/ir.py``;
the heuristic came with pytorch/torchdynamo#1468, "only for exp now ... the list of heavy ops
can be further revised"), not ``sin``/``cos``. So the ``[L, d]`` tables of the textbook form
are recomputed for every batch row and head of q and of k, forward and backward, and since
the turned copy reads ``x[i ^ 1]`` (``% 2`` and ``// 2`` in the index) the CPU vectoriser
leaves those loops scalar: scalar ``std::sin``/``std::cos`` per element. ``torch.stack`` /
``torch.cat`` are lowered on CPU to a kernel that writes its inputs into one buffer, so the
``tables`` form evaluates ``sin``/``cos`` once per angle. The rest of the gap was ours: the
backward autograd derives for the channel swap is a scatter into zeros with a branch per
element; posenc now gives it the rotation by minus the angle, as its eager path always did.
No upstream issue about ``sin``/``cos`` in this heuristic was found (the nearest,
pytorch/pytorch#110611, is about the speed of vectorised transcendental functions).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import subprocess
import sys
import time

import torch
from torch._inductor.utils import run_and_get_code

B, H, L, DH = 8, 4, 256, 32


def textbook(x, pos, inv):
    ang = pos.float()[:, None] * inv  # [L, d/2]
    full = ang.repeat_interleave(2, dim=-1)  # [L, d]: t0 t0 t1 t1 ...
    cos, sin = full.cos(), full.sin()
    pairs = x.unflatten(-1, (-1, 2))
    turn = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return x * cos + turn * sin


def tables(x, pos, inv):
    ang = pos.float()[:, None] * inv  # [L, d/2]
    c, s = ang.cos(), ang.sin()
    cos = torch.stack([c, c], dim=-1).flatten(-2)  # [L, d]: one buffer, written once
    sin = torch.stack([s, s], dim=-1).flatten(-2)
    pairs = x.unflatten(-1, (-1, 2))
    turn = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return x * cos + turn * sin


def posenc_form(x, pos, inv):
    from posenc.rope import _rope_compiled

    full = (pos.float()[:, None] * inv).repeat_interleave(2, dim=-1)  # as posenc computes them
    return _rope_compiled(x, full.cos(), full.sin(), True)


def eager_complex(x, pos, inv):
    ang = pos.float()[:, None] * inv
    cis = torch.polar(torch.ones_like(ang), ang)  # [L, d/2] complex64
    return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * cis).flatten(-2)


def _qk(rot, inv):
    def fn(qkv, pos):  # q, k as MultiHeadAttention makes them: transposed views of one matmul
        q, k, _ = qkv.unflatten(-1, (3, H, DH)).unbind(2)
        return rot(q.transpose(1, 2), pos, inv), rot(k.transpose(1, 2), pos, inv)
    return fn


def _trig_loops(code: str) -> tuple[int, bool]:
    """Largest number of elements a loop nest evaluating sin/cos runs over, and whether every
    such loop is vectorised, from Inductor's generated C++."""
    most, vector = 0, True
    for body in re.findall(r"cpp_pybinding\(.*?r'''(.*?)'''", code, flags=re.S):
        stack: list[tuple[int, int]] = []  # (brace depth at the loop, trip count)
        depth = 0
        for line in body.splitlines():
            m = re.search(r"for\(int64_t x\w+=.*?<static_cast<int64_t>\((\d+)L\)", line)
            if m:
                stack.append((depth, int(m.group(1))))
            if re.search(r"\b(std::)?(sin|cos)\(|\.(sin|cos)\(\)", line):
                n = 1
                for _, trips in stack:
                    n *= trips
                most = max(most, n)
                vector = vector and "std::" not in line
            depth += line.count("{") - line.count("}")
            while stack and depth <= stack[-1][0] and "}" in line:
                stack.pop()
    return most, vector


def part1(args) -> None:
    inv = 1.0 / 10000 ** (torch.arange(0, DH, 2, dtype=torch.float32) / DH)
    qkv = torch.randn(B, L, 3 * H * DH, requires_grad=True)
    pos = torch.arange(L)

    def step(fn):
        def run():
            qkv.grad = None
            q, k = fn(qkv, pos)
            (q.sum() + (2 * k).sum()).backward()
            return q, k
        return run

    runs = {"eager (complex multiply)": step(_qk(eager_complex, inv))}
    ref = runs["eager (complex multiply)"]()
    print(f"\n1. rotation of q and k [{B}, {H}, {L}, {DH}] (interleaved), forward + backward, "
          f"compiled, median of {args.repeats}")
    print(f"{'form':<26}{'sin/cos over':>14}{'vectorised':>12}{'wall ms':>10}{'CPU ms':>9}"
          f"{'max |diff|':>12}")
    info = {}
    for name, rot in (("textbook", textbook), ("tables", tables), ("posenc", posenc_form)):
        fn = step(torch.compile(_qk(rot, inv), fullgraph=True))
        out, codes = run_and_get_code(fn)
        n, vec = _trig_loops("\n".join(codes))
        diff = max((a - b).abs().max().item() for a, b in zip(out, ref, strict=True))
        info[name] = (n, vec, diff)
        runs[name] = fn
    wall, cpu = _medians(runs, args.repeats)
    for name in runs:
        n, vec, diff = info.get(name, (0, True, 0.0))
        trig = f"{n:,}" if name in info else "-"
        vec_s = ("yes" if vec else "no") if name in info else "-"
        print(f"{name:<26}{trig:>14}{vec_s:>12}{wall[name] * 1e3:>10.2f}{cpu[name] * 1e3:>9.2f}"
              f"{diff:>12.1e}")
    print(f"   an [L, d/2] table has {L * DH // 2:,} angles; q and k have {2 * B * H * L * DH:,} "
          "elements")


def _medians(runs, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    for fn in runs.values():
        for _ in range(3):
            fn()
    wall: dict[str, list[float]] = {n: [] for n in runs}
    cpu: dict[str, list[float]] = {n: [] for n in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            w, c = time.perf_counter(), time.thread_time()
            fn()
            cpu[name].append(time.thread_time() - c)
            wall[name].append(time.perf_counter() - w)
    return ({n: statistics.median(t) for n, t in wall.items()},
            {n: statistics.median(t) for n, t in cpu.items()})


def layer(args) -> None:
    import posenc.rope_kernels as kernels
    from posenc import MultiHeadAttention

    if args.form == "textbook":  # the compiled rotation before issue 22
        kernels._rope_compiled = kernels._rope_textbook
    D = H * DH
    torch.manual_seed(0)
    eager = MultiHeadAttention(D, H, scheme="rope")
    compiled_mod = copy.deepcopy(eager)
    compiled = torch.compile(compiled_mod, fullgraph=True)
    x = torch.randn(B, L, D, requires_grad=True)

    def step(m):
        def run():
            x.grad = None
            for p in m.parameters():
                p.grad = None
            out = m(x)
            out.square().mean().backward()
            return out
        return run

    step(compiled)()  # compile (not timed)
    wall, cpu = _medians({"eager": step(eager), "compiled": step(compiled)}, args.repeats)
    load = os.getloadavg()[0]
    print(f"   {args.form:<9} eager {wall['eager'] * 1e3:7.2f} ms, compiled "
          f"{wall['compiled'] * 1e3:7.2f} ms: wall {wall['compiled'] / wall['eager']:.2f}x, "
          f"CPU {cpu['compiled'] / cpu['eager']:.2f}x (load {load:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--form", choices=("textbook", "posenc"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.form:
        layer(args)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}")
    part1(args)
    print(f"\n2. MultiHeadAttention(128, 4, scheme='rope'), x [{B}, {L}, 128], forward + "
          f"backward, compiled (fullgraph) / eager, median of {args.repeats}")
    for _ in range(args.rounds):
        for form in ("textbook", "posenc"):
            subprocess.run([sys.executable, __file__, "--form", form, "--repeats",
                            str(args.repeats), "--threads", str(args.threads)], check=True)


if __name__ == "__main__":
    main()
