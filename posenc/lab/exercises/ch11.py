"""Checkers for chapter 11's exercises (positions at serving time): the ALiBi bias after an
eviction, StreamingLLM's eviction and moves, re-rotating a cached RoPE key, the per-document
head-tail positions of a context-parallel shard of packed documents, a speculative tree's
positions and mask, and the log-sum-exp merge of partial attention. Every hint is wrapped by
display width (``verdict``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import posenc
from posenc.cache import streaming_keep

from ..production import rotate_by
from ..serving import tree_positions_and_mask
from . import attempt, check_lang, compare, fail, say, verdict

__all__ = ["check_alibi_after_eviction", "check_streaming_keep", "check_rerotate",
           "check_shard_positions", "check_tree_mask", "check_merge_partials"]


def _is_int_tensor(x: object) -> bool:
    return isinstance(x, Tensor) and not x.is_floating_point() and x.dtype != torch.bool


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
    positions ``0, 1, ...``. Compared with ``posenc.streaming_keep(length, sinks, window + 1)``
    (whose ``window`` is attention's: the next token is its last key)."""
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
        for name, t in (("keep", keep), ("delta", delta)):
            if not _is_int_tensor(t):
                return fail(say(lang, en=f"{name} must hold integers, got dtype {t.dtype}",
                                zh=f"{name} 必须是整数，得到的 dtype 是 {t.dtype}"),
                            setting, lang)
        want_keep, want_delta = streaming_keep(length, sinks, window + 1)
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
                           zh="delta 是新位置减旧位置：位置减小（在缓存中下移）的键，delta 为负")
            elif got.shape == want.shape and torch.equal(
                    got.long(), want - sinks * (torch.arange(len(want)) >= sinks)):
                hint = say(lang, en="the kept keys take positions 0, 1, ... in order, the sinks "
                           "first: the first window key lands at position sinks",
                           zh="保留的键按顺序取位置 0、1、2……，汇聚点在前：窗口里第一个键落在位置 sinks")
            return fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your keep and delta equal StreamingLLM's bookkeeping for every cache tried",
        zh="你的 keep 和 delta 与 StreamingLLM 的做法相同，试过的每个缓存都一样"))


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
                               "balances only documents of equal length whose boundaries fall "
                               "on the chunks' edges: cut every document",
                               zh="你把整行切成了 2 * world_size 块；只有各篇文档等长、边界又正好落在块的"
                               "边上时，这样才能平衡计算量：应切分每一篇文档")
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
        "  试过的每一行、每个 rank 和每种 rank 总数都一样"))


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




# ----------------------------------------------------------------- a speculative tree

_TREES = [([-1, 0, 0, 1], 3), ([-1, -1, 0, 1, 2], 2), ([-1, 0, 1], 0), ([-1, -1, -1, 0, 3], 4)]


def _tree_hint(positions: Tensor, mask: Tensor, parents: list[int], prefix: int,
               want_pos: Tensor, want_mask: Tensor, lang: str) -> str | None:
    """A hint for a common slip in a tree's positions (``None`` if none is recognised)."""
    N = len(parents)
    if positions.shape == want_pos.shape and _is_int_tensor(positions):
        p = positions.long()
        if torch.equal(p, prefix + torch.arange(N)):
            return say(lang, en="these are the nodes' slots (prefix + index): siblings are "
                       "alternatives for the same place and share a position, prefix + depth",
                       zh="这是节点的槽位（前缀长度 + 序号）：兄弟节点是同一位置上的候选，"
                       "位置相同，应为前缀长度 + 深度")
        if torch.equal(p, want_pos - prefix) and prefix:
            return say(lang, en="the depths are right, but the tree continues the prefix: "
                       "add its length (positions = prefix + depth)",
                       zh="深度是对的，但这棵树接在前缀之后：要加上前缀长度（位置 = 前缀长度 + 深度）")
        if torch.equal(p, want_pos + 1):
            return say(lang, en="off by one: a root continues the prefix's last token, so it "
                       "sits at position prefix (depth 0)",
                       zh="差了 1：根节点接在前缀最后一个词元之后，位置是前缀长度（深度 0）")
        return None
    return None


