"""posenc's attention inside a Hugging Face transformers model: ``register`` and ``use``.

transformers (5.x) looks a model's attention up by name in two tables: ``AttentionInterface``
(the function that attends) and ``AttentionMaskInterface`` (the function that turns the 2-D
padding mask into what the attention function is given). :func:`~posenc.hf.register` puts
posenc into both; registering only the first makes transformers hand the attention
``attention_mask=None``, and padding is then silently ignored. :func:`~posenc.hf.use` switches
a loaded model to it, and may swap the model's RoPE for another posenc scheme (ALiBi, T5 bias,
NoPE, posenc's RoPE).

What the attention sees, and where it comes from:

* **positions** (the one rule every call follows): with a 2-D ``attention_mask``, a token's
  position is the number of real tokens before it (``cumsum(mask) - 1``, transformers'
  ``generate`` rule), for the queries and for every cached key alike, whatever the forward's
  ``position_ids`` say (the forward numbers a left-padded row from its first pad). Without a
  mask, the new tokens take ``position_ids`` (the forward's ``arange``, or a packing collator's
  restarting ids) and cached keys their index in the cache;
* **documents** (packed rows): without a mask and with nothing cached, ``position_ids`` that
  restart mark documents by FlashAttention's rule (``prepare_fa_kwargs_from_position_ids``):
  every row starts a document, and another starts wherever a position equals the row's
  smallest, so ``[3, 4, 5, 0, 1, 2, 0, 1]`` is three documents (the first a chunk that started
  earlier) and ``[0, 1, 2, 3, 10, 11, 12, 13]`` one (PoSE's skipped positions). transformers'
  mask path would split the second row where it jumps (and apply no document mask at all once a
  cache is passed, e.g. ``use_cache=True``, the default);
* **visibility**: causal, the layer's ``sliding_window``, the padding mask, the documents:
  :func:`~posenc.attention.attend`'s rule (a window counts positions: query ``m`` sees keys
  ``n`` with ``m - W < n <= m``, as transformers counts indices; a 2-D mask with zeros
  between real tokens makes the two counts differ, and a warning says so);
* **the model's own settings**, from the attention module's call: ``scaling``, Gemma 2's
  ``softcap``, gpt-oss's learned sinks (``s_aux``), grouped-query heads, dropout.

transformers owns the cache (``DynamicCache``, ``StaticCache``, the sliding-window layers):
keys arrive from it in token order, and the mask function tells which token each cache slot
holds (``kv_offset``, ``kv_length``). With a swapped scheme the cache holds keys as projected
(the model's rotary is the identity) and posenc rotates or biases them by their positions at
every step.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import is_compiling
from ..attention import BACKENDS, attend
from ..positions import cu_seqlens, packed_positions
from ..rope_config import rotary_kwargs_from_hf_config
from ..schemes import SCHEMES, PositionScheme, RoPE, _a_class, make_scheme

SWAPS = ("alibi", "t5", "nope", "rope")
"""The scheme names :func:`~posenc.hf.use` accepts besides ``None`` (keep the model's own RoPE)."""

_MIN_TRANSFORMERS = (5, 0)
_registered: set[str] = set()


@dataclass(frozen=True)
class _Options:
    """What one attention layer runs: its scheme (None: the model's own RoPE) and backend."""

    scheme: PositionScheme | None = None
    backend: str = "sdpa"


_DEFAULT = _Options()
_OPTIONS = "_posenc_options"  # the attribute of an attention module that holds its _Options


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
      before); the logits equal transformers' own attention. A model switched to ``"alibi"``
      and back gets its rotary embedding back;
    * ``"alibi"``, ``"t5"``, ``"nope"``: replace the model's rotary embedding (it becomes the
      identity) by ALiBi slopes, a T5 relative bias (learned: one bias shared by all layers, as
      T5 shares it; its weights are ``model.posenc_scheme``'s) or no positions at all;
    * ``"rope"``: posenc's RoPE from the config (``RotaryEmbedding.from_hf_config``: theta,
      scaling, partial rotary, layout; per layer type where the config nests it), applied inside
      attention to the queries and every cached key by their positions;
    * a :class:`~posenc.schemes.PositionScheme` instance (one object, shared by every layer).

    ``options``: ``backend`` (``"sdpa"`` default, ``"math"`` or ``"flex"``, as
    :func:`~posenc.attention.attend`), ``name`` (the implementation name to register and switch
    to, default ``"posenc"``), and for ``"t5"`` its ``num_buckets`` / ``max_distance``, for
    ``"rope"`` ``interleaved`` (the layout, default from the config).

    The scheme (a module: ``model.posenc_scheme``) moves with ``model.to(...)`` and is in its
    ``state_dict``; a model loaded with ``from_pretrained`` needs ``use`` again (the T5 bias
    ``use`` builds starts fresh: load the saved ``posenc_scheme`` weights after it with
    ``strict=False``). Positions, documents and visibility follow the rules of
    :mod:`posenc.hf.adapter`; transformers keeps the cache. Switching the model's attention
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
    built = _build_schemes(model, layers, scheme, options)  # {layer_idx: scheme} or None
    _set_rotaries(model, swapped=built is not None)
    if built is None:
        model._modules.pop("posenc_scheme", None)
    else:
        model.add_module("posenc_scheme", _scheme_container(built))
    for idx, layer in layers:
        layer.__dict__[_OPTIONS] = _Options(None if built is None else built[idx], backend)
    model.set_attn_implementation(name)
    return model


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
        _check_instance(scheme, _text_config(model))
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


