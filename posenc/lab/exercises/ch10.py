"""Checkers for chapter 10's exercises (positions in production): the position ids of a decode
step in a left-padded batch, FlashAttention's varlen offsets of a packed batch, the ALiBi bias
after an eviction, StreamingLLM's eviction and moves, the per-document head-tail positions of a
context-parallel shard of packed documents, and re-rotating a cached RoPE key. Every hint is
wrapped by display width (``verdict``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from ..production import rotate_by, streaming_keep
from . import attempt, check_lang, compare, fail, say, verdict

__all__ = ["check_positions_from_mask", "check_cu_seqlens", "check_alibi_after_eviction",
           "check_streaming_keep", "check_shard_positions", "check_rerotate"]



def _is_int_tensor(x: object) -> bool:
    return isinstance(x, Tensor) and not x.is_floating_point() and x.dtype != torch.bool


# ----------------------------------------------------------------- a decode step's positions

_STEPS = [  # (attention_mask over the cached and the new tokens, number of new tokens)
    (torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]), 1),
    (torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]]), 3),
    (torch.tensor([[0, 0, 0, 1], [0, 1, 1, 1]]), 1),  # a row whose cache holds pads only
    (torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]), 5),  # the prefill: pads included
    (torch.tensor([[False, True, True, True, True]]), 2),  # a bool mask
]


def check_positions_from_mask(fn: Callable[[Tensor, int], Tensor], *,
                              lang: str = "en") -> bool:
    """``fn(attention_mask, new) -> positions``: ``attention_mask [B, C + new]`` covers the
    ``C`` tokens already in the cache and the ``new`` tokens of this step, 1 (or True) on real
    tokens and 0 on left padding; return the positions ``[B, new]`` of the new tokens: each real
    token its index among the real tokens of its row, a padded slot 0 (as the ``generate`` of
    transformers 5). Compared with ``posenc.positions_from_mask(attention_mask)[:, -new:]``;
    the verdict in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    for mask, new in _STEPS:
        setting = f"attention_mask={mask.long().tolist()}, new={new}"
        got, error = attempt(fn, mask.clone(), new, lang=lang)
        if error:
            return fail(error, setting, lang)
        full = posenc.positions_from_mask(mask)
        want = full[:, -new:]
        if isinstance(got, Tensor) and got.shape == want.shape and not _is_int_tensor(got):
            return fail(say(lang, en=f"positions must be integers (an index into the rotation "
                             f"or the table), got dtype {got.dtype}",
                             zh=f"位置必须是整数（旋转角或位置表的下标），得到的 dtype 是 {got.dtype}"),
                         setting, lang)
        problem = compare(got.float() if _is_int_tensor(got) else got, want.float(),
                          what=say(lang, en="the positions", zh="位置"), lang=lang)
        if problem is None:
            continue
        if isinstance(got, Tensor) and got.shape == full.shape and new < mask.shape[1]:
            return fail(say(lang, en=f"you returned the positions of every token, shape "
                            f"{list(full.shape)}; a decode step needs only the new tokens' "
                            f"[B, new] = {list(want.shape)}",
                            zh=f"你返回了所有词元的位置，形状为 {list(full.shape)}；解码一步只需要新词元的 "
                            f"[B, new] = {list(want.shape)}"), setting, lang)
        if not (isinstance(got, Tensor) and got.shape == want.shape):
            return fail(problem, setting, lang)
        real = mask[:, -new:].bool()
        g = got.long()
        slots = torch.arange(mask.shape[1])[-new:].expand_as(g)
        if torch.equal(g, torch.arange(new).expand_as(g)) and new < mask.shape[1]:
            hint = say(lang, en="you counted from the first new token: the new tokens continue "
                       "their row, so count the real tokens of the whole mask, the cached ones "
                       "included",
                       zh="你从第一个新词元开始计数：新词元接在它所在行的后面，应对整个掩码中的真实词元"
                       "计数，包括已缓存的那些")
        elif torch.equal(g, slots):
            hint = say(lang, en="these are slot indices (arange over the mask), which ignore "
                       "the padding: a left-padded row counts from its first real token",
                       zh="这是词元格下标（对掩码做 arange），没有考虑填充：左填充的一行应从它的第一个"
                       "真实词元开始计数")
        elif torch.equal(g[real], want[real]):
            hint = say(lang, en="the real tokens are right; the padded slots should hold 0, as "
                       "the generate of transformers 5 fills them (masked_fill(mask == 0, 0); "
                       "version 4 filled 1); their value never reaches a real token, but keep "
                       "the convention",
                       zh="真实词元的位置是对的；填充位置应当是 0，与 transformers 5 的 generate 一致"
                       "（masked_fill(mask == 0, 0)；第 4 版填的是 1）；它们的值不会影响真实词元，"
                       "但请遵守这个约定")
        elif torch.equal(g[real], want[real] + 1):
            hint = say(lang, en="off by one: the first real token of a row is at position 0 "
                       "(cumsum(mask) - 1)",
                       zh="差了一：每行第一个真实词元的位置是 0（cumsum(mask) - 1）")
        else:
            hint = problem
        return fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your positions equal those transformers' generate gives the new tokens\n"
        "  (posenc.positions_from_mask over the whole mask), for every step tried",
        zh="你的位置与 transformers 的 generate 给新词元的位置相同\n"
        "  （对整个掩码做 posenc.positions_from_mask），试过的每一步都一样"))


