"""Attention reads no field of the KV cache, only its protocol (issue 33; architecture review
§3.3): in the modules that attend, every attribute of a variable named ``cache`` is one of
``PROTOCOL``, and ``getattr``/``vars`` never take a ``cache``. The storage kinds behind
``KVCache`` (growing, static, rolling) may then change without touching attention."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from posenc.cache import KVCache

PKG = Path(__file__).resolve().parents[1] / "posenc"
ATTENDING = ("attention.py", "attend_inputs.py", "backends.py", "varlen.py")
PROTOCOL = frozenset({
    "imposed_rule", "next_positions", "mask_columns", "held_document_ids", "append",
    "positions_are_slots", "holds_storage", "reached", "holds_evicted",
    "claim", "check_claim",  # which layer writes the cache (MultiHeadAttention)
})


def cache_reads(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each read of a ``cache`` variable beyond the protocol."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "cache" and node.attr not in PROTOCOL):
            found.append((node.lineno, f"cache.{node.attr}"))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "vars", "setattr") and node.args
                and isinstance(node.args[0], ast.Name) and node.args[0].id == "cache"):
            found.append((node.lineno, f"{node.func.id}(cache, ...)"))
    return found


@pytest.mark.parametrize("name", ATTENDING)
def test_attention_reads_only_the_cache_protocol(name):
    found = cache_reads((PKG / name).read_text())
    assert not found, f"posenc/{name} reads cache fields beyond the protocol: {found}"


def test_the_protocol_is_the_caches():
    for attr in PROTOCOL:
        assert hasattr(KVCache, attr), attr


def test_a_field_read_is_found():
    src = "def f(cache):\n    n = cache.filled\n    return getattr(cache, 'k'), cache.append\n"
    assert cache_reads(src) == [(2, "cache.filled"), (3, "getattr(cache, ...)")]
