"""Chapter 11's explorable: who sees whom in a speculative-decoding draft tree.

:func:`speculative_tree` draws a :func:`~posenc.lab.explore_figures.heatmap` of the distances
:func:`~posenc.attention.attend` sees under a draft tree's mask, one tree per step of the slider.
:mod:`posenc.lab.explore` re-exports both names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

import posenc

from .explore_figures import frame_data, heatmap
from .explore_frames import Frame, _integer, _short
from .explore_page import Explorable
from .serving_positions import tree_positions_and_mask

__all__ = ["speculative_tree", "tree_value"]


def tree_value(prefix: int, parents: Sequence[int]) -> str:
    """The control value :func:`speculative_tree` gives a tree: ``"P:p0,p1,..."`` (the prefix
    length and each node's parent), from which a reader of the page (the browser test) can
    recompute every cell."""
    return f"{prefix}:" + ",".join(str(int(p)) for p in parents)


def speculative_tree(
    name: str,
    trees: Mapping[str, Sequence[int]],
    *,
    prefix: int,
    xlabel: str,
    ylabel: str,
    zlabel: str,
    control_label: str,
    label: str,
    active: int = 0,
    height: int = 480,
) -> Explorable:
    """Who sees whom in a speculative-decoding draft tree, one tree per step of the slider
    (chapter 11): a :func:`heatmap` of the ``prefix`` tokens and the tree's nodes, query rows
    against key columns, each cell the distance ``m - n`` between the positions the two get,
    blank where the query may not see the key.

    ``trees`` maps the control's label of each tree to its ``parents`` (node ``i`` continues
    node ``parents[i]``, ``-1`` the last prefix token; see
    :func:`~posenc.lab.serving_positions.tree_positions_and_mask`). Positions: ``0 .. prefix - 1``, then
    ``prefix + depth`` (siblings share one); the tick labels show them. Trees of different sizes
    are padded with blank rows and columns. Every cell is computed by
    :func:`~posenc.attention.attend` itself (one-hot values under zero queries and keys: a key
    gets weight > 0 exactly where the query sees it) with the tree's boolean mask, checked
    against the mask, and read back from the figure after it is built; a difference raises
    ``RuntimeError``. The frames' values are :func:`tree_value` strings.
    """
    if not isinstance(trees, Mapping) or not trees:
        raise TypeError(f"trees must be a non-empty dict (control label -> parents), got "
                        f"{_short(trees)}")
    prefix = _integer(prefix, "prefix", 1, 64)
    built = []
    for tree_label, parents in trees.items():
        positions, mask = tree_positions_and_mask(parents, prefix=prefix)  # [N], [N, P + N]
        N = positions.numel()
        T = prefix + N
        allowed = torch.zeros(T, T, dtype=torch.bool)
        allowed[:prefix, :prefix] = torch.ones(prefix, prefix, dtype=torch.bool).tril()
        allowed[prefix:] = mask
        pos = torch.cat([torch.arange(prefix), positions])  # [T]
        zeros = torch.zeros(1, 1, T, T)
        out = posenc.attend(zeros, zeros, torch.eye(T)[None, None], positions=pos,
                            attention_mask=allowed[None], backend="math")
        seen = out[0, 0] > 0  # [T, T]: attend's own visibility
        if not torch.equal(seen, allowed):
            raise RuntimeError(f"tree {tree_label!r}: attend's visibility differs from the mask")
        distance = (pos[:, None] - pos[None, :]).double().masked_fill(~seen, float("-inf"))
        built.append((tree_label, parents, pos, distance))
    size = max(d.shape[0] for *_, d in built)
    frames, ticks, drawn = [], [], []
    for tree_label, parents, pos, distance in built:
        T = distance.shape[0]
        z = torch.full((size, size), float("-inf"), dtype=torch.float64)
        z[:T, :T] = distance
        drawn.append(z)
        ticks.append([str(p) for p in pos.tolist()] + [""] * (size - T))
        frames.append(Frame(label=tree_label, value=tree_value(prefix, list(parents)),
                            traces=[{"z": z}]))
    top = max(float(z[torch.isfinite(z)].max()) for z in drawn)
    slots = list(range(size))
    ex = heatmap(name, frames, x=slots, y=slots, xlabel=xlabel, ylabel=ylabel, zlabel=zlabel,
                 control_label=control_label, label=label, active=active,
                 zrange=(0, max(top, 1.0)), xticktext=ticks, yticktext=ticks, height=height)
    for i, z in enumerate(drawn):  # the figure holds these numbers (blank: None)
        (shown,) = frame_data(ex, i, key="z")
        got = torch.tensor([[float("-inf") if v is None else v for v in row] for row in shown],  # type: ignore[attr-defined]
                           dtype=torch.float64)
        if not torch.equal(got, z):
            raise RuntimeError(f"{name}: step {i} draws other numbers than attend computed")
    return ex