def _check_instance(scheme: PositionScheme, config: Any) -> None:
    """A ready scheme must fit the model: one bias per head, RoPE over the head dimension."""
    heads = getattr(config, "num_attention_heads", None)
    own = getattr(scheme, "num_heads", None)
    if isinstance(own, int) and isinstance(heads, int) and own != heads:
        raise ValueError(
            f"scheme {scheme.name!r} has a bias for num_heads={own}, but the model has "
            f"num_attention_heads={heads}; build it with num_heads={heads}"
        )
    rotary = getattr(scheme, "rotary", None)
    if rotary is None:
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
        warnings.warn(
            f"scheme 'rope' rotates {'interleaved' if layout else 'half-split'} pairs, but "
            f"this model's own RoPE rotates {'interleaved' if wanted else 'half-split'} ones "
            f"(its q/k weights expect that layout): pass RoPE(..., interleaved={wanted}) or "
            "scheme='rope' to read the config",
            stacklevel=3,
        )


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


# --------------------------------------------------------------------------- the mask function


def positions_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Tensor | None = None,
    device: torch.device | str = "cpu",
    use_vmap: bool = False,
    **kwargs: Any,
) -> Tensor:
    """posenc's entry in transformers' ``AttentionMaskInterface``: the positions of this
    step's queries and of every key the cache will hand the attention.

    Returns an int64 ``[B | 1, 1, 1, q_length + kv_length]`` tensor (4-D, so that transformers
    passes it through untouched, even when ``generate`` prepares it ahead for a static cache):
    the queries' positions, then the keys', ``-1`` on a key that is padding or a static cache's
    unwritten slot. Query ``i`` is token ``q_offset + i`` of the sequence and key slot ``j``
    token ``kv_offset + j`` (transformers' own mask functions index them so). Positions count
    the real tokens of the 2-D ``attention_mask`` before each one; without a mask, the token's
    index. An empty ``[1, 1, 1, 0]`` tensor means: no mask, nothing cached, so the new tokens
    are all the keys and their positions are the forward's ``position_ids`` (restarting ones
    mark packed documents). transformers' ``mask_function`` (causal, sliding) is not
    evaluated: the attention applies the same rule from the layer's own settings.
    """
    if use_vmap:  # transformers sets it exactly when a model overlays or_/and_mask_function
        raise ValueError(
            "this model overlays a mask pattern of its own on the causal mask (an "
            "or_mask_function / and_mask_function, e.g. image tokens that see each other); "
            "posenc's attention does not apply it: use transformers' own attention for it"
        )
    fresh = (attention_mask is None and isinstance(q_offset, int) and q_offset == 0
             and kv_offset == 0 and kv_length == q_length)
    if fresh:
        return torch.zeros(1, 1, 1, 0, dtype=torch.long, device=device)
    span = kv_offset + kv_length  # the tokens up to the last key slot
    index = torch.arange(span, device=device)  # [span]
    end = q_offset + q_length  # the tokens seen so far, this step's included (int or 0-d tensor)
    if attention_mask is None:
        pos = index[None]  # [1, span]
        real = (index < end)[None]  # [1, span]: a static cache's later slots are unwritten
    else:
        mask = attention_mask.to(device=device, dtype=torch.bool)  # [B, T]
        T = mask.shape[-1]
        mask = F.pad(mask, (0, span - T), value=False) if T < span else mask[:, :span]  # [B, span]
        pos = (mask.long().cumsum(-1) - 1).masked_fill(~mask, 0)  # [B, span]
        real = mask & (index < end)[None]
    q_index = torch.arange(q_length, device=device) + q_offset  # [Lq]
    k_index = torch.arange(kv_length, device=device) + kv_offset  # [Lk]
    q_pos = pos[:, q_index]  # [B | 1, Lq]
    k_pos = pos[:, k_index].masked_fill(~real[:, k_index], -1)  # [B | 1, Lk]
    return torch.cat([q_pos, k_pos], dim=-1)[:, None, None]  # [B | 1, 1, 1, Lq + Lk]


