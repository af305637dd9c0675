"""posenc.lab: the book's laboratory -- a tiny byte-level language model, its corpus, training,
evaluation, the extrapolation and long-context experiments, the command line and the figure style.

Not needed to use positional encodings: ``import posenc`` never imports this package. Its own
needs are the ``lab`` extra (``pip install 'posenc[lab]'``: tqdm, filelock, platformdirs), its
figures the ``plot`` extra (matplotlib, imported only when a figure is drawn).
"""

import importlib.util as _util

_LAB_NEEDS = ("tqdm", "filelock", "platformdirs")  # pyproject.toml's `lab` extra
_missing = [name for name in _LAB_NEEDS if _util.find_spec(name) is None]
if _missing:
    raise ImportError(
        f"posenc.lab needs {', '.join(_missing)}, which {'is' if len(_missing) == 1 else 'are'} not "
        "installed: pip install 'posenc[lab]' (and 'posenc[lab,plot]' for the figures)",
        name=_missing[0],
    )
del _util, _missing

from . import plot  # noqa: E402
from .cache import cache_dir, set_cache_dir
from .config import TrainConfig
from .data import Corpus, load_corpus, make_passkey
from .evaluate import EvalResult, evaluate
from .experiment import Extrapolation, run_extrapolation
from .long_context import (
    FineTuneConfig,
    fine_tune,
    fine_tune_many,
    passkey_grid,
    rope_scaling_config,
    with_rope_scaling,
    yarn_betas,
)
from .model import ModelConfig, TransformerLM
from .serving import (
    PagedKVCache,
    attend_sharded,
    kvcache_step_reference,
    merge_partials,
    paged_attend,
    partial_attention,
    rebase_cache,
    shift_rotated_keys,
    tree_positions_and_mask,
)
from .train import TrainedModel, build_model, train_model

__all__ = [
    "Corpus",
    "EvalResult",
    "Extrapolation",
    "FineTuneConfig",
    "ModelConfig",
    "PagedKVCache",
    "TrainConfig",
    "TrainedModel",
    "TransformerLM",
    "attend_sharded",
    "build_model",
    "cache_dir",
    "evaluate",
    "fine_tune",
    "fine_tune_many",
    "kvcache_step_reference",
    "load_corpus",
    "make_passkey",
    "merge_partials",
    "paged_attend",
    "partial_attention",
    "passkey_grid",
    "plot",
    "rebase_cache",
    "rope_scaling_config",
    "run_extrapolation",
    "set_cache_dir",
    "shift_rotated_keys",
    "train_model",
    "tree_positions_and_mask",
    "with_rope_scaling",
    "yarn_betas",
]
