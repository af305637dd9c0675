"""RotaryEmbedding with a scaling config, end to end: Hugging Face parity (cos/sin with the
attention factor, dynamic growing and shrinking, LongRoPE's switch, partial rotary), the KV-cache
pitfall of the length-dependent types, empty positions, bad input at construction."""

from __future__ import annotations

import pytest
import torch

from posenc import RotaryEmbedding, apply_rope
from posenc.rope import rope_permutation

D, H, L = 16, 2, 32  # head_dim, heads, trained length: small, so every test is fast

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": L},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": L},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0 + 0.01 * i for i in range(8)],
                 "long_factor": [1.0 + 0.5 * i for i in range(8)],
                 "original_max_position_embeddings": L, "max_position_embeddings": 4 * L},
}  # fmt: skip

# [B, seq] position ids, one forward each: prefill, decode past L (dynamic grows at every step),
# shorter but still > L (dynamic keeps the longest), exactly L (kept too), < L (reset), a batch
CALLS = [
    torch.arange(10)[None], torch.tensor([[10]]), torch.arange(40)[None], torch.tensor([[40]]),
    torch.tensor([[41]]), torch.arange(35)[None], torch.arange(32)[None], torch.arange(20)[None],
    torch.tensor([[20]]), torch.stack([torch.arange(6), torch.arange(30, 36)]),
]  # fmt: skip


def scaling_for(name: str, partial: float) -> dict:
    s = dict(SCALINGS[name])
    if name == "longrope":  # one factor per rotating pair
        n = int(D * partial) // 2
        s["short_factor"], s["long_factor"] = s["short_factor"][:n], s["long_factor"][:n]
    return s


def hf_rotary(scaling: dict, partial: float):
    """transformers' rotary module and apply function for the same parameters."""
    transformers = pytest.importorskip("transformers", minversion="5.0")
    from transformers.models.llama import modeling_llama
    from transformers.models.phi import modeling_phi
    from transformers.models.phi3 import modeling_phi3

    t = scaling["rope_type"]
    params = {k: v for k, v in scaling.items() if "max_position" not in k}
    params["rope_theta"] = 10000.0
    common = dict(hidden_size=D * H, num_attention_heads=H, rope_parameters=params)
    if t == "longrope":  # Phi-3: both lengths live on the config
        cfg = transformers.Phi3Config(
            **common, partial_rotary_factor=partial, original_max_position_embeddings=L,
            max_position_embeddings=scaling["max_position_embeddings"],
        )  # fmt: skip
        return modeling_phi3.Phi3RotaryEmbedding(cfg), modeling_phi3.apply_rotary_pos_emb
    if "original_max_position_embeddings" in scaling:
        params["original_max_position_embeddings"] = L
    # dynamic scales from max_position_embeddings; the others are told their target length
    max_len = L if t == "dynamic" else int(L * scaling["factor"])
    if partial != 1.0:  # Phi-1/2 (any rope type, partial rotary); Phi-3's apply splits q/k
        cfg = transformers.PhiConfig(
            **common, partial_rotary_factor=partial, max_position_embeddings=max_len
        )
        return modeling_phi.PhiRotaryEmbedding(cfg), modeling_phi3.apply_rotary_pos_emb
    cfg = transformers.LlamaConfig(**common, head_dim=D, max_position_embeddings=max_len)
    return modeling_llama.LlamaRotaryEmbedding(cfg), modeling_llama.apply_rotary_pos_emb


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("name", list(SCALINGS))
def test_parity_with_transformers(name, partial):
    scaling = scaling_for(name, partial)
    hf, hf_apply = hf_rotary(scaling, partial)
    ours = RotaryEmbedding(D, interleaved=False, scaling=scaling, partial_rotary_factor=partial)
    g = torch.Generator().manual_seed(0)
    for pos in CALLS:
        q, k = torch.randn(2, pos.shape[0], H, pos.shape[1], D, generator=g).unbind(0)
        hf_cos, hf_sin = hf(q, pos)  # [B, seq, rd], half layout, attention factor applied
        q1, k1 = ours(q, k, positions=pos)
        cos, sin = ours.cos_sin(pos)  # same seq_len: no second update
        torch.testing.assert_close(ours.inv_freq, hf.inv_freq)
        torch.testing.assert_close((cos, sin), (hf_cos, hf_sin))
        q2, k2 = hf_apply(q, k, hf_cos, hf_sin)
        torch.testing.assert_close((q1, k1), (q2, k2))
        q3 = apply_rope(q, hf_cos[:, None], hf_sin[:, None], interleaved=False)
        torch.testing.assert_close(q3, q2)
    assert ours.attention_factor == pytest.approx(hf.attention_scaling, rel=1e-7)


def test_dynamic_grows_keeps_and_resets_like_hf():
    rot = RotaryEmbedding(D, scaling=SCALINGS["dynamic"])
    original = rot.inv_freq.clone()
    seen = []
    for n in (10, 33, 40, 35, 32, 31, 50, 0):
        rot.cos_sin(torch.arange(n))
        seen.append(rot.freq_len)
    # grows with max(positions) + 1, keeps the longest down to L, resets below L; empty: no change
    assert seen == [L, 33, 40, 40, 40, L, 50, 50]
    rot.cos_sin(torch.arange(5))
    assert torch.equal(rot.inv_freq, original) and rot.cos_cached.shape[0] >= 5


def test_longrope_switches_at_the_original_length():
    rot = RotaryEmbedding(D, scaling=SCALINGS["longrope"])
    short = rot.inv_freq.clone()
    rot.cos_sin(torch.tensor([L]))  # seq_len L + 1: long factors
    long = rot.inv_freq.clone()
    assert (long[1:] < short[1:]).all()
    rot.cos_sin(torch.tensor([L - 1]))  # seq_len L: short again
    assert torch.equal(rot.inv_freq, short)


