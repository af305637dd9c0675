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

Large positions (issue 26): the angles are reduced mod 2 pi before they are rounded to float32
(posenc.rope_angles), so the rotation has no drift at any position below 2**31. Two more tables:
  angles    cos/sin of L positions: posenc's exact angles (rope_cos_sin's; float64 reduction,
            float32 products below 512) over the plain float32 product
            positions[:, None].float() * inv_freq + cos/sin (what transformers computes per call);
  rotate    RotaryEmbedding(q, k, offset=...) (half layout, its cached tables: from 0 up to
            TABLE_MAX, a window of 4096 positions past it) over a hand-written float32 rotation
            (float32 angles + cos/sin per call, q * cos + rotate_half(q) * sin), at decode
            (L = 1) and prefill (L = 2048), near 0 and at 10**6, and over the same module with
            exact_angles=False (float32 products in the same tables: the cost of exactness);
            with --compile also under torch.compile(fullgraph=True) (the angles are then formed
            in the graph on each call).
"""

from __future__ import annotations

import argparse
import os

import torch
from _timing import medians

from posenc import RotaryEmbedding, apply_rope, rope_cos_sin, rope_inv_freq, rotate_half
from posenc.rope_angles import cos_sin_unchecked

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
    width = max(26, *(len(name) for name in t))
    for name, sec in t.items():
        r = f"  {sec / t[unit]:6.2f}x {unit}" if unit else ""
        print(f"  {name:{width}s} " + fmt.format(sec * scale) + r)
    width = max(30, *(len(name) for name, _, _ in rows))
    for name, r, target in rows:
        suffix = " us" if target.endswith("us") else "x"
        print(f"  -> {name:{width}s} {r:6.2f}{suffix}   target {target}")


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
    # the peers form float32 angles, off by up to position * 2**-24 rad (1.2e-4 at 2047);
    # posenc's are exact (reduced mod 2 pi first, rope_angles): equal up to that drift
    drift = {"atol": 1e-3, "rtol": 0}
    torch.testing.assert_close(apply_rope(x, ci, si, interleaved=True), textbook_rope(x), **drift)
    torch.testing.assert_close(apply_rope(x, ch, sh, interleaved=False), hf_rope(x, ch, sh))
    torch.testing.assert_close(apply_rope(x, ci, si), meta_rope(x, freqs_cis), **drift)
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
    torch.testing.assert_close(rot_h(q1, k1, offset=start), hf_decode(q1, k1, inv_freq, pid), **drift)
    torch.testing.assert_close(rot_i(q1, k1, offset=start), meta_decode(q1, k1, freqs_cis, start), **drift)
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

    large_positions(args, inv_freq)


def plain_cos_sin(pos, inv_freq):
    """The float32 product of positions and frequencies, half layout, cos/sin (transformers)."""
    a = pos.float()[:, None] * inv_freq  # [L, D/2]
    a = torch.cat([a, a], dim=-1)
    return a.cos(), a.sin()


def hand_rotate(q, k, pos, inv_freq):
    """A hand-written float32 rotation: angles and cos/sin per call, then the half-layout turn."""
    c, s = plain_cos_sin(pos, inv_freq)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def angles_case(L_, start, inv_freq, repeats) -> dict[str, float]:
    """cos/sin of positions start .. start + L_ - 1: the plain float32 product, posenc's exact
    angles (rope_angles + cos/sin, no checks) and rope_cos_sin (which also checks its input)."""
    pos = torch.arange(start, start + L_)
    want = rope_cos_sin(pos, inv_freq, interleaved=False)
    torch.testing.assert_close(want, plain_cos_sin(pos, inv_freq), atol=0.05, rtol=0)  # drift
    bounds = {"max_position": start + L_ - 1, "min_position": start}
    with torch.inference_mode():
        return medians({
            "plain float32": lambda: plain_cos_sin(pos, inv_freq),
            "posenc exact": lambda: cos_sin_unchecked(pos, inv_freq, interleaved=False, **bounds),
            "rope_cos_sin": lambda: rope_cos_sin(pos, inv_freq, interleaved=False),
        }, repeats=repeats)  # fmt: skip


def rotate_case(L_, start, rot, rot32, compiled, inv_freq, repeats) -> dict[str, float]:
    """Medians for q and k [1, 32, L_, 128] at positions start ..: each pair of peers timed
    round-robin on its own (the call after a peer that allocates more pays for it)."""
    q, k = torch.randn(2, 1, 32, L_, D).unbind(0)
    pos = torch.arange(start, start + L_)
    with torch.inference_mode():
        ours = rot(q, k, offset=start)  # tables built (a window past TABLE_MAX)
        rot32(q, k, offset=start)
        torch.testing.assert_close(ours, hand_rotate(q, k, pos, inv_freq), atol=0.5, rtol=0)
        groups = [
            {"hand-written float32": lambda: hand_rotate(q, k, pos, inv_freq),
             "posenc": lambda: rot(q, k, offset=start)},
            {"posenc exact angles": lambda: rot(q, k, offset=start),
             "posenc float32 angles": lambda: rot32(q, k, offset=start)},
        ]  # fmt: skip
        if compiled:
            chand, cexact, cf32 = compiled["hand"], compiled["posenc"], compiled["posenc float32 angles"]
            groups.append({"compiled hand-written": lambda: chand(q, k, pos, inv_freq),
                           "compiled posenc": lambda: cexact(q, k, positions=pos)})  # fmt: skip
            groups.append({"compiled exact angles": lambda: cexact(q, k, positions=pos),
                           "compiled float32 angles": lambda: cf32(q, k, positions=pos)})  # fmt: skip
        t: dict[str, float] = {}
        for fns in groups:
            t.update(medians(fns, repeats=repeats, warmup=20))
    return t


def large_positions(args, inv_freq) -> None:
    """5. angle formation, exact vs plain float32; 6. RotaryEmbedding vs hand-written rotation."""
    rows, t_all = [], {}
    for L_, start in ((1, 10**6), (2048, 0), (2048, 10**6)):
        t = angles_case(L_, start, inv_freq, max(args.repeats, 300) if L_ == 1 else args.repeats)
        key = f"L={L_} from {start}"
        t_all.update({f"{name}, {key}": sec for name, sec in t.items()})
        rows.append((f"exact / plain, {key}", t["posenc exact"] / t["plain float32"], "(none)"))
        rows.append((f"rope_cos_sin / plain, {key}", t["rope_cos_sin"] / t["plain float32"], "(none)"))
    table("angles: cos/sin of L positions, [L, 128]", t_all, None, rows, fmt="{:8.1f} us", scale=1e6)

    rot = RotaryEmbedding(D, interleaved=False)
    rot32 = RotaryEmbedding(D, interleaved=False, exact_angles=False)  # float32 products, as before
    compiled = {}
    if args.compile:
        compiled["posenc"] = torch.compile(rot, fullgraph=True, dynamic=False)
        compiled["posenc float32 angles"] = torch.compile(rot32, fullgraph=True, dynamic=False)
        compiled["hand"] = torch.compile(hand_rotate, fullgraph=True, dynamic=False)
    rows, t_all = [], {}
    for L_, start in ((1, 1000), (1, 10**6), (2048, 0), (2048, 10**6)):
        repeats = max(args.repeats, 500) if L_ == 1 else args.repeats
        t = rotate_case(L_, start, rot, rot32, compiled, inv_freq, repeats)
        key = f"{'decode' if L_ == 1 else 'prefill'} L={L_} at {start}"
        t_all.update({f"{name}, {key}": sec for name, sec in t.items()})
        rows.append((f"posenc / hand, {key}", t["posenc"] / t["hand-written float32"], "<= 1"))
        rows.append((f"exact / float32 angles, {key}",
                     t["posenc exact angles"] / t["posenc float32 angles"], "~ 1"))  # fmt: skip
        if compiled:
            rows.append((f"compiled posenc / hand, {key}",
                         t["compiled posenc"] / t["compiled hand-written"], "(none)"))  # fmt: skip
            rows.append((f"compiled exact / float32 angles, {key}",
                         t["compiled exact angles"] / t["compiled float32 angles"], "~ 1"))  # fmt: skip
    table("rotate: q and k [1, 32, L, 128], half layout (inference_mode)", t_all, None, rows,
          fmt="{:10.1f} us", scale=1e6)  # fmt: skip


if __name__ == "__main__":
    main()
