"""Train short, test long: seeded training, a cache of trained weights, and evaluation.

* :class:`TrainConfig` holds everything that determines a trained model; the defaults are the
  chapter's (``python -m posenc extrapolate`` uses them too).
* :func:`train_model` trains a :class:`~posenc.model.TransformerLM` on the byte corpus (AdamW,
  linear warm-up then cosine decay, gradient clipping) on any device, or loads it from the
  cache. The cache key hashes the full config, the corpus SHA-256 and ``FORMAT_VERSION``.
* :func:`evaluate` gives, for each evaluation length, the mean loss over all positions, the
  mean loss over positions past the training length, and the loss at every position.
* :func:`run_extrapolation` does both for several schemes and seeds (the experiment).

Cache directory: :func:`set_cache_dir`, else the ``POSENC_CACHE`` environment variable, else
``~/.cache/posenc``. Files are written atomically and read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_float, check_int
from .data import Corpus, eval_chunks, load_corpus, passkey_batch, random_windows
from .device import default_device
from .model import ModelConfig, TransformerLM, scheme_kwargs
from .schemes import SCHEMES

FORMAT_VERSION = 1  # bump when a change to posenc makes cached weights stale

# ------------------------------------------------------------------------------- cache

_cache_dir: Path | None = None


def set_cache_dir(path) -> None:
    """Use ``path`` (a string or path) for trained weights from now on (``None``: back to the
    default)."""
    global _cache_dir
    _cache_dir = None if path is None else Path(path).expanduser()


def cache_dir():
    """Where trained weights live (a ``pathlib.Path``): :func:`set_cache_dir`, else
    ``$POSENC_CACHE``, else ``~/.cache/posenc``."""
    if _cache_dir is not None:
        return _cache_dir
    env = os.environ.get("POSENC_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "posenc"


def _atomic_save(obj: object, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a trained model. The defaults are the chapter's.

    ``max_len`` is the number of rows of the learned absolute table (``None``: 16 x
    ``train_len``); only the first ``train_len`` rows are ever trained, the rest keep their
    initial values -- that is what testing a learned table on longer inputs means. Other
    schemes ignore it. ``scheme_options`` are keyword arguments for the scheme on top of the
    fair defaults of :func:`~posenc.model.scheme_kwargs` (e.g. ``{"scale": True}`` for
    sinusoidal, ``{"base": 500000.0}`` for RoPE). ``warmup`` is a number of steps; the
    learning rate then follows a cosine from ``lr`` down to ``lr * min_lr_ratio``. Weight
    decay applies to the blocks' matrices only (not to embeddings, position parameters, norms
    or biases).
    """

    scheme: str = "alibi"
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: int = 4
    train_len: int = 64
    batch_size: int = 32
    steps: int = 1000
    lr: float = 1e-2
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    max_len: int | None = None
    scheme_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}; allowed: {', '.join(SCHEMES)}")
        for name in ("dim", "num_layers", "num_heads", "mlp_ratio", "train_len", "batch_size", "steps"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("warmup", self.warmup, minimum=0)
        check_int("seed", self.seed, minimum=0)
        check_float("lr", self.lr, positive=True)
        check_float("min_lr_ratio", self.min_lr_ratio, minimum=0.0)
        check_float("weight_decay", self.weight_decay, minimum=0.0)
        check_float("grad_clip", self.grad_clip, minimum=0.0)
        if self.max_len is not None and check_int("max_len", self.max_len, minimum=1) < self.train_len:
            raise ValueError(f"max_len must be >= train_len={self.train_len}, got {self.max_len}")
        if not isinstance(self.scheme_options, dict):
            raise TypeError(f"scheme_options must be a dict, got {type(self.scheme_options).__name__}")

    @property
    def table_len(self) -> int:
        """Rows of the learned absolute table."""
        return self.max_len if self.max_len is not None else 16 * self.train_len

    def model_config(self) -> ModelConfig:
        return ModelConfig(
            scheme=self.scheme, dim=self.dim, num_layers=self.num_layers, num_heads=self.num_heads,
            mlp_ratio=self.mlp_ratio, vocab_size=256,
            max_len=self.table_len if self.scheme == "learned" else None,
            scheme_kwargs={**scheme_kwargs(self.scheme, train_len=self.train_len), **self.scheme_options},
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def key(self, corpus_sha256: str) -> str:
        """SHA-256 of the full config (as the model sees it), the corpus and the format."""
        cfg = self.to_dict()
        if self.scheme != "learned":
            cfg["max_len"] = None  # irrelevant to every other scheme: share their cache entries
        blob = {
            "config": cfg, "model": self.model_config().to_dict(), "corpus_sha256": corpus_sha256,
            "format_version": FORMAT_VERSION,
        }  # fmt: skip
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()

    def cache_path(self, corpus_sha256: str):
        """The file (a ``pathlib.Path``) that holds this model's weights for that corpus."""
        return cache_dir() / f"lm-{self.scheme}-{self.key(corpus_sha256)[:24]}.pt"


def full_config(scheme: str = "alibi", *, seed: int = 0, **overrides) -> TrainConfig:
    """The chapter's "full" setting (off by default, run with seeds 0, 1, 2): twice the width,
    three layers, 8 heads, twice the steps. About 7 minutes per model on one CPU core, so about
    70 minutes for 6 schemes x 3 seeds on a 2-core CPU."""
    base = {"dim": 128, "num_layers": 3, "num_heads": 8, "steps": 2000, "lr": 5e-3, "warmup": 150}
    return TrainConfig(scheme=scheme, seed=seed, **{**base, **overrides})


# ----------------------------------------------------------------------------- training


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up over ``config.warmup`` steps, then cosine to ``lr * min_lr_ratio``."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    span = max(1, config.steps - config.warmup)
    t = min(1.0, (step - config.warmup) / span)
    lo = config.lr * config.min_lr_ratio
    return lo + 0.5 * (config.lr - lo) * (1 + math.cos(math.pi * t))


def make_optimizer(model: TransformerLM, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (betas 0.9, 0.95) with ``config.weight_decay`` on the blocks' matrices only."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        in_block = name.startswith("blocks.") and ".scheme." not in name
        (decay if in_block and p.dim() == 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))


def _resolve_device(device: torch.device | str | None) -> torch.device:
    if device is None or device == "auto":
        return default_device()
    return torch.device(device)


@contextmanager
def cpu_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)`` (``None``: leave it as it is)."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(check_int("threads", n, minimum=1))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def build_model(config: TrainConfig) -> TransformerLM:
    """A freshly initialised model for ``config`` (seeded by ``config.seed``; the global RNG is
    left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return TransformerLM(config.model_config())


def train_model(
    config: TrainConfig,
    *,
    corpus: Corpus | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
    cache: bool = True,
    retrain: bool = False,
    threads: int | None = 1,
) -> TransformerLM:
    """Train (or load from the cache) the model ``config`` describes; returned in eval mode.

    The returned model carries ``train_config``, ``history`` (the training loss at every
    step, nats per byte), ``train_seconds`` and ``from_cache``. ``progress`` shows a tqdm bar;
    ``cache=False`` neither reads nor writes the cache; ``retrain=True`` ignores a cached copy.
    The data order depends on ``config.seed`` only, so every scheme with the same seed sees the
    same batches.

    ``threads`` is the number of CPU threads while training (``None``: torch's setting). The
    default, 1, makes a CPU run independent of the machine's core count (more threads change
    the order of float additions), and models this small gain little from more threads; on a
    busy machine, OpenMP threads that wait for each other can even make a 2-thread run many
    times slower than a 1-thread one.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    corpus = load_corpus() if corpus is None else corpus
    device = _resolve_device(device)
    key = config.key(corpus.sha256)
    path = config.cache_path(corpus.sha256)
    model = build_model(config)
    if cache and not retrain and path.is_file():
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            if state.get("key") != key:
                raise ValueError("cache key mismatch")
            model.load_state_dict(state["model"])
        except Exception:  # a stale or damaged file: train again (from scratch) and overwrite it
            model = build_model(config)
        else:
            model.to(device).eval()
            model.train_config, model.history = config, list(state["history"])
            model.train_seconds, model.from_cache = float(state["train_seconds"]), True
            return model

    with cpu_threads(threads if device.type == "cpu" else None):
        history, seconds = _train(model, config, corpus, device, progress)
    if cache:
        state = {
            "key": key, "format_version": FORMAT_VERSION, "config": config.to_dict(),
            "corpus_sha256": corpus.sha256, "history": history, "train_seconds": seconds,
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        }  # fmt: skip
        _atomic_save(state, path)
    model.train_config, model.history = config, history
    model.train_seconds, model.from_cache = seconds, False
    return model


def _train(
    model: TransformerLM, config: TrainConfig, corpus: Corpus, device: torch.device, progress: bool
) -> tuple[list[float], float]:
    model.to(device).train()
    opt = make_optimizer(model, config)
    gen = torch.Generator().manual_seed(config.seed)
    data = corpus.train
    history: list[float] = []
    bar = _progress_bar(config, progress)
    start = time.perf_counter()
    losses = []
    for step in range(config.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, config)
        x, y = random_windows(data, config.batch_size, config.train_len, generator=gen)
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        opt.step()
        losses.append(loss.detach())
        if len(losses) == 50 or step == config.steps - 1:  # one device sync per 50 steps
            history.extend(torch.stack(losses).float().cpu().tolist())
            losses = []
            if bar is not None:
                bar.set_postfix(loss=f"{history[-1]:.3f}", refresh=False)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    model.eval()
    return history, time.perf_counter() - start


def _progress_bar(config: TrainConfig, progress: bool):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.steps, desc=f"{config.scheme:>10} seed {config.seed}", leave=False, unit="step")


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class EvalResult:
    """Loss of one model at one evaluation ``length`` (nats per byte).

    ``loss``: mean over all positions; ``tail_loss``: mean over positions ``>= train_len``
    (``None`` when ``length <= train_len``); ``per_position [length]``: mean over windows at
    each position (position ``p`` predicts byte ``p + 1`` from bytes ``0..p``).
    """

    length: int
    train_len: int
    loss: float
    tail_loss: float | None
    per_position: Tensor = field(repr=False)
    num_windows: int = 0


