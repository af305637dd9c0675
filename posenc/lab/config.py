"""What determines a trained model of the lab: :class:`TrainConfig`, the chapter's "full" setting,
and what fine-tuning shares with training and evaluation (:class:`FineTuneConfig`,
:func:`fingerprint`).

The lab's modules import one way: ``cache`` <- ``config`` <- ``train`` <- ``evaluate`` <-
``long_context`` and ``experiment``; what several of them need lives here or in ``cache``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .._checks import check_float, check_int
from ..schemes import SCHEMES, RoPE
from .cache import FINE_TUNE_FORMAT_VERSION, FORMAT_VERSION, cache_dir
from .model import ModelConfig, TransformerLM, check_layer_schemes, scheme_kwargs


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a trained model. The defaults are the chapter's.

    ``max_len`` is the number of rows of the learned absolute table (``None``: 16 x
    ``train_len``); only the first ``train_len`` rows are ever trained, the rest keep their
    initial values -- that is what testing a learned table on longer inputs means. Other
    schemes ignore it. ``scheme_options`` are keyword arguments for the scheme on top of the
    fair defaults of :func:`~posenc.lab.model.scheme_kwargs` (e.g. ``{"scale": True}`` for
    sinusoidal, ``{"base": 500000.0}`` for RoPE). ``scheme`` may be a list with one name per
    layer (e.g. ``["rope", "rope", "rope", "nope"]``, iRoPE); ``scheme_options`` then maps a
    name to its options, e.g. ``{"nope": {"floor_scale": 32, "attn_scale": 0.1}}`` for Llama 4's
    attention temperature in the NoPE layers. ``warmup`` is a number of steps; the
    learning rate then follows a cosine from ``lr`` down to ``lr * min_lr_ratio``. Weight
    decay applies to the blocks' matrices only (not to embeddings, position parameters, norms
    or biases).
    """

    scheme: str | tuple[str, ...] = "alibi"
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
        if isinstance(self.scheme, list | tuple):
            check_int("num_layers", self.num_layers, minimum=1)
            object.__setattr__(self, "scheme", check_layer_schemes(self.scheme, self.num_layers))
        elif not isinstance(self.scheme, str) or self.scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}: scheme must be one of {', '.join(SCHEMES)}")
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
        if not isinstance(self.scheme, str):
            opts = self.scheme_options.items()
            bad = {k: v for k, v in opts if k not in self.scheme or not isinstance(v, dict)}
            if bad:
                raise ValueError(
                    f"with a per-layer scheme list, scheme_options maps a scheme of the list to a dict "
                    f"of its options, e.g. {{'nope': {{'floor_scale': 32}}}}; got {bad}"
                )

    @property
    def table_len(self) -> int:
        """Rows of the learned absolute table."""
        return self.max_len if self.max_len is not None else 16 * self.train_len

    @property
    def scheme_label(self) -> str:
        """The scheme's name, or the per-layer names joined by ``+`` (for file names and logs)."""
        return self.scheme if isinstance(self.scheme, str) else "+".join(self.scheme)

    def model_config(self) -> ModelConfig:
        if isinstance(self.scheme, str):
            kwargs = {**scheme_kwargs(self.scheme, train_len=self.train_len), **self.scheme_options}
        else:
            kwargs = {n: {**scheme_kwargs(n, train_len=self.train_len), **self.scheme_options.get(n, {})}
                      for n in dict.fromkeys(self.scheme)}
        return ModelConfig(
            scheme=self.scheme, dim=self.dim, num_layers=self.num_layers, num_heads=self.num_heads,
            mlp_ratio=self.mlp_ratio, vocab_size=256,
            max_len=self.table_len if self.scheme == "learned" else None,
            scheme_kwargs=kwargs,
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

    def cache_path(self, corpus_sha256: str) -> Path:
        """The file that holds this model's weights for that corpus."""
        return cache_dir() / f"lm-{self.scheme_label}-{self.key(corpus_sha256)[:24]}.pt"


def full_config(scheme: str = "alibi", *, seed: int = 0, **overrides) -> TrainConfig:
    """The chapter's "full" setting (off by default, run with seeds 0, 1, 2): twice the width,
    three layers, 8 heads, twice the steps. About 7 minutes per model on one CPU core, so about
    70 minutes for 6 schemes x 3 seeds on a 2-core CPU. ``overrides``: other TrainConfig fields."""
    unknown = sorted(set(overrides) - {f for f in TrainConfig.__dataclass_fields__})
    if unknown:
        raise TypeError(f"full_config got unknown keyword arguments {unknown}; allowed: TrainConfig's fields")
    base = {"dim": 128, "num_layers": 3, "num_heads": 8, "steps": 2000, "lr": 5e-3, "warmup": 150}
    return TrainConfig(scheme=scheme, seed=seed, **{**base, **overrides})


# ------------------------------------------------- shared with fine-tuning and evaluation


def rope_modules(model: torch.nn.Module) -> list[RoPE]:
    """The distinct RoPE schemes inside ``model`` (a TransformerLM shares one across blocks)."""
    seen, out = set(), []
    for m in model.modules():
        if isinstance(m, RoPE) and id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


@dataclass(frozen=True)
class FineTuneConfig:
    """What :func:`~posenc.lab.long_context.fine_tune` did: the task, the sequence length,
    steps, batch and schedule."""

    task: str
    length: int
    steps: int
    batch_size: int
    lr: float
    warmup: int
    min_lr_ratio: float
    weight_decay: float
    grad_clip: float
    seed: int

    def __post_init__(self) -> None:
        if self.task not in ("lm", "passkey"):
            raise ValueError(f"task must be 'lm' or 'passkey', got {self.task!r}")
        for name in ("length", "steps", "batch_size"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("warmup", self.warmup, minimum=0)
        check_int("seed", self.seed, minimum=0)
        check_float("lr", self.lr, positive=True)

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine to ``lr * min_lr_ratio`` (as :func:`posenc.lab.train.lr_at`)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        t = min(1.0, (step - self.warmup) / max(1, self.steps - self.warmup))
        lo = self.lr * self.min_lr_ratio
        return lo + 0.5 * (self.lr - lo) * (1 + math.cos(math.pi * t))


def fingerprint(model: TransformerLM) -> str:
    """SHA-256 of the weights, the model config and every RoPE scaling inside the model."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        buf = io.BytesIO()
        torch.save(t.detach().cpu().contiguous(), buf)
        h.update(name.encode() + b"\0" + hashlib.sha256(buf.getvalue()).digest())
    meta = {
        "model": model.config.to_dict(),
        "rope": [r.rotary.scaling for r in rope_modules(model)],
        "format_version": FINE_TUNE_FORMAT_VERSION,
    }
    h.update(json.dumps(meta, sort_keys=True, default=str).encode())
    return h.hexdigest()
