"""The integrations layer: install posenc's attention in a transformers model.

:func:`register` puts :mod:`posenc.hf.forward`'s two functions into transformers' attention
and mask tables under a name; :func:`use` switches a loaded model to that name, resolves the
scheme (the model's own RoPE, ALiBi, T5 bias, NoPE, posenc's RoPE from the config, or a ready
``PositionScheme``) and swaps the model's rotary embeddings for identity stand-ins when the
scheme replaces them. transformers is imported inside :func:`register` only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._checks import warn_caller
from ..attention import BACKENDS
from ..rope_config import rotary_kwargs_from_hf_config
from ..schemes import SCHEMES, PositionScheme, RoPE, _a_class, make_scheme
from .forward import _OPTIONS, _Options, attention_forward, positions_mask
from .mask_checks import watch_inputs
from .saved import SAVED as SAVED
from .saved import Recorded, recorded_call, restore_saved_weights
from .scheme_checks import (
    check_instance,
    filled_options,
    held_schemes,
    warn_dropped,
    warn_named_layout,
)

SWAPS = ("alibi", "t5", "nope", "rope")
"""The scheme names :func:`~posenc.hf.use` accepts besides ``None`` (keep the model's own RoPE)."""

_MIN_TRANSFORMERS = (5, 0)
_registered: set[str] = set()


# --------------------------------------------------------------------------- registration


def register(name: str = "posenc") -> str:
    """Make ``attn_implementation=name`` run posenc's attention in transformers; returns ``name``.

    Registers two functions under ``name``: the attention (``transformers.AttentionInterface``)
    and its mask (``transformers.masking_utils.AttentionMaskInterface``, which hands the
    attention the positions of its queries and keys and which keys are padding). Then
    ``AutoModelForCausalLM.from_config(cfg, attn_implementation=name)``,
    ``from_pretrained(path, attn_implementation=name)`` and
    ``model.set_attn_implementation(name)`` work. A model switched this way keeps its own RoPE;
    :func:`~posenc.hf.use` also swaps the scheme. Calling it again is harmless.

    transformers (>= 5.0) is imported here, never by ``import posenc``.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: ``name`` is empty, holds a ``/`` (transformers reads such a name as a
            kernel to download from the Hub) or is one of transformers' own implementations.
        ImportError: transformers is missing or older than 5.0.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {name!r} ({type(name).__name__})")
    if not name or "/" in name or name != name.strip():
        raise ValueError(
            f"name must be a plain non-empty name such as 'posenc' (no '/': transformers reads "
            f"'org/repo' as a Hub kernel), got {name!r}"
        )
    attention_interface, mask_interface = _interfaces()
    if name not in _registered:
        builtin = set(attention_interface._global_mapping) | {"eager"}
        builtin -= _registered
        if name in builtin or name.startswith(("flash_attention", "paged|")):
            raise ValueError(
                f"name {name!r} is one of transformers' own attention implementations "
                f"({', '.join(sorted(builtin))}); registering posenc under it would replace it "
                "for every model: pick another name (default 'posenc')"
            )
    attention_interface.register(name, attention_forward)
    mask_interface.register(name, positions_mask)
    _registered.add(name)
    return name


def _interfaces() -> tuple[Any, Any]:
    """transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` (imported here)."""
    try:
        import transformers
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as err:
        raise ImportError(
            "posenc.hf.register and posenc.hf.use need Hugging Face transformers >= 5.0 "
            "(pip install 'transformers>=5.24', the version posenc is tested with)"
        ) from err
    major_minor = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    if major_minor < _MIN_TRANSFORMERS:
        raise ImportError(
            f"posenc.hf needs transformers >= 5.0 (its attention and mask interfaces), got "
            f"{transformers.__version__}"
        )
    return AttentionInterface, AttentionMaskInterface


# --------------------------------------------------------------------------- use(model, ...)


def use(model: Any, scheme: str | PositionScheme | None = None, **options: Any) -> Any:
    """Run ``model``'s attention through posenc; returns ``model`` (changed in place).

    ``model`` is a loaded transformers ``PreTrainedModel`` (Llama, Mistral, Qwen2, Gemma 2,
    GPT-NeoX, gpt-oss and the other models built on transformers' attention interface).

    ``scheme``:

    * ``None`` (default): keep the model's own RoPE (its rotary embedding rotates q and k as
      before); the logits equal transformers' own attention on rows that are not packed (packed
      rows follow the documents rule of the module notes, which transformers' SDPA path
      applies only without a cache). A model switched to ``"alibi"`` and back gets its rotary
      embedding back;
    * ``"alibi"``, ``"t5"``, ``"nope"``: replace the model's rotary embedding (it becomes the
      identity) by ALiBi slopes, a T5 relative bias (learned: one bias shared by all layers, as
      T5 shares it; its weights are ``model.posenc_scheme``'s) or no positions at all;
    * ``"rope"``: posenc's RoPE from the config (``RotaryEmbedding.from_hf_config``: theta,
      scaling, partial rotary, layout; per layer type where the config nests it), applied inside
      attention to the queries and every cached key by their positions, with exact angles
      (reduced mod 2 pi before rounding; ``from_hf_config`` defaults to transformers' float32
      product);
    * a :class:`~posenc.schemes.PositionScheme` instance (one object, shared by every layer).

    ``options``: ``backend`` (``"sdpa"`` default, ``"math"`` or ``"flex"``, as
    :func:`~posenc.attention.attend`), ``name`` (the implementation name to register and switch
    to, default ``"posenc"``), and for ``"t5"`` its ``num_buckets`` / ``max_distance``, for
    ``"rope"`` ``interleaved`` (the layout, default from the config).

    The scheme (a module: ``model.posenc_scheme``) moves with ``model.to(...)`` and is in its
    ``state_dict``. ``use`` records a swapped scheme in the config (``config.posenc``: scheme
    name, options, backend; JSON, so ``save_pretrained`` writes it); ``scheme=None`` removes it.
    With it ``use`` writes ``attn_implementation: "posenc"`` (``SAVED_ATTENTION``), so a plain
    ``from_pretrained(path)`` refuses until :func:`register` has run (transformers does not know
    "posenc") rather than run the weights with the model's own RoPE. A model loaded with
    ``from_pretrained(path)`` after ``register()`` needs ``use`` again: its rotary embedding
    is the model's own after loading, and its first forward raises a ValueError naming the
    recorded call (``posenc.hf.use(model, 'alibi')``) rather than run RoPE on weights trained
    with another scheme. ``use`` on such a model, with the scheme it records, also loads a
    learned scheme's saved weights (T5's bias: ``from_pretrained`` drops them,
    ``model.posenc_scheme`` being added after loading) from the checkpoint the config was loaded
    from (``config.name_or_path``: a local directory or a cached Hub snapshot, safetensors);
    where it cannot read them it warns with the call that loads them, since a fresh bias gives
    other logits. Positions, documents
    and visibility follow the rules of :mod:`posenc.hf.adapter`; transformers keeps the cache.
    Calling ``use`` again with the scheme and options in force keeps the schemes built (a
    trained T5 bias keeps its weights; ``backend`` may change). Switching the model's attention
    away (``set_attn_implementation("sdpa")``) after a swap raises at the next forward rather
    than run without positions.

    Raises:
        TypeError: ``model`` is not a transformers model; ``scheme`` is not a name, ``None`` or
            a ``PositionScheme`` instance (a class is named as such); an option the scheme does
            not take.
        ValueError: an unknown scheme name or backend; a scheme with an ``embed`` hook
            (sinusoidal, learned: they add to the token embeddings, not inside attention);
            a swap on a model with no rotary embedding to replace (GPT-2's learned positions,
            BLOOM's built-in ALiBi); a model without attention layers posenc recognises.
        ImportError: transformers is missing or older than 5.0.
    """
    if not callable(getattr(model, "set_attn_implementation", None)) or not hasattr(model, "config"):
        raise TypeError(
            "model must be a transformers PreTrainedModel (with .config and "
            f".set_attn_implementation), got {type(model).__name__}"
        )
    backend = options.pop("backend", "sdpa")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    name = register(options.pop("name", "posenc"))
    layers = _attention_layers(model)
    record = _record(scheme, dict(options), backend)
    reloaded = _check_recorded(model, layers, record)
    held = held_schemes(layers, _OPTIONS)
    built = _in_force(model, layers, record) or _build_schemes(model, layers, scheme, options)
    warn_dropped(held, [] if built is None else list(built.values()))
    _set_rotaries(model, swapped=built is not None)
    if built is None:
        model._modules.pop("posenc_scheme", None)
    else:
        model.add_module("posenc_scheme", _scheme_container(built))
    for idx, layer in layers:
        layer.__dict__[_OPTIONS] = _Options(None if built is None else built[idx], backend)
    for config in _configs(model, layers):
        if record is None:
            config.__dict__.pop(SAVED, None)
            config.__dict__.pop(SAVED_ATTENTION, None)
        else:
            setattr(config, SAVED, record)
            setattr(config, SAVED_ATTENTION, name)  # a reload asks for this attention
    model.set_attn_implementation(name)
    watch_inputs(model, name)  # the 2-D mask's values, before transformers makes it bool
    if reloaded is not None:
        restore_saved_weights(model, reloaded)
    return model


SAVED_ATTENTION = "attn_implementation"
"""Beside ``config.posenc``, :func:`use` writes ``attn_implementation: "posenc"`` into the config,
which transformers reads back as the attention to load with: a reload in a process where posenc
is not registered fails loudly (transformers: ``attn_implementation="posenc"`` is not supported)
instead of running the weights under the model's own RoPE; after :func:`register` it loads with
posenc's attention, whose first forward names the ``use`` call. Only an explicit
``from_pretrained(path, attn_implementation="sdpa")`` runs without it."""


def _record(scheme: object, options: dict[str, Any], backend: str) -> dict[str, Any] | None:
    """What ``config.posenc`` holds after ``use(model, scheme, **options)``: JSON values, the
    call that rebuilds it (None: the model's own RoPE, nothing to record)."""
    if scheme is None:
        return None
    if isinstance(scheme, PositionScheme):  # a ready object: its name, not its arguments
        return Recorded(scheme=scheme.name, options={}, backend=backend, instance=True)
    return Recorded(scheme=scheme, options=options, backend=backend)


def _check_recorded(
    model: Any, layers: list[tuple[int, nn.Module]], record: dict[str, Any] | None
) -> dict[str, Any] | None:
    """A model whose config records a scheme (``config.posenc``) and whose layers ``use`` has
    not set up: loaded from a checkpoint trained under that scheme (returned when ``record``
    asks for it: its learned weights are to be restored), or sharing a config ``use``
    switched on another model. Asking for another scheme is allowed, but said."""
    saved = getattr(model.config, SAVED, None)
    if not isinstance(saved, dict) or any(_OPTIONS in layer.__dict__ for _, layer in layers):
        return None
    shared = isinstance(saved, Recorded)
    same = record is not None and record.get("scheme") == saved.get("scheme")
    if same and _same_call(model, saved, record):
        return None if shared else saved
    asked = "the model's own RoPE" if record is None else (
        f"scheme {record['scheme']!r}" + ("" if not same else f" with options "
                                           f"{record.get('options')!r}"))
    how = ("set by posenc.hf.use on another model that shares this config object: this "
           "call switches that model's config too; give each model its own config, e.g. "
           "copy.deepcopy(config)" if shared else
           "written by posenc.hf.use before save_pretrained: its weights were trained with it")
    warn_caller(
        f"this model's config records posenc scheme {saved.get('scheme')!r} ({how}), but "
        f"use() was asked for {asked}; to run it with that scheme call {recorded_call(saved)}"
    )
    return None


def _configs(model: Any, layers: list[tuple[int, nn.Module]]) -> list[Any]:
    """The model's config and every distinct config its attention layers read."""
    found = [model.config]
    for _, layer in layers:
        config = getattr(layer, "config", None)
        if config is not None and all(config is not c for c in found):
            found.append(config)
    return found


def _attention_layers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """``(layer_idx, module)`` of every self-attention module (transformers names them
    ``...Attention`` and gives each its ``layer_idx``)."""
    found: list[tuple[int, nn.Module]] = []
    for m in model.modules():
        idx = getattr(m, "layer_idx", None)
        if type(m).__name__.endswith("Attention") and isinstance(idx, int):
            found.append((idx, m))
    if not found:
        raise ValueError(
            f"model {type(model).__name__} has no attention module posenc recognises (a "
            "'...Attention' module with a layer_idx, as transformers' decoder models have)"
        )
    return found


def _text_config(model: Any) -> Any:
    config = model.config
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _in_force(
    model: Any, layers: list[tuple[int, nn.Module]], record: dict[str, Any] | None
) -> dict[int, PositionScheme] | None:
    """``use`` again with the scheme and options already in force in this process: the schemes
    built then (a trained T5 bias keeps its weights; a new backend is only a new backend)."""
    saved = getattr(model.config, SAVED, None)
    if record is None or record.get("instance") or not isinstance(saved, dict):
        return None
    if saved.get("instance") or not _same_call(model, saved, record):
        return None
    held = {idx: getattr(layer.__dict__.get(_OPTIONS), "scheme", None) for idx, layer in layers}
    return None if any(s is None for s in held.values()) else held  # type: ignore[return-value]


def _same_call(model: Any, saved: dict[str, Any], record: dict[str, Any] | None) -> bool:
    """Two ``config.posenc`` records name the same scheme with the same options once every
    default is filled in (``num_buckets=32`` is T5's default); the backend is not compared."""
    if record is None:
        return False
    name, config = saved.get("scheme"), _text_config(model)
    return name == record.get("scheme") and (
        filled_options(name, saved.get("options"), config)
        == filled_options(name, record.get("options"), config))


def _build_schemes(
    model: Any, layers: list[tuple[int, nn.Module]], scheme: object, options: dict[str, Any]
) -> dict[int, PositionScheme] | None:
    """The scheme of every attention layer, or None to keep the model's own RoPE."""
    chosen = _resolve(model, scheme, options)
    if chosen is None:
        return None
    if not _rotaries(model):
        raise ValueError(
            f"scheme={getattr(scheme, 'name', scheme)!r} replaces the model's rotary embedding, "
            f"but {type(model).__name__} has none (no '...RotaryEmbedding' module): its positions "
            "enter elsewhere (learned absolute embeddings, a built-in bias), and a second scheme "
            "would stack on them; use scheme=None"
        )
    device = next((p.device for p in model.parameters()), None)
    if isinstance(chosen, PositionScheme):
        return {idx: chosen.to(device) for idx, _ in layers}
    if None in chosen:  # one RoPE for every layer
        return {idx: chosen[None].to(device) for idx, _ in layers}
    types = getattr(_text_config(model), "layer_types", None) or []
    out = {}
    for idx, _ in layers:
        kind = types[idx] if idx < len(types) else None
        if kind not in chosen:
            raise ValueError(
                f"config['rope_parameters'] nests RoPE per layer type {sorted(map(str, chosen))}, "
                f"but layer {idx} has layer type {kind!r} (config.layer_types)"
            )
        out[idx] = chosen[kind].to(device)
    return out


def _resolve(
    model: Any, scheme: object, options: dict[str, Any]
) -> PositionScheme | dict[str | None, PositionScheme] | None:
    """``scheme`` checked: None, the instance given, a named scheme, or RoPE per layer type."""
    if scheme is None:
        if options:
            raise TypeError(
                f"posenc.hf.use got options {sorted(options)} for scheme=None; allowed: backend, "
                "name (the scheme options belong to a scheme)"
            )
        return None
    if isinstance(scheme, PositionScheme):
        if options:
            raise TypeError(
                f"posenc.hf.use got options {sorted(options)} with a ready PositionScheme; "
                "pass them to its constructor (allowed here: backend, name)"
            )
        check_instance(scheme, _text_config(model))
        if type(scheme).embed is not PositionScheme.embed:
            raise ValueError(
                f"scheme {scheme.name!r} adds positions to the token embeddings (an embed hook); "
                "posenc.hf.use works inside attention: use a rotate or bias scheme "
                f"({', '.join(SWAPS)})"
            )
        return scheme
    if isinstance(scheme, type) and issubclass(scheme, PositionScheme):
        raise TypeError(f"scheme must be None, a name or a PositionScheme, {_a_class(scheme)}")
    if not isinstance(scheme, str):
        raise TypeError(
            f"scheme must be None, a name ({', '.join(SWAPS)}) or a PositionScheme, got "
            f"{type(scheme).__name__}"
        )
    if scheme not in SWAPS:
        why = (" (sinusoidal and learned add to the token embeddings; the adapter works "
               "inside attention)") if scheme in SCHEMES else ""
        raise ValueError(
            f"scheme must be None (keep the model's RoPE) or one of {', '.join(SWAPS)}, "
            f"got {scheme!r}{why}"
        )
    return _named_scheme(scheme, _text_config(model), options)


_SCHEME_OPTIONS: dict[str, tuple[str, ...]] = {
    "alibi": (), "nope": (), "t5": ("num_buckets", "max_distance"),
}


def _named_scheme(
    name: str, config: Any, options: dict[str, Any]
) -> PositionScheme | dict[str | None, PositionScheme]:
    """``"alibi" | "t5" | "nope"`` for the config's head count, or ``"rope"`` from the config
    (one per layer type where its ``rope_parameters`` nest per layer type)."""
    heads = getattr(config, "num_attention_heads", None)
    if name != "rope":
        bad = sorted(set(options) - set(_SCHEME_OPTIONS[name]))
        if bad:
            takes = ", ".join(_SCHEME_OPTIONS[name]) or "no scheme options"
            raise TypeError(
                f"posenc.hf.use(scheme={name!r}) got unexpected options {bad}; scheme {name!r} "
                f"takes {takes} (and use() itself takes backend, name)"
            )
        return make_scheme(name, num_heads=heads, causal=True, **options)
    allowed = {"interleaved"}
    bad = sorted(set(options) - allowed)
    if bad:
        raise TypeError(f"scheme 'rope' got unexpected options {bad}; allowed: interleaved, backend, name")
    warn_named_layout(options, config)
    params = getattr(config, "rope_parameters", None) or {}
    nested = bool(params) and all(isinstance(v, dict) or v is None for v in params.values())
    kinds = sorted(k for k, v in params.items() if v is not None) if nested else [None]
    out: dict[str | None, PositionScheme] = {}
    for kind in kinds:
        kwargs = rotary_kwargs_from_hf_config(config, layer_type=kind, **options)
        out[kind] = RoPE(kwargs.pop("head_dim"), **kwargs)
    return out


def _scheme_container(built: dict[int, PositionScheme]) -> nn.Module:
    """The distinct schemes as one module (``model.posenc_scheme``): one scheme itself, or a
    ``ModuleList`` when layers differ (RoPE per layer type)."""
    distinct: list[PositionScheme] = []
    for s in built.values():
        if all(s is not d for d in distinct):
            distinct.append(s)
    return distinct[0] if len(distinct) == 1 else nn.ModuleList(distinct)


# --------------------------------------------------------------------------- the rotary swap


def _rotaries(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """``(parent, attribute, module)`` of every rotary embedding (``...RotaryEmbedding``),
    identity stand-ins included."""
    found = []
    for parent in model.modules():
        if isinstance(parent, _Unrotated):
            continue  # never look inside a stand-in: its original is not a second rotary
        for attr, child in parent.named_children():
            if isinstance(child, _Unrotated) or type(child).__name__.endswith("RotaryEmbedding"):
                found.append((parent, attr, child))
    return found


def _set_rotaries(model: Any, *, swapped: bool) -> None:
    """Put identity stand-ins in place of the model's rotary embeddings, or the originals back."""
    for parent, attr, child in _rotaries(model):
        if swapped and not isinstance(child, _Unrotated):
            setattr(parent, attr, _Unrotated(child, model.config))
        elif not swapped and isinstance(child, _Unrotated):
            setattr(parent, attr, child.original)


class _Unrotated(nn.Module):
    """Stands in for a model's rotary embedding once :func:`~posenc.hf.use` swapped the scheme:
    it returns ``cos = 1, sin = 0`` in the shape and dtype of the original's, so the model's own
    ``apply_rotary_pos_emb`` leaves q and k as projected; posenc's scheme acts in attention."""

    _config: Any

    def __init__(self, original: nn.Module, config: Any) -> None:
        super().__init__()
        self.original = original
        self.__dict__["_config"] = config  # not a module: read, never registered

    def forward(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        impl = self._config._attn_implementation
        if impl not in _registered:
            raise ValueError(
                f"this model's rotary embedding was replaced by posenc.hf.use(scheme=...), so its "
                f"attention must stay posenc's, got attn_implementation={impl!r}: call "
                "posenc.hf.use(model) again (scheme=None restores the model's own RoPE)"
            )
        cos, sin = self.original(*args, **kwargs)
        return torch.ones_like(cos), torch.zeros_like(sin)
