"""How a :class:`posenc.explain.RopeReport` reads: a text table and a matplotlib figure, in
English or Chinese (the book's two editions). Strings live in ``LABELS``; matplotlib is imported
only when a figure is drawn."""

from __future__ import annotations

import math
from typing import Any

RopeReport = Any
"""What these functions draw: a :class:`posenc.explain.RopeReport` (this module sits below
``posenc.explain``, which imports it, so it names the type without importing it)."""

LABELS: dict[str, dict[str, str]] = {
    "en": {
        "title": "RoPE of {model} ({rope_type}{layer})",
        "dims": "head_dim {head_dim}, rotary_dim {rotary_dim} ({pairs} pairs), base {base:g}, "
                "{layout} layout",
        "lengths": "trained on {trained} positions; scaling reaches {reach}; target {target}",
        "factor": "factor {factor}; attention factor {attn:.6g}",
        "temperature": "Llama 4 temperature tuning: floor_scale {floor:g}, attn_scale {scale:g};"
                       " NoPE query scale at the target {q:.4g}",
        "deepseek": "DeepSeek MLA: qk_rope_head_dim {rope}, qk_nope_head_dim {nope}",
        "softmax": "softmax scale multiplied by mscale^2 = {s:.6g} (DeepSeek)",
        "mrope": "M-RoPE sections (temporal, height, width pairs): {sections}",
        "never": "{n} of {pairs} pairs never complete a turn within {trained} positions",
        "counts": "treatment: {counts}",
        "issues": "Inconsistencies:",
        "no_issues": "No inconsistencies found.",
        "fix": "fix",
        "pair": "pair", "inv_freq": "theta_i", "wavelength": "wavelength", "turns": "turns@train",
        "treatment": "treatment", "pair_factor": "factor", "scaled_wl": "wl after",
        "scaled_turns": "turns@target",
        "kept": "kept", "interpolated": "interpolated", "ramped": "ramped",
        "rescaled": "rescaled",
        "interleaved": "interleaved", "half": "half", "unknown": "unknown",
        "layer": ", layer type {layer_type}",
        "x": "rotary pair i", "y": "wavelength (positions, log scale)",
        "before": "before scaling", "after": "after scaling",
        "train_line": "training length {n}", "target_line": "target length {n}",
        "plot_title": "{model}: wavelength of each pair ({rope_type})",
    },
    "zh": {
        "title": "{model} 的 RoPE（{rope_type}{layer}）",
        "dims": "head_dim {head_dim}，rotary_dim {rotary_dim}（{pairs} 对），底数 {base:g}，"
                "{layout}布局",
        "lengths": "训练长度 {trained} 个位置；缩放可达 {reach}；目标 {target}",
        "factor": "缩放因子 {factor}；注意力因子 {attn:.6g}",
        "temperature": "Llama 4 温度调节：floor_scale {floor:g}，attn_scale {scale:g}；"
                       "目标长度处 NoPE 查询缩放 {q:.4g}",
        "deepseek": "DeepSeek MLA：qk_rope_head_dim {rope}，qk_nope_head_dim {nope}",
        "softmax": "softmax 缩放再乘以 mscale^2 = {s:.6g}（DeepSeek）",
        "mrope": "M-RoPE 分段（时间、高、宽 各占的对数）：{sections}",
        "never": "{pairs} 对中有 {n} 对在 {trained} 个位置内转不满一圈",
        "counts": "处理方式：{counts}",
        "issues": "发现的不一致：",
        "no_issues": "未发现不一致。",
        "fix": "修正",
        "pair": "对", "inv_freq": "theta_i", "wavelength": "波长", "turns": "训练内圈数",
        "treatment": "处理", "pair_factor": "因子", "scaled_wl": "缩放后波长",
        "scaled_turns": "目标内圈数",
        "kept": "保留", "interpolated": "内插", "ramped": "过渡", "rescaled": "重缩放",
        "interleaved": "交错", "half": "半分", "unknown": "未知",
        "layer": "，层类型 {layer_type}",
        "x": "旋转对 i", "y": "波长（位置数，对数刻度）",
        "before": "缩放前", "after": "缩放后",
        "train_line": "训练长度 {n}", "target_line": "目标长度 {n}",
        "plot_title": "{model}：每一对的波长（{rope_type}）",
    },
}  # fmt: skip
"""Every string the table and the figure show, per language; both have the same keys."""

_CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "Noto Sans SC", "WenQuanYi Zen Hei",
              "WenQuanYi Micro Hei", "Microsoft YaHei", "PingFang SC")
"""CJK fonts tried for ``lang="zh"``, best first (the lab's book style sets one for the book)."""
_COLOURS = {"kept": "#1f77b4", "interpolated": "#d62728", "ramped": "#ff7f0e",
            "rescaled": "#9467bd"}  # fmt: skip


def labels(lang: str) -> dict[str, str]:
    """The strings for ``lang`` (``"en"`` or ``"zh"``)."""
    if not isinstance(lang, str) or lang not in LABELS:
        raise ValueError(f"lang must be one of {sorted(LABELS)}, got {lang!r}")
    return LABELS[lang]


