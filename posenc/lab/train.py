"""Training the lab's tiny language model: seeded, on any device, cached.

:func:`train_model` trains a :class:`~posenc.lab.model.TransformerLM` on the byte corpus (AdamW,
linear warm-up then cosine decay, gradient clipping; the recipe of nanoGPT, Karpathy 2022) or
loads it from the cache, and returns a :class:`TrainedModel`. The cache key hashes the full
config, the corpus SHA-256 and ``FORMAT_VERSION``; a file lock keeps two processes from training
the same model at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .._checks import check_int
from ..device import default_device
from .cache import FORMAT_VERSION, atomic_save, locked
from .config import FineTuneConfig, TrainConfig
from .data import Corpus, load_corpus, random_windows
from .model import TransformerLM


@dataclass(frozen=True, eq=False)
class TrainedModel:
    """What :func:`train_model` and :func:`~posenc.lab.long_context.fine_tune` return.

    ``model``: the network, in eval mode; ``config``: the :class:`~posenc.lab.config.TrainConfig` (or
    :class:`~posenc.lab.config.FineTuneConfig`) it was trained with; ``train_len``: the sequence length
    it last trained on (the fine-tuning length for a fine-tuned model); ``history``: the training
    loss at every step (nats per byte); ``train_seconds``: training time (of the run that filled
    the cache, when loaded); ``from_cache``: whether the weights came from the cache.
    """

    model: TransformerLM
    config: TrainConfig | FineTuneConfig
    train_len: int
    history: list[float] = field(repr=False)
    train_seconds: float
    from_cache: bool

    def __post_init__(self) -> None:
        if not isinstance(self.model, TransformerLM):
            raise TypeError(f"model must be a TransformerLM, got {type(self.model).__name__}")
        check_int("train_len", self.train_len, minimum=1)
        if not isinstance(self.history, list):
            raise TypeError(f"history must be a list of floats, got {type(self.history).__name__}")


def unwrap(model, train_len: int | None = None, *, need_train_len: bool = False,
           name: str = "model") -> tuple[TransformerLM, int | None]:
    """``(network, train_len)`` from a :class:`TrainedModel` or a bare ``TransformerLM``.

    An explicit ``train_len`` wins; a bare model without one raises ``ValueError`` when
    ``need_train_len``."""
    if isinstance(model, TrainedModel):
        net, train_len = model.model, model.train_len if train_len is None else train_len
    elif isinstance(model, TransformerLM):
        net = model
    else:
        raise TypeError(f"{name} must be a TrainedModel or a TransformerLM, got {type(model).__name__}")
    if train_len is not None:
        train_len = check_int("train_len", train_len, minimum=1)
    elif need_train_len:
        raise ValueError(
            "train_len is needed for a bare TransformerLM (got train_len=None); pass train_len=... "
            "or the TrainedModel that train_model returned"
        )
    return net, train_len


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up over ``config.warmup`` steps, then cosine to ``lr * min_lr_ratio``."""
    step = check_int("step", step, minimum=0)
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    span = max(1, config.steps - config.warmup)
    t = min(1.0, (step - config.warmup) / span)
    lo = config.lr * config.min_lr_ratio
    return lo + 0.5 * (config.lr - lo) * (1 + math.cos(math.pi * t))


def make_optimizer(model: TransformerLM, config: TrainConfig | FineTuneConfig) -> torch.optim.Optimizer:
    """AdamW (betas 0.9, 0.95) at ``config.lr`` with ``config.weight_decay`` on the blocks'
    matrices only; used for training (:class:`~posenc.lab.config.TrainConfig`) and fine-tuning
    (:class:`~posenc.lab.config.FineTuneConfig`) alike."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        in_block = name.startswith("blocks.") and ".scheme." not in name
        (decay if in_block and p.dim() == 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))


def resolve_device(device: torch.device | str | None) -> torch.device:
    """``None`` or ``"auto"``: :func:`~posenc.device.default_device`; else the device, checked."""
    if device is None or device == "auto":
        return default_device()
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device {device!r} is not a device; try 'auto', 'cpu', 'cuda' or 'mps'") from None
    ok = {"cpu": True, "cuda": torch.cuda.is_available(),
          "mps": getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()}
    if not ok.get(dev.type, False):
        raise ValueError(f"device {device!r} is not available here; try 'auto' or 'cpu'")
    return dev


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
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
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
) -> TrainedModel:
    """Train (or load from the cache) the model ``config`` describes; a :class:`TrainedModel`
    whose network is in eval mode, on ``device``.

    ``progress`` shows a tqdm bar; ``cache=False`` neither reads nor writes the cache;
    ``retrain=True`` ignores a cached copy. The data order depends on ``config.seed`` only, so
    every scheme with the same seed sees the same batches.

    ``threads`` is the number of CPU threads while training (``None``: torch's setting). The
    default, 1, makes a CPU run independent of the machine's core count (more threads change
    the order of float additions), and models this small gain little from more threads; on a
    busy machine, OpenMP threads that wait for each other can even make a 2-thread run many
    times slower than a 1-thread one.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if corpus is not None and not isinstance(corpus, Corpus):
        raise TypeError(f"corpus must be a Corpus or None, got {type(corpus).__name__}")
    if threads is not None:
        check_int("threads", threads, minimum=1)
    corpus = load_corpus() if corpus is None else corpus
    device = resolve_device(device)
    path = config.cache_path(corpus.sha256)
    with locked(path, enabled=cache):  # a second process waits here, then loads what the first wrote
        if cache and not retrain:
            found = _load(config, corpus, path, device)
            if found is not None:
                return found
        model = build_model(config)
        with cpu_threads(threads if device.type == "cpu" else None):
            history, seconds = _train(model, config, corpus, device, progress)
        if cache:
            state = {
                "key": config.key(corpus.sha256), "format_version": FORMAT_VERSION,
                "config": config.to_dict(), "corpus_sha256": corpus.sha256, "history": history,
                "train_seconds": seconds,
                "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            }  # fmt: skip
            atomic_save(state, path)
    return TrainedModel(model, config, config.train_len, history, seconds, from_cache=False)


def _load(config: TrainConfig, corpus: Corpus, path, device: torch.device) -> TrainedModel | None:
    if not path.is_file():
        return None
    model = build_model(config)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("key") != config.key(corpus.sha256):
            raise ValueError("cache key mismatch")
        model.load_state_dict(state["model"])
    except Exception:  # a stale or damaged file: train again (from scratch) and overwrite it
        return None
    model.to(device).eval()
    return TrainedModel(model, config, config.train_len, list(state["history"]),
                        float(state["train_seconds"]), from_cache=True)


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
        x, y = random_windows(data, config.batch_size, config.train_len, generator=gen)  # [B, L]
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

    label = getattr(config, "scheme_label", config.scheme)  # per-layer lists: "rope+nope"
    return tqdm(total=config.steps, desc=f"{label:>10} seed {config.seed}", leave=False, unit="step")
