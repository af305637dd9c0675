"""posenc.lab: the book's laboratory -- a tiny byte-level language model, its corpus, training,
evaluation, the extrapolation and long-context experiments, the command line and the figure style.

Not needed to use positional encodings: ``import posenc`` never imports this package.
"""

from . import plot
from .cache import cache_dir, set_cache_dir
from .config import TrainConfig
from .data import Corpus, load_corpus, make_passkey
from .evaluate import EvalResult, evaluate
from .experiment import Extrapolation, run_extrapolation
from .long_context import (
    FineTuneConfig,
    fine_tune,
    passkey_grid,
    rope_scaling_config,
    with_rope_scaling,
    yarn_betas,
)
from .model import ModelConfig, TransformerLM
from .train import TrainedModel, build_model, train_model

__all__ = [
    "Corpus",
    "EvalResult",
    "Extrapolation",
    "FineTuneConfig",
    "ModelConfig",
    "TrainConfig",
    "TrainedModel",
    "TransformerLM",
    "build_model",
    "cache_dir",
    "evaluate",
    "fine_tune",
    "load_corpus",
    "make_passkey",
    "passkey_grid",
    "plot",
    "rope_scaling_config",
    "run_extrapolation",
    "set_cache_dir",
    "train_model",
    "with_rope_scaling",
    "yarn_betas",
]
