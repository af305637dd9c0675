"""book/api.md documents every public name of ``posenc`` and ``posenc.lab``.

The page is autodoc: a name is documented when an ``automodule`` of the module that defines it
lists it (all members, or named in ``:members:``) or an explicit directive (``autofunction``,
``autoclass``, ``autodata``, ...) names it. autodoc only shows a module-level constant that has
a docstring, so data names must have one; its first line must not read ``text: more``, which
napoleon would render as a type called ``text``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
from pathlib import Path

import pytest

import posenc
import posenc.lab

sphinx_pycode = pytest.importorskip("sphinx.pycode")

PAGE = Path(__file__).resolve().parents[1] / "book" / "api.md"
LIBRARY = "## posenc (the library)"
LAB = "## posenc.lab (the book's laboratory)"
DIRECTIVE = re.compile(r"^\.\. (auto\w+|py:module|currentmodule|py:currentmodule):: (\S+)\s*$")
OPTION = re.compile(r"^\s+:([\w-]+):\s*(.*)$")


def parse_page(text: str) -> list[dict]:
    """Every autodoc directive of the page's ``eval-rst`` blocks, with its options and part."""
    found, part = [], None
    for line in text.splitlines():
        if line.startswith("## "):
            part = line.strip()
        m = DIRECTIVE.match(line)
        if m:
            found.append({"kind": m[1], "target": m[2], "options": {}, "part": part})
            continue
        m = OPTION.match(line)
        if m and found:
            found[-1]["options"][m[1]] = m[2].strip()
    return found


def _names(option: str | None) -> set[str] | None:
    return None if not option else {n.strip() for n in option.split(",") if n.strip()}


def defining_module(package: types.ModuleType, name: str) -> str:
    """The module whose source defines ``name``: ``__module__`` of a class or function, or the
    module that assigns a constant at top level (a module object: its own name)."""
    obj = getattr(package, name)
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if inspect.isclass(obj) or inspect.isfunction(obj):
        return obj.__module__
    for mod in list(vars(package).values()) + [package]:
        if not isinstance(mod, types.ModuleType) or getattr(mod, name, None) is not obj:
            continue
        tree = ast.parse(inspect.getsource(mod))
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else []
            )
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return mod.__name__
    raise AssertionError(f"cannot find where {package.__name__}.{name} is defined")


def documented_by(directives: list[dict], module: str, name: str, package: str) -> dict | None:
    """The directive that puts ``module.name`` on the page, or None."""
    for d in directives:
        if d["kind"] == "automodule" and d["target"] == module:
            if name == module.rsplit(".", 1)[-1] and module == f"{package}.{name}":
                return d  # a public submodule (posenc.lab.plot): its automodule documents it
            members = d["options"].get("members", "")
            excluded = _names(d["options"].get("exclude-members")) or set()
            listed = _names(members)
            if "members" in d["options"] and (listed is None or name in listed) and name not in excluded:
                return d
        elif d["kind"].startswith("auto") and d["target"] in (f"{module}.{name}", f"{package}.{name}"):
            return d
    return None


def public_names() -> list[tuple[types.ModuleType, str]]:
    return [(posenc, n) for n in posenc.__all__] + [(posenc.lab, n) for n in posenc.lab.__all__]


DIRECTIVES = parse_page(PAGE.read_text(encoding="utf-8"))


def test_page_has_both_parts_in_order():
    text = PAGE.read_text(encoding="utf-8")
    assert LIBRARY in text and LAB in text
    assert text.index(LIBRARY) < text.index(LAB)


def test_parser_reads_the_page():
    # a guard against a parser that silently finds nothing
    kinds = {d["kind"] for d in DIRECTIVES}
    assert {"automodule", "autoclass", "autofunction"} <= kinds
    assert len(DIRECTIVES) > 20


@pytest.mark.parametrize(("package", "name"), public_names(), ids=lambda x: getattr(x, "__name__", x))
def test_public_name_is_documented(package, name):
    module = defining_module(package, name)
    d = documented_by(DIRECTIVES, module, name, package.__name__)
    assert d is not None, (
        f"{package.__name__}.{name} (defined in {module}) is not on book/api.md: add "
        f"'.. automodule:: {module}' with ':members:', or an explicit directive"
    )
    part = LAB if package is posenc.lab else LIBRARY
    assert d["part"] == part, f"{package.__name__}.{name} is documented under {d['part']!r}, not {part!r}"


@pytest.mark.parametrize(("package", "name"), public_names(), ids=lambda x: getattr(x, "__name__", x))
def test_public_name_has_a_docstring(package, name):
    obj = getattr(package, name)
    module = defining_module(package, name)
    if isinstance(obj, types.ModuleType) or inspect.isclass(obj) or inspect.isfunction(obj):
        assert (obj.__doc__ or "").strip(), f"{package.__name__}.{name} has no docstring"
        return
    # a constant: autodoc shows it only with a docstring (or #: comment) after the assignment
    docs = sphinx_pycode.ModuleAnalyzer.for_module(module).find_attr_docs()
    lines = docs.get(("", name))
    assert lines and "".join(lines).strip(), f"{module}.{name} has no docstring after its assignment"
    first = re.sub(r"``.*?``|`.*?`", "", lines[0])
    assert ": " not in first, (
        f"the first line of {module}.{name}'s docstring has ': ', which napoleon reads as "
        f"'type: description': {lines[0]!r}"
    )


def test_from_hf_config_is_documented():
    # a classmethod of RotaryEmbedding, on the page through posenc.rope's automodule
    assert documented_by(DIRECTIVES, "posenc.rope", "RotaryEmbedding", "posenc")
    assert (posenc.RotaryEmbedding.from_hf_config.__doc__ or "").strip()
    assert documented_by(DIRECTIVES, "posenc.hf", "rotary_kwargs_from_hf_config", "posenc")


def test_every_directive_target_imports():
    for d in DIRECTIVES:
        if d["kind"] in ("automodule", "py:module", "currentmodule", "py:currentmodule"):
            importlib.import_module(d["target"])
            continue
        module, _, attr = d["target"].rpartition(".")
        assert hasattr(importlib.import_module(module), attr), f"{d['target']} does not exist"


@pytest.mark.parametrize(
    "cls",
    [
        posenc.SinusoidalPositionalEmbedding,
        posenc.LearnedPositionalEmbedding,
        posenc.RotaryEmbedding,
        posenc.T5RelativeBias,
        posenc.MultiHeadAttention,
        posenc.lab.TransformerLM,
    ],
    ids=lambda c: c.__name__,
)
def test_forward_has_its_own_docstring(cls):
    # without one, autodoc shows torch's "Define the computation performed at every call"
    doc = cls.__dict__["forward"].__doc__ or ""
    assert "Raises" in doc and "[" in doc, f"{cls.__name__}.forward needs shapes and a Raises section"


def test_parser_catches_a_missing_name():
    page = """## posenc (the library)

```{eval-rst}
.. automodule:: posenc.rope
   :members: apply_rope
```
"""
    ds = parse_page(page)
    assert documented_by(ds, "posenc.rope", "apply_rope", "posenc")
    assert documented_by(ds, "posenc.rope", "rope_cos_sin", "posenc") is None
    assert documented_by(ds, "posenc.alibi", "alibi_slopes", "posenc") is None