# ----------------------------------------------------------------- per-document shard positions

_DOC_SHARDS = [([8, 16], 2), ([12, 6, 18], 3), ([16, 8, 24], 4), ([6, 4], 1), ([8], 2)]


def _document_shards(lengths: list[int], rank: int, world: int, **options: bool) -> Tensor:
    return torch.cat([posenc.shard_positions(n, rank, world, **options) for n in lengths])


def check_shard_positions(fn: Callable[[list[int], int, int], Tensor], *,
                          lang: str = "en") -> bool:
    """``fn(doc_lengths, rank, world_size) -> positions``: a row packs documents of the given
    lengths (each a multiple of ``2 * world_size``); every document is cut into
    ``2 * world_size`` chunks and rank ``r`` holds chunks ``r`` and ``2 * world_size - 1 - r``
    of each, document after document (the per-document head-tail layout). Return the positions
    of the tokens rank ``rank`` holds, restarting at 0 in every document. Compared with
    ``posenc.shard_positions`` applied to each document; the verdict in ``lang``."""
    check_lang(lang)
    for lengths, world in _DOC_SHARDS:
        for rank in range(world):
            setting = f"doc_lengths={lengths}, rank={rank}, world_size={world}"
            got, error = attempt(fn, list(lengths), rank, world, lang=lang)
            if error:
                return fail(error, setting, lang)
            want = _document_shards(lengths, rank, world)
            if isinstance(got, Tensor) and got.shape == want.shape and not _is_int_tensor(got):
                return fail(say(lang, en=f"positions must be integers, got dtype {got.dtype}",
                                 zh=f"位置必须是整数，得到的 dtype 是 {got.dtype}"), setting, lang)
            problem = compare(got.float() if _is_int_tensor(got) else got, want.float(),
                              what=say(lang, en="the positions", zh="位置"), lang=lang)
            if problem is None:
                continue
            hint = problem
            if isinstance(got, Tensor) and got.shape == want.shape:
                g = got.long()
                starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
                row = torch.cat([posenc.shard_positions(n, rank, world) + s
                                 for n, s in zip(lengths, starts.tolist(), strict=True)])
                ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
                packed = posenc.packed_positions(ids[None])[0]
                whole = packed[posenc.shard_positions(sum(lengths), rank, world)]
                if torch.equal(g, row):
                    hint = say(lang, en="these are indices into the packed row; the positions "
                               "restart at 0 in every document",
                               zh="这是打包行中的下标；位置应在每篇文档处从 0 重新开始")
                elif torch.equal(g, whole) and world > 1:
                    hint = say(lang, en="you cut the whole row into 2 * world_size chunks; that "
                               "balances nothing when the row holds several documents: cut "
                               "every document",
                               zh="你把整行切成了 2 * world_size 块；一行装着多篇文档时这样平衡不了计算量："
                               "应切分每一篇文档")
                elif torch.equal(g, _document_shards(lengths, rank, world,
                                                     load_balance=False)) and world > 1:
                    hint = say(lang, en="these are contiguous chunks of each document "
                               "(load_balance=False): the last rank then does most of the "
                               "causal work; take chunk r and its mirror 2 * world_size - 1 - r",
                               zh="这是每篇文档的连续切块（load_balance=False）：那样最后一个 rank 承担大部分"
                               "因果计算；应取第 r 块和与它对称的第 2 * world_size - 1 - r 块")
                elif torch.equal(g.sort().values, want.sort().values):
                    hint = say(lang, en="the right positions in the wrong order: document "
                               "after document, in each the head chunk r first, then the tail "
                               "chunk 2 * world_size - 1 - r",
                               zh="位置对了，顺序不对：按文档依次排列，每篇先放头部的第 r 块，"
                               "再放尾部的第 2 * world_size - 1 - r 块")
            return fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your shards equal the per-document head-tail layout (posenc.shard_positions\n"
        "  inside every document) for every row, rank and world size tried",
        zh="你的切分与按文档的首尾布局（在每篇文档内做 posenc.shard_positions）相同，\n"
        "  试过的每一行、rank 和进程数都一样"))


