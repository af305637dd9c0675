"""Evaluating a lab model at several lengths, and the cache of those evaluations.

:func:`evaluate` gives, for each evaluation length, the mean loss over all positions, the mean
loss over positions past the training length, and the loss at every position (the measurement
of Press et al., 2022, "Train Short, Test Long"). :func:`passkey_accuracy` scores the passkey task
(Mohtashami & Jaggi, 2023).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_float, check_int
from .cache import FORMAT_VERSION, atomic_save, cache_dir
from .config import TrainConfig, fingerprint
from .data import Corpus, eval_chunks, passkey_batch
from .train import TrainedModel, cpu_threads, unwrap


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

    def __post_init__(self) -> None:
        check_int("length", self.length, minimum=1)
        check_int("train_len", self.train_len, minimum=1)
        if not isinstance(self.per_position, Tensor) or self.per_position.shape != (self.length,):
            raise ValueError(
                f"per_position must be a tensor of shape ({self.length},), got {self.per_position!r:.60}"
            )


def _check_data(data) -> Tensor:
    if not isinstance(data, Tensor):
        raise TypeError(
            f"data must be a 1-D torch.Tensor of byte ids (e.g. corpus.val), got {type(data).__name__}"
        )
    if data.dim() != 1 or data.dtype.is_floating_point or data.dtype == torch.bool:
        raise ValueError(f"data must be a 1-D integer tensor, got shape {tuple(data.shape)} and {data.dtype}")
    return data


def _check_lengths(lengths) -> list[int]:
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise TypeError(f"lengths must be a list of ints, got {lengths!r}")
    lengths = [check_int("length", n, minimum=1) for n in lengths]
    if not lengths:
        raise ValueError("lengths must hold at least one length, got []")
    return lengths


@torch.no_grad()
def evaluate(
    model: TrainedModel | torch.nn.Module,
    data: Tensor,
    lengths: Iterable[int],
    *,
    train_len: int | None = None,
    num_tokens: int = 32768,
    batch_tokens: int = 8192,
    threads: int | None = 1,
    cache: bool = True,
) -> dict[int, EvalResult]:
    """Evaluate ``model`` on ``data`` (a 1-D byte tensor, e.g. ``corpus.val``) at each length.

    ``model`` is a :class:`~posenc.lab.train.TrainedModel` (``train_len`` defaults to its own) or a bare
    ``TransformerLM`` (then ``train_len`` is required). The text is ``num_tokens // max(lengths)``
    segments of ``max(lengths)`` bytes spread evenly over ``data`` (see
    :func:`~posenc.lab.data.eval_chunks`); at each length they are cut into non-overlapping
    windows, so every length sees the same text. Windows are evaluated ``batch_tokens`` at a time
    under ``torch.no_grad()``; ``threads`` as in :func:`~posenc.lab.train.train_model`.

    With ``cache=True`` the results are stored under :func:`~posenc.lab.cache.cache_dir`, keyed by the
    model's fingerprint (weights, config, RoPE scaling), the data's SHA-256 and the arguments, so
    a second call with the same model and arguments reads them back instead of evaluating.
    """
    net, train_len = unwrap(model, train_len, need_train_len=True)
    data = _check_data(data)
    lengths = _check_lengths(lengths)
    num_tokens = check_int("num_tokens", num_tokens, minimum=1)
    batch_tokens = check_int("batch_tokens", batch_tokens, minimum=1)
    block = max(lengths)
    device = next(net.parameters()).device
    path = None
    if cache:
        what = {"model": fingerprint(net), "data": _sha256(data), "lengths": lengths,
                "train_len": train_len, "num_tokens": num_tokens, "batch_tokens": batch_tokens,
                "format_version": FORMAT_VERSION}  # fmt: skip
        key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
        path = cache_dir() / f"evalm-{key[:24]}.pt"
        found = _load_results(path, key, lengths)
        if found is not None:
            return found
    with cpu_threads(threads if device.type == "cpu" else None):
        out = _evaluate(net, data, lengths, train_len, num_tokens, batch_tokens, block, device)
    if path is not None:
        atomic_save({"key": key, "results": _results_state(out)}, path)
    return out


def _sha256(data: Tensor) -> str:
    return hashlib.sha256(data.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def _results_state(results: dict[int, EvalResult]) -> dict:
    return {
        str(n): {"loss": r.loss, "tail_loss": r.tail_loss, "per_position": r.per_position,
                 "num_windows": r.num_windows, "train_len": r.train_len}
        for n, r in results.items()
    }  # fmt: skip


def _load_results(path: Path, key: str, lengths: list[int]) -> dict[int, EvalResult] | None:
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state["key"] != key:
            return None
        return {n: EvalResult(length=n, **state["results"][str(n)]) for n in lengths}
    except Exception:  # damaged or from another version: evaluate again
        return None


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
    model: TrainedModel | torch.nn.Module, length: int, *, num: int = 32, seed: int = 0,
    depth: float | None = None,
) -> float:
    """Fraction of passkey digits the model predicts (argmax, teacher forced) at ``length``."""
    net, _ = unwrap(model)
    if depth is not None:
        check_float("depth", depth, minimum=0.0)
    tokens, mask, _ = passkey_batch(num, length, seed=seed, depth=depth)  # [B, L]
    device = next(net.parameters()).device
    tokens = tokens.to(device)
    pred = net(tokens[:, :-1]).argmax(-1)  # [B, L-1]
    target = tokens[:, 1:]
    m = mask[:, :-1].to(device)
    return float((pred == target)[m].float().mean())


# ------------------------------------------------------------------ the evaluation cache


def eval_path(cfg: TrainConfig, corpus: Corpus, lengths: list[int], num_tokens: int) -> Path:
    """The cache file of ``cfg``'s model evaluated at ``lengths`` with ``num_tokens``."""
    what = json.dumps([cfg.key(corpus.sha256), lengths, num_tokens, FORMAT_VERSION])
    return cache_dir() / f"eval-{cfg.scheme_label}-{hashlib.sha256(what.encode()).hexdigest()[:24]}.pt"


def save_evals(cfg, corpus, lengths, num_tokens, results: dict[int, EvalResult], seconds: float) -> None:
    state = {
        "key": cfg.key(corpus.sha256), "train_seconds": float(seconds),
        "results": {
            str(n): {"loss": r.loss, "tail_loss": r.tail_loss, "per_position": r.per_position,
                     "num_windows": r.num_windows, "train_len": r.train_len}
            for n, r in results.items()
        },
    }  # fmt: skip
    atomic_save(state, eval_path(cfg, corpus, lengths, num_tokens))


def load_evals(cfg, corpus, lengths, num_tokens) -> tuple[dict[int, EvalResult], float] | None:
    path = eval_path(cfg, corpus, lengths, num_tokens)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state["key"] != cfg.key(corpus.sha256):
            return None
        results = {n: EvalResult(length=n, **state["results"][str(n)]) for n in lengths}
        return results, float(state["train_seconds"])
    except Exception:  # damaged or from another version: evaluate again
        return None
