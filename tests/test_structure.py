"""The library's structure and budgets (issue 33, review 2026-12-07-architecture §3.10): read
from the AST of ``posenc/`` (``posenc/lab/`` excluded: tests/test_lab_imports.py has its rules).

- no import cycle among posenc modules, lazy (in a function) and ``TYPE_CHECKING`` imports
  counted;
- no posenc import inside a function or under ``TYPE_CHECKING``;
- layers per DESIGN (ground < encodings < attention < integrations < package): a module never
  imports a higher layer; every module is in ``LAYERS`` (a new module is added there);
- no module over 500 lines; no function body over 60 lines (its docstring not counted); no
  function over 8 parameters (``self``/``cls`` not counted; public signatures fixed by DESIGN
  or transformers are allowlisted for good);
- every module imports alone in a fresh interpreter.

Today's violations are in ``ALLOWLIST``; an entry that no longer occurs fails the test too, so
the list only shrinks: delete the entry in the commit that fixes it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "posenc"

MAX_MODULE_LINES = 500
MAX_BODY_LINES = 60
MAX_PARAMS = 8

GROUND, ENCODINGS, ATTENTION, INTEGRATIONS, PACKAGE = range(5)
LAYER_NAMES = ["ground", "encodings", "attention", "integrations", "package"]
LAYERS = {  # module -> layer; a module missing here fails test_every_module_has_a_layer
    "posenc": PACKAGE, "posenc.__main__": PACKAGE,
    "posenc._checks": GROUND, "posenc.device": GROUND, "posenc.positions": GROUND,
    "posenc.masks": GROUND, "posenc.cache": GROUND, "posenc.rolling_cache": GROUND,
    "posenc.cache_slots": GROUND,
    "posenc.sinusoidal": ENCODINGS, "posenc.learned": ENCODINGS, "posenc.rope": ENCODINGS,
    "posenc.rope_angles": ENCODINGS, "posenc.rope_layout": ENCODINGS,
    "posenc.rope_tables": ENCODINGS, "posenc.rope_kernels": ENCODINGS,
    "posenc.rope_scaling": ENCODINGS, "posenc.rope_config": ENCODINGS,
    "posenc.alibi": ENCODINGS, "posenc.t5": ENCODINGS, "posenc.mrope": ENCODINGS,
    "posenc.axial": ENCODINGS, "posenc.temperature": ENCODINGS, "posenc.explain": ENCODINGS,
    "posenc.explain_render": ENCODINGS, "posenc.explain_issues": ENCODINGS,
    "posenc.rope_families": ENCODINGS,
    "posenc.schemes": ATTENTION, "posenc.backends": ATTENTION, "posenc.varlen": ATTENTION,
    "posenc.attend_inputs": ATTENTION, "posenc.attention": ATTENTION, "posenc.mla": ATTENTION,
    "posenc.hf": INTEGRATIONS, "posenc.hf.*": INTEGRATIONS,
}

_REDESIGN = "issue 33: to be removed by the redesign"
_PUBLIC = "permanent: a public signature fixed by DESIGN/transformers (the rule is for private)"
ALLOWLIST: dict[str, str] = {  # "rule: subject" -> reason
    'parameters: posenc.attention.MultiHeadAttention.__init__': _PUBLIC,
    'parameters: posenc.attention.attend': _PUBLIC,
    'parameters: posenc.hf.forward.attention_forward': _PUBLIC,
    'parameters: posenc.hf.forward.positions_mask': _PUBLIC,
    'parameters: posenc.varlen.attend_varlen': _PUBLIC,
}


# ------------------------------------------------------------------------------ reading


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[:2] == ["posenc", "lab"]:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def layer(module: str) -> int | None:
    if module in LAYERS:
        return LAYERS[module]
    parent = module.rsplit(".", 1)[0]
    return LAYERS.get(parent + ".*")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The posenc modules an import statement loads (a ``from pkg import sub`` loads sub)."""
    is_pkg = MODULES[module].name == "__init__.py"
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "posenc"]
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        name = ".".join(base + ([node.module] if node.module else []))
    else:
        name = node.module or ""
    if name.split(".")[0] != "posenc":
        return []
    out = [name] if node.level and not node.module else []  # ``from . import x`` loads the package
    for alias in node.names:
        sub = f"{name}.{alias.name}"
        out.append(sub if sub in MODULES else name)
    return out