# ----------------------------------------------------------------- re-rotating a cached key


def _rot(x: Tensor, positions: Tensor, base: float, *, interleaved: bool = True) -> Tensor:
    inv = posenc.rope_inv_freq(x.shape[-1], base=base)[0]
    return rotate_by(x, positions, inv, interleaved=interleaved)


def check_rerotate(fn: Callable[[Tensor, Tensor, float], Tensor], *, lang: str = "en") -> bool:
    """``fn(k_cached, delta, base) -> Tensor``: ``k_cached [K, d_h]`` holds keys already
    rotated (interleaved pairs) to their positions ``n``; return them rotated to ``n + delta``
    (``delta [K]`` integers, negative when a key moves down the cache). Compared with
    ``posenc.apply_rope`` at ``n + delta``; the verdict in ``lang``."""
    check_lang(lang)
    gen = torch.Generator().manual_seed(10)
    cases = [(6, 8, 10000.0), (5, 16, 10000.0), (7, 4, 100.0)]
    for T, d, base in cases:
        n = torch.randint(20, 200, (T,), generator=gen)
        delta = torch.randint(-20, 21, (T,), generator=gen)
        k = torch.randn(T, d, generator=gen)
        k_cached = _rot(k, n, base)
        want = _rot(k, n + delta, base)
        setting = f"T={T}, d={d}, delta={delta.tolist()}, base={base:g}"
        k_in = k_cached.clone()
        got, error = attempt(fn, k_in, delta.clone(), base, lang=lang)
        if error:
            return fail(error, setting, lang)
        problem = compare(got, want, what=say(lang, en="the re-rotated keys",
                                               zh="重新旋转后的键"), atol=1e-4, rtol=1e-4,
                          lang=lang)
        if problem is None:
            if not torch.equal(k_in, k_cached):
                return fail(say(lang, en="the result is right, but your function changed the "
                                 "cached keys in place; return a new tensor",
                                 zh="结果是对的，但你的函数原地修改了缓存的键；请返回一个新张量"),
                             setting, lang)
            continue
        hint = problem
        if isinstance(got, Tensor) and got.shape == want.shape and got.is_floating_point():
            g = got.detach().double()
            slips = [
                (k_cached, "the keys came back unrotated: turn each pair by delta * theta_i",
                 "键没有被旋转：应把每一对维度再转 delta * theta_i"),
                (_rot(k, n - delta, base), "rotated by -delta: a key that moves from n to "
                 "n + delta turns by +delta (a negative delta turns it backwards)",
                 "转了 -delta：从 n 移到 n + delta 的键应转 +delta（delta 为负时向回转）"),
            ]
            for ref, en, zh in slips:
                if torch.allclose(g, ref.double(), atol=1e-4, rtol=1e-4):
                    hint = say(lang, en=en, zh=zh)
                    break
            else:
                if torch.allclose(g, _rot(k_cached, delta, base, interleaved=False).double(),
                                  atol=1e-4, rtol=1e-4):
                    hint = say(lang, en="pairs are (i, i + d/2), the half layout: these keys "
                               "were rotated in interleaved pairs (2i, 2i + 1)",
                               zh="维度对取成了 (i, i + d/2)，那是对半布局；这些键是按交错的维度对 "
                               "(2i, 2i + 1) 旋转的")
        return fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your re-rotation equals rotating the original keys to n + delta:\n"
        "  R(n) R(delta) = R(n + delta), for every size, shift and base tried",
        zh="你的重新旋转等于把原始的键直接转到 n + delta：\n"
        "  R(n) R(delta) = R(n + delta)，试过的每种大小、位移和基数都成立"))