@torch.no_grad()
def evaluate(
    model: TransformerLM,
    data: Tensor,
    lengths: Iterable[int],
    *,
    train_len: int | None = None,
    num_tokens: int = 32768,
    batch_tokens: int = 8192,
    threads: int | None = 1,
) -> dict[int, EvalResult]:
    """Evaluate ``model`` on ``data`` (a 1-D byte tensor, e.g. ``corpus.val``) at each length.

    The text is ``num_tokens // max(lengths)`` segments of ``max(lengths)`` bytes spread evenly
    over ``data`` (see :func:`~posenc.data.eval_chunks`); at each length they are cut into
    non-overlapping windows, so every length sees the same text. Windows are evaluated
    ``batch_tokens`` at a time under ``torch.no_grad()``. ``train_len`` defaults to
    ``model.train_config.train_len``; ``threads`` as in :func:`train_model`.
    """
    lengths = [check_int("length", n, minimum=1) for n in lengths]
    if not lengths:
        raise ValueError("lengths must hold at least one length")
    block = max(lengths)
    if train_len is None:
        cfg = getattr(model, "train_config", None)
        if cfg is None:
            raise ValueError("train_len is needed for a model that train_model did not return")
        train_len = cfg.train_len
    train_len = check_int("train_len", train_len, minimum=1)
    batch_tokens = check_int("batch_tokens", batch_tokens, minimum=1)
    device = next(model.parameters()).device
    with cpu_threads(threads if device.type == "cpu" else None):
        return _evaluate(model, data, lengths, train_len, num_tokens, batch_tokens, block, device)


