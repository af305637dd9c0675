"""Checkers for chapter 9's exercises (positions in today's models): Pixtral's 2-D frequencies,
M-RoPE's text position after an image, xPos (Sun et al., 2023), Llama 4's attention scale of its
NoPE layers (Meta, 2025) and MLA's decoupled rotary slice (DeepSeek-AI, 2024)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ...axial import axial_rope_cos_sin
from ...mla import mla_rope
from ...mrope import mrope_position_ids
from ...rope import RotaryEmbedding, apply_rope, rope_cos_sin
from ...rope_scaling import rope_inv_freq
from ...temperature import llama4_attn_scale
from . import attempt, check_lang, compare, fail, say, verdict

__all__ = [
    "check_axial", "check_text_resumes", "check_xpos", "check_llama4_scale", "check_mla_rope",
]

_GRIDS = [(3, 4, 16), (2, 5, 8), (1, 1, 4), (4, 2, 32)]


def _layout(h: int, w: int, d: int, *, row: Tensor, col: Tensor, order: str) -> Tensor:
    """cos of a 2-D layout with the given per-axis frequencies (for the hints)."""
    rows = torch.arange(h).repeat_interleave(w)
    cols = torch.arange(w).repeat(h)
    if order == "column-major":
        rows, cols = torch.arange(h).repeat(w), torch.arange(w).repeat_interleave(h)
    angles = torch.cat([rows[:, None] * row, cols[:, None] * col], dim=-1)  # [N, d/2]
    return torch.cat([angles, angles], dim=-1).cos()  # [N, d]


def _hint(got: Tensor, h: int, w: int, d: int, lang: str = "en") -> str | None:
    inv = rope_inv_freq(d)[0]
    even, odd = inv[0::2], inv[1::2]
    qwen = rope_inv_freq(d // 2)[0]  # Qwen2-VL's vision encoder: the same set for both axes
    known = [
        (dict(row=odd, col=even, order="row-major"),
         say(lang, en="rows and columns are swapped: the row takes the even frequencies (0, 2, 4, ...)",
             zh="行和列对调了：行取偶数序号的频率（0, 2, 4, ...）")),
        (dict(row=even, col=even, order="row-major"),
         say(lang, en="both axes use the row's frequencies (that is Qwen2-VL's vision encoder); "
                "Pixtral gives the column the odd ones",
             zh="两个轴都用了行的频率（那是 Qwen2-VL 的视觉编码器）；Pixtral 让列取奇数序号的频率")),
        (dict(row=qwen, col=qwen, order="row-major"),
         say(lang, en="both axes use the row's frequencies (that is Qwen2-VL's vision encoder); "
                "Pixtral gives the column the odd ones",
             zh="两个轴都用了行的频率（那是 Qwen2-VL 的视觉编码器）；Pixtral 让列取奇数序号的频率")),
        (dict(row=even, col=odd, order="column-major"),
         say(lang, en="patches are in column-major order; patch p sits at row p // width, column p % width",
             zh="图块排成了列优先顺序；图块 p 应位于第 p // width 行、第 p % width 列")),
    ]
    for kw, msg in known:
        want = _layout(h, w, d, **kw)  # type: ignore[arg-type]  # kw holds row/col tensors and an order str
        if got.shape == want.shape and torch.allclose(got.float(), want, atol=1e-5):
            return msg
    return None


def check_axial(fn: Callable[[int, int, int], tuple[Tensor, Tensor]], *, lang: str = "en") -> bool:
    """``fn(height, width, head_dim) -> (cos, sin)``, each ``[height * width, head_dim]``, equal to
    Pixtral's 2-D RoPE (``posenc.axial_rope_cos_sin``), half layout, row-major patches; the
    verdict and hints in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    for h, w, d in _GRIDS:
        out, err = attempt(fn, h, w, d, lang=lang)
        if err:
            return verdict(False, err)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            kind = type(out).__name__
            return verdict(False, say(lang, en=f"return a pair (cos, sin), got {kind}",
                                      zh=f"应返回一对 (cos, sin)，得到的是 {kind}"))
        cos_want, sin_want = axial_rope_cos_sin(h, w, d)
        for name, got, want in (("cos", out[0], cos_want), ("sin", out[1], sin_want)):
            what = say(lang, en=f"{name} for a {h} x {w} grid, head_dim {d}",
                       zh=f"{h} × {w} 网格、head_dim {d} 时的 {name} ")
            problem = compare(got, want, what=what, lang=lang)
            if problem:
                hint = _hint(got, h, w, d, lang) if name == "cos" and isinstance(got, Tensor) else None
                return verdict(False, hint or problem)
    return verdict(True, say(lang, en="your 2-D frequencies match Pixtral's for every grid tried",
                             zh="在所有试过的网格上，你的二维频率都与 Pixtral 的一致"))