# --------------------------------------------------------------------------- the attention


def attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """posenc's entry in transformers' ``AttentionInterface``: ``query [B, H, Lq, D]``,
    ``key / value [B, H_kv, Lk, D]`` (every key of the cache) -> ``([B, Lq, H, D], None)``.

    Runs :func:`~posenc.attention.attend` with the layer's scheme (:func:`~posenc.hf.use`;
    none: the model's RoPE already rotated q and k), the positions :func:`positions_mask` gave,
    the layer's ``sliding_window``, ``scaling``, ``softcap`` and sinks (``s_aux``, else
    ``module.sinks``). Packed documents (restarting ``position_ids``, no mask, nothing cached)
    run through :func:`~posenc.varlen.attend_varlen` in eager mode, at a cost of ``sum n_i**2``
    rather than one ``[L, L]`` mask (flash-attn's varlen kernel where it runs), when it computes
    the same thing: no softcap or sinks, and positions that count from each document's start
    (or the model's own RoPE, which has rotated q and k already).
    """
    opts: _Options = getattr(module, _OPTIONS, _DEFAULT)
    B, Lq, Lk = query.shape[0], query.shape[-2], key.shape[-2]
    rows = _layout(attention_mask, kwargs.get("position_ids"), B, Lq, Lk, query.device)
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", True)))
    if rows.cu_seqlens is not None and softcap is None and sinks is None and opts.backend != "flex" and (
            rows.restart or (opts.scheme is None and (rows.contiguous or sliding_window is None))):
        return _attend_packed(query, key, value, opts, rows, causal, sliding_window, scaling,
                              float(dropout)), None
    if sliding_window is not None and rows.key_valid is not None and not is_compiling():
        _warn_on_holes(rows.key_valid, sliding_window)
    extra: dict[str, Any] = {}
    if scaling is not None:
        extra["scale"] = float(scaling)
    if softcap is not None:
        extra["softcap"] = float(softcap)
    if sinks is not None:
        extra["sink_logits"] = sinks
    out = attend(
        query, key, value, opts.scheme, positions=rows.positions, key_positions=rows.key_positions,
        attention_mask=rows.key_valid, document_ids=rows.documents, window=sliding_window,
        causal=causal, backend=opts.backend, dropout_p=float(dropout), **extra,
    )  # [B, H, Lq, Dv]
    return out.transpose(1, 2).contiguous(), None


