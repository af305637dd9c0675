"""Positions for the layouts models really run: padded batches, packed rows, sharded sequences.

Every hook in posenc works from positions, never from slot indices, so each layout needs only
the right position ids:

- ``positions_from_mask``: a left-padded batch counts from its first real token, exactly as
  Hugging Face transformers' ``generate`` builds ``position_ids``;
- ``packed_positions``: documents packed into one row restart at 0 (Krell et al., 2021);
  ``document_ids_from_positions``, ``document_ids_from_lengths`` and ``cu_seqlens`` convert
  between the descriptions of a packed batch (document ids, restarting positions, document
  lengths, FlashAttention's varlen offsets);
- ``shard_positions``: the global positions of one rank's slice of the sequence under context
  parallelism, in the head-tail layout of torch's context-parallel load balancer (which gives
  every rank the same causal work; Liu et al., 2023, ring attention).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import _document_ids_hint, check_bool, check_int, check_tensor, is_compiling


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
            hint = _document_ids_hint(document_ids)
            raise ValueError(
                "document_ids must hold each document as one contiguous run (e.g. [0, 0, 1, 1, 1]); "
                f"got a row with {int((runs - distinct).max())} id(s) that come back after another id"
                + (f". {hint}" if hint else "")
            )
    idx = torch.arange(L, device=document_ids.device).expand(document_ids.shape)  # [..., L]
    start = torch.where(new, idx, torch.zeros_like(idx)).cummax(-1).values  # first index of the run
    return idx - start


def _check_integer_2d(name: str, value: object) -> Tensor:
    """An integer tensor of shape ``[L]`` or ``[B, L]`` (bool is not an integer here)."""
    check_tensor(name, value)
    assert isinstance(value, Tensor)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.dim() not in (1, 2):
        raise ValueError(f"{name} must have shape [L] or [B, L], got shape {tuple(value.shape)}")
    return value


def document_ids_from_positions(position_ids: Tensor) -> Tensor:
    """Document ids ``[..., L]`` (int64, from 0 in every row) of restarting ``position_ids``.

    This is transformers' packing detection (``masking_utils.find_packed_sequence_indices``,
    transformers 5.24): a new document begins wherever a position does not continue the previous
    one by 1, so ``[0, 1, 2, 0, 1, 0]`` gives ``[0, 0, 0, 1, 1, 2]``. The result is the inverse
    of :func:`packed_positions` up to renaming the documents, and equals transformers' wherever
    that returns a tensor; where transformers returns ``None`` (one document per row, outside
    ``torch.compile``) this returns zeros, which is what ``None`` stands for.

    Transformers builds this document mask only when ``attention_mask`` is ``None`` (and there is
    no cache): pass an all-ones ``attention_mask`` with restarting positions and every token
    attends to the earlier documents of its row while its positions restart. Hugging Face's
    ``DataCollatorWithFlattening`` packs a batch into one row this way, with positions restarting
    at ``position_ids_start`` (default 0) and ``separator_id`` (default ``-100``, the ignored
    label) as the first label of every packed sequence, so that no token is trained to predict
    the first token of the next document (Krell et al., 2021, packing without
    cross-contamination).

    ``position_ids [L]`` or ``[B, L]``: non-negative integers. Every document after the first in a
    row must restart at the batch's smallest position (0, or 2 for RoBERTa-like models that number
    from ``padding_idx + 1``), as the collator makes them; a row's first document may start
    anywhere (a chunk that continues an earlier one). Positions that jump by more than 1, repeat,
    or fall back to anything but the restart value are refused: transformers' two paths disagree
    on them (the mask above would start a document there, FlashAttention's
    ``prepare_fa_kwargs_from_position_ids`` would not, since it splits only where positions equal
    their minimum). The value checks need a host sync and are skipped under ``torch.compile``;
    the computation itself compiles without graph breaks.
    """
    position_ids = _check_integer_2d("position_ids", position_ids)
    if position_ids.shape[-1] == 0:
        return torch.zeros(position_ids.shape, dtype=torch.long, device=position_ids.device)
    diff = torch.diff(position_ids, prepend=position_ids[..., :1] - 1, dim=-1)  # [..., L]
    new = diff != 1  # [..., L]: a document starts here (never at index 0)
    if not is_compiling() and position_ids.numel():
        lo = int(position_ids.min())
        if lo < 0:
            raise ValueError(f"position_ids must be >= 0, got a minimum of {lo}")
        bad = new & (position_ids != lo)  # a later document that does not restart at lo
        if bool(bad.any()):
            where = bad.nonzero()[0].tolist()  # [row, index] (or [index] for [L])
            at = tuple(where) if len(where) > 1 else where[0]
            i = where[-1]
            row = position_ids[tuple(where[:-1])] if len(where) > 1 else position_ids
            raise ValueError(
                f"position_ids must restart at {lo} (the smallest position) or go on by 1, got "
                f"{int(row[i - 1])} then {int(row[i])} at index {at}; transformers' mask and "
                "FlashAttention paths split such positions differently"
            )
    return new.long().cumsum(-1)


def document_ids_from_lengths(lengths: object) -> Tensor:
    """Document ids ``[sum(lengths)]`` (int64) of documents packed one after another.

    Document ``i`` is ``lengths[i]`` copies of ``i``: ``[3, 2, 1]`` gives
    ``[0, 0, 0, 1, 1, 2]``, the ``document_ids`` of :func:`packed_positions`, :func:`cu_seqlens`
    and ``posenc.attend``. ``lengths``: a list or tuple of ints, or a 1-D integer tensor (the
    result is on its device), every length >= 0. ``cu_seqlens(document_ids_from_lengths(n))``
    gives back the offsets ``[0, n_1, n_1 + n_2, ...]`` and ``document_ids_from_lengths(
    cu.diff())`` the ids of FlashAttention's offsets ``cu``.

    A zero-length document (an example emptied by truncation) is allowed and takes no token:
    the ids keep each document's index in ``lengths``, so ``[2, 0, 1]`` gives ``[0, 0, 2]``
    and an id still names its source document. :func:`cu_seqlens` of that lists the non-empty
    documents only (``[0, 2, 3]``); FlashAttention would also accept the empty one as a
    repeated offset (``[0, 2, 2, 3]``), which changes nothing it computes.

    Raises:
        TypeError: ``lengths`` is not a list, tuple or tensor; an entry is not an int (a bool or
            a float is not); a tensor that is not an integer tensor.
        ValueError: a tensor that is not 1-D; a negative length.
    """
    if isinstance(lengths, Tensor):
        if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
            raise TypeError(
                f"lengths must be a list of ints or an integer tensor, got dtype {lengths.dtype}"
            )
        if lengths.dim() != 1:
            raise ValueError(
                f"lengths must be 1-D (one length per document), got shape {tuple(lengths.shape)}"
            )
        n = lengths.to(torch.long)
        if n.numel() and not is_compiling():
            lo = int(n.min())
            if lo < 0:
                raise ValueError(f"lengths must be >= 0, got a minimum of {lo}")
    elif isinstance(lengths, (list, tuple)):
        n = torch.tensor(
            [check_int(f"lengths[{i}]", x, minimum=0) for i, x in enumerate(lengths)],
            dtype=torch.long,
        )
    else:
        one = f" (one document of {lengths} tokens: [{lengths}])" if isinstance(lengths, int) else ""
        raise TypeError(
            f"lengths must be a list or tuple of ints or a 1-D integer tensor, got "
            f"{type(lengths).__name__}{one}"
        )
    return torch.repeat_interleave(torch.arange(n.numel(), device=n.device), n)  # [sum(n)]


def _check_mask_of(name: str, mask: object, ids: Tensor) -> Tensor:
    """``mask`` (0/1, any of transformers' dtypes) of ``ids``' shape, as bool ``[B, L]``; a
    1-D ``ids [L]`` takes ``[L]`` or ``[1, L]``."""
    check_tensor(name, mask)
    assert isinstance(mask, Tensor)
    if ids.dim() == 1 and mask.dim() == 1:
        mask = mask[None]
    rows = ids if ids.dim() == 2 else ids[None]  # [B, L]
    if mask.dim() != 2 or mask.shape != rows.shape:
        want = f"{list(ids.shape)} or {list(rows.shape)}" if ids.dim() == 1 else f"{list(rows.shape)}"
        raise ValueError(
            f"{name} must have the shape of document_ids, {want} (1 = a real token), got shape "
            f"{tuple(mask.shape)}"
        )
    return _check_mask(name, mask).to(ids.device)


def _real_starts(rows: Tensor, real: Tensor) -> tuple[Tensor, int]:
    """``(the start of each document among the real tokens [N], number of real tokens)`` for
    ``rows [B, L]`` and the bool ``real [B, L]``: the real tokens in row-major order, a new
    document wherever the id or the row changes. Checks that every document is one contiguous
    run of its id among its row's real tokens."""
    B, L = rows.shape
    flat = rows.reshape(-1)[real.reshape(-1)]  # [T]: the real tokens' ids, row-major
    row = torch.arange(B, device=rows.device).repeat_interleave(L)[real.reshape(-1)]  # [T]
    T = flat.numel()
    new = torch.ones(T, dtype=torch.bool, device=rows.device)  # [T]
    new[1:] = (flat[1:] != flat[:-1]) | (row[1:] != row[:-1])
    if T and not is_compiling():
        runs = torch.bincount(row[new], minlength=B)  # [B]
        pairs = torch.unique(torch.stack([row, flat.to(torch.long)], dim=1), dim=0)  # [D, 2]
        distinct = torch.bincount(pairs[:, 0], minlength=B)  # [B]
        if not bool((runs == distinct).all()):
            b = int((runs != distinct).nonzero()[0, 0])
            hint = _document_ids_hint(rows[b][real[b]])
            raise ValueError(
                "document_ids must hold each document as one contiguous run of its id among the "
                f"real tokens (attention_mask 1); in row {b}, {int(runs[b] - distinct[b])} id(s) "
                "come back after another id" + (f". {hint}" if hint else "")
            )
    return new.nonzero().reshape(-1), T


def cu_seqlens(document_ids: Tensor, *, attention_mask: Tensor | None = None) -> tuple[Tensor, int]:
    """FlashAttention's varlen offsets of a packed batch: ``(cu_seqlens [N + 1] int32, max_seqlen)``.

    FlashAttention-2's variable-length kernels (``flash_attn_varlen_func``; Dao, 2023) take the
    batch flattened to ``[total, heads, d_h]`` and the ``N`` sequences in it as cumulative offsets
    ``cu_seqlens = [0, n_1, n_1 + n_2, ..., total]``: every sequence attends only to itself, so
    packing costs ``sum n_i**2`` rather than ``B * L**2``. Here every document of every row of
    ``document_ids [L]`` or ``[B, L]`` (one contiguous run per document, as for
    :func:`packed_positions`) is one sequence, so ``N`` is the number of runs over all rows and
    ``cu_seqlens.diff()`` their lengths in order. ``max_seqlen`` (a Python int) is the longest.

    ``attention_mask`` (``[B, L]``, the shape of ``document_ids``; 1 / True = a real token, as in
    transformers) drops the padding: the offsets then count the real tokens only, in row-major
    order, which is flash-attn's ``unpad_input`` convention (``q[attention_mask.flatten() != 0]``
    is the ``[total, heads, d_h]`` that goes with them). Without it a padded tail counts as one
    more sequence. The padded slots' ids do not matter (a pad id equal to a real document's is
    fine); a document's real tokens must be one contiguous run among the row's real tokens. A
    row with no real token adds no sequence (transformers' ``_get_unpad_data`` gives it a
    zero-length one, a repeated offset, which changes nothing flash-attn computes). With one
    document per row this equals ``_get_unpad_data(attention_mask)``'s ``cu_seqlens`` and
    ``max_seqlen_in_batch`` (transformers 5.24, ``modeling_flash_attention_utils``).

    Without padding this equals transformers' ``prepare_fa_kwargs_from_position_ids``
    (transformers 5.24, its ``cu_seq_lens_q`` and ``max_length_q``) fed
    ``packed_positions(document_ids)``, and
    ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``'s ``cu_seq_lens_q`` for its
    single packed row (the collator drops the padding a tokenizer added, as ``attention_mask``
    does here). Transformers derives these from restarting ``position_ids`` only when
    ``attention_mask`` is ``None``; the collator marks each boundary in the labels with
    ``separator_id`` (default ``-100``) as the first label of every packed sequence, so no token
    predicts across a boundary (packing: Krell et al., 2021). ``document_ids``,
    :func:`packed_positions`, :func:`document_ids_from_positions` and
    :func:`document_ids_from_lengths` convert into each other.

    The offsets have a data-dependent length and ``max_seqlen`` is a Python int, so this needs a
    host sync (``nonzero`` and ``.item()``): compute it once per batch, outside the compiled model,
    as the collator does.
    """
    document_ids = _check_integer_2d("document_ids", document_ids)
    if document_ids.numel() >= 2**31:
        raise ValueError(
            f"document_ids must have fewer than 2**31 elements (int32 offsets), got shape "
            f"{tuple(document_ids.shape)}"
        )
    real = None if attention_mask is None else _check_mask_of("attention_mask", attention_mask, document_ids)
    if document_ids.numel() == 0:
        return torch.zeros(1, dtype=torch.int32, device=document_ids.device), 0
    rows = document_ids.reshape(-1, document_ids.shape[-1])  # [B, L]
    B, L = rows.shape
    if real is None:
        packed_positions(rows)  # checks that every document is one contiguous run
        new = torch.ones(B, L, dtype=torch.bool, device=rows.device)  # [B, L]
        new[:, 1:] = rows[:, 1:] != rows[:, :-1]
        starts, total = new.reshape(-1).nonzero().reshape(-1), B * L  # [N]: each start
    else:
        starts, total = _real_starts(rows, real)  # [N], among the real tokens
    end = torch.full((1,), total, dtype=starts.dtype, device=starts.device)
    offsets = torch.cat([starts, end]).to(torch.int32)  # [N + 1]
    return offsets, int(offsets.diff().max()) if len(offsets) > 1 else 0


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
