"""The notebooks' first cells work in Colab: the bootstrap installs posenc, the Chinese edition gets a
CJK font.

* The bootstrap cell (``scripts/set_repo.py``'s, character for character, only its repository
  address pointed at a local clone) runs with a stand-in ``google.colab`` module: against a clone
  without the release tag it prints one line and installs the default branch; with the tag it
  installs the tag and prints nothing. pip runs offline (``--no-deps``, no build isolation, no
  index) into a ``--target`` folder, set through pip's environment variables so the cell's text is
  the one the notebooks carry. About 5 s.
* :func:`posenc.lab.plot.cjk_font` with every CJK font hidden from matplotlib: outside Colab the
  error says how to install one and nothing is installed; in Colab the (stubbed) installer runs once
  and the font it brings is registered with matplotlib's font manager.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(*args: str, cwd: Path) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false",
           *args]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A clone of this repository's committed HEAD, without tags, with the working tree's
    ``pyproject.toml`` and ``posenc/`` committed on top (so the test sees uncommitted packaging
    changes too)."""
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-tags", str(ROOT), str(dest)], check=True)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.rmtree(dest / "posenc")
    shutil.copytree(ROOT / "posenc", dest / "posenc", ignore=shutil.ignore_patterns("__pycache__"))
    _git("add", "-A", cwd=dest)
    _git("commit", "-q", "--allow-empty", "-m", "working tree", cwd=dest)
    assert _git("tag", "-l", cwd=dest).strip() == ""
    return dest