def check_text_resumes(answer: object, *, lang: str = "en") -> bool:
    """The position of the ``<vision_end>`` token after a 4 x 2 (merged) image starting at 6;
    the verdict in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    start, rows, cols = 6, 4, 2  # 5 text tokens and <vs> at 0 ... 5; 8 x 4 patches merged
    ids = torch.tensor([[1, 2, 3, 4, 8, 5] + [7] * (rows * cols) + [6, 9]])  # ..., <ve>, text
    pos, _ = mrope_position_ids(ids, torch.tensor([[1, 2 * rows, 2 * cols]]), image_token_id=7,
                                vision_start_token_id=5)
    want = int(pos[0, 0, start + rows * cols])  # the <vision_end> token
    if isinstance(answer, bool) or not isinstance(answer, int):
        kind = type(answer).__name__
        return verdict(False, say(lang, en=f"answer with an int position, got {kind}",
                                  zh=f"请用一个整数位置作答，得到的是 {kind}"))
    if answer == want:
        return verdict(True, say(lang, en=f"text resumes at {want} = start + max(rows, columns)",
                                 zh=f"文本从 {want} = 起点 + max(行数, 列数) 处继续"))
    if answer == start + rows * cols:
        return verdict(False, say(lang, en="that counts every image token; M-RoPE advances by max(h, w) only",
                                  zh="这把每个图像词元都算进去了；M-RoPE 只前进 max(h, w)"))
    last = want - 1
    return verdict(False, say(lang, en=f"{answer} is off; the image's ids run from {start} to "
                                       f"{last} on the widest axis",
                              zh=f"{answer} 不对；在最宽的轴上，图像的 id 从 {start} 到 {last}"))


def _pair_or_hint(out: object, lang: str) -> str | None:
    if isinstance(out, tuple | list) and len(out) == 2:
        return None
    kind = type(out).__name__
    return say(lang, en=f"return a pair (q, k), got {kind}", zh=f"应返回一对 (q, k)，得到的是 {kind}")


def _first_slip(got: Sequence[Any], slips: Sequence[tuple[str, str, Sequence[Tensor]]],
                lang: str) -> str | None:
    """The hint of the first slip whose result equals ``got`` (every part of it)."""
    for en, zh, want in slips:
        if all(isinstance(g, Tensor) and g.shape == w.shape and g.is_floating_point()
               and torch.allclose(g.detach().double(), w.double(), atol=1e-5, rtol=1e-4)
               for g, w in zip(got, want, strict=True)):
            return say(lang, en=en, zh=zh)
    return None


# --- xPos --------------------------------------------------------------------------------------

def _xpos(q: Tensor, k: Tensor, scale_base: float, *, centre: int | None = None,
          key_power: float = -1.0, sign: float = 1.0, step: float = 2.0, per_base: bool = True,
          repeat: bool = True, scale: bool = True) -> tuple[Tensor, Tensor]:
    """xPos on ``[L, d]`` inputs (interleaved, positions 0 ... L - 1), with one slip at most."""
    L, d = q.shape
    c = L // 2 if centre is None else centre
    zeta = (step * torch.arange(d // 2, dtype=torch.float32) + 0.4 * d) / (1.4 * d)  # [d/2]
    power = sign * (torch.arange(L, dtype=torch.float32) - c) / (scale_base if per_base else 1)
    s = zeta ** power[:, None] if scale else torch.ones(L, d // 2)  # [L, d/2]
    s = s.repeat_interleave(2, dim=-1) if repeat else torch.cat([s, s], dim=-1)  # [L, d]
    cos, sin = rope_cos_sin(torch.arange(L), rope_inv_freq(d)[0], interleaved=True)
    kp = s**key_power
    return apply_rope(q, cos * s, sin * s), apply_rope(k, cos * kp, sin * kp)


_XPOS_SLIPS: list[tuple[str, str, dict[str, Any]]] = [
    ("that is plain RoPE: xPos also multiplies the query by zeta_i^((m - c)/scale_base) and "
     "divides the key by zeta_i^((n - c)/scale_base)",
     "这是普通的 RoPE：xPos 还要把查询乘以 zeta_i^((m - c)/scale_base)，把键除以 "
     "zeta_i^((n - c)/scale_base)", {"scale": False}),
    ("the key is multiplied by the scale too; xPos divides it, so that only "
     "zeta_i^((m - n)/scale_base) is left in the score",
     "键也乘上了缩放；xPos 要把键除以它，分数里才只剩 zeta_i^((m - n)/scale_base)",
     {"key_power": 1.0}),
    ("the exponent has the wrong sign: the query gets zeta_i^(+(m - m0)/scale_base), the key "
     "zeta_i^(-(n - m0)/scale_base)",
     "指数的符号反了：查询乘 zeta_i^(+(m - m0)/scale_base)，键乘 zeta_i^(-(n - m0)/scale_base)",
     {"sign": -1.0}),
    ("the centre: m0 = L // 2 of the sequence, not 0 (it cancels in the scores, not in q and k)",
     "中心取错了：m0 = L // 2（序列的中点），不是 0（它在分数里抵消，在 q 和 k 里不抵消）",
     {"centre": 0}),
    ("zeta_i = (2i + 0.4 d)/(1.4 d) with i the pair index; you used i instead of 2i",
     "zeta_i = (2i + 0.4 d)/(1.4 d)，i 是维度对的序号；你用的是 i 而不是 2i", {"step": 1.0}),
    ("the exponent is divided by scale_base: zeta_i^((m - c)/scale_base)",
     "指数要除以 scale_base：zeta_i^((m - c)/scale_base)", {"per_base": False}),
    ("pair i is channels (2i, 2i + 1): repeat each zeta_i twice in a row (repeat_interleave), "
     "not cat([zeta, zeta]), which is the half layout",
     "第 i 对是维度 (2i, 2i + 1)：每个 zeta_i 要连着重复两次（repeat_interleave），"
     "cat([zeta, zeta]) 是对半布局的排法", {"repeat": False}),
]


def check_xpos(fn: Callable[[Tensor, Tensor, float], tuple[Tensor, Tensor]], *,
               lang: str = "en") -> bool:
    """``fn(q, k, scale_base) -> (q, k)``: ``q``, ``k`` are ``[L, head_dim]`` at positions
    ``0 ... L - 1``, rotated by RoPE (interleaved pairs, base 10,000) and scaled by xPos with the
    centre ``L // 2``; compared with ``posenc.RotaryEmbedding(head_dim,
    xpos_scale_base=scale_base)``. The verdict and hints in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    gen = torch.Generator().manual_seed(9)
    for L, d, base in ((8, 16, 8.0), (5, 8, 4.0), (12, 32, 64.0)):
        q, k = torch.randn(L, d, generator=gen), torch.randn(L, d, generator=gen)
        setting = f"L={L}, head_dim={d}, scale_base={base:g}"
        out, err = attempt(fn, q.clone(), k.clone(), base, lang=lang)
        if err or (err := _pair_or_hint(out, lang)):
            return fail(err, setting, lang)
        rq, rk = RotaryEmbedding(d, xpos_scale_base=base)(q[None, None], k[None, None])
        want = (rq[0, 0], rk[0, 0])
        torch.testing.assert_close(_xpos(q, k, base), want)  # the slips start from the truth
        for got, w, name in ((out[0], want[0], ("the query", "查询")),
                             (out[1], want[1], ("the key", "键"))):
            problem = compare(got, w, what=say(lang, en=name[0], zh=name[1]), atol=1e-5,
                              rtol=1e-4, lang=lang)
            if problem:
                slips = [(en, zh, _xpos(q, k, base, **kw)) for en, zh, kw in _XPOS_SLIPS]
                return fail(_first_slip(tuple(out), slips, lang) or problem, setting, lang)
    return verdict(True, say(
        lang, en="your xPos equals posenc.RotaryEmbedding(..., xpos_scale_base=...)\n"
        "  for every size and scale_base tried",
        zh="你的 xPos 与 posenc.RotaryEmbedding(..., xpos_scale_base=...) 一致，\n"
        "  试过的每种大小和 scale_base 都一样"))


