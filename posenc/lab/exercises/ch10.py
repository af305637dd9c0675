"""Checkers for chapter 10's exercises (positions in production): position ids of a left-padded
batch, the head-tail positions of a context-parallel shard, and re-rotating a cached RoPE key.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import torch
from torch import Tensor

import posenc

from ..production import rotate_by
from . import attempt, check_lang, compare, say, verdict

__all__ = ["check_positions_from_mask", "check_shard_positions", "check_rerotate"]


def _fail(hint: str, setting: str, lang: str = "en") -> bool:
    """``✗ hint`` wrapped to fit a page's output block, then the input that showed it."""
    width = 38 if lang == "zh" else 76  # a Chinese character is two columns wide
    tail = say(lang, en=f"  (input: {setting})", zh=f"  （输入：{setting}）")
    return verdict(False, "\n".join(textwrap.wrap(hint, width, subsequent_indent="  ") + [tail]))


def _is_int_tensor(x: object) -> bool:
    return isinstance(x, Tensor) and not x.is_floating_point() and x.dtype != torch.bool


# ----------------------------------------------------------------- positions_from_mask

_MASKS = [
    torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]),
    torch.tensor([[0, 0, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]]),
    torch.tensor([[0, 1, 1], [0, 0, 0]]),  # a row of padding only
    torch.tensor([[False, True, True, True]]),  # a bool mask
]


