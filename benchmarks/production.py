"""posenc where models really run: compiled, decoding with a static cache, packed, windowed.

    python benchmarks/production.py [--repeats 10] [--threads 1] [--only compile train decode pack memory]

Five tables, each from one run (calls timed round-robin, medians; ``benchmarks/_timing.py``):

1. ``compile``: ``posenc.MultiHeadAttention`` with RoPE, forward + backward, eager vs
   ``torch.compile(fullgraph=True)`` (same weights; outputs and gradients compared); wall and
   CPU (``time.thread_time``) medians of the same calls, since on a shared machine the wall
   time also counts the waits for other processes.
2. ``train``: one training step of chapter 6's model (``posenc.lab.TrainConfig()`` with
   ``scheme="rope"``: dim 64, 2 layers, 4 heads, batch 32 x 64, forward, backward, clip,
   AdamW), eager vs the model compiled with ``fullgraph=True``.
3. ``decode``: chapter 6's model decoding 32 tokens after a 64-token prompt (batch 4) with the
   static cache ``KVCache(max_len=96)``, eager vs compiled; a compile counter backend counts
   the graphs compiled for the prefill and all 32 steps (must be <= 2) and the compiled greedy
   tokens must equal the eager ones. Eager with the growing ``KVCache()`` for reference.
4. ``pack``: a batch of 48 documents of mixed lengths (16-512 tokens, seeded) through a
   2-block model of ``MultiHeadAttention`` (chapter 6's shape, RoPE), forward + backward,
   padded (one row per document, ``attention_mask``) vs packed (rows of 512 filled first-fit,
   ``document_ids``); tokens/s counts only the real tokens.
5. ``memory``: one packed, windowed ``attend`` (L = 4096, 8 heads, head_dim 64, 8 documents,
   ``window=256``, RoPE, forward, no_grad) on ``sdpa`` vs ``flex``: the peak resident memory
   above the resident set before the call (VmHWM reset through /proc/self/clear_refs, glibc
   told to return every allocation over 64 KiB to the system at once so freed memory is not
   reused unseen), and the largest tensor made while building the visibility rule (a
   ``TorchDispatchMode`` around ``dense_visibility`` / ``block_visibility``). Measured in a
   fresh process (the script starts itself with ``--only memory``). ``sdpa`` builds
   the ``[L, L]`` rule; ``flex`` builds a ``BlockMask`` from per-tile tables and never does.

Linux only (memory from /proc). Takes a few minutes on a 2-core CPU, most of it compiling.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import random
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from _timing import medians
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from posenc import KVCache, MultiHeadAttention, attend, make_scheme
from posenc.lab.config import TrainConfig
from posenc.lab.train import build_model, make_optimizer

SECTIONS = ("compile", "train", "decode", "pack", "memory")


def _compile_seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _row(name: str, *cols: str) -> None:
    print(f"{name:<44}" + "".join(f"{c:>14}" if not c.startswith(" ") else c for c in cols))


# ---- 1. MultiHeadAttention RoPE, forward + backward ---------------------------------------


def compile_table(args) -> None:
    B, L, D, H = 8, 256, 128, 4
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

    secs = _compile_seconds(step(compiled))
    ye = step(eager)()
    ge = [p.grad.clone() for p in eager.parameters()]
    yc = step(compiled)()
    diff = max((ye - yc).abs().max().item(),
               *((a - p.grad).abs().max().item() for a, p in zip(ge, compiled_mod.parameters(), strict=True)))
    fns = {"eager": step(eager), "compiled": step(compiled)}
    cpu: dict[object, list[float]] = {f: [] for f in fns.values()}

    def wall_and_cpu(fn) -> float:  # CPU time too: on a shared machine wall time waits for others
        w, c = time.perf_counter(), time.thread_time()
        fn()
        cpu[fn].append(time.thread_time() - c)
        return time.perf_counter() - w

    t = medians(fns, repeats=args.repeats, warmup=2, timer=wall_and_cpu)
    tc = {n: statistics.median(cpu[f]) for n, f in fns.items()}
    print(f"\n1. MultiHeadAttention(dim={D}, heads={H}, scheme='rope'), x [{B}, {L}, {D}], "
          f"forward + backward, median of {args.repeats}")
    _row("variant", "ms", "t / eager", "CPU ms", "CPU / eager")
    _row("eager", f"{t['eager'] * 1e3:.2f}", "1.00x", f"{tc['eager'] * 1e3:.2f}", "1.00x")
    _row("torch.compile(fullgraph=True)", f"{t['compiled'] * 1e3:.2f}", f"{t['compiled'] / t['eager']:.2f}x",
         f"{tc['compiled'] * 1e3:.2f}", f"{tc['compiled'] / tc['eager']:.2f}x")
    print(f"   compile (first call): {secs:.1f} s; max |eager - compiled| over output and grads: {diff:.1e}")


# ---- 2. one training step of chapter 6's model ----------------------------------------------


def train_table(args) -> None:
    cfg = TrainConfig(scheme="rope")
    B, L = cfg.batch_size, cfg.train_len
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (B, L), generator=g)
    y = torch.randint(0, 256, (B, L), generator=g)
    models = {"eager": build_model(cfg), "compiled": build_model(cfg)}
    opts = {k: make_optimizer(m, cfg) for k, m in models.items()}
    fwd = {"eager": models["eager"], "compiled": torch.compile(models["compiled"], fullgraph=True)}

    def step(name):
        def run():
            loss = F.cross_entropy(fwd[name](x).flatten(0, 1), y.flatten())
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(models[name].parameters(), cfg.grad_clip)
            opts[name].step()
            return loss
        return run

    secs = _compile_seconds(step("compiled"))
    first = step("eager")()
    second_e, second_c = step("eager")(), step("compiled")()  # after one identical step each
    diff = abs(second_e.item() - second_c.item())
    t = medians({"eager": step("eager"), "compiled": step("compiled")}, repeats=args.repeats, warmup=2)
    print(f"\n2. one training step, chapter 6's model (rope, dim {cfg.dim}, {cfg.num_layers} layers, "
          f"{cfg.num_heads} heads), batch {B} x {L}, AdamW, median of {args.repeats}")
    _row("variant", "ms / step", "tok/s", "t / eager")
    for name in ("eager", "compiled"):
        _row(f"{name}" + (" (model compiled, fullgraph)" if name == "compiled" else ""),
             f"{t[name] * 1e3:.1f}", f"{B * L / t[name]:,.0f}", f"{t[name] / t['eager']:.2f}x")
    print(f"   compile (first step): {secs:.1f} s; loss at step 1 {first.item():.4f}; "
          f"|eager - compiled| loss at step 2: {diff:.1e}")


# ---- 3. decoding with the static cache ----------------------------------------------------


def decode_table(args) -> None:
    from torch._dynamo.testing import CompileCounterWithBackend

    cfg = TrainConfig(scheme="rope")
    model = build_model(cfg).eval()
    B, P, N = 4, 64, 32
    prompt = torch.randint(0, 256, (B, P), generator=torch.Generator().manual_seed(1))
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True)

    def prefill(fn, caches):
        return fn(prompt, caches=caches)[:, -1].argmax(-1, keepdim=True)  # [B, 1]

    def steps(fn, caches, nxt):
        out = []
        for _ in range(N):
            nxt = fn(nxt, caches=caches)[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
        return torch.cat(out, 1)  # [B, N]

    state = {}
    with torch.no_grad():
        for name, fn, static in (("eager static", model, True), ("compiled static", compiled, True),
                                 ("eager growing", model, False)):
            caches = [KVCache(max_len=P + N) if static else KVCache() for _ in model.blocks]
            t0 = time.perf_counter()
            first = prefill(fn, caches)
            tokens = steps(fn, caches, first)
            state[name] = (fn, caches, first, tokens, time.perf_counter() - t0)
        compiles = counter.frame_count
        same = all(torch.equal(state[n][3], state["eager static"][3]) for n in state)

        def rerun(name):
            fn, caches, first, _, _ = state[name]

            def run():
                for c in caches:  # rewind to the prompt: the steps overwrite their own slots
                    c.crop(P)
                return steps(fn, caches, first)
            return run

        fns = {n: rerun(n) for n in state}
        again = {n: f() for n, f in fns.items()}
        same = same and all(torch.equal(again[n], state[n][3]) for n in state)
        t = medians(fns, repeats=args.repeats, warmup=1)
    print(f"\n3. decode, chapter 6's model (rope), batch {B}, prompt {P}, {N} greedy steps, "
          f"median of {args.repeats}")
    _row("variant", "ms / step", "tok/s", "t / eager st.")
    for name in fns:
        per = t[name] / N
        _row(name, f"{per * 1e3:.2f}", f"{B / per:,.0f}", f"{t[name] / t['eager static']:.2f}x")
    print(f"   graphs compiled for prefill + {N} steps: {compiles} (must be <= 2); compiled tokens "
          f"== eager tokens: {same}; first compiled run (prefill + steps, compiling): "
          f"{state['compiled static'][4]:.1f} s")
    if compiles > 2 or not same:
        raise SystemExit("decode: more than 2 compiles or tokens differ")


# ---- 4. packed vs padded ------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, scheme) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads, scheme=scheme)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, **kw):
        x = x + self.attn(self.ln1(x), **kw)
        return x + self.mlp(self.ln2(x))


class Stack(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(256, dim)
        scheme = make_scheme("rope", dim=dim, num_heads=heads)
        self.blocks = nn.ModuleList(Block(dim, heads, scheme) for _ in range(layers))

    def forward(self, tokens, **kw):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x, **kw)
        return x @ self.embed.weight.T


def _pack(lengths: list[int], row: int) -> list[list[int]]:
    """First-fit-decreasing: document indices per row of ``row`` tokens."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, left in enumerate(room):
            if lengths[i] <= left:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(row - lengths[i])
    return rows


