"""Long context: extend a trained RoPE model with a scaling method, fine-tune it, test it.

* :func:`rope_scaling_config` writes the Hugging Face ``rope_parameters`` dict of each method
  for a model trained on ``original_len`` tokens and extended ``factor`` times.
* :func:`yarn_betas` rescales YaRN's ``beta_fast`` / ``beta_slow`` (32 and 1, chosen for the
  4096-token Llama 2) to another training length.
* :func:`with_rope_scaling` returns a copy of a trained :class:`~posenc.lab.model.TransformerLM`
  whose RoPE uses a scaling config (zero-shot extension: no weight changes).
* :func:`fine_tune` continues training a copy at a new length, on the byte corpus or on the
  passkey task, with a cache of the result like :func:`~posenc.lab.train.train_model`'s.
* :func:`passkey_grid` measures passkey accuracy over lengths and needle depths.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_float, check_int
from ..rope import RotaryEmbedding
from ..rope_scaling import ROPE_TYPES
from .cache import FINE_TUNE_FORMAT_VERSION as FORMAT_VERSION
from .cache import atomic_save, cache_dir, locked, set_cache_dir
from .config import FineTuneConfig, fingerprint, rope_modules
from .data import Corpus, load_corpus, passkey_batch, passkey_min_length, random_windows
from .evaluate import passkey_accuracy
from .model import TransformerLM
from .train import TrainedModel, cpu_threads, make_optimizer, resolve_device, unwrap

YARN_REFERENCE_LEN = 4096
"""The training length YaRN's default betas were chosen for (Llama 2; Peng et al., 2024, "YaRN")."""


# ------------------------------------------------------------------------- configs


def rope_scaling_config(
    rope_type: str, factor: float, original_len: int, **overrides
) -> dict | None:
    """The ``rope_parameters`` dict that extends a model trained on ``original_len`` tokens
    ``factor`` times with ``rope_type`` (``"default"`` gives ``None``: no scaling).

    * ``linear``, ``ntk``: ``{"rope_type", "factor"}``;
    * ``dynamic``: plus ``max_position_embeddings = original_len`` (HF grows the factor from
      there);
    * ``yarn``: plus ``original_max_position_embeddings`` (``beta_fast`` / ``beta_slow`` default
      to HF's 32 and 1; see :func:`yarn_betas`);
    * ``llama3``: plus ``low_freq_factor = 1``, ``high_freq_factor = 4`` (Llama 3.1's values);
    * ``longrope``: ``short_factor`` and ``long_factor`` must be given in ``overrides``.

    ``max_position_embeddings = factor * original_len`` is added for the by-parts types, as a
    Hugging Face config would hold it. ``overrides`` are merged last.
    """
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type must be one of {list(ROPE_TYPES)}, got {rope_type!r}")
    factor = check_float("factor", factor, minimum=1.0)
    original_len = check_int("original_len", original_len, minimum=1)
    if rope_type == "default":
        if overrides:
            raise ValueError(f"rope_type 'default' takes no overrides, got {sorted(overrides)}")
        return None
    cfg: dict = {"rope_type": rope_type, "factor": factor}
    if rope_type == "dynamic":
        cfg["max_position_embeddings"] = original_len
    elif rope_type in ("yarn", "llama3", "longrope"):
        cfg["original_max_position_embeddings"] = original_len
        cfg["max_position_embeddings"] = int(round(factor * original_len))
        if rope_type == "llama3":
            cfg.update(low_freq_factor=1.0, high_freq_factor=4.0)
        if rope_type == "longrope" and not {"short_factor", "long_factor"} <= set(overrides):
            raise ValueError("rope_type 'longrope' needs short_factor and long_factor in overrides")
    cfg.update(overrides)
    return cfg


