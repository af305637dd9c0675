"""Streaming inside transformers: :class:`SinkCache`, a transformers ``Cache`` built on posenc's
rolling :class:`~posenc.cache.KVCache` (StreamingLLM's sinks plus a window; Xiao et al., 2024).

transformers 5 dropped its own ``SinkCache``. This one keeps, per layer, the first ``sinks``
keys and the last ``window`` in a fixed ``[B, H_kv, sinks + window + 1, D]`` buffer written in
place, so ``model.generate(..., cache=SinkCache(sinks=4, window=1020))`` runs for any
number of tokens in fixed memory. It works with posenc's attention only (a model switched by
:func:`~posenc.hf.use`): a layer's ``update`` hands posenc's attention the new keys and the
layer's rolling cache, and :func:`~posenc.attention.attend` writes and reads it with the cache's
own rule (query ``m`` sees keys ``n`` with ``m - window < n <= m``, plus the first ``sinks``).

Key layouts (``positions=``, chapter 11 measures both):

- ``"true"`` (the default): every key keeps its **true position** (the one the model gave it;
  chapter 11's "sinks at their true positions"): the model's own RoPE rotated it there,
  posenc's schemes (``use(model, "alibi" | "t5" | "rope")``) rotate or bias by it. The cache
  stores keys as attention rotated them; nothing is re-rotated.
- ``"in_cache"``: StreamingLLM's positions **inside the cache**: the sinks keep ``0 .. S - 1``,
  the window's keys are renumbered ``S, S + 1, ...`` in the order they were seen, and the query
  sits at the next in-cache position (at most ``S + W - 1``). The keys are stored unrotated
  and posenc's scheme is applied inside attention at those positions every step, so it needs
  a relative posenc scheme (``use(model, "rope" | "alibi" | "t5")``); with the model's own
  RoPE (``use(model)``) the keys arrive already rotated at their true positions and the
  layout cannot be honoured: it is refused at the first forward. Only the sinks' distances
  differ from ``"true"`` (a window's offsets are the same in both).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from .._checks import check_int, is_compiling
from ..attention import attend
from ..cache import KVCache
from ..schemes import PositionScheme

ROLLING_KWARG = "posenc_rolling_cache"
"""The attention kwarg a :class:`SinkCache` layer puts the layer's rolling cache under."""
LAYOUT_KWARG = "posenc_rolling_layout"
UNREAD = "_posenc_unread"
"""Set on a layer's ``KVCache`` when :meth:`update` hands it out, cleared by posenc's attention
when it reads it: still set at the next update means another attention ran (eager check)."""
"""The attention kwarg a :class:`SinkCache` layer puts its key layout under."""
LAYOUTS = ("true", "in_cache")


def _cache_base() -> tuple[type, type]:
    """transformers' ``Cache`` and ``CacheLayerMixin`` (imported here, never by ``import
    posenc``)."""
    try:
        from transformers.cache_utils import Cache, CacheLayerMixin
    except ImportError as err:
        raise ImportError(
            "posenc.hf.SinkCache needs Hugging Face transformers >= 5.0 "
            "(pip install 'transformers>=5.24')"
        ) from err
    return Cache, CacheLayerMixin


def _hand_out(kv: KVCache, attn_kwargs: Any, seen: Tensor, rows: int) -> dict[str, Any]:
    """The attention's kwargs ``kv`` goes out through; marks ``kv`` handed out and, in eager
    mode, refuses when the last hand-off was never read (posenc's attention clears the mark:
    another attention ignored the cache) or the ``rows`` new tokens cannot continue the
    ``seen`` it holds (:func:`_check_continues`)."""
    if not isinstance(attn_kwargs, dict):
        raise ValueError(
            "posenc.hf.SinkCache is written by posenc's attention, but this model's attention "
            "layer passed it no kwargs (transformers' attention calls cache.update(k, v, "
            "layer_idx, kwargs=kwargs)); switch the model with posenc.hf.use(model)"
        )
    if is_compiling():
        return attn_kwargs
    _check_continues(kv, seen, rows, attn_kwargs.get("position_ids"))
    if kv.__dict__.get(UNREAD):
        raise ValueError(
            "posenc.hf.SinkCache was handed to an attention that is not posenc's (the keys of "
            "the last call were never written: its output ignored the cache); switch the model "
            "with posenc.hf.use(model) before generate"
        )
    kv.__dict__[UNREAD] = True
    return attn_kwargs


