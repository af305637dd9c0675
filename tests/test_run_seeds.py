"""scripts/run_seeds.py: a chapter run with another seed passes or fails on its own assertions."""

from pathlib import Path

import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "tests" / "fixtures" / "seeds" / "chapter.ipynb"


def _module():
    return load_script("run_seeds")


def test_seed_line_and_replacements_are_applied():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(CHAPTER, as_version=4)
    out = _module().with_seed(nb, 7, [("STEPS = 10", "STEPS = 5")])
    assert out.cells[1].source.startswith("SEED = 7  #")
    assert "STEPS = 5" in out.cells[1].source
    assert nb.cells[1].source.startswith("SEED = 0")  # the original is left alone


def test_a_notebook_without_a_seed_line_is_refused():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    with pytest.raises(ValueError, match="SEED"):
        _module().with_seed(nb, 1, [])


def test_passes_and_fails_by_seed(tmp_path, capsys):
    module = _module()
    assert module.main([str(CHAPTER), "1", "--out", str(tmp_path)]) == 0
    assert module.main([str(CHAPTER), "0", "2"]) == 1  # seed 2 breaks the assertion
    printed = capsys.readouterr().out
    assert "PASS" in printed and "seed 2" in printed and "FAIL" in printed
    assert (tmp_path / "chapter-seed1.ipynb").is_file()
    # a replacement that breaks the chapter is caught too
    assert module.main([str(CHAPTER), "0", "--sub", "STEPS = 10=>STEPS = 9"]) == 1