def yarn_betas(
    original_len: int,
    *,
    reference_len: int = YARN_REFERENCE_LEN,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> dict:
    """YaRN's ``beta_fast`` / ``beta_slow`` rescaled from ``reference_len`` to ``original_len``.

    A beta counts full turns inside the training context: pairs turning more than
    ``beta_fast`` times are kept, pairs turning fewer than ``beta_slow`` times are interpolated.
    The pair that sits at a given turn count ``beta`` has index
    ``(d / 2) * ln(L / (2 pi beta)) / ln(base)``, so the same *share* of pairs falls on each side
    of the ramp at length ``L`` as at ``reference_len`` when ``beta`` scales like ``L``:
    ``beta * original_len / reference_len``. Returns ``{"beta_fast", "beta_slow"}``.
    """
    original_len = check_int("original_len", original_len, minimum=1)
    reference_len = check_int("reference_len", reference_len, minimum=1)
    beta_fast = check_float("beta_fast", beta_fast, positive=True)
    beta_slow = check_float("beta_slow", beta_slow, positive=True)
    r = original_len / reference_len
    return {"beta_fast": beta_fast * r, "beta_slow": beta_slow * r}


# --------------------------------------------------------------------- zero shot


def with_rope_scaling(model: TrainedModel | TransformerLM, scaling: Mapping | None):
    """A copy of ``model`` whose RoPE uses ``scaling`` (a ``rope_parameters`` dict, or ``None``
    for the plain frequencies); the weights are copied, ``model`` is not changed.

    Head size, base, layout and partial rotary factor are kept. A
    :class:`~posenc.lab.train.TrainedModel` gives a :class:`~posenc.lab.train.TrainedModel` (same
    config, ``train_len`` and history, the scaled network); a bare ``TransformerLM`` gives a
    ``TransformerLM``. Raises ``ValueError`` if the model has no RoPE.
    """
    net, _ = unwrap(model)
    if scaling is not None and not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be None or a dict, got {type(scaling).__name__}")
    if not rope_modules(net):
        raise ValueError("model has no RoPE scheme to scale (with_rope_scaling needs scheme='rope')")
    new = copy.deepcopy(net)
    for scheme in rope_modules(new):
        old = scheme.rotary
        keep = {"partial_rotary_factor": old.scaling["partial_rotary_factor"]} if (
            "partial_rotary_factor" in old.scaling
        ) else {}
        scaled = {**dict(scaling or {}), **keep} or None
        scheme.rotary = RotaryEmbedding(
            old.head_dim, base=old.base, interleaved=old.interleaved, scaling=scaled
        ).to(old.inv_freq.device)
    return replace(model, model=new) if isinstance(model, TrainedModel) else new


# --------------------------------------------------------------------- fine-tuning


def _loss(model: TransformerLM, cfg: FineTuneConfig, step: int, data: Tensor | None,
          gen: torch.Generator, device: torch.device) -> Tensor:
    """The training loss of one step (see :func:`fine_tune`)."""
    if cfg.task == "lm":
        assert data is not None  # _fine_tune_setup gives the lm task its training bytes
        x, y = random_windows(data, cfg.batch_size, cfg.length, generator=gen)
        x, y = x.to(device), y.to(device)
        return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
    # passkey: a random length per step, so the key's distance from the question varies;
    # seeds far from the ones evaluation uses (0, 1, ...)
    n = int(torch.randint(passkey_min_length(), cfg.length + 2, (1,), generator=gen))
    tokens, _, _ = passkey_batch(cfg.batch_size, n, seed=1_000_000 + 100_000 * cfg.seed + step)
    tokens = tokens.to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]  # [B, n - 1]
    loss = F.cross_entropy(model(x).transpose(1, 2).float(), y, reduction="none")  # [B, n - 1]
    return loss.mean() + loss[:, -5:].mean()  # every byte, plus the 5 key digits once more


