"""The laboratory of chapters 10 and 11 (positions in batches and at serving time): the lab's
language model run the way served and trained models run, with a visibility rule, a streaming
cache, packed rows and shards.

- :func:`forward`: a :class:`~posenc.lab.model.TransformerLM` forward pass with every option of
  :func:`~posenc.attention.attend` (``positions``, ``attention_mask``, ``document_ids``,
  ``window``, ``caches``) passed to every attention layer, written out from the model's own
  weights so that a chapter can call it the same way for each rule (the model's ``forward``
  takes positions, caches, ``attention_mask`` and ``document_ids`` too, but no ``window``);
- :func:`attention_weights`: every layer's attention probabilities, to see where the mass goes
  (how much lands on the first tokens: attention sinks);
- :func:`stream`: token-by-token decoding with a cache that keeps a few *sink* tokens and a
  sliding window (Xiao et al., 2024, StreamingLLM), keys keeping their original positions (from
  ``offset`` on), taking StreamingLLM's positions inside the cache (only the sinks are
  re-rotated, each step from a copy that is never overwritten, by their total shift), or
  rebased in bulk every ``R`` tokens (the move of llama.cpp's context shift applied to a
  sliding window, ``posenc.lab.serving.rebase_cache``); :func:`~posenc.cache.streaming_keep` gives
  StreamingLLM's own bookkeeping (the slots kept and how far each key moves);
- :func:`with_angles`: a copy of a model whose RoPE forms its angles as float32 products (as
  transformers, Meta's code and torchtune do; they drift with the absolute position) or as
  posenc's exact ones, to stream at large positions before and after that fix;
- :func:`rotate_by`: turn rotated keys by a further ``delta`` positions (negative allowed);
- :func:`first_fit` and :func:`causal_work`: packing documents into rows, and the causal work
  of each rank under context parallelism;
- :func:`shard_worker` / :func:`run_sharded`: a real multi-process run (``torch.distributed``,
  gloo) of attention over a sequence sharded in the head-tail layout; ``python -m
  posenc.lab.production --world-size 2 --out FILE`` starts it.
"""
from __future__ import annotations

import argparse
import copy
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

import posenc
from posenc._checks import check_int
from posenc.attention import MultiHeadAttention
from posenc.cache import KVCache, streaming_keep
from posenc.rope import RotaryEmbedding
from posenc.schemes import PositionScheme, RoPE

from .model import Block, TransformerLM
from .serving import rebase_cache

__all__ = [
    "forward", "attention_weights", "stream", "with_angles", "streaming_keep", "rotate_by", "first_fit",
    "causal_work", "shard_worker", "run_sharded", "sharded_reference",
]


def _attention(mha: MultiHeadAttention, x: Tensor, **options) -> Tensor:
    """``mha``'s forward with every option of :func:`~posenc.attention.attend` (same weights)."""
    H, H_kv, Dh = mha.num_heads, mha.num_kv_heads, mha.head_dim
    q, k, v = mha.qkv(x).split([H * Dh, H_kv * Dh, H_kv * Dh], dim=-1)
    q, k, v = (t.unflatten(-1, (-1, Dh)).transpose(1, 2) for t in (q, k, v))  # [B, H, L, Dh]
    y = posenc.attend(q, k, v, mha.scheme, causal=mha.causal, backend=mha.backend, **options)
    return mha.proj(y.transpose(1, 2).flatten(2))  # [B, L, D]


