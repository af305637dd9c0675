"""Run a chapter's code cells again and again in fresh processes, with each thread count, to check
that they are deterministic: every run passes its assertions and prints the same output.

A cell whose result depends on the process or on the number of threads (an ill-conditioned solve
left to a library's default, a reduction whose order changes with the threads, an unseeded
generator) passes on one machine and fails on the next. This script executes the chosen code
cells of a notebook (all of them by default; ``--cells`` picks some by id, in notebook order) as
one Python program, ``--repeat`` times for each of ``--threads``, each run a new interpreter with
``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``torch.set_num_threads`` set to that count. It
prints one line per run and then PASS, or FAIL with the failing run's error or the first line
where two runs' outputs differ.

    python scripts/run_repeat.py book/08_long_context_practice.ipynb --repeat 3 --threads 1,2 \\
        --cells c8a0e003,033bb055,50221ad1

The cells run as plain Python (no kernel, no IPython magics), in the notebook's folder, with
``MPLBACKEND=Agg``. ``--prelude`` replaces a chapter's setup cell by a line of imports when only a
few cells are wanted; ``--jobs`` runs that many processes at once; ``--fresh-cache`` gives each
run an empty ``$POSENC_CACHE``, so that models are trained in every run instead of loaded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat

# set before the cells run: the thread count of this run, for torch and for the BLAS below it
PRELUDE = """\
import os as _os
import torch as _torch
_torch.set_num_threads(int(_os.environ["POSENC_REPEAT_THREADS"]))
"""


@dataclass
class Run:
    """One execution: its thread count, whether it exited 0, its output and its duration."""

    threads: int
    ok: bool
    output: str
    seconds: float


def program(nb: nbformat.NotebookNode, cells: list[str] | None = None, prelude: str = "") -> str:
    """The code cells of ``nb`` (those with the ids in ``cells``, in notebook order; all when
    ``cells`` is None) joined into one program after :data:`PRELUDE` and ``prelude``."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    if cells is not None:
        ids = [c.get("id") for c in code]
        missing = [i for i in cells if i not in ids]
        if missing:
            raise ValueError(f"no code cell with id {missing} in the notebook")
        code = [c for c in code if c.get("id") in cells]
    return PRELUDE + prelude + "\n\n" + "\n\n".join(f"# cell {c.get('id')}\n{c.source}" for c in code) + "\n"


def run_once(source: str, threads: int, cwd: Path, timeout: float = 3600,
             fresh_cache: bool = False) -> Run:
    """Execute ``source`` in a new interpreter with ``threads`` threads (and, with
    ``fresh_cache``, an empty ``$POSENC_CACHE`` of its own)."""
    env = dict(os.environ, MPLBACKEND="Agg", POSENC_REPEAT_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads), PYTHONHASHSEED="0",
               OMP_WAIT_POLICY="PASSIVE")  # idle threads sleep: runs share the cores
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False, encoding="utf-8") as f:
        f.write(source)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        if fresh_cache:
            env["POSENC_CACHE"] = cache
        try:
            proc = subprocess.run([sys.executable, f.name], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=timeout)
        finally:
            os.unlink(f.name)
    seconds = time.perf_counter() - start
    return Run(threads, proc.returncode == 0, proc.stdout + proc.stderr * (proc.returncode != 0),
               seconds)


def first_difference(a: str, b: str) -> str:
    """The first line where two outputs differ, both versions."""
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f"line {i + 1}:\n  {x}\n  {y}"
    return f"one output has {abs(len(la) - len(lb))} more line(s)"


def check(path: Path, repeat: int, threads: list[int], cells: list[str] | None = None,
          prelude: str = "", jobs: int = 1, fresh_cache: bool = False) -> bool:
    """Run the cells ``repeat`` times per thread count, ``jobs`` processes at a time; print each
    run and the verdict (True: every run passed and printed the same)."""
    if repeat < 1 or jobs < 1 or not threads or min(threads) < 1:
        raise ValueError(f"repeat, jobs and every thread count must be >= 1, got {repeat}, "
                         f"{jobs}, {threads}")
    source = program(nbformat.read(path, as_version=4), cells, prelude)
    plan = [t for _ in range(repeat) for t in threads]
    with ThreadPoolExecutor(jobs) as pool:  # each run is its own process
        runs = list(pool.map(
            lambda t: run_once(source, t, path.parent, fresh_cache=fresh_cache), plan))
    for i, r in enumerate(runs):
        verdict = "ok" if r.ok else "FAILED"
        print(f"run {i + 1}/{len(runs)}, {r.threads} thread(s): {verdict} in {r.seconds:.1f} s")
    failed = [r for r in runs if not r.ok]
    if failed:
        print(f"FAIL {path}: {len(failed)} of {len(runs)} runs failed; the first:\n"
              f"{failed[0].output[-3000:]}")
        return False
    differ = [r for r in runs if r.output != runs[0].output]
    if differ:
        print(f"FAIL {path}: {len(differ)} of {len(runs)} runs printed something else than the "
              f"first ({differ[0].threads} thread(s)), {first_difference(runs[0].output, differ[0].output)}")
        return False
    print(f"PASS {path}: {len(runs)} runs ({repeat} x threads {threads}), the same output")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("--repeat", type=int, default=3, help="runs per thread count (default 3)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--cells", help="comma-separated ids of the code cells to run (default: all)")
    ap.add_argument("--prelude", default="", help="code to run before the cells (imports)")
    ap.add_argument("--jobs", type=int, default=1, help="processes at once (default 1)")
    ap.add_argument("--fresh-cache", action="store_true",
                    help="an empty $POSENC_CACHE per run: train instead of loading")
    args = ap.parse_args(argv)
    try:
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        ap.error(f"--threads {args.threads!r}: expected integers separated by commas")
    cells = args.cells.split(",") if args.cells else None
    ok = check(args.notebook, args.repeat, threads, cells, args.prelude, args.jobs,
               args.fresh_cache)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