def _warn_on_holes(key_valid: Tensor, window: int) -> None:
    """A 2-D mask with zeros between real tokens: the window counts positions (the real tokens
    before each one), transformers' own attention counts indices; say so rather than differ."""
    left = key_valid.long().cummax(-1).values.bool()  # [B, Lk]: a real key at or before
    right = key_valid.flip(-1).long().cummax(-1).values.flip(-1).bool()  # ... at or after
    if bool((left & right & ~key_valid).any()):
        warnings.warn(
            f"attention_mask has zeros between real tokens and the layer has sliding_window="
            f"{window}: posenc's window counts positions (the real tokens before each one), "
            "transformers' own attention counts indices, so the two differ on such rows; "
            "remove the holes (pack the row) to get transformers' answer",
            stacklevel=2,
        )


def _attend_packed(
    q: Tensor, k: Tensor, v: Tensor, opts: _Options, rows: _Rows, causal: bool,
    window: int | None, scale: float | None, dropout_p: float,
) -> Tensor:
    """Packed documents in flash-attn's ``[total, H, D]`` layout (every row's documents one
    after another): ``q [B, H, L, D]`` -> ``[B, L, H, Dv]``, transformers' output layout."""
    from ..varlen import attend_varlen

    B, H, L, _ = q.shape
    qf, kf, vf = (t.transpose(1, 2).reshape(B * L, t.shape[1], t.shape[-1]) for t in (q, k, v))
    assert rows.cu_seqlens is not None
    out = attend_varlen(
        qf, kf, vf, opts.scheme, cu_seqlens=rows.cu_seqlens, max_seqlen=rows.max_seqlen,
        causal=causal, window=window, scale=scale, backend=opts.backend, dropout_p=dropout_p,
    )  # [B * L, H, Dv]
    return out.reshape(B, L, H, out.shape[-1])


@dataclass(frozen=True)
class _Rows:
    """What :func:`~posenc.attention.attend` is told about one call's rows; None where its
    default is the same. ``cu_seqlens`` / ``max_seqlen``: packed documents' varlen offsets over
    the flattened batch (eager mode only); ``restart``: the positions count 0, 1, ... from each
    document's start; ``contiguous``: they go on by 1 inside each document."""

    positions: Tensor | None = None  # [B, Lq]
    key_positions: Tensor | None = None  # [B, Lk]
    key_valid: Tensor | None = None  # [B, Lk]
    documents: Tensor | None = None  # [B, Lq]
    cu_seqlens: Tensor | None = None  # [N + 1]
    max_seqlen: int = 0
    restart: bool = False
    contiguous: bool = False


def _layout(
    mask: Tensor | None, position_ids: Tensor | None, B: int, Lq: int, Lk: int, device: torch.device
) -> _Rows:
    """The rows' positions, key positions, valid keys and documents from the mask function's
    tensor (or, with no padding mask and nothing cached, from the forward's ``position_ids``)."""
    if mask is None:
        raise ValueError(
            "posenc's attention got attention_mask=None: transformers did not run posenc's mask "
            "function, so padding would be ignored. Switch the model with posenc.hf.use(model) "
            "or set attn_implementation to a name registered by posenc.hf.register() (it "
            "registers the attention and its mask together); a PagedAttentionCache (continuous "
            "batching) is not supported"
        )
    if not isinstance(mask, Tensor) or mask.dim() != 4 or mask.dtype != torch.long:
        raise ValueError(
            "posenc's attention got an attention_mask its mask function did not make "
            f"({type(mask).__name__}"
            f"{'' if not isinstance(mask, Tensor) else f' {mask.dtype} {tuple(mask.shape)}'}): "
            "a 4-D mask passed to the model replaces transformers' mask creation; pass the 2-D "
            "[batch, length] padding mask instead"
        )
    if mask.shape[-1] == 0:  # no padding mask and nothing cached: the forward's position_ids
        if Lk != Lq:
            raise ValueError(_keys_unknown(Lq, Lk, Lq))
        return _fresh_rows(position_ids, B, Lq, device)
    if mask.shape[-1] != Lq + Lk:
        raise ValueError(_keys_unknown(Lq, Lk, mask.shape[-1] - Lq))
    flat = mask[:, 0, 0].expand(B, Lq + Lk)
    q_pos, k_pos = flat[:, :Lq], flat[:, Lq:]
    valid = k_pos >= 0  # [B, Lk]
    if Lk == Lq:  # the keys are this step's tokens: causal by slot
        return _Rows(positions=q_pos, key_valid=valid)
    return _Rows(positions=q_pos, key_positions=k_pos.clamp(min=0), key_valid=valid)