@functools.cache
def _layer_class() -> type:
    _, mixin = _cache_base()

    class SinkLayer(mixin):  # type: ignore[misc, valid-type]
        """One layer's rolling cache: posenc's ``KVCache(max_len=sinks + window, sinks=sinks,
        window=window)``, written by posenc's attention."""

        is_compileable = False
        is_croppable = False
        is_sliding = False

        def __init__(self, sinks: int, window: int, layout: str = "true") -> None:
            super().__init__()
            self.kv = KVCache(max_len=sinks + window, sinks=sinks, window=window)
            self.layout, self.seen = layout, torch.zeros((), dtype=torch.long)

        def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
            self.is_initialized, self.seen = True, self.seen.to(key_states.device)

        def update(self, key_states: Tensor, value_states: Tensor, *args: Any,
                   **kwargs: Any) -> tuple[Tensor, Tensor]:
            """Hand posenc's attention this layer's rolling cache (through the attention's
            kwargs, which transformers passes here as ``kwargs=``); the new keys and values go
            back unchanged, and :func:`~posenc.attention.attend` writes them."""
            attn_kwargs = _hand_out(self.kv, kwargs.get("kwargs"), self.seen,
                                    key_states.shape[0])
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            attn_kwargs[ROLLING_KWARG], attn_kwargs[LAYOUT_KWARG] = self.kv, self.layout
            self.seen.add_(key_states.shape[-2])
            return key_states, value_states

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            """``(kv_length, kv_offset)``: the new tokens only (the cache knows the rest)."""
            seen = self.get_seq_length()  # tokens since reset; compiled: 0-dim, no recompile
            if query_length == 0 and not is_compiling() and int(seen):
                raise ValueError(_reuse_message(int(seen), _NO_NEW_TOKENS, self.kv))
            return query_length, seen if is_compiling() else int(seen)

        def get_seq_length(self) -> Any:
            return self.seen if self.is_initialized else 0  # 0: a fresh prefill

        def get_max_length(self) -> int:
            return -1  # any number of tokens: the oldest beyond the window are dropped

        def reset(self) -> None:
            self.kv.reset()
            self.kv.__dict__.pop(UNREAD, None)
            self.seen.zero_()

        def crop(self, tokens_to_remove: int) -> None:  # only crop(0): see _crop_refusal
            if tokens_to_remove != 0:
                raise _crop_refusal(tokens_to_remove, self.kv.sinks, self.kv.window)

        def reorder_cache(self, beam_idx: Tensor) -> None:
            if self.seen:
                self.kv.select(beam_idx)

        batch_select_indices = reorder_cache

    return SinkLayer


_NO_NEW_TOKENS = ("an earlier call, and generate passed no new tokens (it takes a prompt "
                  "given with a filled cache as that call's continuation)")


def _check_continues(kv: KVCache, seen: Tensor, rows: int, positions: object) -> None:
    """A filled layer given new tokens that cannot continue it (eager mode): a batch of
    another size, or ``positions`` (the model's ``position_ids``) all below what a row reached
    (``generate`` given a prompt no longer than the tokens held reads its tail as new)."""
    if is_compiling() or kv.k is None or not bool(seen):
        return
    if kv.k.shape[0] != rows:
        raise ValueError(_reuse_message(
            int(seen), f"a batch of {kv.k.shape[0]} rows, and this batch has {rows}", kv))
    reached = kv.reached()
    if isinstance(positions, Tensor) and positions.numel() and reached is not None:
        top = positions.amax(-1).to(reached.device)  # [B | 1]
        if bool((top < reached).any()):
            raise ValueError(_reuse_message(
                int(seen), f"rows whose keys stop at positions {(reached - 1).tolist()} (a "
                f"continuation starts at {reached.tolist()}), and the new tokens' positions "
                f"stop at {top.tolist()} (a new batch, not a continuation)", kv))


def _reuse_message(seen: int, since: str, kv: KVCache) -> str:
    """The refusal of a filled SinkCache given a batch that cannot continue it (``seen``: the
    tokens given since the last reset, of which it keeps the sinks and the window)."""
    kept = (kv.sinks or 0) + (kv.window or 0)
    held = f"{seen} tokens" if seen <= kept else f"{kept} of the {seen} tokens it was given"
    return (
        f"posenc.hf.SinkCache holds {held} from {since}: a cache that already holds "
        "keys continues them; cache.reset() empties it to start a new batch"
    )


def _crop_refusal(tokens_to_remove: object, sinks: int | None, window: int | None) -> ValueError:
    """transformers' rollback (assisted decoding's ``crop(-n)``) on a rolling layer: only
    ``crop(0)`` (nothing to remove) is possible; the keys a rollback needs are overwritten."""
    return ValueError(
        f"posenc.hf.SinkCache cannot crop({tokens_to_remove!r}): a rolling cache (sinks={sinks}, "
        f"window={window}) overwrites its oldest window keys in place once full, so the keys "
        "a rollback would need again can be gone (only crop(0) is a no-op). Assisted or "
        "speculative decoding needs a cache that keeps every key (transformers' "
        "DynamicCache); cache.reset() empties this one to start anew"
    )


