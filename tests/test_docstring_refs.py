"""Every cross-reference in a docstring the API page renders points at an object the page documents.

Sphinx resolves ``:class:`Name``` in a docstring of module ``m`` (class ``C``) as ``Name``,
``m.Name`` or ``m.C.Name``, among the objects the page documents -- not among the names ``m``
merely imports. A reference that resolves nowhere is a warning, and the nitpicky site build (-W -n)
fails on it; this test finds it in a second instead of at the end of a CI run.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

API = Path(__file__).resolve().parents[1] / "book" / "api.md"
DIRECTIVE = re.compile(r"^\.\. (automodule|autoclass|autofunction|autodata):: (\S+)\n((?:   :.*\n)*)", re.M)
ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|data|exc|obj|mod):`~?\.?([\w.]+)`")
EXTERNAL = ("torch.", "typing.", "collections.", "pathlib.", "dataclasses.")
BUILTINS = {"int", "float", "str", "bool", "list", "tuple", "dict", "None", "ValueError", "TypeError"}


def _members(obj: object, option: str | None) -> list[str]:
    """The public members autodoc shows: those defined by ``obj`` (or the ``:members:`` list)."""
    if option:
        return [name.strip() for name in option.split(",")]
    if inspect.ismodule(obj):
        return [n for n, v in vars(obj).items() if not n.startswith("_")
                and getattr(v, "__module__", obj.__name__) == obj.__name__ and not inspect.ismodule(v)]
    return [n for n in vars(obj) if not n.startswith("_")]


def _documented() -> tuple[set[str], list[tuple[str, str | None, str]]]:
    """The page's documented names, and (module, class, docstring) for every rendered docstring."""
    names: set[str] = set()
    docs: list[tuple[str, str | None, str]] = []

    def add(qualname: str, obj: object, module: str, cls: str | None) -> None:
        names.add(qualname)
        if inspect.isclass(obj):  # a class's own docstring is read inside the class
            cls = qualname.rpartition(".")[2]
        docs.append((module, cls, inspect.getdoc(obj) or ""))

    for kind, target, options in DIRECTIVE.findall(API.read_text(encoding="utf-8")):
        members_option = re.search(r":members:(.*)", options)
        if kind == "automodule":
            module = importlib.import_module(target)
            names.add(target)
            docs.append((target, None, module.__doc__ or ""))
            for name in _members(module, members_option and members_option.group(1).strip()):
                obj = getattr(module, name)
                add(f"{target}.{name}", obj, target, None)
                if inspect.isclass(obj):
                    for attr in _members(obj, None):
                        add(f"{target}.{name}.{attr}", getattr(obj, attr), target, name)
        else:
            module_name, _, name = target.rpartition(".")
            obj = getattr(importlib.import_module(module_name), name)
            add(target, obj, module_name, None)
            if kind == "autoclass" and members_option:
                for attr in _members(obj, members_option.group(1).strip()):
                    add(f"{target}.{attr}", getattr(obj, attr), module_name, name)
    return names, docs


def unresolved() -> list[str]:
    names, docs = _documented()
    bad = []
    for module, cls, doc in docs:
        for _, target in ROLE.findall(doc):
            if target in BUILTINS or target.startswith(EXTERNAL):
                continue
            candidates = [target, f"{module}.{target}"] + ([f"{module}.{cls}.{target}"] if cls else [])
            if not any(c in names for c in candidates):
                bad.append(f"{module}{'.' + cls if cls else ''}: {target!r}")
    return sorted(set(bad))


def test_every_reference_resolves():
    assert not unresolved(), "qualify these (e.g. :class:`~posenc.lab.config.TrainConfig`)"


def test_an_imported_name_is_not_enough(monkeypatch):
    """The failure this test exists for: a bare name the module imports but does not define."""
    from posenc.lab import train

    doc = train.make_optimizer.__doc__
    monkeypatch.setattr(train.make_optimizer, "__doc__", doc + "\n\nSee :class:`TrainConfig`.")
    assert "posenc.lab.train: 'TrainConfig'" in unresolved()

