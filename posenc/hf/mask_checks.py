"""The integrations layer: the masks a caller hands a model that :func:`~posenc.hf.use`
switched to posenc, checked where transformers would run them silently or fail obscurely.

What each check guards (the practitioner reading of 2026-12-07: s96, o94, o97):

* :func:`check_mask_dims` (the mask function): a mask of neither 2 nor 4 dimensions (a 3-D
  ``[B, Lq, Lk]`` tree mask) is refused with the ``unsqueeze`` that fixes it;
* :func:`check_4d_dtype` (the attention): a 4-D integer mask is named as such rather than
  read as the mask function's positions (which blamed the cache);
* :func:`check_tree_convention` (the attention): a 4-D bool mask in the "True = masked"
  convention (no query sees its own key) is refused.

Value checks read the tensors (a host sync): they are skipped while compiling.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._checks import is_compiling

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
        raise ValueError(
            f"the 4-D bool attention_mask {tuple(mask.shape)} lets no query see its own key: "
            "it looks inverted (True = masked, torch.nn.MultiheadAttention's convention); "
            "transformers' convention is True = the query may attend to the key: pass ~mask"
        )
