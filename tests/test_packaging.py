"""The package is packaged like its peers: licence, typing marker, metadata, one version.

The wheel test builds from a copy of the sources in a temporary directory (no build isolation,
no network), so the checkout gets no ``build/`` or ``*.egg-info`` and CI can run it: about 5 s.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
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
    assert project["license"] == "MIT"  # SPDX expression, not a table
    assert project["license-files"] == ["LICENSE*"]
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
    assert cff["license"] == _pyproject()["project"]["license"]


@pytest.mark.packaging
def test_wheel_holds_licence_and_py_typed(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "LICENSE-BOOK"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "posenc", src / "posenc", ignore=shutil.ignore_patterns("__pycache__"))
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
        assert f"{dist_info}/licenses/LICENSE" in names, sorted(n for n in names if "dist-info" in n)
        assert f"{dist_info}/licenses/LICENSE-BOOK" in names
        meta = Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
    assert meta["License-Expression"] == "MIT"
    assert set(meta.get_all("License-File")) == {"LICENSE", "LICENSE-BOOK"}
    assert not any(n.startswith(("tests/", "book/", "benchmarks/")) for n in names)
