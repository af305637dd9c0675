"""The package is packaged like its peers: licence, typing marker, metadata, one version.

* the licence expression and the licence files cover everything shipped (the MIT code and the
  PSF-licensed corpus snapshot);
* the runtime dependencies are what ``import posenc`` imports (torch, at the tested version); the
  lab's and the figures' needs are extras, and ``import posenc.lab`` without them names the extra;
* the developer extras together hold every tool ``requirements.txt`` pins;
* the sdist leaves the tests out (they need the repository), ``dist/`` is ignored by git.

The build tests work on a copy of the sources in a temporary directory (no build isolation, no
network), so the checkout gets no ``build/`` or ``*.egg-info`` and CI can run them: about 10 s.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_pyproject_metadata():
    project = _pyproject()["project"]
    assert project["license"] == "MIT AND PSF-2.0"  # SPDX expression, not a table
    assert project["license-files"] == ["LICENSE", "LICENSE-BOOK", "posenc/lab/corpus/LICENSE-PSF.txt"]
    assert project["authors"] and project["keywords"]
    assert "Typing :: Typed" in project["classifiers"]
    assert not any(c.startswith("License ::") for c in project["classifiers"]), "SPDX replaces these"
    for name in ("Homepage", "Documentation", "Repository", "Issues", "Changelog"):
        assert project["urls"][name].startswith("https://"), name
    requires = _pyproject()["build-system"]["requires"]
    assert any(r.replace(" ", "") == "setuptools>=77" for r in requires), requires


def test_licence_files():
    assert "MIT License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "CC BY 4.0" in (ROOT / "LICENSE-BOOK").read_text(encoding="utf-8")
    psf = (ROOT / "posenc" / "lab" / "corpus" / "LICENSE-PSF.txt").read_text(encoding="utf-8")
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in psf
    assert (ROOT / "posenc" / "py.typed").exists()


def test_version_in_one_place():
    import posenc

    assert posenc.__version__ == metadata.version("posenc")
    source = (ROOT / "posenc" / "__init__.py").read_text(encoding="utf-8")
    version = _pyproject()["project"]["version"]
    assert f'"{version}"' not in source, "posenc/__init__.py repeats the version; read it from metadata"


def test_changelog_has_this_version():
    version = _pyproject()["project"]["version"]
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_citation_cff():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    for key in ("cff-version", "message", "title", "authors"):  # required by CFF 1.2.0
        assert cff.get(key), f"CITATION.cff has no {key}"
    assert cff["cff-version"] == "1.2.0"
    assert all(("name" in a) or ("family-names" in a) for a in cff["authors"])
    assert cff["version"] == _pyproject()["project"]["version"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(cff["date-released"]))
    # CFF reads a list of licences as "any of them"; the code's licence is the one to cite under
    assert cff["license"] in _pyproject()["project"]["license"].split(" AND ")


def _requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for req in requirements:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        assert match, req
        names.add(match.group(1).lower().replace("_", "-"))
    return names


def test_dependencies_and_extras():
    project = _pyproject()["project"]
    assert project["dependencies"] == ["torch>=2.13"]
    extras = project["optional-dependencies"]
    assert _requirement_names(extras["lab"]) == {"tqdm", "filelock", "platformdirs"}
    assert _requirement_names(extras["plot"]) == {"matplotlib", "plotly"}
    assert _requirement_names(extras["hf"]) == {"transformers"}  # the Colab bootstrap's third
    assert "posenc[lab,plot]" in extras["test"] and "posenc[lab,plot]" in extras["book"]
    tools = {"pytest", "pytest-xdist", "hypothesis", "nbval", "ipykernel"}
    assert tools <= _requirement_names(extras["test"])
    assert {"jieba", "sphinx-sitemap", "sphinxext-opengraph", "sphinx-notfound-page"} <= _requirement_names(
        extras["book"])
    assert extras["dev"] == ["posenc[test,lint,book,release]"]


def test_torch_floor_is_the_tested_torch():
    """The declared floor is the torch that requirements.txt pins (what CI tests)."""
    pinned = re.search(r"^torch==(\d+\.\d+)", (ROOT / "requirements.txt").read_text(encoding="utf-8"),
                       re.MULTILINE)  # fmt: skip
    assert pinned and _pyproject()["project"]["dependencies"] == [f"torch>={pinned.group(1)}"]


def test_requirements_are_in_the_extras():
    """`pip install -e .[dev]` installs every tool that requirements.txt pins (same names)."""
    extras = _pyproject()["project"]["optional-dependencies"]
    declared = set().union(*(_requirement_names(v) for v in extras.values())) | {"torch"}
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    pinned = _requirement_names([line for line in lines if line and not line.startswith("-")])
    assert pinned - declared == set(), "pinned in requirements.txt but in no extra"


def test_library_imports_only_torch():
    """`import posenc` loads nothing beyond what `import torch` loads and the standard library."""
    code = (
        "import sys; import torch; before = set(sys.modules); import posenc; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(m for m in new if m not in sys.stdlib_module_names and not m.startswith('_')))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "['posenc']", out


@pytest.mark.parametrize("missing", ["tqdm", "filelock", "platformdirs"])
def test_lab_without_its_extra_names_it(missing: str):
    code = f"import sys; sys.modules[{missing!r}] = None; import posenc.lab"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: posenc.lab needs " + missing), last
    assert "pip install 'posenc[lab]'" in last


def test_plot_without_matplotlib_names_the_extra():
    code = "import sys; sys.modules['matplotlib'] = None; from posenc.lab import plot; plot.use_book_style()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "pip install 'posenc[plot]'" in done.stderr.strip().splitlines()[-1]


def test_dist_is_ignored():
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "/dist/" in ignored and "/build/" in ignored


def _source_copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "LICENSE-BOOK", "MANIFEST.in"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "posenc", src / "posenc", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", src / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    return src


@pytest.mark.packaging
def test_wheel_holds_licence_and_py_typed(tmp_path: Path):
    src = _source_copy(tmp_path)
    out = tmp_path / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
           "--no-index", "-q", "-w", str(out)]
    subprocess.run(cmd, check=True, cwd=tmp_path)
    (wheel,) = out.glob("posenc-*.whl")
    version = _pyproject()["project"]["version"]
    assert wheel.name.startswith(f"posenc-{version}-py3-none-any"), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = f"posenc-{version}.dist-info"
        assert "posenc/py.typed" in names
        assert "posenc/lab/corpus/stdlib-3.11.tar.xz" in names
        assert f"{dist_info}/licenses/LICENSE" in names, sorted(n for n in names if "dist-info" in n)
        assert f"{dist_info}/licenses/LICENSE-BOOK" in names
        assert f"{dist_info}/licenses/posenc/lab/corpus/LICENSE-PSF.txt" in names
        meta = Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
    assert meta["License-Expression"] == "MIT AND PSF-2.0"
    licences = {"LICENSE", "LICENSE-BOOK", "posenc/lab/corpus/LICENSE-PSF.txt"}
    assert set(meta.get_all("License-File")) == licences
    assert not any(n.startswith(("tests/", "book/", "benchmarks/")) for n in names)
    requires = meta.get_all("Requires-Dist")
    runtime = [r for r in requires if "extra ==" not in r]
    assert runtime == ["torch>=2.13"], runtime
    assert any(r.startswith("tqdm") and 'extra == "lab"' in r for r in requires), requires
    assert any(r.startswith("matplotlib") and 'extra == "plot"' in r for r in requires), requires
    assert any(r.startswith("pytest-xdist") and 'extra == "test"' in r for r in requires), requires
    extras = {"lab", "plot", "hf", "test", "lint", "book", "release", "dev"}
    assert set(meta.get_all("Provides-Extra")) == extras


@pytest.mark.packaging
def test_sdist_leaves_out_the_tests(tmp_path: Path):
    pytest.importorskip("build")
    src = _source_copy(tmp_path)
    out = tmp_path / "dist"
    cmd = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(src)]
    subprocess.run(cmd, check=True, cwd=tmp_path, capture_output=True)
    (sdist,) = out.glob("posenc-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert "pyproject.toml" in names and "posenc/__init__.py" in names
    assert "posenc/lab/corpus/LICENSE-PSF.txt" in names and "LICENSE" in names
    assert not any(n.startswith("tests") for n in names), sorted(n for n in names if n.startswith("tests"))
