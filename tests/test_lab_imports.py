"""The lab's modules import one way: no import cycle, and each imports alone in a fresh interpreter;
and each stays within the lab's budget of 600 lines (DESIGN.md), split by concern past it.

train.py, long_context.py and evaluate.py once imported each other (train <-> long_context <->
evaluate); what they share now lives in posenc/lab/config.py and cache.py. The graph below counts
every import of a lab module, at module level, inside a function or under ``TYPE_CHECKING`` alike:
a lazy import is still a cycle, only hidden.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parent.parent / "posenc" / "lab"


def _module_name(path: Path) -> str:
    parts = path.relative_to(LAB.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(LAB.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """The lab modules that ``name`` imports (resolved, ``from . import x`` included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names)  # submodules
    # a module's own package __init__ is imported first anyway: not an edge of the cycle check
    return {m for m in found if m in MODULES and m != name and not name.startswith(m + ".")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_the_imports():
    # the walk resolves relative imports: the known edges are there
    assert "posenc.lab.config" in GRAPH["posenc.lab.train"]
    assert {"posenc.lab.train", "posenc.lab.evaluate"} <= GRAPH["posenc.lab.long_context"]
    assert "posenc.lab.config" in GRAPH["posenc.lab.evaluate"]


def test_no_import_cycle_in_the_lab():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle():
    GRAPH["posenc.lab.cache"].add("posenc.lab.train")  # train -> config -> cache -> train
    try:
        assert _cycle() is not None
    finally:
        GRAPH["posenc.lab.cache"].discard("posenc.lab.train")


@pytest.mark.parametrize("name", ["posenc.lab.cache", "posenc.lab.config", "posenc.lab.train",
                                  "posenc.lab.evaluate", "posenc.lab.long_context",
                                  "posenc.lab.experiment", "posenc.lab.explore",
                                  "posenc.lab.serving"])
def test_each_module_imports_alone(name):
    # a fresh interpreter, this module first: what a cycle breaks is the import order
    done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


LINE_BUDGET = 600  # DESIGN.md: posenc/lab/ modules at most 600 lines


def _over_budget(sources: dict[str, str], budget: int = LINE_BUDGET) -> list[str]:
    """``"module (N lines)"`` for each module of ``sources`` (name -> text) longer than ``budget``."""
    lengths = {name: len(text.splitlines()) for name, text in sources.items()}
    return [f"{name} ({n} lines)" for name, n in sorted(lengths.items()) if n > budget]


def test_no_lab_module_over_the_line_budget():
    over = _over_budget({name: path.read_text(encoding="utf-8") for name, path in MODULES.items()})
    assert not over, (f"posenc/lab modules over {LINE_BUDGET} lines; split them by concern "
                      f"(re-export the public names where they were): {', '.join(over)}")


def test_the_budget_check_names_a_long_module():
    assert _over_budget({"posenc.lab.a": "x\n" * 601, "posenc.lab.b": "x\n" * 600}) == [
        "posenc.lab.a (601 lines)"]


# the split of issue 33: explore.py and serving.py re-export what their concern modules define
REEXPORTED = {
    "posenc.lab.explore": ["Frame", "Explorable", "explorable", "heatmap", "frame_data",
                           "power_label", "plotlyjs_url", "plotlyjs_version", "plotlyjs_file",
                           "PLOTLYJS_ENV", "setup", "dedupe_scripts", "speculative_tree",
                           "tree_value", "FONT", "COLORS"],
    "posenc.lab.serving": ["PagedKVCache", "paged_attend", "shift_rotated_keys",
                           "kvcache_step_reference", "partial_attention", "merge_partials",
                           "attend_sharded", "ShardedAttention", "rebase_cache",
                           "tree_positions_and_mask", "LAYOUT"],
}


@pytest.mark.parametrize("name", sorted(REEXPORTED))
def test_split_modules_keep_their_public_names(name):
    module = importlib.import_module(name)
    missing = [n for n in REEXPORTED[name] if not hasattr(module, n)]
    assert not missing, f"{name} no longer exports {missing}"
    for n in REEXPORTED[name]:
        obj = getattr(module, n)
        home = getattr(obj, "__module__", None)
        if home and home != name and home.startswith("posenc.lab."):  # the same object
            assert getattr(importlib.import_module(home), n) is obj
