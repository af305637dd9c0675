"""apply_rope vs the memory bound and its peers, every mode, as ratios from one run.

    python benchmarks/rope.py [--repeats 30] [--threads 2] [--compile]

Shape [1, 32, 2048, 128] (x) on ``--threads`` threads (torch.set_num_threads); every table's
columns are timed round-robin in the same run, medians kept. Peers, written out here:
  copy      x.clone(): reads and writes the tensor once, the memory bound (the unit);
  textbook  angles recomputed every call, torch.stack / flatten over interleaved pairs
            (the style of the source article and many tutorials);
  hf        Hugging Face Llama: q * cos + rotate_half(q) * sin, plain autograd
            (transformers' apply_rotary_pos_emb; its rotary module computes cos/sin per call);
  meta      Meta's LLaMA apply_rotary_emb: view_as_complex of the float32 pairs times
            freqs_cis, view_as_real, cast back (type_as);
  posenc    posenc.apply_rope / posenc.RotaryEmbedding;
  compiled  torch.compile(posenc.apply_rope), with --compile (slow to build on a CPU).
Tables: forward float32; forward + backward float32 (y.backward(g) with a fixed g); forward
bfloat16 (with the max error against float64 math); decode, q and k [1, 32, 1, 128] at
offset 1000, microseconds per call.
"""

from __future__ import annotations

import argparse
import os

import torch
from _timing import medians

from posenc import RotaryEmbedding, apply_rope, rope_cos_sin, rope_inv_freq, rotate_half

L, D = 2048, 128


def textbook_rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    L, d = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)  # [d/2]
    angles = torch.arange(L, dtype=torch.float32)[:, None] * inv_freq  # [L, d/2]
    sin, cos = angles.sin(), angles.cos()
    x1, x2 = x[..., 0::2], x[..., 1::2]  # [B, H, L, d/2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


