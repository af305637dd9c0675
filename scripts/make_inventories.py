#!/usr/bin/env python
"""Write the small intersphinx inventories the API page links through: ``book/_inv/*.inv``.

The site builds offline, so ``_config.yml`` points ``intersphinx_mapping`` at these local files
instead of downloading ``objects.inv`` from docs.python.org and docs.pytorch.org. Each file is a
valid Sphinx inventory (version 2, zlib-compressed) listing the objects the API page refers to,
with their real addresses on those sites. Private paths that autodoc writes for a public class
(``torch.nn.modules.module.Module`` for ``torch.nn.Module``) point at the public page.

Usage::

    python scripts/make_inventories.py           # rewrite book/_inv/python.inv and torch.inv
    python scripts/make_inventories.py --check   # exit 1 if the files are out of date

To link a new object: add it to :data:`PYTHON` or :data:`TORCH` below and rerun.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "_inv"

# (name, role, uri relative to the site's base); a uri ending in "#$" means "#" + name, as Sphinx
# writes it
Entry = tuple[str, str, str]

_ABC = [
    "Callable", "Collection", "Container", "Generator", "Hashable", "Iterable", "Iterator",
    "Mapping", "MutableMapping", "MutableSequence", "MutableSet", "Sequence", "Set", "Sized",
]  # fmt: skip
_TYPING_DATA = ["Any", "Callable", "ClassVar", "Final", "Literal", "Optional", "Union"]
_TYPING_CLASS = ["Generic", "NamedTuple", "Protocol", "TypedDict", "TypeVar"]
_BUILTINS = ["bool", "float", "int", "object", "slice", "type"]  # documented in functions.html
_STDTYPES = ["bytes", "dict", "list", "set", "str", "tuple"]  # documented in stdtypes.html

PYTHON: list[Entry] = (
    [(f"collections.abc.{n}", "py:class", "library/collections.abc.html#$") for n in _ABC]
    + [(f"typing.{n}", "py:data", "library/typing.html#$") for n in _TYPING_DATA]
    + [(f"typing.{n}", "py:class", "library/typing.html#$") for n in _TYPING_CLASS]
    + [(n, "py:class", "library/functions.html#$") for n in _BUILTINS]
    + [(n, "py:class", "library/stdtypes.html#$") for n in _STDTYPES]
    + [(n, "py:exception", "library/exceptions.html#$") for n in ("ValueError", "TypeError", "KeyError")]
    + [
        ("None", "py:data", "library/constants.html#$"),
        ("pathlib.Path", "py:class", "library/pathlib.html#$"),
        ("pathlib.PurePath", "py:class", "library/pathlib.html#$"),
        ("os.PathLike", "py:class", "library/os.html#$"),
        ("dataclasses.dataclass", "py:function", "library/dataclasses.html#$"),
        ("collections.OrderedDict", "py:class", "library/collections.html#$"),
        ("argparse.ArgumentParser", "py:class", "library/argparse.html#$"),
        ("argparse.Namespace", "py:class", "library/argparse.html#$"),
    ]
)

_NN = {  # public class -> (page, private module path autodoc may write)
    "Module": ("generated/torch.nn.Module.html", "torch.nn.modules.module.Module"),
    "ModuleList": ("generated/torch.nn.ModuleList.html", "torch.nn.modules.container.ModuleList"),
    "Embedding": ("generated/torch.nn.Embedding.html", "torch.nn.modules.sparse.Embedding"),
    "Linear": ("generated/torch.nn.Linear.html", "torch.nn.modules.linear.Linear"),
    "Dropout": ("generated/torch.nn.Dropout.html", "torch.nn.modules.dropout.Dropout"),
    "LayerNorm": ("generated/torch.nn.LayerNorm.html", "torch.nn.modules.normalization.LayerNorm"),
    "RMSNorm": ("generated/torch.nn.RMSNorm.html", "torch.nn.modules.normalization.RMSNorm"),
}
_FLEX = "nn.attention.flex_attention.html#torch.nn.attention.flex_attention."

TORCH: list[Entry] = [
    ("torch.Tensor", "py:class", "tensors.html#$"),
    ("torch.dtype", "py:class", "tensor_attributes.html#$"),
    ("torch.device", "py:class", "tensor_attributes.html#$"),
    ("torch.Size", "py:class", "size.html#$"),
    ("torch.Generator", "py:class", "generated/torch.Generator.html#$"),
    ("torch._C.Generator", "py:class", "generated/torch.Generator.html#torch.Generator"),
    ("torch.optim.Optimizer", "py:class", "optim.html#$"),
    ("torch.optim.optimizer.Optimizer", "py:class", "optim.html#torch.optim.Optimizer"),
    (
        "torch.nn.Parameter",
        "py:class",
        "generated/torch.nn.parameter.Parameter.html#torch.nn.parameter.Parameter",
    ),
    ("torch.nn.parameter.Parameter", "py:class", "generated/torch.nn.parameter.Parameter.html#$"),
    ("torch.nn.attention.flex_attention.BlockMask", "py:class", _FLEX + "BlockMask"),
    ("torch.nn.attention.flex_attention.flex_attention", "py:function", _FLEX + "flex_attention"),
    ("torch.nn.attention.flex_attention.create_block_mask", "py:function", _FLEX + "create_block_mask"),
    (
        "torch.nn.functional.scaled_dot_product_attention",
        "py:function",
        "generated/torch.nn.functional.scaled_dot_product_attention.html#$",
    ),
    ("torch.compile", "py:function", "generated/torch.compile.html#$"),
    ("torch.manual_seed", "py:function", "generated/torch.manual_seed.html#$"),
    ("torch.testing.assert_close", "py:function", "testing.html#$"),
    ("torch.finfo", "py:class", "type_info.html#$"),
] + [
    entry
    for name, (page, private) in _NN.items()
    for entry in (
        (f"torch.nn.{name}", "py:class", page + "#$"),
        (private, "py:class", f"{page}#torch.nn.{name}"),
    )
]

INVENTORIES = {
    "python.inv": ("Python", "3", PYTHON),
    "torch.inv": ("PyTorch", "stable", TORCH),
}


def render(project: str, version: str, entries: list[Entry]) -> bytes:
    """A Sphinx inventory, version 2: four header lines, then zlib-compressed entries
    ``name domain:role priority uri dispname`` (``-`` as dispname: same as the name)."""
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n"
        f"# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    ).encode()
    lines = "".join(f"{name} {role} 1 {uri} -\n" for name, role, uri in sorted(set(entries)))
    return header + zlib.compress(lines.encode(), 9)


def _plain(data: bytes) -> bytes:
    """Header and decompressed entries: compressed bytes may differ between zlib builds."""
    head = data.split(b"\n", 4)
    return b"\n".join(head[:4]) + b"\n" + zlib.decompress(head[4])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    parser.add_argument("--out", type=Path, default=OUT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stale = []
    for filename, (project, version, entries) in INVENTORIES.items():
        path = args.out / filename
        data = render(project, version, entries)
        if path.exists() and _plain(path.read_bytes()) == _plain(data):
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        print(f"{'stale' if args.check else 'wrote'}: {path} ({len(set(entries))} objects)")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