def forward(
    model: TransformerLM,
    tokens: Tensor,
    *,
    positions: Tensor | None = None,
    attention_mask: Tensor | None = None,
    document_ids: Tensor | None = None,
    window: int | None = None,
    caches: list[KVCache] | None = None,
) -> Tensor:
    """Logits ``[B, L, vocab]`` of ``model`` for ``tokens [B, L]`` with a visibility rule.

    ``positions`` (``[L]`` or ``[B, L]``) go to the ``embed`` hook (absolute schemes) and to
    every attention layer; by default ``arange(L)`` after the cached tokens (restarting per
    document with ``document_ids``). The other options are :func:`~posenc.attention.attend`'s.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    if caches is not None and len(caches) != len(model.blocks):
        raise ValueError(f"caches must hold one KVCache per block ({len(model.blocks)})")
    L = tokens.shape[1]
    embed_pos = positions
    if embed_pos is None:
        if document_ids is not None:
            embed_pos = posenc.packed_positions(document_ids)
        elif caches:
            embed_pos = caches[0].next_positions(L, tokens.device)
        else:
            embed_pos = torch.arange(L, device=tokens.device)
    x = model.scheme.embed(model.embed(tokens), embed_pos)  # [B, L, D]
    for i, blk in enumerate(model.blocks):
        block = cast(Block, blk)
        x = x + _attention(
            block.attn, block.ln1(x), positions=positions, attention_mask=attention_mask,
            document_ids=document_ids, window=window, cache=caches[i] if caches else None,
        )
        x = x + block.mlp(block.ln2(x))
    return model.ln_f(x) @ model.embed.weight.T  # [B, L, vocab]


def attention_weights(model: TransformerLM, tokens: Tensor) -> list[Tensor]:
    """The causal attention probabilities ``[B, H, L, L]`` of every layer of ``model`` for
    ``tokens [B, L]`` at positions ``0 .. L - 1``, written out (scores, bias, mask, softmax)
    from the same weights; each layer's output from them equals :func:`forward`'s."""
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    B, L = tokens.shape
    pos = torch.arange(L, device=tokens.device)
    future = torch.ones(L, L, dtype=torch.bool, device=tokens.device).triu(1)  # [L, L]
    x = model.scheme.embed(model.embed(tokens), pos)  # [B, L, D]
    out = []
    for blk in model.blocks:
        block = cast(Block, blk)
        mha = block.attn
        H, H_kv, Dh = mha.num_heads, mha.num_kv_heads, mha.head_dim
        q, k, v = mha.qkv(block.ln1(x)).split([H * Dh, H_kv * Dh, H_kv * Dh], dim=-1)
        q, k, v = (t.unflatten(-1, (-1, Dh)).transpose(1, 2) for t in (q, k, v))
        q, k = mha.scheme.rotate(q, k, pos)
        k, v = (t.repeat_interleave(H // H_kv, dim=1) for t in (k, v))  # GQA: [B, H, L, Dh]
        scores = q.float() @ k.float().transpose(-1, -2) / Dh**0.5  # [B, H, L, L]
        bias = mha.scheme.position_bias(pos.expand(B, -1), pos.expand(B, -1))
        if bias is not None:
            scores = scores + bias
        probs = scores.masked_fill(future, float("-inf")).softmax(-1)
        out.append(probs)
        y = (probs.to(v.dtype) @ v).transpose(1, 2).flatten(2)  # [B, L, H * Dh]
        x = x + mha.proj(y)
        x = x + block.mlp(block.ln2(x))
    return out


def rotate_by(x: Tensor, delta: Tensor, inv_freq: Tensor, *, interleaved: bool = True) -> Tensor:
    """Rotate ``x [..., T, Dh]``, already rotated to some positions, by ``delta [T]`` more
    positions (any sign): ``R(n) R(delta) = R(n + delta)``. Positions are never negative in
    posenc, so a backward turn is the forward one with ``sin`` negated."""
    cos, sin = posenc.rope_cos_sin(delta.abs(), inv_freq, interleaved=interleaved)  # [T, Dh]
    sin = sin * delta.sign()[:, None].to(sin.dtype)
    return posenc.apply_rope(x, cos, sin, interleaved=interleaved)


def with_angles(model: TransformerLM, *, exact: bool) -> TransformerLM:
    """A copy of ``model`` whose RoPE layers form their angles exactly (``exact=True``,
    posenc's default: ``p * theta`` reduced mod ``2 pi`` before rounding, no drift at any
    position below ``2**31``) or as float32 products ``float(p) * theta`` (``exact=False``: the
    tables of transformers, Meta's LLaMA code and torchtune, bit for bit, and their drift, up
    to ``p * 3e-8`` rad). The weights are shared by value (a deep copy); a model without RoPE
    comes back as an unchanged copy."""
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    if not isinstance(exact, bool):
        raise TypeError(f"exact must be True or False, got {exact!r}")
    out = copy.deepcopy(model)
    for module in out.modules():
        if isinstance(module, RoPE):
            r = module.rotary
            module.rotary = RotaryEmbedding(
                r.head_dim, base=r.base, interleaved=r.interleaved, scaling=r.scaling,
                xpos_scale_base=r.xpos_scale_base, seq_dim=r.seq_dim, exact_angles=exact,
            ).to(r.inv_freq.device)
    return out


def stream(
    model: TransformerLM,
    tokens: Tensor,
    *,
    window: int,
    sinks: int = 0,
    reposition: bool = False,
    offset: int = 0,
    rebase_every: int | None = None,
) -> Tensor:
    """Decode ``tokens [B, L]`` one at a time with a cache of at most ``sinks + window`` keys
    per layer (the first ``sinks`` tokens, then the latest ones); returns the per-token loss
    ``[B, L - 1]`` (nats) of predicting ``tokens[:, 1:]``.

    ``offset``: the first token's position (a stream that has already run that long), so the
    token of step ``t`` is at position ``offset + t``.

    ``reposition=False``, ``rebase_every=None``: every key keeps the position it was seen at.
    The positions grow without bound. In exact arithmetic only offsets matter to RoPE and to
    the biases, but RoPE's angles are rounded to float32, and a float32 product
    ``float(p) * theta`` carries an error of up to ``p * 3e-8`` rad: with such angles
    (transformers', Meta's, torchtune's; :func:`with_angles` ``exact=False``) the scores drift
    with the absolute position (a relative error of about 1e-3 at 10**5, 1e-2 at 10**6 with
    ``head_dim`` 128). posenc's own angles are reduced mod ``2 pi`` before rounding and do not
    drift (``posenc.rope_angles``); positions must still stay below ``2**31``.

    ``reposition=True``: StreamingLLM's positions inside the cache, ``0 .. sinks + window - 1``,
    for relative schemes (RoPE, ALiBi, T5). StreamingLLM moves every kept key down each step;
    the same offsets come from leaving the window at its original positions (a window is
    contiguous) and moving only the sinks, to ``offset + t - (sinks + window - 1) + j`` for
    sink ``j``. So only the sinks' keys are re-rotated, each step from a copy taken when they
    were cached and never overwritten, by their total shift: ``sinks`` rotations per step, and
    no rounding that accumulates step after step. (The window's positions still grow.)

    ``rebase_every=R``: the move of llama.cpp's context shift (which, when its context is full,
    drops half of the keys after the first ``n_keep`` and moves the rest down), applied to a
    sliding window on another schedule: every ``R`` steps, once the cache is full,
    every cached key is moved down in one rotation (``posenc.lab.serving.rebase_cache``):
    the sinks to ``0 .. sinks - 1``, the window right after them; so every position stays below
    ``sinks + window + R`` however long the stream, at the cost of one rounding per key and
    rebase.

    Raises:
        ValueError: ``window < 1``, ``sinks < 0``, ``offset < 0``, ``rebase_every < 1``;
            ``reposition=True`` or ``rebase_every`` with an absolute scheme (sinusoidal,
            learned); ``reposition=True`` with ``rebase_every``.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    if window < 1 or sinks < 0:
        raise ValueError(f"window must be >= 1 and sinks >= 0, got {window} and {sinks}")
    offset = check_int("offset", offset, minimum=0)
    if rebase_every is not None:
        rebase_every = check_int("rebase_every", rebase_every, minimum=1)
        if reposition:
            raise ValueError("give reposition=True (StreamingLLM, every step) or rebase_every "
                             "(llama.cpp, every R steps), not both")
    if (reposition or rebase_every) and type(model.scheme).embed is not PositionScheme.embed:
        what = "reposition=True" if reposition else "rebase_every"
        raise ValueError(
            f"{what} needs a relative scheme (rope, alibi, t5), got {model.scheme.name!r}:"
            " an absolute position is mixed into every layer and cannot be moved"
        )
    size = sinks + window
    rotaries = [getattr(cast(Block, b).attn.scheme, "rotary", None) for b in model.blocks]
    caches = [KVCache() for _ in model.blocks]
    pristine: list[Tensor] = []  # per layer: the sinks' keys as first cached, never overwritten
    B, L = tokens.shape
    device = tokens.device
    logits = []
    next_pos = offset  # the next token's position
    full_steps = 0  # steps since the cache first filled (rebase_every counts these)
    for t in range(L):
        pos = torch.tensor([next_pos], device=device)
        next_pos += 1
        logits.append(forward(model, tokens[:, t:t + 1], positions=pos, caches=caches)[:, 0])
        if len(caches[0]) < size:
            continue
        keep, _ = streaming_keep(len(caches[0]), sinks, window)  # room for the next token
        shift = t + 2 - size  # the sinks' move, so the next query (t + 1) sits at size - 1
        full_steps += 1
        rebase = rebase_every is not None and full_steps % rebase_every == 0
        for i, cache in enumerate(caches):
            cache.evict(keep.to(device))
            if rebase:
                moved_by = rebase_cache(cache, rotaries[i], keep=sinks)
                if i == 0:
                    next_pos -= moved_by
                continue
            if not (reposition and sinks):
                continue
            assert cache.k is not None and cache.positions is not None
            if len(pristine) <= i:
                pristine.append(cache.k[:, :, :sinks].clone())
            k_sinks = pristine[i]
            rope = rotaries[i]
            if rope is not None:  # one rotation from the pristine copy, by the total shift
                moved = torch.full((sinks,), shift, device=device)
                k_sinks = rotate_by(k_sinks, moved, rope.inv_freq, interleaved=rope.interleaved)
            cache.k = torch.cat([k_sinks, cache.k[:, :, sinks:]], dim=2)
            sink_pos = torch.arange(sinks, device=device) + offset + shift
            cache.positions = torch.cat(
                [sink_pos.expand(B, -1), cache.positions[:, sinks:]], dim=1)
    out = torch.stack(logits[:-1], dim=1).float()  # [B, L - 1, vocab]
    return F.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none").view(B, L - 1)


def first_fit(lengths: list[int], row_len: int) -> list[list[int]]:
    """Pack documents of ``lengths`` into rows of at most ``row_len`` tokens, first fit in the
    given order: a list of rows, each the indices of its documents."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i, n in enumerate(lengths):
        if n > row_len:
            raise ValueError(f"document {i} has {n} tokens, more than row_len={row_len}")
        for r, space in enumerate(free):
            if n <= space:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(row_len - n)
    return rows


def causal_work(seq_len: int, world_size: int, *, load_balance: bool) -> list[int]:
    """Causal (query, key) pairs each rank computes when one sequence of ``seq_len`` tokens is
    split over ``world_size`` ranks (:func:`~posenc.positions.shard_positions`): query ``m`` scores the
    ``m + 1`` keys at positions ``0 .. m``."""
    return [
        int((posenc.shard_positions(seq_len, r, world_size, load_balance=load_balance) + 1).sum())
        for r in range(world_size)
    ]


# ------------------------------------------------------------ context parallelism on CPU


def _inputs(seq_len: int, heads: int, head_dim: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, seq_len, head_dim, generator=gen) for _ in range(3))
    return q, k, v


def _scheme(name: str, heads: int, head_dim: int, seed: int) -> posenc.PositionScheme:
    torch.manual_seed(seed)  # the same T5 table in every process
    return posenc.make_scheme(name, dim=heads * head_dim, num_heads=heads)


def sharded_reference(scheme_name: str, seq_len: int = 64, heads: int = 4, head_dim: int = 16,
                      seed: int = 0) -> Tensor:
    """The single-process causal attention ``[1, H, L, Dh]`` that :func:`shard_worker` shards."""
    q, k, v = _inputs(seq_len, heads, head_dim, seed)
    return posenc.attend(q, k, v, _scheme(scheme_name, heads, head_dim, seed))


def shard_worker(rank: int, world_size: int, scheme_name: str, seq_len: int = 64,
                 heads: int = 4, head_dim: int = 16, seed: int = 0) -> tuple[Tensor, Tensor]:
    """One rank's part of causal attention over a sequence sharded in the head-tail layout;
    needs ``torch.distributed`` initialised. Returns ``(positions, output)``, the rank's global
    positions ``[L / P]`` and its rows of attention ``[1, H, L / P, Dh]`` (P = world_size)."""
    import torch.distributed as dist

    q, k, v = _inputs(seq_len, heads, head_dim, seed)  # every rank could build all; it keeps
    pos = posenc.shard_positions(seq_len, rank, world_size)  # only its shard
    q, k, v = q[:, :, pos], k[:, :, pos], v[:, :, pos]  # [1, H, L / P, Dh]
    scheme: PositionScheme | None = _scheme(scheme_name, heads, head_dim, seed)
    if scheme_name == "rope" and scheme is not None:  # rotate by their global positions
        q, k = scheme.rotate(q, k, pos)
        scheme = None  # already rotated: attention only needs the positions for causality
    gathered = [[torch.empty_like(t) for _ in range(world_size)] for t in (k, v, pos)]
    for out, t in zip(gathered, (k, v, pos), strict=True):
        dist.all_gather(out, t)
    k_all, v_all = torch.cat(gathered[0], dim=2), torch.cat(gathered[1], dim=2)  # [1, H, L, Dh]
    key_pos = torch.cat(gathered[2])  # [L]: the keys' global positions, in shard order
    y = posenc.attend(q, k_all, v_all, scheme, positions=pos, key_positions=key_pos)
    return pos, y


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sharded(schemes: tuple[str, ...] = ("rope", "alibi", "t5"), world_size: int = 2, *,
                timeout: float = 300.0) -> dict[str, dict]:
    """Start ``world_size`` processes (gloo) that run :func:`shard_worker` for each scheme;
    returns ``{scheme: {"positions": [P] list of [L / P], "outputs": [P] list of
    [1, H, L / P, Dh]}}`` (P = world_size), read back from the files the ranks wrote."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(world_size):
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "RANK": str(rank), "WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1"}
            cmd = [sys.executable, "-m", "posenc.lab.production", "--schemes", ",".join(schemes),
                   "--out", str(Path(tmp) / f"rank{rank}.pt")]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
        for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
            if p.returncode:
                raise RuntimeError(f"rank {rank} failed ({p.returncode}):\n{log[-2000:]}")
        parts = [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(world_size)]
    return {name: {"positions": [p[name]["positions"] for p in parts],
                   "outputs": [p[name]["output"] for p in parts]} for name in schemes}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one rank of the chapter-10 context-parallel run")
    ap.add_argument("--schemes", default="rope,alibi,t5")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the env
    try:
        out = {}
        for name in args.schemes.split(","):
            pos, y = shard_worker(dist.get_rank(), dist.get_world_size(), name)
            out[name] = {"positions": pos, "output": y}
        torch.save(out, args.out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
