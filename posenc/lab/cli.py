"""Command line: ``python -m posenc extrapolate`` (train short, test long) and
``python -m posenc explain CONFIG`` (a model's RoPE, pair by pair: ``posenc.explain``).

    python -m posenc extrapolate                      # the chapter's defaults
    python -m posenc extrapolate --schemes rope,alibi --steps 300 --out results.json
    python -m posenc extrapolate --full --device cuda # 3 seeds, larger models (mean +- sd)

Prints a table (schemes x evaluation lengths, nats per byte) and optionally writes JSON and a
figure. Bad arguments give a one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from ..explain import explain
from ..schemes import SCHEMES

FULL_SEEDS = (0, 1, 2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block, status 2
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def _int_list(minimum: int):
    def parse(text: str) -> list[int]:
        items = [t for t in text.replace(",", " ").split() if t]
        if not items:
            raise argparse.ArgumentTypeError(f"must list at least one integer, got {text!r}")
        return [_int(t, minimum) for t in items]

    return parse


def _schemes(text: str) -> list[str]:
    items = [t for t in text.replace(",", " ").split() if t]
    if not items:
        raise argparse.ArgumentTypeError("must name at least one scheme")
    for t in items:
        if t not in SCHEMES:
            raise argparse.ArgumentTypeError(f"unknown scheme {t!r}; allowed: {', '.join(SCHEMES)}")
    return list(dict.fromkeys(items))


def _device(text: str) -> str:
    import torch

    if text == "auto":
        return text
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; try auto, cpu, cuda or mps") from None
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available(),
    }
    if not available.get(device.type, False):
        raise argparse.ArgumentTypeError(f"device {text!r} is not available here")
    return text


def _prog() -> str:
    """``python -m posenc`` when run as a module, else the name the script was called by."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m posenc" if name in ("", "__main__.py", "-c", "-m") else name


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from .config import TrainConfig
    from .experiment import DEFAULT_FACTORS, DEFAULT_SCHEMES

    d = TrainConfig()
    parser = _Parser(prog=_prog(), description="posenc command line")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser(
        "extrapolate",
        help="train each scheme on short sequences, evaluate on longer ones",
        description=(
            "Train a small byte-level language model with each position scheme on sequences of "
            "--train-len bytes of Python standard-library source, then evaluate it at longer "
            "lengths (losses in nats per byte, averaged over seeds). Trained weights are cached "
            "(see --cache-dir)."
        ),
    )
    p.add_argument("--schemes", type=_schemes, default=list(DEFAULT_SCHEMES),
                   help=f"comma-separated, from {', '.join(SCHEMES)} (default: all)")
    p.add_argument("--train-len", type=lambda t: _int(t, 1), default=d.train_len,
                   help=f"training sequence length in bytes (default {d.train_len})")
    p.add_argument("--eval-lens", type=_int_list(1), default=None,
                   help="comma-separated evaluation lengths (default: "
                   + ", ".join(f"{f}x" for f in DEFAULT_FACTORS) + " the training length)")
    p.add_argument("--steps", type=lambda t: _int(t, 1), default=None,
                   help=f"training steps (default {d.steps}; --full: 2000)")
    p.add_argument("--seeds", type=_int_list(0), default=None,
                   help="comma-separated seeds, results averaged (default 0; --full: 0,1,2)")
    p.add_argument("--eval-tokens", type=lambda t: _int(t, 1), default=32768,
                   help="predictions per evaluation length (default 32768)")
    p.add_argument("--threads", type=lambda t: _int(t, 0), default=1,
                   help="CPU threads (default 1, see posenc.lab.train_model; 0: torch's default)")
    p.add_argument("--workers", type=lambda t: _int(t, 0), default=0,
                   help="processes that train at once on a CPU (default 0: one per core, at most 8)")
    p.add_argument("--full", action="store_true",
                   help="the chapter's full setting: larger models, longer training, 3 seeds")
    p.add_argument("--device", type=_device, default="auto", help="auto (default), cpu, cuda, mps")
    p.add_argument("--cache-dir", default=None, help="trained-weights cache (default $POSENC_CACHE, "
                   "else the user cache directory, e.g. ~/.cache/posenc)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is none anyway when stderr is not a terminal)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--plot", type=Path, default=None,
                   help="save a figure (PNG, PDF, SVG) here; needs matplotlib (pip install 'posenc[plot]')")
    _explain_parser(sub)
    return parser


def _explain_parser(sub) -> None:
    e = sub.add_parser(
        "explain",
        help="explain a model's RoPE config pair by pair (posenc.explain)",
        description=(
            "Read a transformers config.json and print, for each rotary pair, its frequency, "
            "wavelength, turns within the training length and what the scaling rule does to it, "
            "with the attention factor, the lengths and every inconsistency found."
        ),
    )
    e.add_argument("config", type=Path, help="a model's config.json")
    e.add_argument("--context", type=lambda t: _int(t, 1), default=None,
                   help="the length you want to run at (default: max_position_embeddings, "
                        "or the scaling's reach where larger)")
    e.add_argument("--plot", type=Path, default=None,
                   help="save the wavelength figure here (PNG, PDF, SVG); needs matplotlib")
    e.add_argument("--lang", choices=("en", "zh"), default="en", help="en (default) or zh")