# ----------------------------------------------------------------- cu_seqlens


_DOC_IDS = [
    torch.tensor([[0, 0, 0, 1, 1]]),
    torch.tensor([[7, 7, 3, 3, 3, 9]]),
    torch.tensor([[0, 0, 1, 1, 1, 1], [2, 2, 2, 2, 3, 3]]),  # two rows
    torch.tensor([[5, 5, 5, 5], [5, 5, 6, 6]]),  # the same id in two rows: two documents
]


def check_cu_seqlens(fn: Callable[[Tensor], tuple[Tensor, int]], *, lang: str = "en") -> bool:
    """``fn(document_ids) -> (cu_seqlens, max_seqlen)``: ``document_ids [B, L]`` holds each
    document as one run of its id in a row (a row boundary always ends a document); the batch
    flattened row after row holds ``N`` documents, and ``cu_seqlens`` (int32 ``[N + 1]``) are
    their cumulative offsets from 0, ``max_seqlen`` (a Python int) the longest. Compared with
    ``posenc.cu_seqlens``; the verdict in ``lang``."""
    check_lang(lang)
    for ids in _DOC_IDS:
        setting = f"document_ids={ids.tolist()}"
        out, error = attempt(fn, ids.clone(), lang=lang)
        if error:
            return fail(error, setting, lang)
        want, want_max = posenc.cu_seqlens(ids)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            return fail(say(lang, en="return a pair (cu_seqlens, max_seqlen)",
                            zh="请返回一个二元组 (cu_seqlens, max_seqlen)"), setting, lang)
        got, got_max = out
        if isinstance(got, Tensor) and got.shape == want.shape and not _is_int_tensor(got):
            return fail(say(lang, en=f"offsets must be integers, got dtype {got.dtype}",
                            zh=f"累计偏移量必须是整数，得到的 dtype 是 {got.dtype}"), setting, lang)
        problem = compare(got.float() if _is_int_tensor(got) else got, want.float(),
                          what=say(lang, en="cu_seqlens", zh="cu_seqlens"), lang=lang)
        if problem is not None:
            return fail(_cu_hint(got, ids, want, lang) or problem, setting, lang)
        if got.dtype != torch.int32:
            return fail(say(lang, en=f"the offsets are right, but FlashAttention's varlen "
                            f"kernels take them as int32, got {got.dtype}",
                            zh=f"累计偏移量是对的，但 FlashAttention 的变长核函数要求 int32，"
                            f"得到的是 {got.dtype}"), setting, lang)
        if isinstance(got_max, Tensor) or not isinstance(got_max, int) or got_max != want_max:
            shown = f"{type(got_max).__name__} {got_max!r}"
            return fail(say(lang, en=f"max_seqlen must be the longest document as a Python int "
                            f"({want_max}), got {shown}",
                            zh=f"max_seqlen 应是最长文档的长度，类型为 Python int（{want_max}），"
                            f"得到的是 {shown}"), setting, lang)
    return verdict(True, say(
        lang, en="your offsets equal posenc.cu_seqlens (and transformers'\n"
        "  prepare_fa_kwargs_from_position_ids) for every packed batch tried",
        zh="你的累计偏移量与 posenc.cu_seqlens（以及 transformers 的\n"
        "  prepare_fa_kwargs_from_position_ids）相同，试过的每个打包批次都一样"))