# --- Llama 4's attention scale ---------------------------------------------------------------

def _llama4(positions: Tensor, floor_scale: float, attn_scale: float, *, plus_one: float = 1.0,
            log1p: bool = True, floor: bool = True, one: float = 1.0) -> Tensor:
    x = (positions.double() + plus_one) / floor_scale
    x = torch.floor(x) if floor else x
    return (torch.log1p(x) if log1p else torch.log(x)) * attn_scale + one


_LLAMA4_SLIPS: list[tuple[str, str, dict[str, Any]]] = [
    ("off by one: positions count from 0, so the floor is taken of (m + 1) / floor_scale; "
     "the scale first changes at m = floor_scale - 1",
     "差了 1：位置从 0 开始数，所以要对 (m + 1) / floor_scale 取下整；"
     "缩放在 m = floor_scale - 1 处第一次变化", {"plus_one": 0.0}),
    ("log(1 + ...): the scale is 1 + attn_scale * log(1 + floor((m + 1) / floor_scale))",
     "要用 log(1 + ...)：缩放是 1 + attn_scale * log(1 + floor((m + 1) / floor_scale))",
     {"log1p": False}),
    ("the floor is missing: the scale grows in steps, once every floor_scale positions",
     "少了取下整：缩放是一级一级增长的，每 floor_scale 个位置一级", {"floor": False}),
    ("the 1 + is missing: the scale starts at 1 and only grows from there",
     "少了 1 +：缩放从 1 开始，只会往上长", {"one": 0.0}),
]