def pack_table(args) -> None:
    rng = random.Random(0)
    n_docs, lo, hi, row = 48, 16, 512, 512
    lengths = [min(hi, max(lo, int(rng.lognormvariate(4.8, 0.8)))) for _ in range(n_docs)]
    docs = [torch.randint(1, 256, (n,), generator=torch.Generator().manual_seed(i))
            for i, n in enumerate(lengths)]
    real = sum(lengths)
    # padded: one document per row, right-padded to the longest (training pads on the right)
    Lp = max(lengths)
    pad_tok = torch.zeros(n_docs, Lp, dtype=torch.long)
    pad_mask = torch.zeros(n_docs, Lp, dtype=torch.long)
    for i, d in enumerate(docs):
        pad_tok[i, : len(d)], pad_mask[i, : len(d)] = d, 1
    # packed: first-fit rows of `row` tokens; the tail of a row is one extra document (no loss)
    rows = _pack(lengths, row)
    pk_tok = torch.zeros(len(rows), row, dtype=torch.long)
    pk_doc = torch.zeros(len(rows), row, dtype=torch.long)
    pk_real = torch.zeros(len(rows), row, dtype=torch.bool)
    for r, idx in enumerate(rows):
        s = 0
        for j, i in enumerate(idx):
            pk_tok[r, s : s + lengths[i]], pk_doc[r, s : s + lengths[i]] = docs[i], j
            pk_real[r, s : s + lengths[i]] = True
            s += lengths[i]
        pk_doc[r, s:] = len(idx)
    model = Stack()

    def loss_of(logits, tokens, pair):  # pair [B, L - 1]: token t predicts t + 1 of its document
        tgt = tokens[:, 1:].masked_fill(~pair, -100)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tgt.flatten(), ignore_index=-100)

    pad_pair = pad_mask[:, 1:].bool()
    pk_pair = pk_real[:, 1:] & (pk_doc[:, 1:] == pk_doc[:, :-1])

    def padded():
        model.zero_grad(set_to_none=True)
        loss = loss_of(model(pad_tok, attention_mask=pad_mask), pad_tok, pad_pair)
        loss.backward()
        return loss

    def packed():
        model.zero_grad(set_to_none=True)
        loss = loss_of(model(pk_tok, document_ids=pk_doc), pk_tok, pk_pair)
        loss.backward()
        return loss

    # the same documents, the same logits: check one document's logits both ways
    with torch.no_grad():
        lp = model(pad_tok, attention_mask=pad_mask)
        lk = model(pk_tok, document_ids=pk_doc)
        r, i = 0, rows[0][1] if len(rows[0]) > 1 else rows[0][0]
        s = sum(lengths[j] for j in rows[0][: rows[0].index(i)])
        diff = (lp[i, : lengths[i]] - lk[r, s : s + lengths[i]]).abs().max().item()
    t = medians({"padded": padded, "packed": packed}, repeats=args.repeats, warmup=1)
    print(f"\n4. {n_docs} documents ({real:,} tokens, lengths {min(lengths)}-{max(lengths)}, median "
          f"{sorted(lengths)[n_docs // 2]}), 2 blocks dim 64 rope, forward + backward, median of "
          f"{args.repeats}")
    _row("layout", "slots", "ms", "real tok/s", "speed-up")
    _row(f"padded: {n_docs} rows x {Lp}, attention_mask", f"{n_docs * Lp:,}", f"{t['padded'] * 1e3:.0f}",
         f"{real / t['padded']:,.0f}", "1.00x")
    _row(f"packed: {len(rows)} rows x {row}, document_ids", f"{len(rows) * row:,}",
         f"{t['packed'] * 1e3:.0f}", f"{real / t['packed']:,.0f}", f"{t['padded'] / t['packed']:.2f}x")
    print(f"   one document's logits, padded vs packed: max |diff| {diff:.1e}")


