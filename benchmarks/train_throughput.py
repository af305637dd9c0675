"""Training throughput per position scheme: the same model, only the scheme changes.

    python benchmarks/train_throughput.py [--steps 5] [--repeats 5] [--threads 1]

The model is chapter 6's default (``posenc.lab.TrainConfig()``: dim 64, 2 layers, 4 heads,
batch 32 x 64 bytes). One "call" is ``--steps`` full training steps (forward, backward, clip,
AdamW) on random bytes; calls are timed round-robin over the schemes and the median is kept,
so the ratios come from one run and share the machine's noise. It also times evaluation
(forward only, no_grad) at 16x the training length, where the [H, L, L] bias of ALiBi and T5 is
largest. Columns: position parameters, training tokens per second, training time relative to
NoPE, evaluation tokens per second at the long length, relative to NoPE.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
import torch.nn.functional as F
from _timing import medians

from posenc.lab.config import TrainConfig
from posenc.lab.experiment import DEFAULT_SCHEMES
from posenc.lab.train import build_model, make_optimizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="training steps per timed call")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1, as posenc.lab trains)")
    ap.add_argument("--eval-factor", type=int, default=16, help="evaluation length / train length")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = TrainConfig()
    B, L = base.batch_size, base.train_len
    Le = args.eval_factor * L
    Be = max(1, 8192 // Le)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (B, L), generator=gen)
    y = torch.randint(0, 256, (B, L), generator=gen)
    xe = torch.randint(0, 256, (Be, Le), generator=gen)

    train_fns, eval_fns, pos_params = {}, {}, {}
    for scheme in DEFAULT_SCHEMES:
        cfg = replace(base, scheme=scheme)
        model = build_model(cfg)
        opt = make_optimizer(model, cfg)
        pos_params[scheme] = sum(p.numel() for p in model.scheme.parameters())

        def train(model=model, opt=opt):
            for _ in range(args.steps):
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()

        @torch.no_grad()
        def evaluate(model=model):
            model(xe)

        train_fns[scheme], eval_fns[scheme] = train, evaluate

    t_train = medians(train_fns, repeats=args.repeats, warmup=1)
    t_eval = medians(eval_fns, repeats=args.repeats, warmup=1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, dim {base.dim}, "
          f"{base.num_layers} layers, {base.num_heads} heads; train batch {B} x {L}, "
          f"eval batch {Be} x {Le}; median of {args.repeats}")
    print(f"{'scheme':<11}{'pos. params':>12}{'train tok/s':>13}{'x NoPE':>8}"
          f"{'eval tok/s @' + str(Le):>18}{'x NoPE':>8}")
    for s in DEFAULT_SCHEMES:
        tr = args.steps * B * L / t_train[s]
        ev = Be * Le / t_eval[s]
        print(f"{s:<11}{pos_params[s]:>12,}{tr:>13,.0f}{t_train[s] / t_train['nope']:>8.2f}"
              f"{ev:>18,.0f}{t_eval[s] / t_eval['nope']:>8.2f}")


if __name__ == "__main__":
    main()