def _mask_hint(mask: Tensor, prefix: int, want_mask: Tensor, lang: str) -> str | None:
    N = want_mask.shape[0]
    if mask.shape != want_mask.shape or mask.dtype != torch.bool:
        return None
    tree = mask[:, prefix:]
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    if torch.equal(tree, causal) and not torch.equal(want_mask[:, prefix:], causal):
        return say(lang, en="a causal mask over the nodes lets a node see its siblings' "
                   "branches: a node sees only its ancestors and itself",
                   zh="对节点用因果掩码，会让一个节点看到兄弟分支：节点只应看到它的祖先和它自己")
    if torch.equal(tree | torch.eye(N, dtype=torch.bool), want_mask[:, prefix:]) \
            and not tree.diagonal().all():
        return say(lang, en="every node must see itself (the diagonal is True)",
                   zh="每个节点都应能看到它自己（对角线为 True）")
    if prefix and not mask[:, :prefix].all() and torch.equal(tree, want_mask[:, prefix:]):
        return say(lang, en="every node sees the whole prefix (the first prefix columns are "
                   "True)", zh="每个节点都能看到整个前缀（前 prefix 列为 True）")
    return None


def check_tree_mask(fn: Callable[[list[int], int], tuple[Tensor, Tensor]], *,
                    lang: str = "en") -> bool:
    """``fn(parents, prefix) -> (positions, mask)``: a draft tree of ``N`` nodes, node ``i``
    continuing node ``parents[i]`` (``-1``: the prefix's last token; parents come first),
    after a ``prefix`` of cached tokens. ``positions [N]`` (integers: ``prefix + depth``) and
    ``mask [N, prefix + N]`` (bool: a node sees the prefix, its ancestors and itself).
    Compared with ``posenc.lab.serving.tree_positions_and_mask``; the verdict in ``lang``."""
    check_lang(lang)
    for parents, prefix in _TREES:
        setting = f"parents={parents}, prefix={prefix}"
        out, error = attempt(fn, list(parents), prefix, lang=lang)
        if error:
            return fail(error, setting, lang)
        if not (isinstance(out, tuple | list) and len(out) == 2
                and all(isinstance(t, Tensor) for t in out)):
            return fail(say(lang, en="return a pair of tensors (positions, mask)",
                            zh="请返回两个张量组成的二元组 (positions, mask)"), setting, lang)
        positions, mask = out
        want_pos, want_mask = tree_positions_and_mask(parents, prefix=prefix)
        if positions.shape == want_pos.shape and not _is_int_tensor(positions):
            return fail(say(lang, en=f"positions must be integers, got dtype {positions.dtype}",
                            zh=f"位置必须是整数，得到的 dtype 是 {positions.dtype}"), setting, lang)
        problem = compare(positions.float() if _is_int_tensor(positions) else positions,
                          want_pos.float(), what=say(lang, en="the positions", zh="位置"),
                          lang=lang)
        if problem is not None:
            hint = _tree_hint(positions, mask, parents, prefix, want_pos, want_mask, lang)
            return fail(hint or problem, setting, lang)
        if mask.shape == want_mask.shape and mask.dtype != torch.bool:
            return fail(say(lang, en=f"the mask must be bool (True = may see), got "
                            f"{mask.dtype}", zh=f"掩码必须是布尔张量（True 表示可以看见），"
                            f"得到的是 {mask.dtype}"), setting, lang)
        if mask.shape != want_mask.shape:
            return fail(say(lang, en=f"the mask must have shape [N, prefix + N] = "
                            f"{list(want_mask.shape)}, got {list(mask.shape)}",
                            zh=f"掩码的形状应为 [N, prefix + N] = {list(want_mask.shape)}，"
                            f"得到的是 {list(mask.shape)}"), setting, lang)
        if not torch.equal(mask, want_mask):
            hint = _mask_hint(mask, prefix, want_mask, lang)
            return fail(hint or say(lang, en="the mask differs: a node sees the prefix, its "
                                    "ancestors and itself, nothing else",
                                    zh="掩码不对：节点只能看到前缀、它的祖先和它自己"),
                        setting, lang)
    return verdict(True, say(
        lang, en="your positions (by depth) and tree mask equal those the target model\n"
        "  verifies a draft tree with, for every tree tried",
        zh="你的位置（按深度）和树掩码与目标模型验证草稿树时所用的相同，\n"
        "  试过的每棵树都一样"))


# ----------------------------------------------------------------- the log-sum-exp merge


def _partials(seed: int, blocks: int, empty_row: bool) -> tuple[list[Tensor], list[Tensor],
                                                               Tensor, Tensor]:
    """Scores of 3 queries over ``blocks`` blocks of 4 keys, split into partial results;
    returns (outputs, lses, the full attention, its log-sum-exp)."""
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(2, 3, 4 * blocks, generator=gen) * 3  # [H, Lq, Lk]
    v = torch.randn(2, 4 * blocks, 5, generator=gen)  # [H, Lk, Dv]
    if empty_row:  # query 0 sees no key of any block; query 1 none of block 0
        s[:, 0] = float("-inf")
        s[:, 1, :4] = float("-inf")
    outs, lses = [], []
    for j in range(blocks):
        sj, vj = s[..., 4 * j:4 * j + 4], v[:, 4 * j:4 * j + 4]
        lse = torch.logsumexp(sj, -1)  # [H, Lq]
        outs.append((torch.exp(sj - lse[..., None]).nan_to_num(0.0)) @ vj)
        lses.append(lse)
    lse = torch.logsumexp(s, -1)
    full = torch.exp(s - lse[..., None]).nan_to_num(0.0) @ v
    return outs, lses, full, lse