def _cu_hint(got: object, ids: Tensor, want: Tensor, lang: str) -> str | None:
    if not isinstance(got, Tensor) or got.dim() != 1:
        return None
    g = got.long()
    lengths = want.long().diff()
    if torch.equal(g, lengths):
        return say(lang, en="these are the documents' lengths; cu_seqlens are their running "
                   "sum, starting with 0 (N + 1 offsets)",
                   zh="这是各文档的长度；cu_seqlens 是它们的累加和，并以 0 开头（共 N + 1 个累计偏移量）")
    if torch.equal(g, want.long()[1:]):
        return say(lang, en="the leading 0 is missing: cu_seqlens has N + 1 entries, "
                   "document i spans cu_seqlens[i] to cu_seqlens[i + 1]",
                   zh="缺少开头的 0：cu_seqlens 有 N + 1 项，第 i 个文档从 cu_seqlens[i] 到 "
                   "cu_seqlens[i + 1]")
    merged = torch.cat([torch.zeros(1, dtype=torch.long),
                        torch.unique(ids.flatten(), return_counts=True)[1].cumsum(0)])
    if g.shape == merged.shape and torch.equal(g, merged) and not torch.equal(merged, want):
        return say(lang, en="documents counted by their id over the whole batch (torch.unique "
                   "sorts the ids and merges repeats): documents are runs in row order, a new "
                   "one starts wherever the id changes and at the start of every row, so an "
                   "id in two rows is two documents",
                   zh="按 id 在整个批次中计数文档是不对的（torch.unique 会把 id 排序并合并重复）："
                   "文档是按行内顺序排列的连续段，id 改变之处和每行的开头都开始一个新文档，"
                   "所以出现在两行里的同一个 id 是两个文档")
    return None


# ----------------------------------------------------------------- ALiBi after eviction


def _alibi_from_positions(slopes: Tensor, m: Tensor, n: Tensor, *, sign: float = 1.0,
                          causal: bool = True) -> Tensor:
    dist = (m[:, None] - n[None, :]).float()  # [Lq, Lk]: how far back each key is
    bias = -sign * slopes[:, None, None] * dist  # [H, Lq, Lk]
    if causal:
        bias = bias.masked_fill(dist < 0, float("-inf"))
    return bias


def check_alibi_after_eviction(fn: Callable[[Tensor, Tensor, Tensor], Tensor], *,
                               lang: str = "en") -> bool:
    """``fn(slopes, q_positions, k_positions) -> bias``: the ALiBi bias ``[H, Lq, Lk]`` of
    queries at ``q_positions [Lq]`` over cached keys at ``k_positions [Lk]`` (what a cache
    stores after eviction: not ``0 .. Lk - 1``): ``-slope_h * (m - n)``, ``-inf`` where the
    key is after the query. Compared with the formula; the verdict in ``lang``."""
    check_lang(lang)
    cases = [
        (4, torch.tensor([12]), torch.tensor([0, 1, 6, 7, 8, 9, 10, 11, 12])),  # sinks + tail
        (2, torch.tensor([30, 31]), torch.tensor([3, 17, 18, 25, 29, 30, 31])),  # H2O-like
        (8, torch.tensor([9, 10, 11]), torch.tensor([0, 1, 2, 8, 9, 10, 11])),
    ]
    for H, m, n in cases:
        slopes = posenc.alibi_slopes(H)
        setting = f"heads={H}, q_positions={m.tolist()}, k_positions={n.tolist()}"
        got, error = attempt(fn, slopes.clone(), m.clone(), n.clone(), lang=lang)
        if error:
            return fail(error, setting, lang)
        want = _alibi_from_positions(slopes, m, n)
        if isinstance(got, Tensor) and got.shape == want.shape and got.is_floating_point():
            g = got.detach().float()
            same_inf = torch.equal(torch.isneginf(g), torch.isneginf(want))
            finite = torch.isfinite(want)
            if same_inf and torch.allclose(g[finite], want[finite], atol=1e-5, rtol=1e-5):
                continue
        problem = compare(got, want, what=say(lang, en="the bias", zh="偏置"), lang=lang)
        hint = problem
        if isinstance(got, Tensor) and got.shape == want.shape and got.is_floating_point():
            g = got.detach().float()
            slot_q = torch.arange(len(n) - len(m), len(n))
            slips = [
                (_alibi_from_positions(slopes, slot_q, torch.arange(len(n))),
                 "this bias is built from slot indices (alibi_bias(H, Lq, Lk)): after "
                 "eviction slot j is not position j; take the distance from the stored "
                 "positions",
                 "这个偏置是由槽位下标算出的（alibi_bias(H, Lq, Lk)）：淘汰之后第 j 个槽位不再是位置 j；"
                 "距离应当用缓存里存下的位置来算"),
                (_alibi_from_positions(slopes, m, n, sign=-1.0),
                 "the sign is reversed: ALiBi subtracts slope * (m - n), so a far key gets "
                 "a lower score",
                 "符号反了：ALiBi 减去 slope * (m - n)，越远的键得分越低"),
                (_alibi_from_positions(slopes, m, n, causal=False),
                 "keys after the query must get -inf (the causal mask), not a finite bias",
                 "位于查询之后的键应当是 -inf（因果掩码），而不是一个有限的偏置"),
            ]
            for ref, en, zh in slips:
                same = torch.equal(torch.isneginf(g), torch.isneginf(ref))
                fin = torch.isfinite(ref) & torch.isfinite(g)
                if same and torch.allclose(g[fin], ref[fin], atol=1e-5, rtol=1e-5):
                    hint = say(lang, en=en, zh=zh)
                    break
        return fail(hint or say(lang, en="the bias differs", zh="偏置不对"), setting, lang)
    return verdict(True, say(
        lang, en="your bias equals -slope * (m - n) from the stored positions, -inf on future\n"
        "  keys, for every eviction tried",
        zh="你的偏置等于用存下的位置算出的 -slope * (m - n)，未来的键为 -inf，\n"
        "  试过的每种淘汰都一样"))


