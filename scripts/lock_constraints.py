"""Write constraints.txt: the exact version of every package that requirements.txt installs.

requirements.txt names what the book and the tests need, mostly as ranges; jupyter-book 1.x
then pulls whatever theme, Sphinx and myst release is newest inside its own ranges, so two builds
of one commit could look different (sphinx-book-theme 1.3.0 arrived that way). requirements.txt
therefore starts with ``-c constraints.txt``: every package it installs, directly or through
another, is pinned there to one version, and every install of a commit gets the same toolchain.
Dependabot moves the pins (.github/dependabot.yml), and this script rewrites them:

    python scripts/lock_constraints.py            # pin what the current environment has installed
    python scripts/lock_constraints.py --upgrade  # pip install --upgrade inside requirements.txt's
                                                  # ranges (the lock ignored), then pin that
    python scripts/lock_constraints.py --check    # exit 1 when the environment differs from it

It walks requirements.txt (and the extras of ``-e .[...]``) through the installed packages'
metadata, so the lock holds exactly the closure of what requirements.txt asks for, evaluated on
this platform and Python (CI's: Linux, Python 3.11). torch is left out: requirements.txt pins it,
and its wheels carry a platform tag in the version (``2.13.0+cpu``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements.txt"
CONSTRAINTS = ROOT / "constraints.txt"
SKIP = {"torch", "posenc", "pip", "setuptools", "wheel"}  # pinned elsewhere, or the tools
HEADER = """\
# The exact toolchain that requirements.txt installs (it starts with `-c constraints.txt`), so
# that every build of a commit uses the same Sphinx, theme and myst. Written by
# `python scripts/lock_constraints.py` (--upgrade to move everything inside requirements.txt's
# ranges); Dependabot moves the pins weekly. Do not edit by hand.
"""


def _top_level() -> list[tuple[str, set[str]]]:
    """(name, extras) of each requirement in requirements.txt; ``-e .[a,b]`` is posenc[a,b]."""
    out = []
    for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith(("-c", "--constraint", "-r", "--")):
            continue
        if line.startswith("-e"):
            extras = re.search(r"\[([^\]]*)\]", line)
            out.append(("posenc", set(extras.group(1).split(",")) if extras else set()))
            continue
        req = Requirement(line)
        out.append((req.name, set(req.extras)))
    return out


def closure() -> dict[str, str]:
    """Every installed distribution that requirements.txt pulls in: canonical name -> version."""
    pinned: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = _top_level()
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), frozenset(extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is not installed: pip install -r requirements.txt first") from None
        if key[0] not in SKIP:
            pinned[key[0]] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            wanted = req.marker is None or any(
                req.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            )
            if wanted:
                todo.append((req.name, set(req.extras)))
    return pinned


def render(pinned: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pinned.items()))


def upgrade() -> None:
    """pip install --upgrade -r requirements.txt without its ``-c constraints.txt`` line."""
    lines = [line for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines()
             if not line.strip().startswith(("-c", "--constraint"))]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=ROOT, delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--upgrade", "-r", f.name],
                       cwd=ROOT, check=True)
    finally:
        Path(f.name).unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 when the environment differs")
    group.add_argument("--upgrade", action="store_true", help="upgrade inside the ranges first")
    args = parser.parse_args(argv)
    if args.upgrade:
        upgrade()
    text = render(closure())
    if args.check:
        current = CONSTRAINTS.read_text(encoding="utf-8") if CONSTRAINTS.exists() else ""
        if current != text:
            old = {line for line in current.splitlines() if "==" in line}
            new = {line for line in text.splitlines() if "==" in line}
            print("constraints.txt differs from this environment:", file=sys.stderr)
            for line in sorted(old - new):
                print(f"  - {line}", file=sys.stderr)
            for line in sorted(new - old):
                print(f"  + {line}", file=sys.stderr)
            return 1
        print("constraints.txt matches the environment")
        return 0
    CONSTRAINTS.write_text(text, encoding="utf-8")
    print(f"wrote {CONSTRAINTS.relative_to(ROOT)}: {text.count('==')} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
