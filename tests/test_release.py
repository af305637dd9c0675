"""A release is one step: ``scripts/check_release.py`` finds every disagreement between the tag,
``pyproject.toml``, the notebooks' pinned ref, ``CITATION.cff`` and ``CHANGELOG.md``, and
``.github/workflows/release.yml`` runs it before it builds, tags and publishes.

The cases run on small copies in a temporary folder: the repository's own release files (after
``scripts/set_repo.py`` has rewritten the copied notebooks) agree; each kind of disagreement is
reported, one line each.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from _scripts import load_script

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]

CHANGELOG = """# Changelog

## [Unreleased]

## [1.2.0] - 2026-11-30

### Added
- Something new.

### Removed

## [1.1.0] - 2026-01-02

### Fixed
- An old bug.

[Unreleased]: https://github.com/o/r/compare/v1.2.0...HEAD
[1.2.0]: https://github.com/o/r/compare/v1.1.0...v1.2.0
[1.1.0]: https://github.com/o/r/releases/tag/v1.1.0
"""


def _notebook() -> dict:
    cell = {"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {}, "outputs": [],
            "source": ["print(1)\n"]}  # fmt: skip
    return {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A tiny repository whose release files agree (version 1.2.0)."""
    (tmp_path / "book" / "zh").mkdir(parents=True)
    (tmp_path / "_config.yml").write_text("repository:\n  url: https://github.com/o/r\n", encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1.2.0"\n', encoding="utf-8")
    (tmp_path / "CITATION.cff").write_text(
        "cff-version: 1.2.0\ntitle: x\nversion: 1.2.0\ndate-released: 2026-11-30\n", encoding="utf-8"
    )
    (tmp_path / "CHANGELOG.md").write_text(CHANGELOG, encoding="utf-8")
    for rel in ("book/01_a.ipynb", "book/zh/01_a.ipynb"):
        (tmp_path / rel).write_text(json.dumps(_notebook(), indent=1), encoding="utf-8")
    assert load_script("set_repo").main(["--root", str(tmp_path)]) == 0  # writes the bootstraps
    return tmp_path


def _check(root: Path, tag: str | None = None) -> list[str]:
    return load_script("check_release").check(root, tag)


def test_agreeing_release(repo: Path, tmp_path: Path, capsys):
    assert _check(repo) == []
    assert _check(repo, "v1.2.0") == []
    module = load_script("check_release")
    notes = tmp_path / "notes.md"
    assert module.main(["--root", str(repo), "--tag", "v1.2.0", "--notes", str(notes)]) == 0
    assert notes.read_text(encoding="utf-8") == "### Added\n- Something new.\n", "empty headings dropped"
    assert "agree" in capsys.readouterr().out
    assert module.main(["--root", str(repo), "--version"]) == 0
    assert capsys.readouterr().out == "1.2.0\n"


def test_wrong_tag(repo: Path):
    assert _check(repo, "v1.2.1") == ["tag 'v1.2.1' != 'v' + pyproject.toml's version '1.2.0'"]
    assert len(_check(repo, "1.2.0")) == 1, "the tag carries the v"


def test_version_bumped_alone(repo: Path):
    """pyproject.toml says 1.3.0, nothing else was updated: every other file is named."""
    path = repo / "pyproject.toml"
    path.write_text(path.read_text(encoding="utf-8").replace("1.2.0", "1.3.0"), encoding="utf-8")
    problems = _check(repo, "v1.3.0")
    joined = "\n".join(problems)
    assert "book/01_a.ipynb: the bootstrap pins ['v1.2.0'], not 'v1.3.0'" in joined
    assert "book/zh/01_a.ipynb" in joined
    assert "CITATION.cff: version '1.2.0' != '1.3.0'" in joined
    assert "CHANGELOG.md: no section '## [1.3.0] - YYYY-MM-DD'" in joined
    assert len(problems) == 4, problems


def test_notebook_edited_by_hand(repo: Path):
    """The right ref, but not set_repo.py's cell."""
    path = repo / "book" / "01_a.ipynb"
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb["cells"][0]["source"].append("\nprint('extra')")
    path.write_text(json.dumps(nb), encoding="utf-8")
    assert _check(repo) == ["book/01_a.ipynb: the bootstrap is not scripts/set_repo.py's cell (run it)"]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("## [1.2.0] - 2026-11-30", "## [1.2.0] - unreleased",
         "CHANGELOG.md: the [1.2.0] heading has no date: ## [1.2.0] - YYYY-MM-DD"),
        ("## [1.2.0] - 2026-11-30", "## [1.2.0] - 2026-12-01",
         "CHANGELOG.md dates 1.2.0 2026-12-01; CITATION.cff's date-released: 2026-11-30"),
        ("### Added\n- Something new.\n", "",
         "CHANGELOG.md: the [1.2.0] section is empty"),
        ("[1.2.0]: https://github.com/o/r/compare/v1.1.0...v1.2.0\n", "",
         "CHANGELOG.md: no link '[1.2.0]: https://...' at the bottom"),
    ],
    ids=["undated", "other-date", "empty", "no-link"],
)  # fmt: skip
def test_changelog_disagrees(repo: Path, old: str, new: str, expected: str):
    path = repo / "CHANGELOG.md"
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")
    assert _check(repo) == [expected]


