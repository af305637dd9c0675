"""Masks a practitioner hands a model switched by ``posenc.hf.use`` that ran silently wrong or
failed obscurely (practitioner reading 2, items s33-s35, s96, o94, o97, o65): each is now
refused or warned with the fix, and the correct calls beside them still run.

Models are tiny transformers Llamas built from a config (test_hf_adapter's helpers).
"""

from __future__ import annotations

import pytest
import torch

import posenc

# --------------------------------------------------------------------------- o65: static reuse


def test_o65_a_full_static_cache_names_reset_too():
    layer = posenc.MultiHeadAttention(64, 4, scheme="alibi").eval()
    x = torch.randn(2, 8, 64)
    cache = posenc.KVCache(max_len=8)
    with torch.no_grad():
        layer(x, cache=cache)
        with pytest.raises(ValueError, match=r"holds 8 tokens and cannot take 1 more.*"
                           r"cache.reset\(\).*make max_len larger"):
            layer(x[:, :1], cache=cache)
        cache.reset()
        layer(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match="make max_len larger") as info:  # nothing held: no reset
        layer(x[:, :4], cache=posenc.KVCache(max_len=3))
    assert "reset" not in str(info.value)
