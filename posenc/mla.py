"""Decoupled RoPE of multi-head latent attention, MLA (DeepSeek-AI, 2024, "DeepSeek-V2"; 2024,
"DeepSeek-V3 Technical Report").

MLA caches one small latent ``c_n`` per token and recovers keys as ``k_n = W_UK c_n``. Without
positions the up-projection folds into the query, ``q . W_UK c_n = (W_UK^T q) . c_n``, so the
keys never need to be rebuilt. RoPE would put a rotation between them, ``q . R_{n-m} W_UK c_n``,
which depends on ``n - m`` and cannot be folded. MLA therefore gives each head a query of
``nope + rope`` channels and each token one extra shared key slice ``k_rope`` (computed from the
hidden state, rotated, and cached next to the latent): only the rope slices rotate,

    score(m, n) = q_nope(m) . W_UK c_n + (R_m q_rope(m)) . (R_n k_rope(n)).

``mla_rope`` rotates those slices; with ``rope_interleave=True`` the weights produce interleaved
pairs and the result comes out in the half layout, as transformers 5.24's DeepSeek-V3 attention
(``apply_rotary_pos_emb_interleave``) does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_tensor
from .rope import apply_rope, rope_permutation


def mla_rope(
    q: Tensor, k_rope: Tensor, cos: Tensor, sin: Tensor, *, rope_interleave: bool = False
) -> tuple[Tensor, Tensor]:
    """Rotate the last ``rope_dim`` channels of ``q`` and all of ``k_rope``.

    ``q [B, H, L, nope + rope]``, ``k_rope [B, 1, L, rope]`` (one slice shared by the heads),
    ``cos``/``sin [..., L, rope]`` in the half layout (``rope_cos_sin(..., interleaved=False)``).
    Returns ``(q, k_rope)`` with the nope channels of ``q`` untouched.
    """
    check_tensor("q", q, floating=True, min_dim=2)
    check_tensor("k_rope", k_rope, floating=True, min_dim=2)
    check_tensor("cos", cos, floating=True, min_dim=2)
    rope = k_rope.shape[-1]
    if rope % 2 or rope < 2:
        raise ValueError(f"k_rope.shape[-1] (rope_dim) must be even and >= 2, got {rope}")
    if cos.shape[-1] != rope:
        raise ValueError(
            f"cos/sin must cover rope_dim=k_rope.shape[-1]={rope} channels, got {cos.shape[-1]}"
        )
    if q.shape[-1] < rope:
        raise ValueError(f"q.shape[-1]={q.shape[-1]} is smaller than rope_dim={rope}")
    if q.shape[-2] != k_rope.shape[-2]:
        raise ValueError(
            f"q and k_rope must have the same seq length, got {q.shape[-2]} and {k_rope.shape[-2]}"
        )
    q_pass, q_rot = q.split([q.shape[-1] - rope, rope], dim=-1)  # [B, H, L, nope], [.., rope]
    if rope_interleave:
        perm = rope_permutation(rope, to="half").to(q.device)  # pairs (0,1),(2,3).. -> half
        q_rot, k_rope = q_rot[..., perm], k_rope[..., perm]
    q_rot = apply_rope(q_rot, cos, sin, interleaved=False)
    k_rope = apply_rope(k_rope, cos, sin, interleaved=False)
    return torch.cat([q_pass, q_rot], dim=-1), k_rope  # [B, H, L, nope + rope], [B, 1, L, rope]