def imports(module: str) -> list[tuple[str, str, int]]:
    """(target, where, line): where is "top", "function" or "TYPE_CHECKING"."""
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            here = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                here = "function"
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_one(stmt, "TYPE_CHECKING" if where == "top" else where)
                for stmt in child.orelse:
                    visit_one(stmt, where)
                continue
            visit_one(child, here)

    def visit_one(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.extend((t, where, node.lineno) for t in _targets(module, node))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            where = "function"
        visit(node, where)

    visit(TREES[module], "top")
    return found


def functions(module: str):
    """(qualified name, node, is_method) of every function, nested ones too."""
    out = []

    def walk(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((prefix + child.name, child, in_class))
                walk(child, f"{prefix}{child.name}.", False)
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.", True)
            else:
                walk(child, prefix, in_class)

    walk(TREES[module], "", False)
    return out


# --------------------------------------------------------------------------- violations


def _cycles() -> dict[str, str]:
    graph = {m: sorted({t for t, _, _ in imports(m) if t in MODULES and t != m})
             for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return {f"cycle: {' <-> '.join(c)}": "these modules import one another (lazy and "
            "TYPE_CHECKING imports counted)" for c in sccs}


def violations() -> dict[str, str]:
    """Every violation today: "rule: subject" -> the details."""
    out = _cycles()
    for m in MODULES:
        for target, where, line in imports(m):
            if where != "top":
                how = "inside a function" if where == "function" else "under TYPE_CHECKING"
                out[f"lazy import: {m} -> {target}"] = f"{m} line {line} imports {target} {how}"
            lo, hi = layer(m), layer(target)
            if lo is not None and hi is not None and hi > lo:
                out[f"layer: {m} -> {target}"] = (
                    f"{m} ({LAYER_NAMES[lo]}) imports {target} ({LAYER_NAMES[hi]}), a higher layer "
                    f"(line {line})")
        n = len(MODULES[m].read_text().splitlines())
        if n > MAX_MODULE_LINES:
            out[f"module lines: {m}"] = f"{m} has {n} lines > {MAX_MODULE_LINES}"
        for qual, fn, is_method in functions(m):
            body = fn.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str) and len(body) > 1):
                body = body[1:]
            lines = body[-1].end_lineno - body[0].lineno + 1
            if lines > MAX_BODY_LINES:
                out[f"body lines: {m}.{qual}"] = (
                    f"{m}.{qual} has a {lines}-line body > {MAX_BODY_LINES} (docstring excluded)")
            a = fn.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            if is_method and params and params[0].arg in ("self", "cls"):
                params = params[1:]
            count = len(params) + (a.vararg is not None) + (a.kwarg is not None)
            if count > MAX_PARAMS:
                out[f"parameters: {m}.{qual}"] = (
                    f"{m}.{qual} takes {count} parameters > {MAX_PARAMS}")
    return out


# -------------------------------------------------------------------------------- tests


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if layer(m) is None]
    assert not missing, (
        f"modules without a layer: {missing}; add each to LAYERS in tests/test_structure.py "
        "(ground, encodings, attention, integrations) as DESIGN places it")


def test_no_violation_beyond_the_allowlist():
    found = violations()
    new = {k: v for k, v in found.items() if k not in ALLOWLIST}
    assert not new, "structure violations (fix them; the allowlist only shrinks):\n" + "\n".join(
        f"  {k}: {v}" for k, v in sorted(new.items()))


def test_allowlist_has_no_stale_entries():
    found = violations()
    stale = sorted(k for k in ALLOWLIST if k not in found)
    assert not stale, ("allowlisted violations that no longer occur: delete them from ALLOWLIST "
                       "in tests/test_structure.py:\n" + "\n".join(f"  {k}" for k in stale))


_ALONE = """
import importlib, os, sys, traceback
import torch  # noqa: F401 - loaded once; each module is then imported in a forked child
failed = 0
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            print(f"{name}: " + traceback.format_exc(limit=-3), flush=True)
            os._exit(1)
        os._exit(0)
    failed |= os.waitpid(pid, 0)[1] != 0
sys.exit(failed)
"""


def test_every_module_imports_alone():
    """Each module alone, in a fresh interpreter as far as posenc goes (one interpreter loads
    torch, then a forked child imports each module: no posenc module is loaded before it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _ALONE, *sorted(MODULES)], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, f"modules that fail to import alone:\n{r.stdout}{r.stderr[-2000:]}"