def _n(x: Any, t: dict[str, str]) -> str:
    return t["unknown"] if x is None else f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _header(r: RopeReport, t: dict[str, str]) -> list[str]:
    layer = t["layer"].format(layer_type=r.layer_type) if r.layer_type else ""
    lines = [
        t["title"].format(model=r.model_type or "?", rope_type=r.rope_type, layer=layer),
        t["dims"].format(head_dim=r.head_dim, rotary_dim=r.rotary_dim, pairs=r.num_pairs,
                         base=r.base, layout=t["interleaved" if r.interleaved else "half"]),
        t["lengths"].format(trained=_n(r.training_length, t), reach=_n(r.reach, t),
                            target=_n(r.target_length, t)),
        t["factor"].format(factor="-" if r.rope_type == "default" else _n(r.factor, t),
                           attn=r.attention_factor),
    ]  # fmt: skip
    if r.temperature_tuning is not None and r.nope_query_scale is not None:
        floor, scale = r.temperature_tuning
        lines.append(t["temperature"].format(floor=floor, scale=scale, q=r.nope_query_scale))
    if r.qk_rope_head_dim is not None:
        lines.append(t["deepseek"].format(rope=r.qk_rope_head_dim, nope=r.qk_nope_head_dim))
    if r.softmax_scale_factor is not None:
        lines.append(t["softmax"].format(s=r.softmax_scale_factor))
    if r.mrope_section is not None:
        lines.append(t["mrope"].format(sections=list(r.mrope_section)))
    if r.turns is not None:
        never = int((r.turns < 1).sum())
        lines.append(t["never"].format(n=never, pairs=r.num_pairs,
                                       trained=_n(r.training_length, t)))
    counts = ", ".join(f"{t[k]} {v}" for k, v in r.counts().items() if v)
    lines.append(t["counts"].format(counts=counts))
    return lines


def _rows(r: RopeReport, t: dict[str, str]) -> list[str]:
    cols = ("pair", "inv_freq", "wavelength", "turns", "treatment", "pair_factor",
            "scaled_wl", "scaled_turns")  # fmt: skip
    out = ["  ".join(f"{t[c]:>12}" for c in cols)]

    def cell(v: float | None) -> str:
        return f"{'-':>12}" if v is None or not math.isfinite(v) else f"{v:>12.5g}"

    turns = r.turns.tolist() if r.turns is not None else [None] * r.num_pairs
    sturns = r.scaled_turns.tolist() if r.scaled_turns is not None else [None] * r.num_pairs
    for i in range(r.num_pairs):
        out.append("  ".join([
            f"{i:>12}", cell(r.inv_freq[i].item()), cell(r.wavelength[i].item()), cell(turns[i]),
            f"{t[r.treatment[i]]:>12}", cell(r.pair_factor[i].item()),
            cell(r.scaled_wavelength[i].item()), cell(sturns[i]),
        ]))  # fmt: skip
    return out


def render_text(r: RopeReport, lang: str = "en") -> str:
    """The report as text: a header, one row per pair, the issues with their fixes; then the
    same for every other layer type."""
    t = labels(lang)
    lines = _header(r, t) + [""] + _rows(r, t) + [""]
    if r.issues:
        lines.append(t["issues"])
        lines += [f"  - {i.field}: {i.message}. {t['fix']}: {i.fix}" for i in r.issues]
    else:
        lines.append(t["no_issues"])
    text = "\n".join(lines)
    for other in r.layers:
        text += "\n\n" + render_text(other, lang)
    return text


def plot(r: RopeReport, *, lang: str = "en", ax: Any = None) -> Any:
    """Wavelength per pair before (open) and after (filled, by treatment) scaling, log scale,
    with the training and target lengths as horizontal lines. Returns the figure."""
    t = labels(lang)
    import matplotlib.pyplot as plt  # optional dependency, imported when drawing

    if ax is None:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
    else:
        fig = ax.figure
    pairs = list(range(r.num_pairs))
    ax.plot(pairs, r.wavelength.tolist(), "o", mfc="none", color="#555555", ms=4,
            label=t["before"])  # fmt: skip
    for kind, colour in _COLOURS.items():
        idx = [i for i in pairs if r.treatment[i] == kind]
        if idx:
            ax.plot(idx, [r.scaled_wavelength[i].item() for i in idx], "o", color=colour, ms=4,
                    label=f"{t['after']}: {t[kind]}")  # fmt: skip
    if r.training_length:
        ax.axhline(r.training_length, color="#2ca02c", ls="--", lw=1.2,
                   label=t["train_line"].format(n=f"{r.training_length:,}"))
    if r.target_length and r.target_length != r.training_length:
        ax.axhline(r.target_length, color="#000000", ls=":", lw=1.2,
                   label=t["target_line"].format(n=f"{r.target_length:,}"))
    ax.set_yscale("log")
    ax.set_xlabel(t["x"])
    ax.set_ylabel(t["y"])
    ax.set_title(t["plot_title"].format(model=r.model_type or "?", rope_type=r.rope_type))
    legend = ax.legend(fontsize=9, loc="upper left")
    if lang == "zh":
        _cjk(fig, [ax.title, ax.xaxis.label, ax.yaxis.label, *legend.get_texts()])
    return fig


def _cjk(fig: Any, texts: list[Any]) -> None:
    """Draw the Chinese texts in the first installed CJK font, when there is one."""
    from matplotlib import font_manager

    have = {f.name for f in font_manager.fontManager.ttflist}
    font = next((f for f in _CJK_FONTS if f in have), None)
    if font is None:  # keep matplotlib's font (it warns about missing glyphs)
        return
    for text in texts:
        text.set_fontfamily(font)