@functools.cache
def _cache_class() -> type:
    cache_cls, _ = _cache_base()

    class SinkCacheLayers(cache_cls):  # type: ignore[misc, valid-type]
        """transformers' ``Cache`` over ``SinkLayer`` s that names a layer index beyond
        ``num_layers`` (transformers' own: an IndexError)."""

        def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[Tensor, Tensor]:
            if self.layer_class_to_replicate is None and layer_idx >= len(self.layers):
                n = len(self.layers)
                raise ValueError(
                    f"posenc.hf.SinkCache(num_layers={n}) holds layers 0 .. {n - 1}, but the "
                    f"model wrote layer_idx={layer_idx}: num_layers must be at least the "
                    f"model's number of layers ({layer_idx + 1} or more); pass "
                    "config=model.config instead and SinkCache reads it"
                )
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return SinkCacheLayers


def SinkCache(sinks: int = 4, window: int = 1020, *, num_layers: int | None = None,
              config: Any = None, positions: str = "true") -> Any:
    """A transformers ``Cache`` that keeps the first ``sinks`` keys and the last ``window`` of
    every layer (StreamingLLM), for ``model.generate(..., cache=cache)`` on a model
    switched by :func:`~posenc.hf.use`; fixed memory for any number of generated tokens.

    The attention rule is the cache's: query ``m`` sees keys ``n`` with ``m - window < n <= m``
    (:func:`~posenc.attention.attend`'s ``window``, counted in positions) and the first
    ``sinks`` keys.

    ``positions``: the key layout (chapter 11 measures both).

    - ``"true"`` (default): keys keep their true positions (the model's RoPE or posenc's
      scheme sees true distances). Outputs equal posenc's own rolling
      ``KVCache(max_len=sinks + window, sinks=sinks, window=window)`` decode, and a full pass
      under the same visibility, and it works with the model's own RoPE (``use(model)``).
      Chapter 11 measures this layout as harmful for RoPE: sinks at their original, ever
      farther positions cost loss periodically (where pair 3's angle to them leaves its trained
      range); ALiBi barely moves under either layout.
    - ``"in_cache"``: StreamingLLM's layout (Xiao et al., 2024): the sinks at ``0 .. sinks -
      1``, the window's keys renumbered ``sinks, sinks + 1, ...`` as they sit in the cache,
      the query at the next in-cache position; no distance exceeds ``sinks + window - 1``.
      Chapter 11's choice where sinks help ("they belong in the cache"): sinks inside the
      cache left its RoPE model's loss within 0.02 nats of the window alone. Keys are stored
      unrotated
      and posenc's scheme rotates or biases them at those positions every step, so the model
      must run a relative posenc scheme, ``posenc.hf.use(model, "rope" | "alibi" | "t5")``;
      the model's own RoPE (``use(model)``) has rotated the keys at their true positions
      before attention and is refused. Outputs equal ``posenc.lab.production.stream(...,
      reposition=True)``'s rule: each query sees exactly the keys of ``"true"``, only the
      sinks' distances differ.

    ``num_layers`` (or ``config``, whose ``num_hidden_layers`` it reads): how many layers to
    build up front; without either the layers are added as the model first writes them. A
    left-padded row keeps pads as its sinks (a warning says so): pad on the right or prefill
    such rows alone. ``crop`` (assisted decoding's rollback) is refused beyond ``crop(0)``: the
    keys a rollback needs are overwritten. ``reset()`` empties it for the next batch: a filled
    cache given a batch of another size, or new tokens whose positions do not continue the
    ones it holds (``generate`` reads a prompt given with a filled cache as the continuation
    of what it holds), is refused with that fix. The layers hold posenc ``KVCache`` objects
    (``cache.layers[i].kv``).
    ``get_seq_length()`` is a 0-dim tensor once written (as ``StaticCache``'s), so
    ``torch.compile(model.forward, fullgraph=True, dynamic=False)`` decodes any number of
    steps in 2 graphs (prefill, step) in both layouts, calls without a growing
    ``attention_mask`` (a mask that grows each step recompiles, as with any cache).

    Raises:
        TypeError: ``sinks``, ``window`` or ``num_layers`` not an int.
        ValueError: ``sinks < 0``, ``window < 1``, ``num_layers < 1``, ``positions`` not
            ``"true"`` or ``"in_cache"``; and, at the first forward, the model's attention is
            not posenc's, or ``positions="in_cache"`` on a model without a relative posenc
            scheme; a model with more layers than ``num_layers``; a filled cache reused
            without ``reset()`` for a batch it cannot continue; ``crop(n)`` with ``n != 0``.
        ImportError: transformers is missing.
    """
    sinks = check_int("sinks", sinks, minimum=0)
    window = check_int("window", window, minimum=1)
    if positions not in LAYOUTS:
        raise ValueError(
            f"positions must be 'true' (every key at the position the model gave it) or "
            f"'in_cache' (StreamingLLM: sinks at 0 .. sinks - 1, the window right after them), "
            f"got {positions!r}"
        )
    if num_layers is None and config is not None:
        text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) \
            else config
        num_layers = getattr(text, "num_hidden_layers", None)
    cache_cls, layer = _cache_class(), _layer_class()
    if num_layers is None:
        return cache_cls(layer_class_to_replicate=lambda: layer(sinks, window, positions))
    num_layers = check_int("num_layers", num_layers, minimum=1)
    return cache_cls(layers=[layer(sinks, window, positions) for _ in range(num_layers)])


