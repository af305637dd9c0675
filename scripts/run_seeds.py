"""Run a chapter notebook with other seeds, to check that its assertions hold for them.

The chapters train seed 0 (``SEED = 0`` in their first code cell) and say in their comments which
seeds each assertion was measured on. This script executes a notebook once per seed with that line
changed, plus any ``OLD=>NEW`` replacements in the code (to try a smaller training run, say), and
prints PASS or the failing cell and its error. Trained models go to ``$POSENC_CACHE`` as usual:
point it at a fresh folder when the change alters what is trained.

    POSENC_CACHE=/tmp/seeds python scripts/run_seeds.py book/06_side_by_side.ipynb 0 1 2
    python scripts/run_seeds.py book/08_long_context_practice.ipynb 1 --sub "steps=800,=>steps=600,"
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def with_seed(nb: nbformat.NotebookNode, seed: int, subs: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A copy of ``nb`` with ``SEED = <seed>`` and the replacements applied to its code cells."""
    nb = nbformat.from_dict(nb)
    found = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.source, n = re.subn(r"^SEED = \d+", f"SEED = {seed}", cell.source, flags=re.M)
        found = found or n > 0
        for old, new in subs:
            cell.source = cell.source.replace(old, new)
    if not found:
        raise ValueError("the notebook has no line 'SEED = <int>' in a code cell")
    return nb


def run(path: Path, seed: int, subs: list[tuple[str, str]], out: Path | None = None) -> bool:
    """Execute ``path`` with ``seed``; print PASS or FAIL with the error; True when it passed."""
    nb = with_seed(nbformat.read(path, as_version=4), seed, subs)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=3600, resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
        ok = True
        print(f"PASS {path} seed {seed} in {time.perf_counter() - start:.0f} s", flush=True)
    except CellExecutionError as err:
        ok = False
        print(f"FAIL {path} seed {seed}:\n{str(err)[-3000:]}", flush=True)
    if out is not None:
        nbformat.write(nb, out)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("seeds", type=int, nargs="+")
    ap.add_argument("--sub", action="append", default=[], metavar="OLD=>NEW",
                    help="replace OLD by NEW in every code cell (repeatable)")
    ap.add_argument("--out", type=Path, help="folder for the executed notebooks")
    args = ap.parse_args(argv)
    subs = []
    for s in args.sub:
        if "=>" not in s:
            ap.error(f"--sub {s!r}: expected OLD=>NEW")
        old, new = s.split("=>", 1)
        subs.append((old, new))
    ok = True
    for seed in args.seeds:
        out = args.out / f"{args.notebook.stem}-seed{seed}.ipynb" if args.out else None
        ok = run(args.notebook, seed, subs, out) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