def rotated_scores(rot, q, k, n0):
    """Scores of the last query: full pass vs. prefill n0 tokens then decode one at a time,
    caching keys rotated when written (the usual KV cache) or caching them unrotated."""
    n = q.shape[-2]
    qf, kf = rot(q, k)
    full = qf[..., -1:, :] @ kf.mT  # [B, H, 1, n]
    _, cache = rot(q[..., :n0, :], k[..., :n0, :])
    for t in range(n0, n):
        qt, kt = rot(q[..., t : t + 1, :], k[..., t : t + 1, :], offset=t)
        cache = torch.cat([cache, kt], dim=-2)
    cos, sin = rot.cos_sin(torch.arange(n))  # the frequencies the last query was rotated with
    fresh = apply_rope(k, cos, sin, interleaved=rot.interleaved)  # re-rotate every key
    return full, qt @ cache.mT, qt @ fresh.mT


@pytest.mark.parametrize("name", ["dynamic", "longrope", "linear", "yarn", "llama3"])
def test_kv_cache_pitfall(name):
    torch.manual_seed(0)
    rot = RotaryEmbedding(D, interleaved=False, scaling=SCALINGS[name])
    q, k = torch.randn(2, 1, H, 2 * L, D).unbind(0)
    full, cached, fresh = rotated_scores(rot, q, k, n0=L - 8)
    torch.testing.assert_close(fresh, full)  # re-rotated keys: incremental == full pass
    if name in ("dynamic", "longrope"):
        # keys written while seq_len <= L carry the original frequencies, the last query the new
        # ones: q . k no longer depends on the offset alone
        assert (cached - full).abs().max() > 0.1
        torch.testing.assert_close(cached[..., -1], full[..., -1])  # written by this same step
    else:
        torch.testing.assert_close(cached, full)  # static: the cache is safe


def test_attention_factor_scales_norms():
    rot = RotaryEmbedding(D, scaling=SCALINGS["yarn"])
    assert rot.attention_factor == pytest.approx(0.1 * torch.tensor(4.0).log().item() + 1)
    q = torch.randn(1, H, 8, D)
    q1, _ = rot(q, q)
    torch.testing.assert_close(q1.norm(dim=-1), rot.attention_factor * q.norm(dim=-1))


@pytest.mark.parametrize("name", list(SCALINGS))
def test_interleaved_equals_half_after_permutation(name):
    inter = RotaryEmbedding(D, interleaved=True, scaling=SCALINGS[name])
    half = RotaryEmbedding(D, interleaved=False, scaling=SCALINGS[name])
    perm = rope_permutation(D)
    x = torch.randn(1, H, 3, D)
    for pos in (torch.arange(3), torch.tensor([38, 39, 40]), torch.tensor([5, 6, 7])):
        torch.testing.assert_close(inter(x, x, positions=pos)[0][..., perm],
                                   half(x[..., perm], x[..., perm], positions=pos)[0])  # fmt: skip


def test_partial_rotary_argument_or_key():
    a = RotaryEmbedding(D, scaling=SCALINGS["yarn"], partial_rotary_factor=0.5)
    b = RotaryEmbedding(D, scaling={**SCALINGS["yarn"], "partial_rotary_factor": 0.5})
    c = RotaryEmbedding(D, scaling={**SCALINGS["yarn"], "partial_rotary_factor": 0.5},
                        partial_rotary_factor=0.5)  # fmt: skip
    assert a.rotary_dim == b.rotary_dim == c.rotary_dim == D // 2
    x = torch.randn(1, H, 5, D)
    ya, yb = a(x, x)[0], b(x, x)[0]
    torch.testing.assert_close(ya, yb)
    torch.testing.assert_close(ya[..., D // 2 :], x[..., D // 2 :])  # the pass-through half
    assert SCALINGS["yarn"].get("partial_rotary_factor") is None  # the caller's dict is untouched


@pytest.mark.parametrize("name", list(SCALINGS))
def test_empty_positions(name):
    rot = RotaryEmbedding(D, scaling=SCALINGS[name])
    before = rot.inv_freq.clone()
    cos, sin = rot.cos_sin(torch.empty(2, 0, dtype=torch.long))
    assert cos.shape == sin.shape == (2, 0, D)
    q = torch.randn(1, H, 0, D)
    q1, k1 = rot(q, q)
    assert q1.shape == k1.shape == q.shape and torch.equal(rot.inv_freq, before)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"scaling": {"rope_type": "dynamic", "factr": 2.0, "max_position_embeddings": L}},
         ValueError, r"unknown key.*'factr'"),
        ({"scaling": {"rope_type": "dynamic", "factor": 2.0}}, ValueError,
         r"'max_position_embeddings'.*'dynamic'"),
        ({"scaling": {**SCALINGS["longrope"], "long_factor": [1.0] * 7}}, ValueError,
         r"long_factor.*length rotary_dim // 2 = 8"),
        ({"scaling": {"rope_type": "warp", "factor": 2.0}}, ValueError, r"rope_type.*'warp'"),
        ({"scaling": {**SCALINGS["yarn"], "partial_rotary_factor": 0.25},
          "partial_rotary_factor": 0.5}, ValueError, r"partial_rotary_factor.*disagree"),
        ({"partial_rotary_factor": 0.2}, ValueError, r"rotary_dim=3"),
        ({"scaling": [("rope_type", "linear")]}, TypeError, r"scaling must be None or a dict"),
        ({"scaling": {"rope_type": "linear", "factor": "2"}}, TypeError, r"'factor'.*real number"),
    ],
)  # fmt: skip
def test_bad_scaling_raises_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        RotaryEmbedding(D, **kwargs)