def _evaluate(model, data, lengths, train_len, num_tokens, batch_tokens, block, device):
    was_training = model.training
    model.eval()
    out = {}
    for length in lengths:
        x, y = eval_chunks(data, length, num_tokens, block=block)  # [N, L]
        total = torch.zeros(length, dtype=torch.float64)
        step = max(1, batch_tokens // length)
        for i in range(0, x.shape[0], step):
            xb, yb = x[i : i + step].to(device), y[i : i + step].to(device)
            logits = model(xb).float()  # [b, L, V]
            loss = F.cross_entropy(logits.transpose(1, 2), yb, reduction="none")  # [b, L]
            total += loss.sum(0).cpu().double()  # (MPS has no float64)
        per_pos = (total / x.shape[0]).float()  # [L]
        tail = per_pos[train_len:]
        out[length] = EvalResult(
            length=length, train_len=train_len, loss=float(per_pos.mean()),
            tail_loss=float(tail.mean()) if tail.numel() else None, per_position=per_pos,
            num_windows=int(x.shape[0]),
        )
    model.train(was_training)
    return out


@torch.no_grad()
def passkey_accuracy(
    model: TransformerLM, length: int, *, num: int = 32, seed: int = 0, depth: float | None = None
) -> float:
    """Fraction of passkey digits the model predicts (argmax, teacher forced) at ``length``."""
    tokens, mask, _ = passkey_batch(num, length, seed=seed, depth=depth)
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    pred = model(tokens[:, :-1]).argmax(-1)  # [B, L-1]
    target = tokens[:, 1:]
    m = mask[:, :-1].to(device)
    return float((pred == target)[m].float().mean())


# --------------------------------------------------------------------------- experiment


def _eval_path(cfg: TrainConfig, corpus: Corpus, lengths: list[int], num_tokens: int) -> Path:
    what = json.dumps([cfg.key(corpus.sha256), lengths, num_tokens, FORMAT_VERSION])
    return cache_dir() / f"eval-{cfg.scheme}-{hashlib.sha256(what.encode()).hexdigest()[:24]}.pt"


def _save_evals(cfg, corpus, lengths, num_tokens, results: dict[int, EvalResult], seconds: float) -> None:
    state = {
        "key": cfg.key(corpus.sha256), "train_seconds": float(seconds),
        "results": {
            str(n): {"loss": r.loss, "tail_loss": r.tail_loss, "per_position": r.per_position,
                     "num_windows": r.num_windows, "train_len": r.train_len}
            for n, r in results.items()
        },
    }  # fmt: skip
    _atomic_save(state, _eval_path(cfg, corpus, lengths, num_tokens))


def _load_evals(cfg, corpus, lengths, num_tokens) -> tuple[dict[int, EvalResult], float] | None:
    path = _eval_path(cfg, corpus, lengths, num_tokens)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state["key"] != cfg.key(corpus.sha256):
            return None
        results = {
            n: EvalResult(length=n, **state["results"][str(n)]) for n in lengths
        }
        return results, float(state["train_seconds"])
    except Exception:  # damaged or from another version: evaluate again
        return None


DEFAULT_SCHEMES: tuple[str, ...] = ("sinusoidal", "learned", "rope", "alibi", "t5", "nope")
DEFAULT_FACTORS: tuple[int, ...] = (1, 2, 4, 16)  # evaluation lengths, in training lengths


@dataclass
class Extrapolation:
    """What :func:`run_extrapolation` measured. ``evals[scheme][seed][length]`` holds the
    :class:`EvalResult`; :meth:`table` averages over seeds."""

    config: dict
    corpus: dict
    evals: dict[str, dict[int, dict[int, EvalResult]]]
    train_seconds: dict[str, dict[int, float]]
    models: dict[str, dict[int, TransformerLM]] = field(repr=False, default_factory=dict)

    @property
    def schemes(self) -> list[str]:
        return list(self.evals)

    @property
    def lengths(self) -> list[int]:
        return list(self.config["eval_lens"])

    def values(self, scheme: str, length: int, what: str = "loss") -> list[float]:
        """The per-seed values of ``what`` (``"loss"`` or ``"tail_loss"``)."""
        return [getattr(r[length], what) for r in self.evals[scheme].values()]

    def mean(self, scheme: str, length: int, what: str = "loss") -> float | None:
        vals = self.values(scheme, length, what)
        return None if vals[0] is None else statistics.fmean(vals)

    def sd(self, scheme: str, length: int, what: str = "loss") -> float | None:
        vals = self.values(scheme, length, what)
        return None if vals[0] is None or len(vals) < 2 else statistics.stdev(vals)

    def per_position(self, scheme: str, length: int) -> Tensor:
        """Loss at each position ``[length]``, averaged over seeds."""
        return torch.stack([r[length].per_position for r in self.evals[scheme].values()]).mean(0)

    def results(self) -> dict:
        return {
            s: {
                str(n): {"loss": self.mean(s, n), "tail_loss": self.mean(s, n, "tail_loss")}
                for n in self.lengths
            }
            for s in self.schemes
        }

    def to_json(self) -> dict:
        """``{"config", "corpus": {"bytes", "sha256", ...}, "results": {scheme: {len: {"loss",
        "tail_loss"}}}, "per_seed": ...}``; losses in nats per byte, averaged over seeds."""
        per_seed = {
            s: {
                str(seed): {
                    str(n): {"loss": r[n].loss, "tail_loss": r[n].tail_loss} for n in self.lengths
                }
                for seed, r in by_seed.items()
            }
            for s, by_seed in self.evals.items()
        }
        return {"config": self.config, "corpus": self.corpus, "results": self.results(), "per_seed": per_seed}

    def table(self, what: str = "loss") -> str:
        """A plain-text table, schemes x lengths (mean, and +- sd with several seeds)."""
        header = f"{'scheme':<11}" + "".join(f"{n:>15}" for n in self.lengths)
        rows = [header, "-" * len(header)]
        for s in self.schemes:
            cells = []
            for n in self.lengths:
                m, sd = self.mean(s, n, what), self.sd(s, n, what)
                cells.append("-" if m is None else f"{m:.3f}" + ("" if sd is None else f" ± {sd:.3f}"))
            rows.append(f"{s:<11}" + "".join(f"{c:>15}" for c in cells))
        return "\n".join(rows)


def _num_workers(workers: int | None, jobs: int, device: torch.device, threads: int | None) -> int:
    if jobs < 2 or device.type != "cpu":
        return 1
    if workers is not None:
        return min(check_int("workers", workers, minimum=1), jobs)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(jobs, cores // (threads or cores), 8))


def _prepare_job(
    config: dict, corpus: Corpus, device: str, eval_lens: list[int], num_tokens: int,
    threads: int | None, cache_path: str,
) -> tuple[float, bool]:
    """In a worker process: train (or load) one model, evaluate it, cache both."""
    set_cache_dir(cache_path)
    cfg = TrainConfig(**config)
    model = train_model(cfg, corpus=corpus, device=device, progress=False, threads=threads)
    results = evaluate(model, corpus.val, eval_lens, num_tokens=num_tokens, threads=threads)
    _save_evals(cfg, corpus, eval_lens, num_tokens, results, model.train_seconds)
    return model.train_seconds, model.from_cache


def _prepare_in_parallel(
    todo: list[TrainConfig], workers: int, *, corpus: Corpus, device: torch.device,
    eval_lens: list[int], num_tokens: int, threads: int | None, progress: bool, log,
) -> set[tuple[str, int]]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    done = set()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc=f"training {len(todo)} models in {workers} processes", unit="model")
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {
            pool.submit(_prepare_job, cfg.to_dict(), corpus, str(device), eval_lens, num_tokens,
                        threads, str(cache_dir())): cfg
            for cfg in todo
        }
        for future in as_completed(futures):
            cfg = futures[future]
            seconds, from_cache = future.result()
            done.add((cfg.scheme, cfg.seed))
            if bar is not None:
                bar.update(1)
            if log is not None:
                how = "loaded from cache" if from_cache else f"trained in {seconds:.0f} s"
                log(f"{cfg.scheme:>10} seed {cfg.seed}: {how}")
    if bar is not None:
        bar.close()
    return done


def run_extrapolation(
    schemes: Sequence[str] = DEFAULT_SCHEMES,
    *,
    base: TrainConfig | None = None,
    train_len: int | None = None,
    eval_lens: Sequence[int] | None = None,
    steps: int | None = None,
    seeds: Sequence[int] = (0,),
    device: torch.device | str | None = None,
    corpus: Corpus | None = None,
    progress: bool = True,
    cache: bool = True,
    num_tokens: int = 32768,
    keep_models: bool = False,
    threads: int | None = 1,
    workers: int | None = 1,
    log=None,
) -> Extrapolation:
    """Train every scheme (per seed) on ``train_len`` bytes and evaluate at ``eval_lens``.

    ``base`` gives every setting but the scheme and seed; without it ``TrainConfig()`` is
    used. ``train_len`` and ``steps`` override it. ``eval_lens`` defaults to 1, 2, 4 and 16 times
    ``train_len``; the learned table gets ``max(16 * train_len, max(eval_lens))`` rows.
    ``log``, if given, is called with one line per trained model; ``threads`` as in
    :func:`train_model`. Evaluations are cached next to the weights.

    ``workers`` > 1 trains and evaluates the models that are not cached yet in that many
    processes at once (CPU only, with the cache on; ``None``: one per CPU core, at most 8).
    Each process uses ``threads`` threads, so the results equal a sequential run's. The
    processes are started with ``spawn``: a script that calls this with several workers needs
    the usual ``if __name__ == "__main__":`` guard (notebooks need nothing).
    """
    base = TrainConfig() if base is None else base
    changes = {}
    if train_len is not None:
        changes["train_len"] = check_int("train_len", train_len, minimum=1)
    if steps is not None:
        changes["steps"] = check_int("steps", steps, minimum=1)
    base = replace(base, **changes)
    if eval_lens is None:
        eval_lens = [f * base.train_len for f in DEFAULT_FACTORS]
    eval_lens = sorted({check_int("eval length", n, minimum=1) for n in eval_lens})
    if base.max_len is None and max(eval_lens) > 16 * base.train_len:
        base = replace(base, max_len=max(eval_lens))
    schemes = list(schemes)
    for s in schemes:
        if s not in SCHEMES:
            raise ValueError(f"unknown scheme {s!r}; allowed: {', '.join(SCHEMES)}")
    seeds = [check_int("seed", s, minimum=0) for s in seeds]
    if not seeds or not schemes:
        raise ValueError("need at least one scheme and one seed")
    corpus = load_corpus() if corpus is None else corpus
    if max(eval_lens) >= corpus.val.numel():
        raise ValueError(
            f"eval length {max(eval_lens)} needs more than the {corpus.val.numel()} validation bytes"
        )
    device = _resolve_device(device)
    logged: set[tuple[str, int]] = set()
    if cache:
        todo = [
            replace(base, scheme=s, seed=seed) for s in schemes for seed in seeds
            if _load_evals(replace(base, scheme=s, seed=seed), corpus, eval_lens, num_tokens) is None
        ]
        n = _num_workers(workers, len(todo), device, threads)
        if n > 1:
            logged = _prepare_in_parallel(
                todo, n, corpus=corpus, device=device, eval_lens=eval_lens, num_tokens=num_tokens,
                threads=threads, progress=progress, log=log,
            )
    evals: dict = {}
    seconds: dict = {}
    models: dict = {}
    for scheme in schemes:
        evals[scheme], seconds[scheme], models[scheme] = {}, {}, {}
        for seed in seeds:
            cfg = replace(base, scheme=scheme, seed=seed)
            found = _load_evals(cfg, corpus, eval_lens, num_tokens) if cache else None
            model = None
            if found is None or keep_models:
                model = train_model(
                    cfg, corpus=corpus, device=device, progress=progress, cache=cache, threads=threads
                )
            if found is None:
                results = evaluate(model, corpus.val, eval_lens, num_tokens=num_tokens, threads=threads)
                found = results, model.train_seconds
                if cache:
                    _save_evals(cfg, corpus, eval_lens, num_tokens, *found)
                how = "loaded from cache" if model.from_cache else f"trained in {model.train_seconds:.0f} s"
            else:
                how = "loaded from cache"
            evals[scheme][seed], seconds[scheme][seed] = found
            if log is not None and (scheme, seed) not in logged:
                log(f"{scheme:>10} seed {seed}: {how}")
            if keep_models:
                models[scheme][seed] = model
    config = {
        **{f.name: getattr(base, f.name) for f in fields(base) if f.name not in ("scheme", "seed")},
        "schemes": schemes, "seeds": seeds, "eval_lens": eval_lens, "eval_tokens": num_tokens,
        "format_version": FORMAT_VERSION, "learned_rows": base.table_len,
    }  # fmt: skip
    return Extrapolation(
        config=config, corpus=corpus.summary(), evals=evals, train_seconds=seconds, models=models
    )