def fine_tune(
    model: TrainedModel | TransformerLM,
    *,
    length: int,
    steps: int,
    task: str = "lm",
    batch_size: int | None = None,
    lr: float = 1e-3,
    warmup: int | None = None,
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    seed: int = 0,
    corpus: Corpus | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
    cache: bool = True,
    threads: int | None = 1,
) -> TrainedModel:
    """Continue training a copy of ``model`` (a :class:`~posenc.lab.train.TrainedModel` or a bare
    ``TransformerLM``) on sequences of ``length`` tokens; ``model`` is not changed. Returns a
    :class:`~posenc.lab.train.TrainedModel` (``config``: the :class:`~posenc.lab.config.FineTuneConfig`,
    ``train_len``: ``length``, ``history``: loss per step) whose network is in eval mode, on
    ``device``.

    ``task="lm"``: next-byte prediction on random windows of ``corpus.train``; ``"passkey"``:
    passkey examples (:func:`posenc.lab.data.passkey_batch`) of a random length per step, up to
    ``length`` inputs, with the loss of every byte plus, once more, that of the 5 key digits.
    (At one fixed length a small model learns the few distances between needle and question
    instead of retrieval; the extra weight on the key makes the retrieval signal count.)
    ``batch_size`` defaults to the same number of tokens per step as the original training
    (``config.batch_size * train_len // length`` of a :class:`~posenc.lab.train.TrainedModel`,
    2048 tokens for a bare model; at least 1); ``warmup`` to 10 % of the steps. AdamW with the
    schedule and weight-decay groups of :func:`~posenc.lab.train.train_model`. The RoPE scaling
    inside ``model`` (see :func:`with_rope_scaling`) is used as it is. ``threads``: CPU threads while training
    (``None``: torch's setting), 1 by default as in :func:`~posenc.lab.train.train_model`.

    With ``cache=True`` the result is stored under :func:`~posenc.lab.cache.cache_dir`, keyed by the
    starting weights, the model config, its RoPE scaling, the arguments and the corpus, under a
    file lock (two processes never fine-tune the same model at once).
    """
    net, _ = unwrap(model)
    cfg, data, corpus_sha = _fine_tune_setup(
        model, length=length, steps=steps, task=task, batch_size=batch_size, lr=lr, warmup=warmup,
        min_lr_ratio=min_lr_ratio, weight_decay=weight_decay, grad_clip=grad_clip, seed=seed,
        corpus=corpus,
    )  # fmt: skip
    if threads is not None:
        check_int("threads", threads, minimum=1)
    device = resolve_device(device)
    key = _fine_tune_key(net, cfg, corpus_sha)
    path = cache_dir() / f"ft-{cfg.task}-{cfg.length}-{key[:24]}.pt"
    with locked(path, enabled=cache):
        if cache and path.is_file():
            new = copy.deepcopy(net).to(device)
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
                if state.get("key") != key:
                    raise ValueError("cache key mismatch")
                new.load_state_dict(state["model"])
            except Exception:  # stale or damaged: train again and overwrite it
                pass
            else:
                new.eval()
                return TrainedModel(new, cfg, cfg.length, list(state["history"]),
                                    float(state["train_seconds"]), from_cache=True)
        new = copy.deepcopy(net).to(device)
        with cpu_threads(threads if device.type == "cpu" else None):
            history, seconds = _fine_tune(new, cfg, data, device, progress)
        if cache:
            atomic_save(
                {
                    "key": key, "format_version": FORMAT_VERSION,
                    "fine_tune": asdict(cfg), "history": history, "train_seconds": seconds,
                    "model": {k: v.detach().cpu() for k, v in new.state_dict().items()},
                },
                path,
            )  # fmt: skip
    return TrainedModel(new, cfg, cfg.length, history, seconds, from_cache=False)