def _run_cell(source: str, target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the cell as Colab would (``google.colab`` imported), pip kept offline and in ``target``."""
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setenv("PIP_NO_DEPS", "1")
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")  # pip reads 0 here as "no isolation"
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_TARGET", str(target))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    exec(compile(source, "<bootstrap cell>", "exec"), {"__name__": "__main__"})


def _installed_version(target: Path) -> str:
    (dist,) = target.glob("posenc-*.dist-info")
    assert (target / "posenc" / "__init__.py").exists()
    assert (target / "posenc" / "lab" / "corpus").is_dir(), "package data missing"
    return dist.name.removeprefix("posenc-").removesuffix(".dist-info")


@needs_git
def test_bootstrap_falls_back_to_the_default_branch(clone: Path, tmp_path: Path, monkeypatch, capfd):
    set_repo = load_script("set_repo")
    version = set_repo.package_version(ROOT)
    source = set_repo.bootstrap_source(clone.as_uri(), version)
    assert source == set_repo.bootstrap_source(set_repo.config_url(ROOT), version).replace(
        set_repo.config_url(ROOT), clone.as_uri()
    ), "the test must run the notebooks' cell, only its address changed"
    target = tmp_path / "site-packages"
    _run_cell(source, target, monkeypatch)
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert lines == [f"could not install posenc v{version}: installing the default branch instead"], lines
    assert _installed_version(target) == version


@needs_git
def test_bootstrap_installs_the_tag(clone: Path, tmp_path: Path, monkeypatch, capfd):
    set_repo = load_script("set_repo")
    version = set_repo.package_version(ROOT)
    _git("tag", f"v{version}", cwd=clone)
    # a commit after the tag: the default branch no longer equals the tag, and the tag must win
    (clone / "pyproject.toml").write_text(
        (clone / "pyproject.toml").read_text(encoding="utf-8").replace(
            f'version = "{version}"', 'version = "99.0.0"'
        ),
        encoding="utf-8",
    )
    _git("commit", "-q", "-am", "after the release", cwd=clone)
    target = tmp_path / "site-packages"
    _run_cell(set_repo.bootstrap_source(clone.as_uri(), version), target, monkeypatch)
    out, err = capfd.readouterr()
    assert not (out + err).strip(), out + err
    assert _installed_version(target) == version


def test_bootstrap_does_nothing_outside_colab(monkeypatch, capfd):
    set_repo = load_script("set_repo")
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    exec(set_repo.bootstrap_source("file:///nowhere", "0.0.0"), {"__name__": "__main__"})
    assert calls == [] and capfd.readouterr() == ("", "")


def test_bootstrap_lines_fit_a_notebook():
    set_repo = load_script("set_repo")
    source = set_repo.bootstrap_source(set_repo.config_url(ROOT), set_repo.package_version(ROOT))
    assert max(len(line) for line in source.splitlines()) <= 88
    assert f"posenc[{set_repo.EXTRAS}]" in source and set_repo.EXTRAS == "lab,plot,hf"


# --- the Chinese edition's CJK font ---------------------------------------------------------


def _system_cjk_font() -> str | None:
    """A real CJK font file on this machine (CI installs Debian's fonts-noto-cjk)."""
    fm = pytest.importorskip("matplotlib.font_manager")
    for path in sorted(fm.findSystemFonts()):
        if "notosanscjk-regular" in path.lower() or "notosanscjksc-regular" in path.lower():
            return path
    return None


@pytest.fixture
def no_cjk_fonts(monkeypatch):
    """matplotlib sees no CJK font (as in Colab): the font list and the system's font files are
    stubbed; returns the list of font files the stubbed system "has", which a test may extend."""
    from matplotlib import font_manager

    from posenc.lab import plot

    real = _system_cjk_font()
    visible: list[str] = []
    latin = [f for f in font_manager.fontManager.ttflist
             if f.name not in plot.CJK_FONTS and "CJK" not in f.name]  # fmt: skip
    monkeypatch.setattr(font_manager.fontManager, "ttflist", latin)
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *a, **k: list(visible))
    return visible, real


def test_cjk_font_missing_outside_colab_says_how(no_cjk_fonts, monkeypatch):
    from posenc.lab import plot

    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    calls = []
    monkeypatch.setattr(plot, "_install_cjk_font", lambda: calls.append(1))
    with pytest.raises(RuntimeError) as info:
        plot.use_book_style(lang="zh")
    message = str(info.value)
    assert "no CJK font found" in message
    assert "apt-get install fonts-noto-cjk" in message and "brew install" in message
    assert calls == [], "nothing is installed outside Colab"


def test_cjk_font_is_installed_in_colab(no_cjk_fonts, monkeypatch):
    import matplotlib.pyplot as plt

    from posenc.lab import plot

    visible, real = no_cjk_fonts
    if real is None:
        pytest.skip("no Noto Sans CJK file on this machine to stand in for the installed font")
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    calls = []

    def fake_apt_install():  # what apt-get install fonts-noto-cjk does: a font file appears
        calls.append(1)
        visible.append(real)

    monkeypatch.setattr(plot, "_install_cjk_font", fake_apt_install)
    try:
        plot.use_book_style(lang="zh")
        assert calls == [1]
        name = plt.rcParams["font.sans-serif"][0]
        assert name in plot.CJK_FONTS, name
        from matplotlib import font_manager

        assert name in {f.name for f in font_manager.fontManager.ttflist}, "registered with matplotlib"
        plot.use_book_style(lang="zh")  # a second figure: already there, nothing installed again
        assert calls == [1]
    finally:
        plot.use_book_style(lang="en")


def test_install_cjk_font_runs_apt(monkeypatch, capsys):
    """The installer itself: apt-get install, and update then install again when that fails."""
    from posenc.lab import plot

    calls: list[list[str]] = []
    codes = iter([100, 0, 0])

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, next(codes), "", "")

    monkeypatch.setattr(plot.subprocess, "run", fake_run)
    plot._install_cjk_font()
    assert calls == [["apt-get", "install", "-y", "-q", "fonts-noto-cjk"], ["apt-get", "update", "-q"],
                     ["apt-get", "install", "-y", "-q", "fonts-noto-cjk"]]  # fmt: skip
    assert capsys.readouterr().out.count("\n") == 1, "one line says what is being installed"