# ---- 5. peak memory of one packed, windowed call -----------------------------------------


class Largest(TorchDispatchMode):
    """Records the largest tensor any torch op returns while active (bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes, self.shape = 0, ()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > self.bytes:
                self.bytes, self.shape = t.numel() * t.element_size(), tuple(t.shape)
        return out


def _largest_in_mask(fn) -> tuple[int, tuple]:
    """The largest tensor made while ``attend`` builds its visibility rule (``dense_visibility``
    for sdpa/math, ``block_visibility``, the ``BlockMask``, for flex): run ``fn`` with both
    wrapped in :class:`Largest` (the compiled flex kernel itself cannot run under a dispatch
    mode; it allocates only its output and log-sum-exp)."""
    import posenc.backends as A

    rec = Largest()
    saved = A.dense_visibility, A.block_visibility

    def wrap(f):
        def inner(*a, **kw):
            with rec:
                return f(*a, **kw)
        return inner

    A.dense_visibility, A.block_visibility = wrap(saved[0]), wrap(saved[1])
    try:
        fn()
    finally:
        A.dense_visibility, A.block_visibility = saved
    return rec.bytes, rec.shape


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: the figures may miss reused memory
        return None


def peak_extra_bytes(fn) -> int:
    """Peak resident memory during ``fn()`` above what was resident before it (Linux only).
    glibc first hands every free page back to the system (``malloc_trim``), so memory the call
    reuses from earlier frees is counted too."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    fn()
    return _status("VmHWM") - before