def explain_command(args: argparse.Namespace, prog: str = "python -m posenc") -> int:
    """``python -m posenc explain``: print the report; errors in the config are one line, status 2."""
    if args.plot is not None:
        bad = _plot_path_error(args.plot)
        if bad:
            print(f"{prog} explain: error: {bad}", file=sys.stderr)
            return 2
    try:
        report = explain(str(args.config), context=args.context)
    except (ValueError, TypeError) as e:
        print(f"{prog} explain: error: {e}", file=sys.stderr)
        return 2
    print(report.to_table(args.lang))
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        if args.lang == "zh":  # a CJK font that matplotlib's cache may not list yet, registered
            from .plot import cjk_font

            try:
                cjk_font()
            except RuntimeError as e:  # none installed: the figure's Chinese text shows as boxes
                print(f"{prog} explain: warning: {e}", file=sys.stderr)
        fig = report.plot(lang=args.lang)
        fig.savefig(args.plot, bbox_inches="tight")
        print(f"wrote {args.plot}")
    return 0


def _plot_path_error(path: Path) -> str | None:
    """Why ``--plot PATH`` cannot be written (checked before any work), or None."""
    if not _has_matplotlib():
        return "--plot needs matplotlib (pip install 'posenc[plot]')"
    from matplotlib.figure import Figure

    kinds = sorted(Figure().canvas.get_supported_filetypes())
    ext = path.suffix.lower().lstrip(".")
    if ext and ext not in kinds:  # no extension: matplotlib writes PNG
        return f"argument --plot: the file's extension must be one of {kinds}, got {path.name!r}"
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return f"argument --plot: folder {str(parent)!r} does not exist (got {str(path)!r})"
    return None


def _plot(ex, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    train_len = ex.config["train_len"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    longest = max(ex.lengths)
    # per-position losses averaged over bins that widen with the position (readable on a log axis)
    edges = sorted(set(torch.logspace(0, torch.log10(torch.tensor(float(longest))), 32)
                       .round().long().tolist()) | {0, longest})
    centres = [(lo + hi + 1) / 2 for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    for s in ex.schemes:
        a.plot(ex.lengths, [ex.mean(s, n) for n in ex.lengths], marker="o", label=s)
        per_pos = ex.per_position(s, longest)
        b.plot(centres, [per_pos[lo:hi].mean().item() for lo, hi in zip(edges[:-1], edges[1:], strict=True)],
               lw=1.5, label=s)
    a.set(xscale="log", xlabel="evaluation length (bytes)", ylabel="mean loss (nats/byte)",
          title=f"Trained on {train_len} bytes, evaluated longer")
    a.set_xticks(ex.lengths, [str(n) for n in ex.lengths])
    a.axvline(train_len, color="grey", ls=":")
    b.axvline(train_len, color="grey", ls=":", label="training length")
    b.set(xscale="log", xlabel="position (+1)", ylabel="loss (nats/byte)",
          title=f"Loss at each position, length {longest}")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def extrapolate(args: argparse.Namespace, prog: str = "python -m posenc") -> int:
    if args.plot is not None and not _has_matplotlib():  # before any training
        print(f"{prog} extrapolate: error: --plot needs matplotlib, which is not installed "
              "(pip install 'posenc[plot]')", file=sys.stderr)
        return 2
    from .cache import set_cache_dir
    from .config import TrainConfig, full_config
    from .experiment import run_extrapolation

    if args.cache_dir is not None:
        set_cache_dir(args.cache_dir)
    base = full_config("alibi") if args.full else TrainConfig()
    base = replace(base, train_len=args.train_len)
    seeds = args.seeds if args.seeds is not None else (list(FULL_SEEDS) if args.full else [0])
    try:
        ex = run_extrapolation(
            args.schemes, base=base, eval_lens=args.eval_lens, steps=args.steps, seeds=seeds,
            device=None if args.device == "auto" else args.device,
            progress=not args.no_progress and sys.stderr.isatty(),
            cache=not args.no_cache, num_tokens=args.eval_tokens, threads=args.threads or None,
            workers=args.workers or None,
            log=lambda line: print(line, flush=True),
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"{prog} extrapolate: error: {err}", file=sys.stderr)
        return 1
    c = ex.corpus
    print(f"\ncorpus: {c['bytes']:,} bytes from {c['files']} files of the Python {c['python']} "
          f"standard library, sha256 {c['sha256']}")
    print(f"trained on {ex.config['train_len']} bytes for {ex.config['steps']} steps, "
          f"seeds {', '.join(map(str, seeds))}")
    print("\nmean loss over all positions (nats/byte):")
    print(ex.table())
    print(f"\nmean loss past the training length ({ex.config['train_len']} bytes):")
    print(ex.table("tail_loss"))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(ex.to_json(), indent=2) + "\n")
        print(f"\nwrote {args.out}")
    if args.plot is not None:
        _plot(ex, args.plot)
        print(f"wrote {args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "extrapolate":
        return extrapolate(args, parser.prog)
    if args.command == "explain":
        return explain_command(args, parser.prog)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