def check_positions_from_mask(fn: Callable[[Tensor], Tensor], *, lang: str = "en") -> bool:
    """``fn(attention_mask) -> positions``: ``attention_mask [B, L]`` is 1 (or True) on real
    tokens and 0 on left padding; each real token gets its index among the real tokens of its
    row, a padded slot gets 0 (as the ``generate`` of transformers 5). Compared with
    ``posenc.positions_from_mask``; the verdict in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    for mask in _MASKS:
        setting = f"attention_mask={mask.long().tolist()}"
        got, error = attempt(fn, mask.clone(), lang=lang)
        if error:
            return _fail(error, setting, lang)
        want = posenc.positions_from_mask(mask)
        if isinstance(got, Tensor) and got.shape == want.shape and not _is_int_tensor(got):
            return _fail(say(lang, en=f"positions must be integers (an index into the rotation "
                             f"or the table), got dtype {got.dtype}",
                             zh=f"位置必须是整数（旋转角或位置表的下标），得到的 dtype 是 {got.dtype}"),
                         setting, lang)
        problem = compare(got.float() if _is_int_tensor(got) else got, want.float(),
                          what=say(lang, en="the positions", zh="位置"), lang=lang)
        if problem is None:
            continue
        if not (isinstance(got, Tensor) and got.shape == want.shape):
            return _fail(problem, setting, lang)
        real = mask.bool()
        g = got.long()
        if torch.equal(g[real], want[real]):
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
        elif torch.equal(g, torch.arange(mask.shape[1]).expand_as(g)):
            hint = say(lang, en="these are arange(L) positions, which ignore the padding: a "
                       "left-padded row must start counting at its first real token",
                       zh="这是 arange(L) 的位置，没有考虑填充：左填充的一行应从它的第一个真实词元开始计数")
        else:
            hint = problem
        return _fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your positions equal posenc.positions_from_mask (and transformers' generate)\n"
        "  for every padded batch tried",
        zh="你的位置与 posenc.positions_from_mask（以及 transformers 的 generate）相同，\n"
        "  试过的每个填充批次都一样"))


# ----------------------------------------------------------------- shard positions

_SHARDS = [(16, 2), (24, 3), (32, 4), (8, 1)]


def check_shard_positions(fn: Callable[[int, int, int], Tensor], *, lang: str = "en") -> bool:
    """``fn(seq_len, rank, world_size) -> positions``: the global positions ``[seq_len //
    world_size]`` of rank ``rank``'s shard in the head-tail layout (the sequence cut into
    ``2 * world_size`` chunks; rank ``r`` holds chunk ``r``, then chunk ``2 * world_size - 1 -
    r``). Compared with ``posenc.shard_positions``; the verdict in ``lang``."""
    check_lang(lang)
    for seq_len, world in _SHARDS:
        for rank in range(world):
            setting = f"seq_len={seq_len}, rank={rank}, world_size={world}"
            got, error = attempt(fn, seq_len, rank, world, lang=lang)
            if error:
                return _fail(error, setting, lang)
            want = posenc.shard_positions(seq_len, rank, world)
            if isinstance(got, Tensor) and got.shape == want.shape and not _is_int_tensor(got):
                return _fail(say(lang, en=f"positions must be integers, got dtype {got.dtype}",
                                 zh=f"位置必须是整数，得到的 dtype 是 {got.dtype}"), setting, lang)
            problem = compare(got.float() if _is_int_tensor(got) else got, want.float(),
                              what=say(lang, en="the positions", zh="位置"), lang=lang)
            if problem is None:
                continue
            hint = problem
            if isinstance(got, Tensor) and got.shape == want.shape:
                g, c = got.long(), seq_len // (2 * world)
                contiguous = posenc.shard_positions(seq_len, rank, world, load_balance=False)
                strided = torch.cat([torch.arange(rank * c, (rank + 1) * c),
                                     torch.arange((rank + world) * c, (rank + world + 1) * c)])
                if torch.equal(g, contiguous):
                    hint = say(lang, en="these are contiguous chunks (load_balance=False): the "
                               "last rank then does most of the causal work; take chunk r and "
                               "its mirror 2W - 1 - r",
                               zh="这是连续切块（load_balance=False）：那样最后一个 rank 承担大部分因果计算；"
                               "应取第 r 块和与它对称的第 2W - 1 - r 块")
                elif torch.equal(g, strided):
                    hint = say(lang, en="chunks r and r + W do not balance the work (both grow "
                               "with r); the second chunk is the mirror 2W - 1 - r",
                               zh="取第 r 块和第 r + W 块并不能平衡计算量（两块都随 r 增大）；"
                               "第二块应是对称的第 2W - 1 - r 块")
                elif torch.equal(g.sort().values, want.sort().values):
                    hint = say(lang, en="the right positions in the wrong order: the head chunk "
                               "r first, then the tail chunk 2W - 1 - r, each in increasing order",
                               zh="位置对了，顺序不对：先放头部的第 r 块，再放尾部的第 2W - 1 - r 块，"
                               "每块内按递增顺序")
            return _fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your shards equal posenc.shard_positions (torch's head-tail load balancer)\n"
        "  for every length, rank and world size tried",
        zh="你的切分与 posenc.shard_positions（torch 的首尾负载均衡）相同，\n"
        "  试过的每种长度、rank 和进程数都一样"))


# ----------------------------------------------------------------- re-rotating a cached key


def _rot(x: Tensor, positions: Tensor, base: float, *, interleaved: bool = True) -> Tensor:
    inv = posenc.rope_inv_freq(x.shape[-1], base=base)[0]
    return rotate_by(x, positions, inv, interleaved=interleaved)


def check_rerotate(fn: Callable[[Tensor, Tensor, float], Tensor], *, lang: str = "en") -> bool:
    """``fn(k_cached, delta, base) -> Tensor``: ``k_cached [T, d]`` holds keys already rotated
    (interleaved pairs) to their positions ``a``; return them rotated to ``a + delta``
    (``delta [T]`` integers, negative when a key moves down the cache). Compared with
    ``posenc.apply_rope`` at ``a + delta``; the verdict in ``lang``."""
    check_lang(lang)
    gen = torch.Generator().manual_seed(10)
    cases = [(6, 8, 10000.0), (5, 16, 10000.0), (7, 4, 100.0)]
    for T, d, base in cases:
        a = torch.randint(20, 200, (T,), generator=gen)
        delta = torch.randint(-20, 21, (T,), generator=gen)
        k = torch.randn(T, d, generator=gen)
        k_cached = _rot(k, a, base)
        want = _rot(k, a + delta, base)
        setting = f"T={T}, d={d}, delta={delta.tolist()}, base={base:g}"
        k_in = k_cached.clone()
        got, error = attempt(fn, k_in, delta.clone(), base, lang=lang)
        if error:
            return _fail(error, setting, lang)
        problem = compare(got, want, what=say(lang, en="the re-rotated keys",
                                               zh="重新旋转后的键"), atol=1e-4, rtol=1e-4,
                          lang=lang)
        if problem is None:
            if not torch.equal(k_in, k_cached):
                return _fail(say(lang, en="the result is right, but your function changed the "
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
                (_rot(k, a - delta, base), "rotated by -delta: a key that moves from a to "
                 "a + delta turns by +delta (a negative delta turns it backwards)",
                 "转了 -delta：从 a 移到 a + delta 的键应转 +delta（delta 为负时向回转）"),
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
        return _fail(hint, setting, lang)
    return verdict(True, say(
        lang, en="your re-rotation equals rotating the original keys to a + delta:\n"
        "  R(a) R(delta) = R(a + delta), for every size, shift and base tried",
        zh="你的重新旋转等于把原始的键直接转到 a + delta：\n"
        "  R(a) R(delta) = R(a + delta)，试过的每种大小、位移和基数都成立"))
