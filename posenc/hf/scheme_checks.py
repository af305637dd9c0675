"""The integrations layer: the checks :func:`posenc.hf.use` runs on the scheme it is given.

A ready scheme must fit the model (heads, head_dim; RoPE's layout and frequencies are the
config's or said), a named ``"rope"`` with a layout other than the config's is said, options
are compared with their defaults filled in (``num_buckets=32`` is T5's default, so the
trained bias in force is kept), and a ``use`` call that drops a scheme holding learned
parameters says so at the caller's line.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from .._checks import warn_caller
from ..rope import RotaryEmbedding
from ..rope_config import rotary_kwargs_from_hf_config
from ..schemes import PositionScheme
from ..t5 import T5RelativeBias

_CONSTRUCTORS: dict[str, Any] = {"t5": T5RelativeBias}
"""The constructor whose keyword defaults a named scheme's options take (``T5Bias`` passes its
options on to ``T5RelativeBias``); ``"rope"``'s one option defaults to the config's layout."""


def filled_options(name: object, options: dict[str, Any] | None, config: Any) -> dict[str, Any]:
    """``options`` of ``use(model, name, **options)`` with every default filled in: the
    constructor's keyword defaults, the config's layout for ``"rope"`` (``interleaved``)."""
    out: dict[str, Any] = {}
    target = _CONSTRUCTORS.get(name) if isinstance(name, str) else None
    if target is not None:
        for key, p in inspect.signature(target).parameters.items():
            if p.kind is p.KEYWORD_ONLY and p.default is not p.empty:
                out[key] = p.default
    if name == "rope":
        try:
            out["interleaved"] = rotary_kwargs_from_hf_config(config)["interleaved"]
        except (TypeError, ValueError, KeyError):
            pass
    return {**out, **(options or {})}


def warn_dropped(held: list[PositionScheme], kept: list[PositionScheme]) -> None:
    """Say so when the schemes in force (``held``) that hold learned parameters are not among
    those ``use`` puts in place (``kept``): their weights are gone."""
    for scheme in held:
        n = sum(p.numel() for p in scheme.parameters())
        if n and all(scheme is not k for k in kept):
            warn_caller(
                f"posenc.hf.use replaces the model's scheme {scheme.name!r} "
                f"(model.posenc_scheme), which holds {n} learned parameters: they are "
                f"discarded, and a later posenc.hf.use(model, {scheme.name!r}) starts from a "
                "fresh table; to keep them, save model.posenc_scheme.state_dict() before "
                "switching and load_state_dict it back after switching back"
            )
            return


def _layout(interleaved: bool) -> str:
    return "interleaved" if interleaved else "half-split"


def warn_named_layout(options: dict[str, Any], config: Any) -> None:
    """``use(model, "rope", interleaved=...)`` against the layout the config implies."""
    given = options.get("interleaved")
    if not isinstance(given, bool):
        return
    try:
        wanted = rotary_kwargs_from_hf_config(config)["interleaved"]
    except (TypeError, ValueError, KeyError):  # a config without RoPE settings
        return
    if given != wanted:
        warn_caller(
            f"scheme 'rope' with interleaved={given} rotates {_layout(given)} pairs, but this "
            f"model's own RoPE rotates {_layout(wanted)} ones (its q/k weights expect that "
            f"layout): leave interleaved out (the config's layout) or pass "
            f"interleaved={wanted}"
        )


def check_instance(scheme: PositionScheme, config: Any) -> None:
    """A ready scheme must fit the model: one bias per head, RoPE over the head dimension
    (refused otherwise); RoPE's layout and frequencies are the config's (said otherwise)."""
    heads = getattr(config, "num_attention_heads", None)
    own = getattr(scheme, "num_heads", None)
    if isinstance(own, int) and isinstance(heads, int) and own != heads:
        raise ValueError(
            f"scheme {scheme.name!r} has a bias for num_heads={own}, but the model has "
            f"num_attention_heads={heads}; build it with num_heads={heads}"
        )
    rotary = getattr(scheme, "rotary", None)
    if not isinstance(rotary, RotaryEmbedding):
        return
    try:  # the config's own RoPE: its head_dim and pair layout
        want = rotary_kwargs_from_hf_config(config)
    except (TypeError, ValueError, KeyError):  # a config without RoPE settings
        return
    if rotary.head_dim != want["head_dim"]:
        raise ValueError(
            f"scheme 'rope' rotates head_dim={rotary.head_dim}, but the model's heads have "
            f"head_dim={want['head_dim']}; build it with RoPE({want['head_dim']}, ...) (or "
            "scheme='rope' to read the config)"
        )
    layout, wanted = rotary.interleaved, want["interleaved"]
    if layout != wanted:
        warn_caller(
            f"scheme 'rope' rotates {_layout(layout)} pairs, but this model's own RoPE "
            f"rotates {_layout(wanted)} ones (its q/k weights expect that layout): pass "
            f"RoPE(..., interleaved={wanted}) or scheme='rope' to read the config"
        )
    _check_frequencies(rotary, want)


def _check_frequencies(rotary: RotaryEmbedding, want: dict[str, Any]) -> None:
    """The instance's frequencies (and attention factor) against the config's RoPE."""
    try:
        config_rope = RotaryEmbedding(**want)
    except (TypeError, ValueError, KeyError):  # settings posenc cannot build: nothing to compare
        return
    ours, theirs = rotary.inv_freq.detach().cpu(), config_rope.inv_freq
    same = ours.shape == theirs.shape and bool(torch.allclose(ours.float(), theirs.float(),
                                                              rtol=1e-5, atol=0.0))
    if same and abs(rotary.attention_factor - config_rope.attention_factor) <= 1e-6:
        return
    scaling = want.get("scaling")
    warn_caller(
        f"scheme 'rope' rotates with base={rotary.base}, rope_type={rotary.rope_type!r}, "
        f"attention_factor={rotary.attention_factor}, but this model's own RoPE uses "
        f"base={want['base']} (config rope_theta), scaling={scaling!r}, "
        f"attention_factor={config_rope.attention_factor}: its frequencies differ from those "
        "the q/k weights were trained with; call posenc.hf.use(model, 'rope') to read them "
        f"from the config (or build RoPE({want['head_dim']}, base={want['base']}, "
        f"scaling=..., interleaved={want['interleaved']}) with the config's values)"
    )


def held_schemes(layers: list[tuple[int, nn.Module]], key: str) -> list[PositionScheme]:
    """The distinct schemes ``use`` put in force on these layers (``key``: the layer's slot)."""
    out: list[PositionScheme] = []
    for _, layer in layers:
        scheme = getattr(layer.__dict__.get(key), "scheme", None)
        if isinstance(scheme, PositionScheme) and all(scheme is not s for s in out):
            out.append(scheme)
    return out