def test_citation_without_date(repo: Path):
    path = repo / "CITATION.cff"
    path.write_text(path.read_text(encoding="utf-8").replace("date-released: 2026-11-30\n", ""),
                    encoding="utf-8")  # fmt: skip
    assert _check(repo) == ["CITATION.cff: date-released None is not a YYYY-MM-DD date"]


def test_main_reports_and_fails(repo: Path, capsys):
    module = load_script("check_release")
    assert module.main(["--root", str(repo), "--tag", "v9.9.9"]) == 1
    assert capsys.readouterr().err == "tag 'v9.9.9' != 'v' + pyproject.toml's version '1.2.0'\n"


def test_this_repository_agrees_once_set_repo_ran(tmp_path: Path):
    """The real release files agree: copies of them (and of the notebooks, rewritten by set_repo.py,
    as the lead does before a release) pass the check."""
    root = tmp_path / "repo"
    for name in ("_config.yml", "pyproject.toml", "CITATION.cff", "CHANGELOG.md"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    for nb in sorted((ROOT / "book").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in nb.parts:
            continue
        dest = root / nb.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(nb, dest)
    if (ROOT / "book" / "zh" / "_config.yml").exists():
        shutil.copy(ROOT / "book" / "zh" / "_config.yml", root / "book" / "zh" / "_config.yml")
    assert load_script("set_repo").main(["--root", str(root)]) == 0
    version = load_script("set_repo").package_version(ROOT)
    assert _check(root, f"v{version}") == []
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert str(cff["date-released"]) in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def _workflow() -> tuple[str, dict]:
    text = (ROOT / ".github" / "workflows" / "release.yml").read_text(encoding="utf-8")
    return text, yaml.safe_load(text)


def test_release_workflow():
    """Triggers, the order of the jobs, the check before the build, twine --strict, the clean
    install, the tag and the release, trusted publishing with a SHA-pinned action."""
    text, workflow = _workflow()
    triggers = workflow[True] if True in workflow else workflow["on"]
    assert triggers["push"]["branches"] == ["main"] and triggers["push"]["tags"] == ["v*"]
    assert workflow["permissions"] == {}
    jobs = workflow["jobs"]
    assert jobs["build"]["needs"] == "plan" and jobs["build"]["if"] == "needs.plan.outputs.release == 'true'"
    build = [s.get("run", "") for s in jobs["build"]["steps"]]
    order = [next(i for i, r in enumerate(build) if key in r) for key in (
        "scripts/check_release.py --tag", "python -m build", "twine check --strict", "python -m venv")]
    assert order == sorted(order), "check, build, twine check, clean install: in this order"
    assert "import posenc, posenc.lab" in build[order[3]]
    assert jobs["github-release"]["permissions"] == {"contents": "write"}
    assert "gh release create" in text and "--notes-file release-notes.md" in text
    pypi = jobs["pypi"]
    assert pypi["environment"]["name"] == "pypi"
    assert pypi["permissions"] == {"id-token": "write"}
    assert "github-release" in pypi["needs"]
    (publish,) = [s for s in pypi["steps"] if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@")]
    assert re.fullmatch(r"pypa/gh-action-pypi-publish@[0-9a-f]{40}", publish["uses"])
    assert "password" not in publish.get("with", {}), "trusted publishing: no token"
    for job in jobs.values():
        assert "permissions" in job, "every job states its permissions"
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    for line in text.splitlines():
        if "uses:" in line:
            assert re.search(r"@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), f"not pinned by SHA: {line}"
