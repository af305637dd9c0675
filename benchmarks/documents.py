"""Packed documents through ``attend(document_ids=)`` and ``MultiHeadAttention(document_ids=)``
against plain causal attention (issue 33: the grouped path).

    python benchmarks/documents.py [--len 4096] [--docs 8] [--heads 8] [--head-dim 64]
                                   [--repeats 10] [--threads 1] [--backward]

One row of ``--len`` tokens split into ``--docs`` uneven documents (``varlen.doc_lengths``,
seeded), float32, forward only (``--backward``: forward + backward), for RoPE and ALiBi.
Timed round-robin in one run (medians, ``_timing.medians``), each as "x causal" (time over
plain causal ``attend`` on the whole row, no documents: the issue's yardstick):

- ``attend docs``: ``posenc.attend(..., document_ids=ids)``: since issue 33 the grouped path
  (one SDPA call per distinct document length, as ``attend_varlen``);
- ``dense``: the same documents through the dense ``[B, 1, L, L]`` mask, forced by an all-real
  ``attention_mask`` (what ``attend(document_ids=)`` ran before issue 33);
- ``varlen``: ``posenc.varlen.attend_varlen`` on ``[total, H, D]`` with ``cu_seqlens``;
- ``MHA docs``: ``MultiHeadAttention(dim=H*Dh, H, scheme)`` with ``document_ids``, over the
  same layer without documents (``MHA causal``).

The outputs of ``attend docs``, ``dense`` and ``varlen`` are checked equal before timing.
"""

from __future__ import annotations

import argparse

import torch
from _timing import medians
from varlen import doc_lengths

from posenc import MultiHeadAttention, attend, cu_seqlens, document_ids_from_lengths
from posenc.schemes import make_scheme
from posenc.varlen import attend_varlen


def calls(L: int, H: int, D: int, name: str, lens: list[int], grad: bool) -> dict:
    """The columns, each a call returning a tensor."""
    torch.manual_seed(0)
    scheme = make_scheme(name, dim=H * D, num_heads=H)
    q, k, v = (torch.randn(1, H, L, D, requires_grad=grad) for _ in range(3))
    ids = document_ids_from_lengths(lens)[None]  # [1, L]
    cu, max_len = cu_seqlens(ids[0])
    real = torch.ones(1, L, dtype=torch.bool)
    flat = [t[0].transpose(0, 1) for t in (q, k, v)]  # [L, H, D]
    layer = MultiHeadAttention(H * D, H, scheme=name)
    x = torch.randn(1, L, H * D, requires_grad=grad)
    return {
        "causal": lambda: attend(q, k, v, scheme),
        "attend docs": lambda: attend(q, k, v, scheme, document_ids=ids),
        "dense": lambda: attend(q, k, v, scheme, document_ids=ids, attention_mask=real),
        "varlen": lambda: attend_varlen(*flat, scheme, cu_seqlens=cu, max_seqlen=max_len)
        .transpose(0, 1)[None],
        "MHA causal": lambda: layer(x),
        "MHA docs": lambda: layer(x, document_ids=ids),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--len", type=int, default=4096)
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backward", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    L, H, D = args.len, args.heads, args.head_dim
    lens = doc_lengths(L, args.docs)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); L = {L}, "
          f"{args.docs} documents (lengths {min(lens)}..{max(lens)}), H={H}, Dh={D}, float32, "
          f"{'forward + backward' if args.backward else 'forward'}, median of {args.repeats}")
    print(f"{'scheme':>6} {'causal ms':>10} {'attend docs':>12} {'dense':>8} {'varlen':>8} "
          f"{'MHA causal ms':>14} {'MHA docs':>9}")
    for name in ("rope", "alibi"):
        fns = calls(L, H, D, name, lens, args.backward)
        with torch.no_grad():
            ref = fns["attend docs"]()
            torch.testing.assert_close(fns["dense"](), ref)
            torch.testing.assert_close(fns["varlen"](), ref)
        if args.backward:
            fns = {n: (lambda f=f: f().sum().backward()) for n, f in fns.items()}
        with torch.set_grad_enabled(args.backward):
            t = medians(fns, repeats=args.repeats, warmup=1)
        c, m = t["causal"], t["MHA causal"]
        print(f"{name:>6} {c * 1e3:>10.1f} {t['attend docs'] / c:>11.2f}x "
              f"{t['dense'] / c:>7.2f}x {t['varlen'] / c:>7.2f}x {m * 1e3:>14.1f} "
              f"{t['MHA docs'] / m:>8.2f}x")


if __name__ == "__main__":
    main()