def check_llama4_scale(fn: Callable[[Tensor, float, float], Tensor], *,
                       lang: str = "en") -> bool:
    """``fn(positions, floor_scale, attn_scale) -> Tensor``, the query scale of Llama 4's NoPE
    layers at each position (the shape of ``positions``), compared with
    ``posenc.llama4_attn_scale``; the verdict and hints in ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    gen = torch.Generator().manual_seed(4)
    cases = [(torch.arange(40), 8.0, 0.1), (torch.arange(30), 4.0, 0.5),
             (torch.randint(0, 300, (2, 6), generator=gen), 16.0, 0.25)]
    for positions, floor_scale, attn_scale in cases:
        shown = f"arange({positions.numel()})" if positions.dim() == 1 else say(
            lang, en="[2, 6] ints < 300", zh="形状 [2, 6]、小于 300 的整数")
        setting = f"positions={shown}, floor_scale={floor_scale:g}, attn_scale={attn_scale:g}"
        got, err = attempt(fn, positions.clone(), floor_scale, attn_scale, lang=lang)
        if err:
            return fail(err, setting, lang)
        want = llama4_attn_scale(positions, floor_scale=floor_scale, attn_scale=attn_scale)
        problem = compare(got, want, what=say(lang, en="the scale", zh="缩放"), lang=lang)
        if problem:
            slips = [(en, zh, (_llama4(positions, floor_scale, attn_scale, **kw),))
                     for en, zh, kw in _LLAMA4_SLIPS]
            return fail(_first_slip((got,), slips, lang) or problem, setting, lang)
    return verdict(True, say(
        lang, en="your scale equals posenc.llama4_attn_scale at every position tried",
        zh="在试过的每个位置上，你的缩放都与 posenc.llama4_attn_scale 一致"))


# --- MLA's decoupled rotary slice --------------------------------------------------------------

def _mla(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, *, first: bool = False,
         interleaved: bool = False, rotate_k: bool = True, sign: float = 1.0
         ) -> tuple[Tensor, Tensor]:
    r = k.shape[-1]
    q_pass, q_rot = (q[..., r:], q[..., :r]) if first else (q[..., :-r], q[..., -r:])
    q_rot = apply_rope(q_rot, cos, sign * sin, interleaved=interleaved)
    k_out = apply_rope(k, cos, sign * sin, interleaved=interleaved) if rotate_k else k
    q_out = torch.cat([q_rot, q_pass], -1) if first else torch.cat([q_pass, q_rot], -1)
    return q_out, k_out


_MLA_SLIPS: list[tuple[str, str, dict[str, Any]]] = [
    ("the rotary slice is the last rope_dim channels of the query, q = [q_nope, q_rope]; you "
     "rotated the first ones",
     "旋转的是查询的最后 rope_dim 个维度，q = [q_nope, q_rope]；你旋转了最前面的几个",
     {"first": True}),
    ("cos and sin are in the half layout: pairs (i, i + rope_dim/2), apply_rope(..., "
     "interleaved=False)",
     "cos 和 sin 是对半布局：维度对是 (i, i + rope_dim/2)，即 apply_rope(..., interleaved=False)",
     {"interleaved": True}),
    ("k_rope rotates too: it is the only part of the key that carries the position",
     "k_rope 也要旋转：键里只有它带着位置", {"rotate_k": False}),
    ("the angle has the wrong sign: x * cos + rotate_half(x) * sin",
     "角度的符号反了：应为 x * cos + rotate_half(x) * sin", {"sign": -1.0}),
]


def check_mla_rope(fn: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]], *,
                   lang: str = "en") -> bool:
    """``fn(q, k_rope, cos, sin) -> (q, k_rope)``: ``q [B, H, L, nope + rope]``, ``k_rope
    [B, 1, L, rope]``, ``cos``/``sin [L, rope]`` in the half layout; rotate the last ``rope``
    channels of ``q`` and all of ``k_rope``, as ``posenc.mla_rope``. The verdict and hints in
    ``lang`` (``"en"`` or ``"zh"``)."""
    check_lang(lang)
    gen = torch.Generator().manual_seed(3)
    for b, h, L, nope, rope, start in ((1, 2, 5, 8, 4, 0), (2, 3, 4, 6, 8, 10),
                                       (1, 4, 6, 16, 8, 3)):
        q = torch.randn(b, h, L, nope + rope, generator=gen)
        k = torch.randn(b, 1, L, rope, generator=gen)
        positions = torch.arange(start, start + L)
        cos, sin = rope_cos_sin(positions, rope_inv_freq(rope)[0], interleaved=False)
        setting = (f"q [{b}, {h}, {L}, {nope} + {rope}], k_rope [{b}, 1, {L}, {rope}], "
                   f"positions {start}..{start + L - 1}")
        out, err = attempt(fn, q.clone(), k.clone(), cos, sin, lang=lang)
        if err or (err := _pair_or_hint(out, lang)):
            return fail(err, setting, lang)
        want = mla_rope(q, k, cos, sin)
        if isinstance(out[0], Tensor) and out[0].shape[-1] == rope != nope + rope:
            return fail(say(lang, en="return the whole query: its nope channels pass through "
                             "untouched, in front of the rotated slice",
                             zh="要返回整个查询：nope 维度原样保留，放在旋转后的那一段前面"),
                         setting, lang)
        for got, w, name in ((out[0], want[0], ("the query", "查询")),
                             (out[1], want[1], ("k_rope", "k_rope"))):
            problem = compare(got, w, what=say(lang, en=name[0], zh=name[1]), lang=lang)
            if problem:
                slips = [(en, zh, _mla(q, k, cos, sin, **kw)) for en, zh, kw in _MLA_SLIPS]
                return fail(_first_slip(tuple(out), slips, lang) or problem, setting, lang)
    return verdict(True, say(
        lang, en="your decoupled slice equals posenc.mla_rope for every shape tried",
        zh="在试过的每种形状上，你的解耦旋转切片都与 posenc.mla_rope 一致"))
