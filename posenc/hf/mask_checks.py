"""The integrations layer: the masks a caller hands a model that :func:`~posenc.hf.use`
switched to posenc, checked where transformers would run them silently or fail obscurely.

What each check guards (the practitioner reading of 2026-12-07: s33 to s35, s96, o94, o97):

* :func:`check_model_inputs`, a forward pre-hook :func:`watch_inputs` puts on the model
  (the 2-D mask is read before transformers turns it to bool): a 2-D ``attention_mask``
  holding values other than 0/1 (document ids of a packed row, an additive 0/-inf mask) is
  refused, since transformers reads every non-zero as "real"; restarting ``position_ids``
  inside a row together with a padding mask warn, since the rows are then not split into
  documents;
* :func:`check_mask_dims` (the mask function): a mask of neither 2 nor 4 dimensions (a 3-D
  ``[B, Lq, Lk]`` tree mask) is refused with the ``unsqueeze`` that fixes it;
* :func:`check_4d_dtype` (the attention): a 4-D integer mask is named as such rather than
  read as the mask function's positions (which blamed the cache);
* :func:`check_tree_convention` (the attention): a 4-D bool mask in the "True = masked"
  convention (no query sees its own key) is refused.

Value checks read the tensors (a host sync): they are skipped while compiling, and the hook
skips a one-token step (``generate``'s decode loop).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import is_compiling, warn_caller

_NAMES: set[str] = set()  # the attention names use() switched a model to


def watch_inputs(model: nn.Module, name: str) -> None:
    """Put :func:`check_model_inputs` on ``model`` (once) for the attention ``name``."""
    _NAMES.add(name)
    if check_model_inputs not in model._forward_pre_hooks.values():
        model.register_forward_pre_hook(check_model_inputs, with_kwargs=True)


def check_model_inputs(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The forward's 2-D ``attention_mask`` and ``position_ids``, before transformers turns
    the mask to bool: refuse values other than 0/1, warn on restarts under padding."""
    impl = getattr(model.config, "_attn_implementation", None)
    if not isinstance(impl, str) or impl not in _NAMES or is_compiling():
        return
    mask = _argument(model, args, kwargs, "attention_mask")
    if not isinstance(mask, Tensor) or mask.dim() != 2 or mask.shape[-1] < 2:
        return
    ids = _argument(model, args, kwargs, "input_ids")
    embeds = _argument(model, args, kwargs, "inputs_embeds")
    new = ids.shape[-1] if isinstance(ids, Tensor) else (
        embeds.shape[1] if isinstance(embeds, Tensor) and embeds.dim() > 1 else mask.shape[-1])
    if new < 2:  # a decode step: nothing to split, and no host sync in the loop
        return
    if mask.dtype != torch.bool:
        _refuse_values(mask)
    pos = _argument(model, args, kwargs, "position_ids")
    if (isinstance(pos, Tensor) and pos.dim() == 2 and pos.shape[0] in (1, mask.shape[0])
            and pos.shape[-1] == new <= mask.shape[-1]):
        _warn_restart_under_padding(mask, pos)


def _refuse_values(mask: Tensor) -> None:
    """A 2-D mask is 0/1 (bool, int or float): any other value is refused, by name."""
    odd = (mask != 0) & (mask != 1)
    if not bool(odd.any()):
        return
    values = torch.unique(mask.detach()).tolist()
    shown = ", ".join(f"{v:g}" for v in values[:8]) + (", ..." if len(values) > 8 else "")
    raise ValueError(
        f"attention_mask is a 2-D padding mask (1 = a real token, 0 = padding), but it holds "
        f"the values {{{shown}}} ({mask.dtype}): transformers reads every non-zero as a real "
        "token, so document ids (packing: 1, 1, 2, 2, ...) would run as one document and an "
        "additive 0/-inf mask inverted. For packed documents pass positions that restart per "
        "document (position_ids=posenc.packed_positions(document_ids)) with no attention_mask, "
        "or the collator's cu_seq_lens_q/k (cu, _ = posenc.cu_seqlens(document_ids)); for "
        "padding, pass (mask != 0) or the tokenizer's 0/1 mask"
    )


def _warn_restart_under_padding(mask: Tensor, pos: Tensor) -> None:
    """``position_ids`` that restart among a row's real tokens while the mask pads."""
    real = mask[:, -pos.shape[-1]:] != 0  # [B, L]: this call's tokens
    if bool(real.all()):  # no padding: restarting position_ids split the documents
        return
    pos = pos.to(mask.device).expand(real.shape)
    last = torch.where(real, pos, torch.iinfo(torch.long).min).cummax(-1).values  # [B, L]
    restart = real[:, 1:] & (pos[:, 1:] <= last[:, :-1]) & (last[:, :-1] >= 0)
    found = restart.nonzero()
    if not found.numel():
        return
    row, col = (int(v) for v in found[0])
    warn_caller(
        f"position_ids restart inside row {row} (position {int(pos[row, col + 1])} at token "
        f"{col + 1}) while attention_mask pads (it holds zeros): with a padding mask the rows "
        "are not split into documents (transformers does the same), so the documents of a row "
        "see each other. To split them, pass the collator's packed rows with no attention_mask "
        "(or an all-ones one) and the restarting position_ids, or cu_seq_lens_q/k"
    )


