"""Positions for the layouts models really run: padded batches, packed rows, sharded sequences.

Every hook in posenc works from positions, never from indices (see DESIGN.md), so each layout
needs only the right position ids:

- ``positions_from_mask``: a left-padded batch counts from its first real token, exactly as
  Hugging Face transformers' ``generate`` builds ``position_ids``;
- ``packed_positions``: documents packed into one row restart at 0 (Krell et al., 2021);
- ``shard_positions``: the global positions of one rank's slice of the sequence under context
  parallelism, in the head-tail layout of torch's context-parallel load balancer (which gives
  every rank the same causal work; Liu et al., 2023, ring attention).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bool, check_int, check_tensor, is_compiling


def _check_mask(name: str, mask: object) -> Tensor:
    """A ``[B, L]`` mask of 0/1 (bool, integer or float, as transformers accepts): as bool."""
    check_tensor(name, mask)
    assert isinstance(mask, Tensor)
    if mask.dim() != 2:
        raise ValueError(f"{name} must have shape [B, L], got shape {tuple(mask.shape)}")
    if mask.is_complex():
        raise TypeError(f"{name} must be a bool, integer or float tensor of 0/1, got dtype {mask.dtype}")
    if mask.dtype == torch.bool:
        return mask
    if not is_compiling() and mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            f"{name} must hold only 0 and 1 (1 = a real token), got values {mask.unique().tolist()}"
        )
    return mask != 0


def positions_from_mask(attention_mask: Tensor, *, pad_position: int = 0) -> Tensor:
    """Position ids ``[B, L]`` (int64) of a padded batch: ``cumsum(mask) - 1``, padded slots 0.

    ``attention_mask [B, L]`` is 1 (or True) on real tokens, 0 on padding, as in Hugging Face.
    A left-padded row ``[0, 0, 1, 1, 1]`` gets ``[0, 0, 0, 1, 2]``: its first real token is at
    position 0, as it would be alone. This is what transformers 5.x's ``generate`` computes
    (``_prepare_position_ids_for_generation``: ``masked_fill(attention_mask == 0, 0)``; 4.x
    and a few models fill 1: ``pad_position=1``). The padded slots' value does not matter as
    long as the padded keys are masked.
    """
    mask = _check_mask("attention_mask", attention_mask)
    pad_position = check_int("pad_position", pad_position, minimum=0)
    pos = mask.long().cumsum(-1) - 1  # [B, L]
    return pos.masked_fill(~mask, pad_position)


def packed_positions(document_ids: Tensor) -> Tensor:
    """Positions ``[..., L]`` (int64) that restart at 0 where ``document_ids [..., L]`` changes.

    ``[7, 7, 7, 3, 3, 9]`` gives ``[0, 1, 2, 0, 1, 0]``. Each document must be one contiguous
    run of its id (as packing makes them); an id that comes back later in the row is an error,
    since attention would join the two runs while positions restart.
    """
    check_tensor("document_ids", document_ids, min_dim=1)
    if document_ids.is_floating_point() or document_ids.is_complex() or document_ids.dtype == torch.bool:
        raise TypeError(f"document_ids must be an integer tensor, got dtype {document_ids.dtype}")
    if document_ids.dim() > 2:
        raise ValueError(f"document_ids must have shape [L] or [B, L], got shape {tuple(document_ids.shape)}")
    L = document_ids.shape[-1]
    if L == 0:
        return torch.zeros(document_ids.shape, dtype=torch.long, device=document_ids.device)
    new = torch.ones(document_ids.shape, dtype=torch.bool, device=document_ids.device)  # [..., L]
    new[..., 1:] = document_ids[..., 1:] != document_ids[..., :-1]
    if not is_compiling():
        runs = new.sum(-1)  # [...]
        srt = document_ids.sort(-1).values
        distinct = (srt[..., 1:] != srt[..., :-1]).sum(-1) + 1
        if not bool((runs == distinct).all()):
            raise ValueError(
                "document_ids must hold each document as one contiguous run (e.g. [0, 0, 1, 1, 1]); "
                f"got a row with {int((runs - distinct).max())} id(s) that come back after another id"
            )
    idx = torch.arange(L, device=document_ids.device).expand(document_ids.shape)  # [..., L]
    start = torch.where(new, idx, torch.zeros_like(idx)).cummax(-1).values  # first index of the run
    return idx - start


def shard_positions(seq_len: int, rank: int, world_size: int, *, load_balance: bool = True) -> Tensor:
    """Global positions ``[seq_len // world_size]`` (int64) of rank ``rank``'s shard.

    Context parallelism splits one sequence over ``world_size`` devices. With contiguous chunks
    (``load_balance=False``) the last rank's causal queries see every key and the first rank's
    almost none. The head-tail layout (``load_balance=True``, torch's context-parallel load
    balancer ``_HeadTailLoadBalancer``) cuts the sequence into ``2 * world_size`` chunks and gives
    rank ``r`` chunks ``r`` and ``2 * world_size - 1 - r``, so every rank does the same work.
    ``seq_len`` must divide evenly (by ``2 * world_size`` with load balancing).

    On CPU (and in the tests) a rank rotates its local queries and keys by these global
    positions, all-gathers keys, values and key positions, and calls
    ``attend(q, k, v, scheme, positions=mine, key_positions=gathered)``. On GPUs, torch's
    ``torch.distributed.tensor.experimental.context_parallel`` shards the buffers itself and
    patches CUDA SDPA into ring attention (it has no CPU kernel); give it the positions as one
    more buffer so they are sharded exactly like the tokens, and rotate by them::

        pos = torch.arange(seq_len, device="cuda").expand(batch, seq_len)  # [B, L]
        with context_parallel(mesh, buffers=[x, pos], buffer_seq_dims=[1, 1]):
            q, k = rotary(q, k, positions=pos)  # global positions of the local shard
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

    RoPE then needs nothing else. The patched SDPA is written for ``is_causal`` attention, not
    for an additive bias that would itself need sharding by query and key, so for ALiBi and T5
    gather keys with ``key_positions`` as above (or use FlexAttention's ``score_mod``).
    """
    seq_len = check_int("seq_len", seq_len, minimum=0)
    world_size = check_int("world_size", world_size, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    load_balance = check_bool("load_balance", load_balance)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    parts = 2 * world_size if load_balance else world_size
    if seq_len % parts:
        raise ValueError(
            f"seq_len={seq_len} must be divisible by {'2 * world_size' if load_balance else 'world_size'}"
            f" = {parts} (load_balance={load_balance}); pad the sequence to a multiple of {parts}"
        )
    c = seq_len // parts
    if not load_balance:
        return torch.arange(rank * c, (rank + 1) * c)
    tail = parts - 1 - rank
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(tail * c, (tail + 1) * c)])
