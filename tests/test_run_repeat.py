"""scripts/run_repeat.py: a chapter's cells run in fresh processes with 1 and 2 threads pass and
print the same, and a cell that depends on the process or the thread count is caught. Chapter 8's
check of PI's bound (moved there from chapter 7), once flaky across processes, runs here."""

from pathlib import Path

import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
nbformat = pytest.importorskip("nbformat")


def _notebook(tmp_path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    for i, cell in enumerate(nb.cells):
        cell.id = f"c{i}"
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    return path


def test_deterministic_cells_pass_and_cells_are_picked_by_id(tmp_path, capsys):
    module = load_script("run_repeat")
    path = _notebook(tmp_path, "x = sum(range(10))", "assert False", "print(x)")
    assert module.check(path, 2, [1, 2], cells=["c0", "c2"], jobs=2)
    printed = capsys.readouterr().out
    assert "PASS" in printed and "4 runs" in printed
    assert not module.check(path, 1, [1])  # every cell: the assertion fails
    assert "AssertionError" in capsys.readouterr().out
    with pytest.raises(ValueError, match="c9"):
        module.program(nbformat.read(path, as_version=4), ["c9"])


def test_output_that_depends_on_threads_or_process_fails(tmp_path, capsys):
    module = load_script("run_repeat")
    threads = _notebook(tmp_path, "import torch\nprint(torch.get_num_threads())")
    assert module.check(threads, 2, [1])  # one thread count: the same every time
    assert not module.check(threads, 1, [1, 2])
    assert "printed something else" in capsys.readouterr().out
    process = _notebook(tmp_path, "import os\nprint(os.getpid())")
    assert module.main([str(process), "--repeat", "2", "--threads", "1"]) == 1


def test_chapter_8_pi_bound_cells_are_deterministic(capsys):
    """The PI-bound cells (the ridge fits and the truncated-SVD fits) of chapter 8, twice with
    1 thread and twice with 2, each in a fresh process: all pass, all print the same table."""
    module = load_script("run_repeat")
    chapter = ROOT / "book" / "08_long_context_practice.ipynb"
    ok = module.check(chapter, 2, [1, 2], cells=["033bb055", "50221ad1"],
                      prelude="import math\nimport torch\n", jobs=2)
    assert ok, capsys.readouterr().out