def hf_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one tensor (cos/sin already [.., L, D])."""
    return x * cos + rotate_half(x) * sin


def hf_cos_sin(inv_freq, position_ids, dtype):
    """LlamaRotaryEmbedding.forward: float32 outer product per call, cat, cos/sin, cast."""
    inv = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)  # [B, D/2, 1]
    freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)  # [B, L, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def hf_decode(q, k, inv_freq, position_ids):
    cos, sin = hf_cos_sin(inv_freq, position_ids, q.dtype)
    cos, sin = cos[:, None], sin[:, None]  # unsqueeze_dim=1
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def meta_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Meta's apply_rotary_emb for x [B, H, L, D] (their layout is [B, L, H, D]; same math)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis).flatten(-2).type_as(x)


def meta_decode(q, k, freqs_cis, start):
    f = freqs_cis[start : start + q.shape[-2]]
    return meta_rope(q, f), meta_rope(k, f)


def fwd_bwd(fn, x, g):
    def run():
        x.grad = None
        fn(x).backward(g)

    return run


def table(title, t, unit, rows, fmt="{:8.2f} ms", scale=1e3):
    print(f"\n{title}")
    for name, sec in t.items():
        r = f"  {sec / t[unit]:6.2f}x {unit}" if unit else ""
        print(f"  {name:26s} " + fmt.format(sec * scale) + r)
    for name, r, target in rows:
        suffix = " us" if target.endswith("us") else "x"
        print(f"  -> {name:30s} {r:6.2f}{suffix}   target {target}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="add torch.compile(apply_rope)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, x [1, 32, {L}, {D}], "
          f"median of {args.repeats}, load average {load:.2f}")  # fmt: skip
    x = torch.randn(1, 32, L, D)
    inv_freq, _ = rope_inv_freq(D)
    pos = torch.arange(L)
    ci, si = rope_cos_sin(pos, inv_freq, interleaved=True)  # [L, D]
    ch, sh = rope_cos_sin(pos, inv_freq, interleaved=False)
    freqs_cis = torch.polar(torch.ones(L, D // 2), torch.outer(pos.float(), inv_freq))  # [L, D/2]
    torch.testing.assert_close(apply_rope(x, ci, si, interleaved=True), textbook_rope(x))
    torch.testing.assert_close(apply_rope(x, ch, sh, interleaved=False), hf_rope(x, ch, sh))
    torch.testing.assert_close(apply_rope(x, ci, si), meta_rope(x, freqs_cis))
    compiled = torch.compile(apply_rope, dynamic=False) if args.compile else None

    # 1. forward, float32
    fns = {
        "copy": lambda: x.clone(),
        "posenc interleaved": lambda: apply_rope(x, ci, si, interleaved=True),
        "posenc half": lambda: apply_rope(x, ch, sh, interleaved=False),
        "textbook": lambda: textbook_rope(x),
        "hf (cat, half)": lambda: hf_rope(x, ch, sh),
        "meta (complex)": lambda: meta_rope(x, freqs_cis),
    }
    t = medians(fns, repeats=args.repeats)
    table("forward, float32", t, "copy", [
        ("posenc interleaved / copy", t["posenc interleaved"] / t["copy"], "<= 1.5"),
        ("posenc half / copy", t["posenc half"] / t["copy"], "<= 2.5"),
        ("textbook / posenc interleaved", t["textbook"] / t["posenc interleaved"], ">= 2.5"),
        ("hf / posenc half", t["hf (cat, half)"] / t["posenc half"], "> 1"),
    ])  # fmt: skip

    # 2. forward + backward, float32
    xg = x.clone().requires_grad_()
    g = torch.randn_like(x)
    ref = {}
    for name, fn in (("hf", lambda z: hf_rope(z, ch, sh)),
                     ("posenc", lambda z: apply_rope(z, ch, sh, interleaved=False))):  # fmt: skip
        fwd_bwd(fn, xg, g)()
        ref[name] = xg.grad.clone()
    torch.testing.assert_close(ref["posenc"], ref["hf"])
    fns = {
        "copy (forward only)": lambda: x.clone(),
        "hf half": fwd_bwd(lambda z: hf_rope(z, ch, sh), xg, g),
        "posenc half": fwd_bwd(lambda z: apply_rope(z, ch, sh, interleaved=False), xg, g),
        "meta interleaved": fwd_bwd(lambda z: meta_rope(z, freqs_cis), xg, g),
        "posenc interleaved": fwd_bwd(lambda z: apply_rope(z, ci, si), xg, g),
    }
    if compiled is not None:
        fns["compiled half"] = fwd_bwd(lambda z: compiled(z, ch, sh, interleaved=False), xg, g)
    t = medians(fns, repeats=args.repeats)
    rows = [
        ("posenc half / hf half", t["posenc half"] / t["hf half"], "<= 0.5"),
        ("posenc inter. / meta", t["posenc interleaved"] / t["meta interleaved"], "(none)"),
    ]
    table("forward + backward, float32", t, "copy (forward only)", rows)

    # 3. forward, bfloat16, interleaved
    xb = x.to(torch.bfloat16)
    exact = apply_rope(xb.double(), ci.double(), si.double())
    cib, sib = ci.to(torch.bfloat16), si.to(torch.bfloat16)
    fns = {
        "copy": lambda: xb.clone(),
        "meta (complex, fp32 math)": lambda: meta_rope(xb, freqs_cis),
        "posenc (fp32 math)": lambda: apply_rope(xb, ci, si),
        "bf16 math (cos/sin bf16)": lambda: xb * cib + rotate_half(xb) * sib,  # error only
    }
    outs = {
        "meta (complex, fp32 math)": meta_rope(xb, freqs_cis),
        "posenc (fp32 math)": apply_rope(xb, ci, si),
        "bf16 math (cos/sin bf16)": apply_rope(xb.double(), cib.double(), sib.double()).bfloat16(),
    }
    # the last is what rotating in bf16 gives at best: cos/sin rounded to bf16 (HF's cast)
    t = medians(fns, repeats=args.repeats)
    table("forward, bfloat16, interleaved", t, "copy", [
        ("posenc / meta", t["posenc (fp32 math)"] / t["meta (complex, fp32 math)"], "<= 1"),
    ])  # fmt: skip
    for name, y in outs.items():
        err = (y.double() - exact).abs().max().item()
        print(f"     max |error| vs float64 math, {name:26s} {err:.3e}")

    # 4. decode: q and k [1, 32, 1, 128] at offset 1000
    q1, k1 = torch.randn(2, 1, 32, 1, D).unbind(0)
    start = 1000
    rot_i, rot_h = RotaryEmbedding(D), RotaryEmbedding(D, interleaved=False)
    rot_i(q1, k1, offset=start + 8), rot_h(q1, k1, offset=start + 8)  # tables built
    pid = torch.tensor([[start]])
    torch.testing.assert_close(rot_h(q1, k1, offset=start), hf_decode(q1, k1, inv_freq, pid))
    torch.testing.assert_close(rot_i(q1, k1, offset=start), meta_decode(q1, k1, freqs_cis, start))
    with torch.inference_mode():
        t = medians({
            "hf (half)": lambda: hf_decode(q1, k1, inv_freq, pid),
            "meta (interleaved)": lambda: meta_decode(q1, k1, freqs_cis, start),
            "posenc interleaved": lambda: rot_i(q1, k1, offset=start),
            "posenc half": lambda: rot_h(q1, k1, offset=start),
        }, repeats=max(args.repeats, 200), warmup=20)  # fmt: skip
    table("decode, q and k [1, 32, 1, 128] at offset 1000 (inference_mode)", t, None, [
        ("posenc interleaved", t["posenc interleaved"] * 1e6, "<= 60 us"),
        ("posenc half", t["posenc half"] * 1e6, "<= 60 us"),
        ("posenc interleaved / meta", t["posenc interleaved"] / t["meta (interleaved)"], "(none)"),
    ], fmt="{:8.1f} us", scale=1e6)  # fmt: skip


if __name__ == "__main__":
    main()
