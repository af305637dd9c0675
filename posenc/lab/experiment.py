"""The extrapolation experiment: every scheme trained short and tested long (Press et al., 2022).

:func:`run_extrapolation` trains (or loads) one model per scheme and seed, evaluates each at
several lengths, caches the evaluations, and returns an :class:`Extrapolation`. Models that are
not cached yet can train in parallel processes (one thread each, so results equal a sequential
run's).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

from .._checks import check_int
from ..schemes import SCHEMES
from .cache import FORMAT_VERSION, cache_dir, set_cache_dir
from .config import TrainConfig
from .data import Corpus, load_corpus
from .evaluate import EvalResult, evaluate, load_evals, save_evals
from .train import TrainedModel, resolve_device, train_model

DEFAULT_SCHEMES: tuple[str, ...] = ("sinusoidal", "learned", "rope", "alibi", "t5", "nope")
DEFAULT_FACTORS: tuple[int, ...] = (1, 2, 4, 16)  # evaluation lengths, in training lengths


@dataclass
class Extrapolation:
    """What :func:`run_extrapolation` measured. ``evals[scheme][seed][length]`` holds the
    :class:`~posenc.lab.evaluate.EvalResult`; :meth:`table` averages over seeds.
    ``models[scheme][seed]`` holds the :class:`~posenc.lab.train.TrainedModel` when
    ``keep_models=True``."""

    config: dict
    corpus: dict
    evals: dict[str, dict[int, dict[int, EvalResult]]]
    train_seconds: dict[str, dict[int, float]]
    models: dict[str, dict[int, TrainedModel]] = field(repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("config", "corpus", "evals", "train_seconds", "models"):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"{name} must be a dict, got {type(getattr(self, name)).__name__}")

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
    save_evals(cfg, corpus, eval_lens, num_tokens, results, model.train_seconds)
    return model.train_seconds, model.from_cache


def _prepare_in_parallel(
    todo: list[TrainConfig], workers: int, *, corpus: Corpus, device: torch.device,
    eval_lens: list[int], num_tokens: int, threads: int | None, progress: bool, log,
) -> set[tuple[str | tuple[str, ...], int]]:
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
                log(f"{cfg.scheme_label:>10} seed {cfg.seed}: {how}")
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
    log: Callable[[str], object] | None = None,
) -> Extrapolation:
    """Train every scheme (per seed) on ``train_len`` bytes and evaluate at ``eval_lens``.

    ``base`` gives every setting but the scheme and seed; without it ``TrainConfig()`` is
    used. ``train_len`` and ``steps`` override it. ``eval_lens`` defaults to 1, 2, 4 and 16 times
    ``train_len``; the learned table gets ``max(16 * train_len, max(eval_lens))`` rows.
    ``log``, if given, is called with one line per trained model; ``threads`` as in
    :func:`~posenc.lab.train.train_model`. Evaluations are cached next to the weights.

    ``workers`` > 1 trains and evaluates the models that are not cached yet in that many
    processes at once (CPU only, with the cache on; ``None``: one per CPU core, at most 8).
    Each process uses ``threads`` threads, so the results equal a sequential run's. The
    processes are started with ``spawn``: a script that calls this with several workers needs
    the usual ``if __name__ == "__main__":`` guard (notebooks need nothing).
    """
    base = TrainConfig() if base is None else base
    if not isinstance(base, TrainConfig):
        raise TypeError(f"base must be a TrainConfig or None, got {type(base).__name__}")
    changes: dict[str, Any] = {}
    if train_len is not None:
        changes["train_len"] = check_int("train_len", train_len, minimum=1)
    if steps is not None:
        changes["steps"] = check_int("steps", steps, minimum=1)
    base = replace(base, **changes)
    if eval_lens is None:
        eval_lens = [f * base.train_len for f in DEFAULT_FACTORS]
    if isinstance(eval_lens, (str, bytes)) or not isinstance(eval_lens, Sequence):
        raise TypeError(f"eval_lens must be a list of ints, got {eval_lens!r}")
    eval_lens = sorted({check_int("eval_lens", n, minimum=1) for n in eval_lens})
    if not eval_lens:
        raise ValueError("eval_lens must hold at least one length, got []")
    if base.max_len is None and max(eval_lens) > 16 * base.train_len:
        base = replace(base, max_len=max(eval_lens))
    if isinstance(schemes, str) or not isinstance(schemes, Sequence):
        raise TypeError(f"schemes must be a list of scheme names, got {schemes!r}")
    schemes = list(schemes)
    for s in schemes:
        if s not in SCHEMES:
            raise ValueError(f"schemes: unknown scheme {s!r}; allowed: {', '.join(SCHEMES)}")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise TypeError(f"seeds must be a list of ints, got {seeds!r}")
    seeds = [check_int("seeds", s, minimum=0) for s in seeds]
    if not seeds or not schemes:
        raise ValueError("need at least one scheme and one seed")
    corpus = load_corpus() if corpus is None else corpus
    if max(eval_lens) >= corpus.val.numel():
        raise ValueError(
            f"eval length {max(eval_lens)} needs more than the {corpus.val.numel()} validation bytes"
        )
    device = resolve_device(device)
    logged: set[tuple[str | tuple[str, ...], int]] = set()
    if cache:
        todo = [
            replace(base, scheme=s, seed=seed) for s in schemes for seed in seeds
            if load_evals(replace(base, scheme=s, seed=seed), corpus, eval_lens, num_tokens) is None
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
            found = load_evals(cfg, corpus, eval_lens, num_tokens) if cache else None
            model = None
            if found is None or keep_models:
                model = train_model(
                    cfg, corpus=corpus, device=device, progress=progress, cache=cache, threads=threads
                )
            if found is None:
                assert model is not None  # for the type checkers: trained just above
                results = evaluate(model, corpus.val, eval_lens, num_tokens=num_tokens, threads=threads)
                found = results, model.train_seconds
                if cache:
                    save_evals(cfg, corpus, eval_lens, num_tokens, *found)
                how = "loaded from cache" if model.from_cache else f"trained in {model.train_seconds:.0f} s"
            else:
                how = "loaded from cache"
            evals[scheme][seed], seconds[scheme][seed] = found
            if log is not None and (scheme, seed) not in logged:
                log(f"{cfg.scheme_label:>10} seed {seed}: {how}")
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