def attend_in_cache(
    q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme | None, positions: Tensor | None,
    key_valid: Tensor | None, cache: KVCache, settings: dict[str, Any],
) -> Tensor:
    """StreamingLLM's key layout over a rolling cache that stores keys unrotated: for the query
    at true position ``m`` (``S`` sinks, window ``W``), the shift ``d = max(0, m - (S + W -
    1))`` puts it at ``m - d`` (the next in-cache position), the sinks at their positions ``0 ..
    S - 1`` and each window key ``n`` at ``n - d`` (``S, S + 1, ...`` once the cache is full);
    the scheme rotates or biases q and every kept key at those positions. It sees the keys the
    true layout shows it (``m - W < n <= m`` and ``n < S``); only the sinks' distances differ.
    Queries whose shift is 0 in every row (a prefill up to the cache's length, eager mode) run in
    one call at their true positions; the others one call each (a decode step: one).
    ``positions`` / ``key_valid`` ``[B, L]``: the new tokens' positions and which are real
    (None: the cache's next positions, all real); returns ``[B, L, H, Dv]``."""
    if scheme is None:
        raise ValueError(
            "posenc.hf.SinkCache(positions='in_cache') renumbers the kept keys every step, but "
            "this model's own RoPE rotated them at their true positions before attention: "
            "switch the model with posenc.hf.use(model, 'rope') (posenc's RoPE from the "
            "model's config, applied inside attention; or 'alibi' / 't5'), or use "
            "positions='true'"
        )
    if type(scheme).embed is not PositionScheme.embed:  # an absolute scheme (not via use())
        raise ValueError(
            f"posenc.hf.SinkCache(positions='in_cache') needs a relative scheme (rope, alibi, "
            f"t5), got {scheme.name!r}: an absolute position cannot be moved"
        )
    S, W, N = cache.sinks, cache.window, cache.max_len
    assert S is not None and W is not None and N is not None
    L = q.shape[-2]
    new_valid = None if key_valid is None else key_valid[:, -L:]  # [B, L]
    view = cache.append(k, v, positions, None, new_valid, positions is None)
    keys, values, key_pos = view.k, view.v, view.positions  # [B, H_kv, T, D], [B, T]
    B = q.shape[0]
    valid = view.valid if view.valid is not None else torch.ones_like(key_pos, dtype=torch.bool)
    valid = valid.expand(B, -1)  # [B, T]: written slots that are not padding
    key_pos = key_pos.expand(B, -1)
    q_pos = key_pos[:, N:N + L]  # [B, L]: the new keys' positions are the queries'
    last = S + W - 1  # the in-cache position of a full cache's query
    first = 0  # queries before it: shift 0 in every row, true positions
    if L > 1 and not is_compiling():
        first = int((q_pos <= last).all(0).long().cumprod(0).sum())
    outs = []
    if first:
        outs.append(attend(q[:, :, :first], keys, values, scheme, positions=q_pos[:, :first],
                           key_positions=key_pos, attention_mask=valid, window=W,
                           sinks=S or None, **settings))  # [B, H, first, Dv]
    sink = key_pos < S  # [B, T]
    for i in range(first, L):
        m = q_pos[:, i:i + 1]  # [B, 1]
        shift = (m - last).clamp(min=0)  # [B, 1]
        sees = valid & (key_pos <= m) & (sink | (key_pos > m - W))  # the true layout's keys
        k_in = torch.where(sink, key_pos, key_pos - shift).clamp(min=0)  # [B, T]
        outs.append(attend(q[:, :, i:i + 1], keys, values, scheme, positions=m - shift,
                           key_positions=k_in, attention_mask=sees, **settings))  # [B, H, 1, Dv]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)  # [B, H, L, Dv]
    return out.transpose(1, 2).contiguous()
