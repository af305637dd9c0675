"""Chapter 10's laboratory: the lab model run under any visibility rule of ``posenc.attend``.

:func:`forward` is :func:`posenc.lab.production.forward` without a cache and with every rule
``attend`` takes, ``sinks`` included, so that a sliding window with attention sinks can be read
in one pass instead of token by token.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

import posenc

from .model import Block, TransformerLM

__all__ = ["forward"]


def forward(model: TransformerLM, tokens: Tensor, *, positions: Tensor | None = None,
            **rule: object) -> Tensor:
    """Logits ``[B, L, vocab]`` of ``model`` for ``tokens [B, L]`` in one pass.

    ``positions`` (``[L]`` or ``[B, L]``) go to the ``embed`` hook and to every attention layer;
    by default ``arange(L)``, or restarting per document with ``document_ids``. ``rule`` holds
    :func:`~posenc.attention.attend`'s visibility options (``attention_mask``, ``document_ids``,
    ``window``, ``sinks``, ...), passed to every layer unchanged.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    if "cache" in rule:
        raise ValueError("forward runs one pass without a cache; got cache=...")
    embed_pos = positions
    if embed_pos is None:
        ids = rule.get("document_ids")
        embed_pos = (posenc.packed_positions(cast(Tensor, ids)) if ids is not None
                     else torch.arange(tokens.shape[1], device=tokens.device))
    x = model.scheme.embed(model.embed(tokens), embed_pos)  # [B, L, D]
    for blk in model.blocks:
        block = cast(Block, blk)
        mha = block.attn
        H, H_kv, Dh = mha.num_heads, mha.num_kv_heads, mha.head_dim
        h = block.ln1(x)
        q, k, v = mha.qkv(h).split([H * Dh, H_kv * Dh, H_kv * Dh], dim=-1)
        q, k, v = (t.unflatten(-1, (-1, Dh)).transpose(1, 2) for t in (q, k, v))
        y = posenc.attend(q, k, v, mha.scheme, causal=mha.causal, backend=mha.backend,
                          positions=positions, **rule)  # type: ignore[arg-type]
        x = x + mha.proj(y.transpose(1, 2).flatten(2))
        x = x + block.mlp(block.ln2(x))
    return model.ln_f(x) @ model.embed.weight.T  # [B, L, vocab]