# ----------------------------------------------------------------- StreamingLLM's keep


def check_streaming_keep(fn: Callable[[int, int, int], tuple[Tensor, Tensor]], *,
                         lang: str = "en") -> bool:
    """``fn(length, sinks, window) -> (keep, delta)``: a StreamingLLM cache holds ``length``
    keys at positions ``0 .. length - 1`` inside the cache and may hold ``sinks + window``;
    ``keep`` are the slots it keeps (the first ``sinks`` and the latest ``window``) and
    ``delta`` each kept key's change of position (new minus old) when the kept keys take
    positions ``0, 1, ...``. Compared with ``posenc.lab.production.streaming_keep``."""
    check_lang(lang)
    for length, sinks, window in [(10, 2, 4), (70, 4, 60), (6, 1, 8), (9, 0, 5)]:
        setting = f"length={length}, sinks={sinks}, window={window}"
        out, error = attempt(fn, length, sinks, window, lang=lang)
        if error:
            return fail(error, setting, lang)
        if not (isinstance(out, tuple | list) and len(out) == 2
                and all(isinstance(t, Tensor) for t in out)):
            return fail(say(lang, en="return a pair of tensors (keep, delta)",
                            zh="请返回两个张量组成的二元组 (keep, delta)"), setting, lang)
        keep, delta = out
        want_keep, want_delta = streaming_keep(length, sinks, window)
        for got, want, en, zh in ((keep, want_keep, "keep", "keep"),
                                  (delta, want_delta, "delta", "delta")):
            problem = compare(got.float(), want.float(), what=say(lang, en=en, zh=zh),
                              lang=lang)
            if problem is None:
                continue
            hint = problem
            if got is keep and got.shape != want.shape and length <= sinks + window:
                hint = say(lang, en="the cache still has room: keep every slot, nothing moves",
                           zh="缓存还没满：保留每个槽位，什么都不移动")
            elif got is keep:
                tail = torch.arange(length - window - sinks, length)
                if got.shape == tail.shape and torch.equal(got.long(), tail):
                    hint = say(lang, en="these are the latest sinks + window slots: the first "
                               "sinks slots must stay (they are the attention sinks)",
                               zh="这是最近的 sinks + window 个槽位：开头的 sinks 个槽位必须保留"
                               "（它们就是注意力汇聚点）")
            elif got.shape == want.shape and torch.equal(got.long(), -want):
                hint = say(lang, en="delta is new position minus old: a key that moves down "
                           "the cache has a negative delta",
                           zh="delta 是新位置减旧位置：在缓存中往前移的键，delta 为负")
            elif got.shape == want.shape and torch.equal(
                    got.long(), want - sinks * (torch.arange(len(want)) >= sinks)):
                hint = say(lang, en="the kept keys take positions 0, 1, ... in order, the sinks "
                           "first: the first window key lands at position sinks",
                           zh="保留的键按顺序取位置 0, 1, ...，汇聚点在前：窗口里第一个键落在位置 sinks")
            return fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your keep and delta equal StreamingLLM's bookkeeping for every cache tried",
        zh="你的 keep 和 delta 与 StreamingLLM 的做法相同，试过的每个缓存都一样"))
