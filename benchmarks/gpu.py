"""GPU benchmarks: RoPE bandwidth as a fraction of the device's peak; ALiBi via Flex vs SDPA.

    python benchmarks/gpu.py [--peak-gbs 4800] [--repeats 50] [--tiny]

RoPE: ``posenc.apply_rope`` on ``[B, H, L, Dh]`` (default ``[1, 32, 4096, 128]``), interleaved
and half layout, float32 and bfloat16, forward and backward (the backward alone, through a
retained graph). Bytes moved = read ``x`` + write the output + read ``cos`` and ``sin``
(backward: the same with the incoming gradient); GB/s = bytes / median time; "of peak" divides
by the device's memory bandwidth, taken from the table below by device name or from
``--peak-gbs``. Memory-bound code should reach a large fraction of it.

ALiBi: causal attention, ``[1, H, L, 64]`` bfloat16, forward, ``posenc.attend`` with
``backend="flex"`` (``alibi_score_mod``, compiled once per shape) and with the default SDPA
backend (the scheme's cached 4-D mask), against SDPA given a precomputed ``[1, H, L, L]`` mask.

Times are CUDA-event medians taken round-robin in one run. Without a GPU the script prints a
"no GPU: ..." line and exits 0, so it runs unchanged everywhere.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _timing import medians

from posenc import ALiBi, apply_rope, attend, rope_cos_sin, rope_inv_freq

PEAK_GBS = [  # (substring of torch.cuda.get_device_name(), peak memory bandwidth in GB/s)
    ("H200", 4800.0),
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),  # SXM
    ("A100 80GB", 2000.0),
    ("A100-SXM4-80GB", 2000.0),
    ("A100", 1560.0),  # 40GB
    ("L40", 864.0),  # L40 and L40S, not the L4
    ("L4", 300.0),
    ("T4", 320.0),
    ("RTX 4090", 1000.0),
]


def peak_gbs(name: str) -> float | None:
    """The table's peak bandwidth for a device name, or None when the device is not listed."""
    for key, gbs in PEAK_GBS:
        if key in name:
            return gbs
    return None


def cuda_seconds(fn) -> float:
    """One call's seconds, measured with CUDA events (``timer`` of ``_timing.medians``)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def rope_rows(shape: tuple[int, ...], repeats: int, peak: float | None) -> list[tuple]:
    B, H, L, D = shape
    dev = torch.device("cuda")
    inv_freq, _ = rope_inv_freq(D)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for interleaved in (True, False):
            cos, sin = rope_cos_sin(
                torch.arange(L, device=dev), inv_freq.to(dev), interleaved=interleaved, dtype=dtype
            )  # [L, D]
            x = torch.randn(B, H, L, D, device=dev, dtype=dtype, requires_grad=True)
            g = torch.randn_like(x)
            y = apply_rope(x, cos, sin, interleaved=interleaved)

            def fwd(x=x, cos=cos, sin=sin, interleaved=interleaved):
                with torch.no_grad():
                    apply_rope(x, cos, sin, interleaved=interleaved)

            def bwd(y=y, x=x, g=g):
                torch.autograd.grad(y, x, g, retain_graph=True)

            t = medians({"forward": fwd, "backward": bwd}, repeats, timer=cuda_seconds)
            moved = 2 * x.numel() * x.element_size() + 2 * cos.numel() * cos.element_size()
            layout = "interleaved" if interleaved else "half"
            for pas in ("forward", "backward"):
                gbs = moved / t[pas] / 1e9
                frac = f"{gbs / peak:.0%}" if peak else "-"
                rows.append((f"RoPE {layout} {str(dtype)[6:]} {pas}", t[pas] * 1e3, gbs, frac))
            del x, g, y
    return rows


def alibi_rows(lens: list[int], heads: int, repeats: int) -> list[tuple]:
    dev, dtype = torch.device("cuda"), torch.bfloat16
    scheme = ALiBi(heads).to(dev)
    rows = []
    for L in lens:
        q, k, v = torch.randn(3, 1, heads, L, 64, device=dev, dtype=dtype).unbind(0)
        mask = scheme.attn_mask(L, L, dtype=dtype, device=dev).clone()  # [1, H, L, L]
        fns = {
            "SDPA + 4-D mask": lambda q=q, k=k, v=v, m=mask: F.scaled_dot_product_attention(
                q, k, v, attn_mask=m
            ),
            "posenc.attend sdpa": lambda q=q, k=k, v=v: attend(q, k, v, scheme),
            "posenc.attend flex": lambda q=q, k=k, v=v: attend(q, k, v, scheme, backend="flex"),
        }
        with torch.no_grad():
            ref = fns["SDPA + 4-D mask"]().float()
            torch.testing.assert_close(fns["posenc.attend flex"]().float(), ref, atol=2e-2, rtol=2e-2)
            t = medians(fns, repeats, timer=cuda_seconds)
        base = t["SDPA + 4-D mask"]
        for name, sec in t.items():
            rows.append((f"ALiBi L={L} {name}", sec * 1e3, None, f"{sec / base:.2f}x SDPA"))
        del q, k, v, mask
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peak-gbs", type=float, default=None, help="device peak bandwidth, GB/s")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--rope-shape", type=int, nargs=4, default=[1, 32, 4096, 128])
    ap.add_argument("--lens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--tiny", action="store_true", help="small sizes: a smoke test")
    args = ap.parse_args()
    if args.tiny:
        args.rope_shape, args.lens, args.repeats = [1, 2, 256, 64], [256], 3
    if not torch.cuda.is_available():
        print(f"no GPU: torch {torch.__version__} sees no CUDA device; nothing measured "
              "(run this on a machine with an NVIDIA GPU)")
        return
    name = torch.cuda.get_device_name()
    peak = args.peak_gbs if args.peak_gbs is not None else peak_gbs(name)
    torch.manual_seed(0)
    rows = rope_rows(tuple(args.rope_shape), args.repeats, peak)
    rows += alibi_rows(args.lens, args.heads, args.repeats)
    source = "--peak-gbs" if args.peak_gbs is not None else "table"
    print(f"{name}, torch {torch.__version__}, peak "
          f"{f'{peak:,.0f} GB/s ({source})' if peak else 'unknown (pass --peak-gbs)'}; "
          f"RoPE {list(args.rope_shape)}, CUDA-event medians of {args.repeats}")
    print(f"{'what':<42} {'ms':>9} {'GB/s':>9} {'of peak / ratio':>16}")
    for what, ms, gbs, note in rows:
        print(f"{what:<42} {ms:>9.3f} {'' if gbs is None else f'{gbs:,.0f}':>9} {note:>16}")


if __name__ == "__main__":
    main()