_POSITIONAL: dict[tuple[type, str], int | None] = {}


def _argument(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """The forward's argument ``name``, given by keyword or by position."""
    if name in kwargs:
        return kwargs[name]
    if not args:
        return None
    key = (type(model), name)
    if key not in _POSITIONAL:
        params = list(inspect.signature(model.forward).parameters)
        _POSITIONAL[key] = params.index(name) if name in params else None
    index = _POSITIONAL[key]
    return args[index] if index is not None and index < len(args) else None


# --------------------------------------------------------------------------- the mask function


def check_mask_dims(mask: Any) -> None:
    """transformers hands the mask function a mask that is not 4-D as the caller gave it: it
    must be the 2-D ``[B, keys]`` padding mask (a 4-D one never reaches it)."""
    if not isinstance(mask, Tensor) or mask.dim() == 2:
        return
    fix = {1: "mask.unsqueeze(0) (one row)", 3: "mask.unsqueeze(1) (a [B, 1, queries, keys] "
           "who-sees-whom mask; bool, True = the query may attend to the key)"}.get(mask.dim(), "")
    raise ValueError(
        f"attention_mask must be the 2-D [batch, keys] padding mask (1 = a real token) or a "
        f"4-D [batch, 1, queries, keys] bool who-sees-whom mask, got a {mask.dim()}-D "
        f"{mask.dtype} mask of shape {tuple(mask.shape)}" + (f": pass {fix}" if fix else "")
    )


# --------------------------------------------------------------------------- the attention


def check_4d_dtype(mask: Tensor, Lq: int, Lk: int) -> None:
    """A 4-D integer mask the caller made (``[B, 1, Lq, Lk]``; the mask function's own
    positions are int64 ``[B | 1, 1, 1, Lq + Lk]``): refused by its dtype, not blamed on the
    cache. A one-query int64 ``[B, 1, 1, Lk]`` of 0/1 is the caller's too."""
    if mask.dim() != 4 or mask.dtype == torch.bool or mask.is_floating_point():
        return
    if mask.dtype == torch.long and mask.shape[1] == mask.shape[2] == 1:  # the mask function's?
        if Lq != 1 or mask.shape[-1] != Lk or is_compiling():
            return
        if not bool(((mask == 0) | (mask == 1)).all()):
            return
    raise ValueError(
        f"a 4-D attention_mask must be bool (True = the query may attend to the key, "
        f"transformers' convention), got {mask.dtype} of shape {tuple(mask.shape)}: pass "
        "mask.bool() (a 0/1 mask), or a 2-D [batch, keys] padding mask"
    )


def check_tree_convention(mask: Tensor, Lq: int, Lk: int) -> None:
    """A 4-D bool mask ``[B | 1, 1, Lq, Lk]`` in which no query sees its own key (the new
    tokens' block has a False diagonal in every row with any True): the inverted convention
    (``torch.nn.MultiheadAttention``'s True = masked)."""
    if is_compiling() or Lq == 0 or Lk < Lq:
        return
    seen = mask.any(-1)  # [B, 1, Lq]: rows that see anything
    own = mask[..., Lk - Lq:].diagonal(dim1=-2, dim2=-1)  # [B, 1, Lq]: sees its own key
    if bool(seen.any()) and not bool((own & seen).any()):
        if not bool(mask[..., Lk - Lq:].any()):  # the last Lq slots unseen: not the new tokens
            raise ValueError(
                f"the 4-D bool attention_mask {tuple(mask.shape)} shows the queries none of the "
                f"last {Lq} key slots, where posenc places this step's tokens: a StaticCache "
                "with slots past them (max_cache_len > the prefix plus the tree)? Run a tree "
                "with a DynamicCache, or a StaticCache whose max_cache_len is exactly the "
                "cached prefix plus the tree's tokens"
            )
        raise ValueError(
            f"the 4-D bool attention_mask {tuple(mask.shape)} lets no query see its own key: "
            "it looks inverted (True = masked, torch.nn.MultiheadAttention's convention); "
            "transformers' convention is True = the query may attend to the key: pass ~mask"
        )


def check_tree_positions(mask: Tensor, q_pos: Tensor, k_pos: Tensor) -> None:
    """A tree's queries sit at or after every key their 4-D mask lets them see: the rule is
    and-ed with causality, which would drop a later key without a word. ``position_ids``
    counted from a padding mask put a tree over a left-padded prefix below its cached keys,
    which sit at their indices. ``mask [B | 1, 1, Lq, Lk]``, ``q_pos [B, Lq]``, ``k_pos [B, Lk]``."""
    if is_compiling():
        return
    later = mask[:, 0] & (k_pos[:, None, :] > q_pos[:, :, None])  # [B, Lq, Lk]
    if not bool(later.any()):
        return
    b, i, j = (int(v) for v in later.nonzero()[0])
    raise ValueError(
        f"the 4-D attention_mask lets query {i} of row {b} (at position {int(q_pos[b, i])}) see "
        f"key {j}, which sits at position {int(k_pos[b, j])}, after it: causality would drop "
        "that key. The cached keys sit at their indices 0 .. Lk - Lq - 1 (a padded prefix "
        "too), so count the tree's position_ids from the index (Lk - Lq + depth), not from "
        "the padding mask"
    )