def _keys_unknown(Lq: int, Lk: int, slots: int) -> str:
    return (
        f"the cache handed posenc's attention {Lk} keys for {Lq} queries, but its mask sizes "
        f"describe {slots} key slots: posenc cannot tell the keys' positions (a cache that "
        "drops or reorders keys its get_mask_sizes does not report), so it refuses rather than "
        "guess; use DynamicCache, StaticCache or their sliding-window layers"
    )


_fresh_memo: tuple[Any, int, int, _Rows] | None = None


def _fresh_rows(position_ids: Tensor | None, B: int, L: int, device: torch.device) -> _Rows:
    """New tokens with no padding mask and nothing cached: positions from the forward's
    ``position_ids`` (None: the default ``arange``, one document per row).

    Documents by FlashAttention's rule: each row starts one, and so does every position equal
    to the row's smallest. In eager mode, plain ``arange`` rows give no positions and no
    documents, rows of one document no documents, so attend keeps its fast path, and packed rows
    get their varlen offsets; the answer is kept for the same ``position_ids`` tensor, which
    every layer of one forward shares.
    """
    global _fresh_memo
    if position_ids is None:
        return _Rows()
    if not isinstance(position_ids, Tensor) or position_ids.is_floating_point():
        got = type(position_ids).__name__
        if isinstance(position_ids, Tensor):
            got += f" {position_ids.dtype}"
        raise TypeError(f"position_ids must be an integer tensor, got {got}")
    if position_ids.dim() == 1:
        position_ids = position_ids[None]
    if position_ids.dim() != 2 or position_ids.shape[-1] != L or position_ids.shape[0] not in (1, B):
        want = f"[{L}] or [1, {L}]" + ("" if B == 1 else f" or [{B}, {L}]")
        raise ValueError(
            f"position_ids must have shape {want} (one position per token; multimodal 3-D "
            f"positions are not supported), got {tuple(position_ids.shape)}"
        )
    compiling = is_compiling()
    if not compiling and _fresh_memo is not None:
        ref, version, batch, kept = _fresh_memo
        if ref() is position_ids and version == position_ids._version and batch == B:
            return kept
    pos = position_ids.to(device=device, dtype=torch.long).expand(B, L)  # [B, L]
    starts = pos == pos.amin(-1, keepdim=True)  # [B, L]
    starts = torch.cat([torch.ones_like(starts[:, :1]), starts[:, 1:]], dim=-1)
    documents = starts.long().cumsum(-1) - 1  # [B, L]
    if compiling:
        return _Rows(positions=pos, documents=documents)
    rows = _packed_rows(pos, documents)
    _fresh_memo = (weakref.ref(position_ids), position_ids._version, B, rows)
    return rows


def _packed_rows(pos: Tensor, documents: Tensor) -> _Rows:
    """Eager mode: drop what attend's defaults already say, and find the varlen offsets."""
    L = pos.shape[-1]
    if L == 0 or bool((documents[:, -1] == 0).all()):  # one document in every row
        plain = bool((pos == torch.arange(L, device=pos.device)).all())
        return _Rows() if plain else _Rows(positions=pos)
    counted = packed_positions(documents)  # [B, L]: 0, 1, ... from each document's start
    first = pos.gather(-1, (torch.arange(L, device=pos.device) - counted))  # each start's position
    contiguous = bool((pos - first == counted).all())
    cu, longest = cu_seqlens(documents)
    return _Rows(positions=pos, documents=documents, cu_seqlens=cu, max_seqlen=longest,
                 restart=contiguous and bool((first == 0).all()), contiguous=contiguous)
