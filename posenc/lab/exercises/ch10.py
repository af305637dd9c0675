"""Checkers for chapter 10's exercises (positions in batches): the position ids of a decode step
in a left-padded batch, FlashAttention's varlen offsets of a packed batch, and who sees whom
under a sliding window with attention sinks. Every hint is wrapped by display width
(``verdict``). The cache and serving exercises are chapter 11's
(:mod:`posenc.lab.exercises.ch11`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from . import attempt, check_lang, compare, fail, say, verdict

__all__ = ["check_positions_from_mask", "check_cu_seqlens", "check_window_sinks"]



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
    token its index among the real tokens of its row, a padded slot 0. Compared with
    ``posenc.positions_from_mask(attention_mask)[:, -new:]`` (the prefill of transformers 5's
    ``generate`` gives the same; its later steps add 1 to the last position, so a row whose
    cache holds only padding gets 1 there, not 0);
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
                             zh=f"位置必须是整数（用作旋转表或位置表的下标），得到的 dtype 是 {got.dtype}"),
                         setting, lang)
        problem = compare(got.float() if _is_int_tensor(got) else got, want.float(),
                          what=say(lang, en="the positions", zh="位置"), lang=lang)
        if problem is None:
            continue
        if isinstance(got, Tensor) and got.shape == full.shape and new < mask.shape[1]:
            return fail(say(lang, en=f"you returned the positions of every token, shape "
                            f"{list(full.shape)}; a decode step needs only the new tokens' "
                            f"[B, new] = {list(want.shape)}",
                            zh=f"你返回了所有词元的位置，形状为 {list(full.shape)}；解码一步只需要"
                            f"新词元的位置，形状为 [B, new] = {list(want.shape)}"), setting, lang)
        if not (isinstance(got, Tensor) and got.shape == want.shape):
            return fail(problem, setting, lang)
        real = mask[:, -new:].bool()
        g = got.long()
        slots = torch.arange(mask.shape[1])[-new:].expand_as(g)
        if torch.equal(g, torch.arange(new).expand_as(g)) and new < mask.shape[1]:
            hint = say(lang, en="you counted from the first new token: the new tokens continue "
                       "their row, so count the real tokens of the whole mask, the cached ones "
                       "included",
                       zh="你从第一个新词元开始计数：新词元接在它所在行的后面，应当数整个掩码中的真实"
                       "词元，包括已缓存的那些")
        elif torch.equal(g, slots):
            hint = say(lang, en="these are slot indices (arange over the mask), which ignore "
                       "the padding: a left-padded row counts from its first real token",
                       zh="这是词元格下标（对掩码做 arange），没有考虑填充：左填充的一行应从它的第一个"
                       "真实词元开始计数")
        elif torch.equal(g[real], want[real]):
            hint = say(lang, en="the real tokens are right; the padded slots should hold 0, as "
                       "posenc.positions_from_mask and the prefill of transformers 5's generate "
                       "fill them (masked_fill(mask == 0, 0); version 4 filled 1); their value "
                       "never reaches a real token, but keep the convention",
                       zh="真实词元的位置是对的；填充词元格上的位置应当是 0，"
                       "与 posenc.positions_from_mask 以及 transformers 5 的 generate 在预填充时一致"
                       "（masked_fill(mask == 0, 0)；transformers 4 填的是 1）；"
                       "它们的值不会影响真实词元，但请遵守这个约定")
        elif torch.equal(g[real], want[real] + 1):
            hint = say(lang, en="off by one: the first real token of a row is at position 0 "
                       "(cumsum(mask) - 1)",
                       zh="差了 1：每行第一个真实词元的位置是 0（cumsum(mask) - 1）")
        else:
            hint = problem
        return fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your positions equal posenc.positions_from_mask over the whole mask,\n"
        "  for the new tokens, at every step tried",
        zh="你的位置与对整个掩码做 posenc.positions_from_mask 得到的新词元位置相同，\n"
        "  试过的每一步都一样"))


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
                            zh=f"累计偏移量是对的，但 FlashAttention 的变长内核要求 int32，"
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
                   zh="这是各文档的长度；cu_seqlens 是以 0 开头的累加和（共 N + 1 项）")
    if torch.equal(g, want.long()[1:]):
        return say(lang, en="the leading 0 is missing: cu_seqlens has N + 1 entries, "
                   "document i spans cu_seqlens[i] to cu_seqlens[i + 1]",
                   zh="缺少开头的 0：cu_seqlens 有 N + 1 项，第 i 篇文档从 cu_seqlens[i] 到 "
                   "cu_seqlens[i + 1]")
    merged = torch.cat([torch.zeros(1, dtype=torch.long),
                        torch.unique(ids.flatten(), return_counts=True)[1].cumsum(0)])
    if g.shape == merged.shape and torch.equal(g, merged) and not torch.equal(merged, want):
        return say(lang, en="documents counted by their id over the whole batch (torch.unique "
                   "sorts the ids and merges repeats): documents are runs in row order, a new "
                   "one starts wherever the id changes and at the start of every row, so an "
                   "id in two rows is two documents",
                   zh="按 id 在整个批次中计数文档是不对的（torch.unique 会把 id 排序并合并重复）："
                   "文档是按行内顺序排列的连续段，id 改变之处和每行的开头都开始一篇新文档，"
                   "所以出现在两行里的同一个 id 是两篇文档")
    return None


# ----------------------------------------------------------------- a window with sinks

_WINDOWS = [  # (query positions, key positions, window, sinks)
    (torch.arange(8), torch.arange(8), 3, 0),  # a plain window
    (torch.arange(10), torch.arange(10), 4, 2),
    (torch.tensor([9]), torch.arange(10), 4, 2),  # one decode step
    (torch.arange(6, 10), torch.arange(10), 3, 1),  # a chunk of queries after a prefix
    (torch.arange(5), torch.arange(5), 2, 4),  # sinks ahead of the early queries
    (torch.arange(20, 24), torch.arange(16, 24), 3, 2),  # keys from 16: no sink left
]


def _visible(m: Tensor, n: Tensor, window: int, sinks: int, *, reach: int = 0,
             causal_sinks: bool = True) -> Tensor:
    m, n = m[:, None], n[None, :]
    past = n <= m
    in_window = past & (m - n < window + reach)
    sink = n < sinks
    return in_window | (sink & past if causal_sinks else sink)


def check_window_sinks(fn: Callable[[Tensor, Tensor, int, int], Tensor], *,
                       lang: str = "en") -> bool:
    """``fn(q_positions, k_positions, window, sinks) -> visible``: a bool ``[Lq, Lk]``, True where
    the query at position ``m`` may see the key at position ``n``: ``n <= m`` and either
    ``m - window < n`` (the window) or ``n < sinks`` (the first positions). Compared with the rule
    ``posenc.attend(..., window=..., sinks=...)`` applies; the verdict in ``lang``."""
    check_lang(lang)
    for m, n, window, sinks in _WINDOWS:
        setting = (f"q_positions={m.tolist()}, k_positions={n.tolist()}, window={window}, "
                   f"sinks={sinks}")
        got, error = attempt(fn, m.clone(), n.clone(), window, sinks, lang=lang)
        if error:
            return fail(error, setting, lang)
        want = _visible(m, n, window, sinks)
        if isinstance(got, Tensor) and got.shape == want.shape and got.dtype != torch.bool:
            return fail(say(lang, en=f"return a bool tensor (True = may see), got dtype "
                            f"{got.dtype}",
                            zh=f"请返回布尔张量（True 表示能看见），得到的 dtype 是 {got.dtype}"),
                        setting, lang)
        problem = compare(got.float() if isinstance(got, Tensor) else got, want.float(),
                          what=say(lang, en="who sees whom", zh="可见性矩阵"), lang=lang)
        if problem is None:
            continue
        if not (isinstance(got, Tensor) and got.shape == want.shape):
            return fail(problem, setting, lang)
        if torch.equal(got, _visible(m, n, window, sinks, reach=1)):
            hint = say(lang, en="off by one: a window of W keys holds the query itself and the "
                       "W - 1 keys before it, m - W < n <= m",
                       zh="差了 1：W 个键的窗口包括查询自己和它前面的 W - 1 个键，即 m - W < n <= m")
        elif torch.equal(got, _visible(m, n, window, sinks, causal_sinks=False)):
            hint = say(lang, en="a sink is still a key of the past: the query at position m "
                       "sees the sink at position n only if n <= m",
                       zh="汇聚点仍然是过去的键：位置 m 的查询只有在 n <= m 时才能看见位置 n 的汇聚点")
        elif torch.equal(got, _visible(m, n, window, 0)):
            hint = say(lang, en="the sinks are missing: the first `sinks` positions stay "
                       "visible to every query that comes after them",
                       zh="缺少汇聚点：最前面 sinks 个位置对其后的每个查询都保持可见")
        elif torch.equal(got, _visible(torch.arange(len(n))[-len(m):], torch.arange(len(n)),
                                        window, sinks)):
            hint = say(lang, en="you used slot indices; compare the positions you are given",
                       zh="你用的是词元格下标；请比较传入的位置")
        else:
            hint = problem
        return fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your rule is the one posenc.attend applies with window and sinks,\n"
        "  for every case tried",
        zh="你的规则与 posenc.attend 在 window 和 sinks 下使用的规则相同，\n"
        "  试过的每种情形都一样"))