def _fine_tune_setup(
    model, *, length, steps, task, batch_size, lr, warmup, min_lr_ratio, weight_decay, grad_clip,
    seed, corpus,
) -> tuple[FineTuneConfig, Tensor | None, str | None]:
    """Checked arguments of :func:`fine_tune`: its config, the training bytes, the corpus hash."""
    if not isinstance(task, str) or task not in ("lm", "passkey"):
        raise ValueError(f"task must be 'lm' or 'passkey', got {task!r}")
    length = check_int("length", length, minimum=2)
    if task == "passkey" and length + 1 < passkey_min_length():
        raise ValueError(
            f"length must be >= {passkey_min_length() - 1} for the passkey task, got {length}"
        )
    steps = check_int("steps", steps, minimum=1)
    if batch_size is None:
        tokens = 2048
        if isinstance(model, TrainedModel):
            tokens = model.config.batch_size * model.train_len
        batch_size = max(1, tokens // length)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    warmup = max(1, steps // 10) if warmup is None else check_int("warmup", warmup, minimum=0)
    cfg = FineTuneConfig(
        task=task, length=length, steps=steps, batch_size=batch_size,
        lr=check_float("lr", lr, positive=True), warmup=warmup,
        min_lr_ratio=check_float("min_lr_ratio", min_lr_ratio, minimum=0.0),
        weight_decay=check_float("weight_decay", weight_decay, minimum=0.0),
        grad_clip=check_float("grad_clip", grad_clip, minimum=0.0),
        seed=check_int("seed", seed, minimum=0),
    )  # fmt: skip
    if corpus is not None and not isinstance(corpus, Corpus):
        raise TypeError(f"corpus must be a Corpus or None, got {type(corpus).__name__}")
    if task != "lm":
        return cfg, None, None
    corpus = load_corpus() if corpus is None else corpus
    return cfg, corpus.train, corpus.sha256


def _fine_tune_key(net: TransformerLM, cfg: FineTuneConfig, corpus_sha: str | None) -> str:
    blob = {"start": fingerprint(net), "fine_tune": asdict(cfg), "corpus": corpus_sha}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _fine_tune(
    new: TransformerLM, cfg: FineTuneConfig, data: Tensor | None, device: torch.device, progress: bool
) -> tuple[list[float], float]:
    new.train()
    opt = make_optimizer(new, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    bar = None
    if progress:
        import sys

        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, desc=f"fine-tune {cfg.task} @ {cfg.length}", unit="step",
                   file=sys.stdout, leave=False)
    losses: list[Tensor] = []
    start = time.perf_counter()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        loss = _loss(new, cfg, step, data, gen, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(new.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(loss.detach())
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - start
    new.eval()
    return torch.stack(losses).float().cpu().tolist(), seconds


@torch.no_grad()
def passkey_grid(
    model: TrainedModel | TransformerLM,
    lengths: Sequence[int],
    depths: Sequence[float],
    *,
    num: int = 16,
    seed: int = 0,
    threads: int | None = 1,
    cache: bool = True,
) -> Tensor:
    """Passkey digit accuracy ``[len(depths), len(lengths)]`` (float, in ``[0, 1]``), ``num``
    examples per cell with the needle at each depth (0: start of the filler, 1: its end).

    Depth ``i`` uses the examples of seed ``seed + i`` at every length. ``threads``: CPU threads
    (``None``: torch's setting); one is often faster for a model this small, and never slower
    by much. With ``cache=True`` the grid is stored under :func:`~posenc.lab.cache.cache_dir`, keyed by
    the model's :func:`~posenc.lab.config.fingerprint` and the arguments."""
    net, _ = unwrap(model)
    for name, seq in (("lengths", lengths), ("depths", depths)):
        if isinstance(seq, (str, bytes, Tensor)) or not isinstance(seq, Sequence):
            raise TypeError(f"{name} must be a list of numbers, got {seq!r}")
    lengths = [check_int("lengths", n, minimum=passkey_min_length()) for n in lengths]
    depths = [check_float("depths", d, minimum=0.0) for d in depths]
    if any(d > 1 for d in depths):
        raise ValueError(f"depths must lie in [0, 1], got {depths}")
    if not lengths or not depths:
        raise ValueError("lengths and depths must each hold at least one value")
    num = check_int("num", num, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    path = key = None
    if cache:
        what = {"model": fingerprint(net), "lengths": lengths, "depths": depths, "num": num,
                "seed": seed, "format_version": FORMAT_VERSION}  # fmt: skip
        key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
        path = cache_dir() / f"passkey-{key[:24]}.pt"
        if path.is_file():
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
                if state["key"] == key:
                    return state["grid"].clone()
            except Exception:  # damaged: measure again
                pass
    out = torch.zeros(len(depths), len(lengths))  # [depths, lengths]
    cpu = next(net.parameters()).device.type == "cpu"
    with cpu_threads(threads if cpu else None):
        for j, n in enumerate(lengths):
            for i, d in enumerate(depths):
                out[i, j] = passkey_accuracy(net, n, num=num, seed=seed + i, depth=d)
    if path is not None:
        atomic_save({"key": key, "grid": out}, path)
    return out


# ------------------------------------------------------------- fine-tunes in parallel


def _fine_tune_job(job: dict, cache_path: str, threads: int | None) -> tuple[float, bool]:
    """In a worker process: fine-tune one job into the cache."""
    set_cache_dir(cache_path)
    r = fine_tune(**{**job, "progress": False, "cache": True, "threads": threads})
    return r.train_seconds, r.from_cache


def _is_cached(job: Mapping[str, Any]) -> bool:
    net, _ = unwrap(job["model"])
    args = {k: v for k, v in job.items() if k not in ("model", "device", "progress", "cache", "threads")}
    cfg, _, corpus_sha = _fine_tune_setup(job["model"], **{**_SETUP_DEFAULTS, **args})
    key = _fine_tune_key(net, cfg, corpus_sha)
    return (cache_dir() / f"ft-{cfg.task}-{cfg.length}-{key[:24]}.pt").is_file()


_SETUP_DEFAULTS = {
    "task": "lm", "batch_size": None, "lr": 1e-3, "warmup": None, "min_lr_ratio": 0.1,
    "weight_decay": 0.1, "grad_clip": 1.0, "seed": 0, "corpus": None,
}  # fine_tune's defaults, for the keys of jobs that leave them out  # fmt: skip


def fine_tune_many(
    jobs: Sequence[Mapping], *, workers: int | None = None, threads: int | None = 1
) -> list[TrainedModel]:
    """:func:`fine_tune` for each job (a dict of its keyword arguments, ``model`` included), in
    order; the ones not cached yet train at once in ``workers`` spawned processes (CPU only;
    ``None``: one per core, at most 8), ``threads`` threads each, so the results equal one-by-one
    calls. Scripts that call this need the ``if __name__ == "__main__":`` guard (notebooks do not).
    """
    if isinstance(jobs, Mapping) or not isinstance(jobs, Sequence):
        raise TypeError(f"jobs must be a list of dicts of fine_tune arguments, got {type(jobs).__name__}")
    allowed = set(inspect.signature(fine_tune).parameters)
    for i, job in enumerate(jobs):
        if not isinstance(job, Mapping):
            raise TypeError(f"jobs[{i}] must be a dict of fine_tune arguments, got {type(job).__name__}")
        unknown = sorted(set(job) - allowed)
        if unknown or "model" not in job:
            raise ValueError(f"jobs[{i}]: unknown fine_tune arguments {unknown} or no 'model'; "
                             f"allowed: {sorted(allowed)}")
        if job.get("cache", True) is False:
            raise ValueError(f"jobs[{i}]: cache=False cannot run in parallel (results come via the cache)")
    if threads is not None:
        check_int("threads", threads, minimum=1)
    todo = [dict(job) for job in jobs
            if resolve_device(job.get("device")).type == "cpu" and not _is_cached(job)]
    if workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        workers = max(1, min(8, cores // (threads or cores)))
    workers = min(check_int("workers", workers, minimum=1), max(1, len(todo)))
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            for f in [pool.submit(_fine_tune_job, job, str(cache_dir()), threads) for job in todo]:
                f.result()
    return [fine_tune(**{"threads": threads, **job}) for job in jobs]