def check_merge_partials(fn: Callable[[list[Tensor], list[Tensor]], tuple[Tensor, Tensor]], *,
                         lang: str = "en") -> bool:
    """``fn(outputs, lses) -> (out, lse)``: ``outputs[j] [..., Lq, Dv]`` is attention over key
    block ``j`` alone and ``lses[j] [..., Lq]`` the log-sum-exp of its scores (``-inf`` where
    a query sees no key of the block, its output 0); return attention over all the blocks and
    its log-sum-exp, 0 and ``-inf`` for a query no block lets see a key. Compared with the
    softmax over all keys; the verdict in ``lang``."""
    check_lang(lang)
    for seed, blocks, empty in [(0, 2, False), (1, 4, False), (2, 3, True)]:
        outs, lses, full, full_lse = _partials(seed, blocks, empty)
        setting = say(lang, en=f"{blocks} blocks of 4 keys, 3 queries"
                      + (", query 0 sees no key" if empty else ""),
                      zh=f"{blocks} 个块，每块 4 个键，3 个查询"
                      + ("，查询 0 看不到任何键" if empty else ""))
        out, error = attempt(fn, [o.clone() for o in outs], [s.clone() for s in lses],
                             lang=lang)
        if error:
            return fail(error, setting, lang)
        if not (isinstance(out, tuple | list) and len(out) == 2
                and all(isinstance(t, Tensor) for t in out)):
            return fail(say(lang, en="return a pair of tensors (out, lse)",
                            zh="请返回两个张量组成的二元组 (out, lse)"), setting, lang)
        got, got_lse = out
        if isinstance(got, Tensor) and got.shape == full.shape and got.isnan().any() and empty:
            return fail(say(lang, en="NaN where a query sees no key: exp(-inf - (-inf)) is "
                            "NaN; such a row's weights are 0 (nan_to_num), its output 0",
                            zh="查询看不到任何键的地方出现了 NaN：exp(-inf - (-inf)) 是 NaN；"
                            "这种行的权重应为 0（nan_to_num），输出为 0"), setting, lang)
        problem = compare(got, full, what=say(lang, en="the merged output",
                                              zh="合并后的输出"), atol=1e-5, rtol=1e-4,
                          lang=lang)
        if problem is not None:
            hint = problem
            if isinstance(got, Tensor) and got.shape == full.shape:
                mean = torch.stack(outs).mean(0)
                if torch.allclose(got.float(), mean, atol=1e-5, rtol=1e-4):
                    hint = say(lang, en="a plain average of the blocks' outputs: weight block j "
                               "by its share of the softmax mass, exp(lse_j - lse)",
                               zh="这是各块输出的简单平均：应按块 j 在 softmax 总概率质量中的份额 "
                               "exp(lse_j - lse) 加权")
            return fail(hint, setting, lang)
        finite = torch.isfinite(full_lse)
        same_inf = isinstance(got_lse, Tensor) and got_lse.shape == full_lse.shape and \
            torch.equal(torch.isneginf(got_lse), torch.isneginf(full_lse))
        if not same_inf or not torch.allclose(got_lse[finite].float(), full_lse[finite],
                                              atol=1e-5, rtol=1e-5):
            hint = compare(got_lse, full_lse, what="lse", lang=lang) or say(
                lang, en="lse must be -inf where a query sees no key",
                zh="查询看不到任何键的地方，lse 应为 -inf")
            if isinstance(got_lse, Tensor) and got_lse.shape == full_lse.shape:
                if torch.allclose(got_lse, torch.stack(lses).amax(0), atol=1e-5):
                    hint = say(lang, en="the largest lse is not the log-sum-exp: combine them "
                               "with torch.logsumexp over the blocks",
                               zh="最大的 lse 不等于 log-sum-exp：应在块的维度上用 torch.logsumexp 合并")
            return fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your merge equals attention over all the keys (and its log-sum-exp),\n"
        "  for every split tried: what ring attention computes",
        zh="你的合并等于对全部键做注意力（及其 log-sum-exp），\n"
        "  试过的每种切分都一样：这正是环形注意力所算的"))