def memory_table(args) -> None:
    libc = _libc()
    if libc is not None:  # allocations over 64 KiB get their own mapping, returned on free
        libc.mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 64 << 10)  # M_TRIM_THRESHOLD
    L, H, Dh, W, n_docs = 4096, 8, 64, 256, 8
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, H, L, Dh).unbind(0)
    cuts = sorted(random.Random(1).sample(range(1, L), n_docs - 1))
    doc = torch.zeros(1, L, dtype=torch.long)
    for c in cuts:
        doc[0, c:] += 1
    scheme = make_scheme("rope", dim=H * Dh, num_heads=H)
    run = {b: (lambda b=b: attend(q, k, v, scheme, document_ids=doc, window=W, backend=b))
           for b in ("sdpa", "flex")}
    with torch.no_grad():
        secs = _compile_seconds(run["flex"])
        diff = (run["flex"]() - run["sdpa"]()).abs().max().item()
        t = medians(run, repeats=max(3, args.repeats // 3), warmup=1)
        mem = {b: peak_extra_bytes(fn) for b, fn in run.items()}
        big = {b: _largest_in_mask(fn) for b, fn in run.items()}
    print(f"\n5. one attend, L = {L}, {n_docs} packed documents, window={W}, rope, H={H}, Dh={Dh}, "
          f"forward, no_grad")
    _row("backend", "ms", "peak MiB", "mask MiB", "  largest mask tensor")
    for b in run:
        shape = str(list(big[b][1]))
        _row(b, f"{t[b] * 1e3:.0f}", f"{mem[b] / 2**20:.1f}", f"{big[b][0] / 2**20:.2f}", f"  {shape}")
    out_mib = q.numel() * 4 / 2**20
    print(f"   output {out_mib:.0f} MiB; an [L, L] bool is {L * L / 2**20:.0f} MiB, int64 "
          f"{L * L * 8 / 2**20:.0f} MiB; flex compile {secs:.1f} s; max |flex - sdpa| {diff:.1e}; "
          f"flex built an L x L tensor: {big['flex'][0] >= L * L}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    args = ap.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("peak memory is read from /proc: run this on Linux")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    t0 = time.perf_counter()
    tables = {"compile": compile_table, "train": train_table, "decode": decode_table,
              "pack": pack_table, "memory": memory_table}
    for name in args.only:
        if name == "memory" and len(args.only) > 1:  # a fresh process: nothing left by the others
            cmd = [sys.executable, __file__, "--only", "memory", "--repeats", str(args.repeats),
                   "--threads", str(args.threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            print("\n".join(line for line in out.splitlines()
                            if not line.startswith(("torch ", "total "))).rstrip())
        else:
            tables[name](args)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
