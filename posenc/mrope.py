"""Multimodal RoPE, M-RoPE (Qwen2-VL: Wang et al., 2024, "Qwen2-VL: Enhancing Vision-Language
Model's Perception of the World at Any Resolution").

Every token gets three position ids, temporal, height and width ``(t, h, w)``. A text token has
``t = h = w`` (its ordinary 1-D position), so a text-only sequence is plain RoPE. The patches of
an image share one ``t`` and take their row and column for ``h`` and ``w``, offset by where the
image starts; the text after an image resumes at ``start + max(h, w)``.

The rotary frequencies are split into three contiguous chunks (``mrope_section``, e.g.
``[16, 24, 24]`` for ``head_dim=128``): the fastest rotate by ``t``, the next by ``h``, the
slowest by ``w``. Qwen3-VL (``mrope_interleaved=True``) interleaves them instead -- ``t h w t h
w ...`` -- so every axis gets fast and slow frequencies.

``mrope_cos_sin`` equals transformers 5.24's ``Qwen2VLRotaryEmbedding`` (and
``Qwen3VLTextRotaryEmbedding``); ``mrope_position_ids`` equals ``Qwen2VLModel.get_rope_index``.

Layer: encodings (pure functions of positions; no attention).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from ._checks import check_dtype, check_float, check_int, check_range, check_tensor, is_compiling
from .rope_angles import rope_angles


def _check_section(mrope_section: object, half: int, interleaved: bool) -> list[int]:
    if isinstance(mrope_section, Tensor) or not isinstance(mrope_section, Sequence):
        raise TypeError(
            f"mrope_section must be a list of 3 ints (t, h, w), got {type(mrope_section).__name__}"
        )
    if len(mrope_section) != 3:
        raise ValueError(f"mrope_section must have 3 entries (t, h, w), got {list(mrope_section)}")
    sec = [check_int(f"mrope_section[{i}]", s, minimum=0) for i, s in enumerate(mrope_section)]
    if sum(sec) != half:
        raise ValueError(
            f"mrope_section must sum to rotary_dim // 2 = inv_freq.numel() = {half}, got {sec} "
            f"(sum {sum(sec)})"
        )
    if interleaved:  # h takes 1, 4, 7, ... and w 2, 5, 8, ... below 3 * section; t the rest
        h, w = (len(range(off, min(3 * sec[off], half), 3)) for off in (1, 2))
        if [half - h - w, h, w] != sec:
            raise ValueError(
                f"mrope_section={sec} cannot be interleaved t h w t h w ... over {half} "
                f"frequencies (that gives t, h, w {[half - h - w, h, w]}); h and w need "
                f"3 * mrope_section[1] <= {half + 1} and 3 * mrope_section[2] <= {half}"
            )
    return sec


def mrope_cos_sin(
    positions: Tensor,
    inv_freq: Tensor,
    mrope_section: Sequence[int],
    *,
    attention_factor: float = 1.0,
    dtype: torch.dtype | None = None,
    mrope_interleaved: bool = False,
) -> tuple[Tensor, Tensor]:
    """``cos``/``sin`` ``[B, L, rotary_dim]`` (half layout) for positions ``[3, B, L]`` (t, h, w).

    Frequency ``i`` rotates by the t, h or w id according to ``mrope_section`` (contiguous
    chunks, Qwen2-VL; or ``t h w t h w ...`` with ``mrope_interleaved=True``, Qwen3-VL). Use the
    result with ``apply_rope(x, cos[:, None], sin[:, None], interleaved=False)``. Ids are
    integers in ``[0, 2**31)``; the angles are those of ``rope_cos_sin`` (transformers' float32
    products below 512, reduced mod ``2 pi`` before rounding from there on: no drift).
    """
    check_tensor("positions", positions)
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor, got dtype {positions.dtype}")
    if positions.dim() != 3 or positions.shape[0] != 3:
        raise ValueError(
            f"positions must have shape [3, B, L] (t, h, w ids), got shape {tuple(positions.shape)}"
        )
    hi = None
    if positions.numel() and not is_compiling():
        lo, hi = (int(v) for v in torch.aminmax(positions))
        check_range("positions", lo, hi)
    check_tensor("inv_freq", inv_freq, floating=True)
    if inv_freq.dim() != 1 or inv_freq.numel() == 0:
        raise ValueError(f"inv_freq must be 1-D and non-empty, got shape {tuple(inv_freq.shape)}")
    half = inv_freq.numel()
    sec = _check_section(mrope_section, half, bool(mrope_interleaved))
    attention_factor = check_float("attention_factor", attention_factor, positive=True)
    dtype = check_dtype("dtype", dtype)

    angles = rope_angles(positions, inv_freq, max_position=hi)  # [3, B, L, rd/2] float32
    axis = torch.empty(half, dtype=torch.long, device=positions.device)  # which id per freq
    if mrope_interleaved:
        axis[:] = 0
        axis[1 : 3 * sec[1] : 3] = 1
        axis[2 : 3 * sec[2] : 3] = 2
    else:
        axis[:] = torch.repeat_interleave(torch.arange(3), torch.tensor(sec)).to(axis.device)
    angles = angles.gather(0, axis.expand_as(angles[:1]))[0]  # [B, L, rd/2]
    angles = torch.cat([angles, angles], dim=-1)  # [B, L, rd]: half layout
    cos, sin = angles.cos() * attention_factor, angles.sin() * attention_factor
    return (cos, sin) if dtype is None else (cos.to(dtype), sin.to(dtype))


def _check_ids(name: str, value: object) -> Tensor:
    check_tensor(name, value)
    assert isinstance(value, Tensor)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    return value


def _check_grids(image_grid_thw: Tensor | None, m: int) -> Tensor:
    """``image_grid_thw`` checked (``[num_images, 3]``, ``>= 1``, h and w divisible by ``m``);
    an empty ``[0, 3]`` for None."""
    if image_grid_thw is None:
        return torch.zeros(0, 3, dtype=torch.long)
    grids = _check_ids("image_grid_thw", image_grid_thw)
    if grids.dim() != 2 or grids.shape[1] != 3:
        raise ValueError(
            f"image_grid_thw must have shape [num_images, 3] (t, h, w), got shape "
            f"{tuple(grids.shape)}"
        )
    if grids.numel() and int(grids.min()) < 1:
        raise ValueError(f"image_grid_thw must be >= 1, got {grids.tolist()}")
    bad = (grids[:, 1] % m != 0) | (grids[:, 2] % m != 0)
    if bool(bad.any()):
        raise ValueError(
            f"image_grid_thw heights and widths must be divisible by spatial_merge_size={m}, "
            f"got {grids[bad].tolist()}"
        )
    return grids


def _check_mask(attention_mask: Tensor | None, input_ids: Tensor) -> None:
    if attention_mask is not None:
        check_tensor("attention_mask", attention_mask)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got "
                f"{tuple(attention_mask.shape)}"
            )


def _row_pieces(
    ids: list[int],
    b: int,
    grid_list: list[list[int]],
    next_image: int,
    m: int,
    image_token_id: int,
    vision_start_token_id: int,
) -> tuple[list[Tensor], int]:
    """One row's real tokens ``ids`` -> its ``[3, n]`` position pieces, run by run (text runs
    ``t = h = w``, image runs by :func:`_image_piece`), and the index of the next image."""
    pieces, pos, i = [], 0, 0
    for is_image, run in itertools.groupby(ids, key=lambda t: t == image_token_id):
        n = len(list(run))
        if not is_image:
            pieces.append(torch.arange(pos, pos + n).expand(3, n))  # [3, n]: t = h = w
            pos, i = pos + n, i + n
            continue
        if i == 0 or ids[i - 1] != vision_start_token_id:
            raise ValueError(
                f"input_ids row {b}: the image tokens at {i} must follow "
                f"vision_start_token_id={vision_start_token_id}"
            )
        if next_image >= len(grid_list):
            raise ValueError(
                f"input_ids hold more images than the {len(grid_list)} rows of image_grid_thw"
            )
        piece, step = _image_piece(grid_list[next_image], m, n, b, next_image)
        pieces.append(piece + pos)  # [3, t*h*w]
        pos, i, next_image = pos + step, i + n, next_image + 1
    return pieces, next_image


def _image_piece(grid: list[int], m: int, n: int, b: int, index: int) -> tuple[Tensor, int]:
    """An image's ``(t, row, col)`` ids ``[3, t*h*w]`` from 0 (grid ``(t, h, w)`` merged by
    ``m``), and how far the text after it moves on: ``max(h, w) / m``."""
    t, h, w = grid
    h, w = h // m, w // m
    if n != t * h * w:
        raise ValueError(
            f"input_ids row {b}: image {index} has {n} image tokens but "
            f"image_grid_thw row {grid} with spatial_merge_size={m} "
            f"needs {t * h * w}"
        )
    tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([tt, hh, ww]).reshape(3, -1), max(h, w)


def mrope_position_ids(
    input_ids: Tensor,
    image_grid_thw: Tensor | None,
    *,
    image_token_id: int,
    vision_start_token_id: int,
    spatial_merge_size: int = 2,
    attention_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Qwen2-VL's 3-D position ids for text with images: ``(position_ids [3, B, L], rope_deltas
    [B, 1])``.

    Images appear as Qwen2-VL's processor emits them, ``<vision_start> <image>*N <vision_end>``
    with ``N = t * (h / m) * (w / m)`` for the image's row ``(t, h, w)`` of ``image_grid_thw``
    (patches before merging) and ``m = spatial_merge_size``; images are taken in order, row by
    row of the batch. Text tokens get ``t = h = w = `` their running position; an image's tokens
    get ``(start, start + row, start + col)`` and the next text starts at ``start + max(h, w) /
    m``. Slots where ``attention_mask`` is 0 get position 0 and are not counted;
    ``rope_deltas = max position + 1 - number of real tokens`` (what decoding adds to plain
    positions). Equal to transformers 5.24's ``Qwen2VLModel.get_rope_index``.
    """
    _check_ids("input_ids", input_ids)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [B, L], got shape {tuple(input_ids.shape)}")
    image_token_id = check_int("image_token_id", image_token_id)
    vision_start_token_id = check_int("vision_start_token_id", vision_start_token_id)
    if image_token_id == vision_start_token_id:
        raise ValueError(
            f"image_token_id and vision_start_token_id must differ, both are {image_token_id}"
        )
    m = check_int("spatial_merge_size", spatial_merge_size, minimum=1)
    grids = _check_grids(image_grid_thw, m)
    _check_mask(attention_mask, input_ids)

    position_ids = torch.zeros(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
    deltas = []
    grid_list = grids.tolist()
    next_image = 0
    for b in range(input_ids.shape[0]):
        keep = (
            torch.ones(input_ids.shape[1], dtype=torch.bool, device=input_ids.device)
            if attention_mask is None
            else attention_mask[b].bool()
        )
        ids = input_ids[b][keep].tolist()
        pieces, next_image = _row_pieces(
            ids, b, grid_list, next_image, m, image_token_id, vision_start_token_id
        )
        if pieces:
            row = torch.cat(pieces, dim=1).to(input_ids.device, input_ids.dtype)  # [3, n_real]
            position_ids[:, b, keep] = row
            deltas.append(int(row.max()) + 1 - len(ids))
        else:
            deltas.append(0)
    if next_image != len(grid_list):
        raise ValueError(
            f"image_grid_thw has {len(grid_list)} rows but input_ids hold {next_image} images"
        )
    rope_deltas = torch.tensor(deltas, device=input_ids.device).unsqueeze(1)  # [B, 1]
    return position_ids, rope_deltas
