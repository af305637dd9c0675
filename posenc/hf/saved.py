"""A swapped scheme across ``save_pretrained`` and ``from_pretrained``: what
:func:`~posenc.hf.use` records in a model's config (``config.posenc``), the refusal of a model
whose config records a scheme its layers do not run, and the learned weights (T5's bias) a
reloaded model gets back from its checkpoint when ``use`` is called again.

transformers loads only the weights of the modules a fresh model has; ``model.posenc_scheme``
is added by ``use`` after loading, so ``from_pretrained`` drops its saved weights. ``use``
reads them back from the checkpoint the config was loaded from (``config.name_or_path``: a
local directory or a Hub snapshot already in the local cache; safetensors, one file or
sharded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from .._checks import warn_caller

SAVED = "posenc"
"""The config attribute where :func:`use` records a swapped scheme (``config.posenc``), so that
``save_pretrained`` writes it to ``config.json`` and a reloaded model can say which scheme its
weights were trained with."""
PREFIX = "posenc_scheme."
"""The checkpoint keys of the scheme's weights (``model.posenc_scheme``'s state dict)."""


class Recorded(dict):
    """``config.posenc`` as :func:`~posenc.hf.use` wrote it in this process; a model loaded
    by ``from_pretrained`` holds a plain ``dict`` (read from ``config.json``)."""


def recorded_call(saved: dict[str, Any]) -> str:
    """The ``posenc.hf.use(...)`` call that rebuilds the scheme ``saved`` records."""
    name, options = saved.get("scheme"), saved.get("options") or {}
    if saved.get("instance"):
        return f"posenc.hf.use(model, <the {name!r} PositionScheme you built>)"
    args = "".join(f", {k}={v!r}" for k, v in options.items())
    backend = saved.get("backend", "sdpa")
    args += "" if backend == "sdpa" else f", backend={backend!r}"
    return f"posenc.hf.use(model, {name!r}{args})"


def unswapped_error(saved: dict[str, Any]) -> ValueError:
    """A layer ``use`` never set up, whose config records a swapped scheme: reloaded from a
    checkpoint (a plain dict), or sharing a config that ``use`` switched on another model."""
    name, call = saved.get("scheme"), recorded_call(saved)
    if isinstance(saved, Recorded):
        return ValueError(
            f"this model's config records posenc's {name!r} scheme (config.posenc = "
            f"{dict(saved)!r}), set by posenc.hf.use on another model that shares this config "
            "object (or whose config this one copies), but use() never set up this model's "
            "layers: they would run the model's own RoPE. Give each model its own config "
            f"(e.g. LlamaForCausalLM(copy.deepcopy(config))), or call {call} on this model too"
        )
    return ValueError(
        f"this model's config says its weights run with posenc's {name!r} scheme "
        f"(config.posenc = {saved!r}, written by posenc.hf.use before save_pretrained), but "
        f"after loading its rotary embedding is the model's own RoPE again: call {call} "
        "once after from_pretrained (posenc.hf.use(model) instead keeps the model's RoPE "
        "and clears config.posenc)"
    )


def restore_saved_weights(model: nn.Module, saved: dict[str, Any]) -> None:
    """Load ``model.posenc_scheme``'s learned weights (T5's bias) from the checkpoint the
    model's config was loaded from; warn at the caller's line with the loading call where they
    cannot be found (the scheme would start fresh: other logits than the saved model's)."""
    module = model._modules.get("posenc_scheme")
    names = [] if module is None else list(module.state_dict())
    if not names:
        return  # ALiBi, RoPE, NoPE: nothing learned
    where = str(getattr(getattr(model, "config", None), "_name_or_path", "") or "")
    found = _saved_tensors(where, [PREFIX + n for n in names])
    if found is not None:
        assert module is not None
        module.load_state_dict({k[len(PREFIX):]: v for k, v in found.items()})
        return
    warn_caller(
        f"this model's config records posenc's {saved.get('scheme')!r} scheme, whose weights "
        f"are learned, but its checkpoint ({where or 'unknown: config.name_or_path is empty'}) "
        f"has no {PREFIX}* weights posenc can read (a local directory or a cached Hub "
        "snapshot, safetensors): the scheme starts fresh, and the logits differ from the saved "
        "model's. Load them after use(): from safetensors.torch import load_file; "
        f"model.load_state_dict({{k: v for k, v in load_file('<checkpoint>/model.safetensors')"
        f".items() if k.startswith('{PREFIX}')}}, strict=False)"
    )


def _saved_tensors(where: str, keys: list[str]) -> dict[str, Tensor] | None:
    """``keys`` read from the safetensors checkpoint at ``where`` (None: not all found)."""
    if not where:
        return None
    index = _checkpoint_file(where, "model.safetensors.index.json")
    if index is not None:
        weight_map = json.loads(Path(index).read_text()).get("weight_map", {})
        if not all(k in weight_map for k in keys):
            return None
        files = {k: _checkpoint_file(where, weight_map[k]) for k in keys}
    else:
        single = _checkpoint_file(where, "model.safetensors")
        files = {k: single for k in keys}
    if any(f is None for f in files.values()):
        return None
    from safetensors import safe_open  # a transformers dependency

    found: dict[str, Tensor] = {}
    for key, file in files.items():
        with safe_open(str(file), framework="pt") as f:
            if key not in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                return None
            found[key] = f.get_tensor(key)
    return found


def _checkpoint_file(where: str, name: str) -> str | None:
    """``name`` inside the checkpoint ``where``: a local directory, or a Hub repository whose
    snapshot is in the local cache (never downloaded here)."""
    local = Path(where) / name
    if Path(where).is_dir():
        return str(local) if local.is_file() else None
    try:
        from transformers.utils.hub import cached_file

        return cached_file(where, name, local_files_only=True,
                           _raise_exceptions_for_missing_entries=False,
                           _raise_exceptions_for_connection_errors=False)
    except (OSError, ValueError):
        return None
