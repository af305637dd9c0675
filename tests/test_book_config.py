"""The book's configuration agrees with itself.

* every notebook's Colab bootstrap installs posenc from ``repository.url`` of ``_config.yml``;
* notebooks are committed without outputs;
* every ``_toc.yml`` entry exists, and every chapter in ``book/`` is in the toc;
* every ``{cite}`` key used in ``book/`` is in ``book/references.bib``;
* ``scripts/set_repo.py --check`` has nothing left to rewrite.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _scripts import load_script

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(p for p in BOOK.glob("*.ipynb"))
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
BIB_KEY = re.compile(r"^@\s*[A-Za-z]+\s*\{\s*([^,\s]+)\s*,", re.MULTILINE)
REPO_LINE = re.compile(r'^REPO(?:, REF)? = "([^"]*)"', re.MULTILINE)


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def _toc() -> dict:
    return yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _toc_files(node) -> list[str]:
    """All ``file:`` (and ``root:``) entries of a jb-book toc, depth first."""
    found: list[str] = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if key in node:
                found.append(str(node[key]))
        for value in node.values():
            if isinstance(value, list | dict):
                found.extend(_toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_toc_files(item))
    return found


def _set_repo():
    return load_script("set_repo")


def test_config_basics():
    config = _config()
    assert config["only_build_toc_files"] is True
    assert config["execute"]["raise_on_error"] is True
    assert "book/references.bib" in config["bibtex_bibfiles"]
    url = config["repository"]["url"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url), url
    for pattern in (".venv", "_build", "tests", "posenc", "scripts", ".github", ".ci"):
        assert pattern in config["exclude_patterns"], pattern


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in book/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_bootstrap_repo_matches_config(path: Path):
    url = _config()["repository"]["url"].rstrip("/")
    cells = [c for c in _load(path)["cells"] if c["cell_type"] == "code"]
    assert cells, f"{path.name} has no code cell"
    first = _source(cells[0])
    found = REPO_LINE.findall(first)
    assert found, f"{path.name}: the first code cell is not the Colab bootstrap (no REPO = line)"
    assert found == [url], (
        f"{path.name}: bootstrap REPO {found} != _config.yml repository.url {url!r}; "
        "run `python scripts/set_repo.py`"
    )
    assert "google.colab" in first, f"{path.name}: the bootstrap must only install in Colab"
    for cell in cells[1:]:
        assert not REPO_LINE.search(_source(cell)), f"{path.name}: REPO set outside the bootstrap"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_bootstrap_is_the_canonical_cell(path: Path):
    """One identical bootstrap everywhere, pinned to this version's tag, hidden from the HTML."""
    set_repo = _set_repo()
    url, version = set_repo.config_url(ROOT), set_repo.package_version(ROOT)
    first = next(c for c in _load(path)["cells"] if c["cell_type"] == "code")
    assert _source(first) == set_repo.bootstrap_source(url, version), (
        f"{path.name}: the bootstrap differs from scripts/set_repo.py's; run it"
    )
    assert "remove-cell" in first["metadata"].get("tags", []), f"{path.name}: bootstrap not removed"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_outputs(path: Path):
    for index, cell in enumerate(_load(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert cell.get("outputs") == [], f"{path.name}: cell {index} has outputs (nbstripout it)"
        assert cell.get("execution_count") is None, f"{path.name}: cell {index} has a count"


def test_toc_entries_exist():
    toc = _toc()
    assert toc.get("format") == "jb-book"
    entries = _toc_files(toc)
    assert entries and entries[0] == toc["root"]
    missing = [e for e in entries if not any((ROOT / f"{e}{ext}").exists() for ext in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"
    assert len(entries) == len(set(entries)), "_toc.yml lists a file twice"


def test_every_chapter_is_in_the_toc():
    listed = set(_toc_files(_toc()))
    for path in NOTEBOOKS:
        assert f"book/{path.stem}" in listed, f"{path.name} is not in _toc.yml"


def _cited_keys() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for path in sorted(BOOK.rglob("*")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        if path.suffix == ".md":
            texts = [path.read_text(encoding="utf-8")]
        elif path.suffix == ".ipynb":
            texts = [_source(c) for c in _load(path)["cells"] if c["cell_type"] == "markdown"]
        else:
            continue
        for text in texts:
            for group in CITE.findall(text):
                for key in group.split(","):
                    if key.strip():
                        used.setdefault(key.strip(), set()).add(path.name)
    return used


def test_cite_keys_exist():
    bib = (BOOK / "references.bib").read_text(encoding="utf-8")
    keys = BIB_KEY.findall(bib)
    assert len(keys) == len(set(keys)), "duplicate keys in references.bib"
    used = _cited_keys()
    assert used, "no {cite} roles found in book/"
    missing = {k: sorted(v) for k, v in used.items() if k not in set(keys)}
    assert not missing, f"cited but not in references.bib: {missing}"


def test_bib_entries_are_complete():
    bib = (BOOK / "references.bib").read_text(encoding="utf-8")
    for entry in re.split(r"\n(?=@)", bib):
        match = BIB_KEY.search(entry)
        if not match:
            continue
        fields = {f.lower() for f in re.findall(r"^\s*(\w+)\s*=", entry, re.MULTILINE)}
        needed = ("author", "title", "year", "url")
        if match.group(1) == "seedarticle":  # the saved copy of the source article records none
            assert "records no author, date or address" in entry, "seedarticle: say what is unknown"
            needed = ("title",)
        for field in needed:
            assert field in fields, f"{match.group(1)} has no {field}"
        venue = {"journal", "booktitle", "eprint", "howpublished", "institution", "publisher"}
        assert fields & venue, f"{match.group(1)} has no venue"


def test_set_repo_has_nothing_to_do():
    module = _set_repo()
    url = module.config_url(ROOT)
    assert module.site_url(url).startswith("https://") and module.site_url(url).endswith("/")
    stale = [str(p.relative_to(ROOT)) for p in module.plan(ROOT)]
    assert not stale, f"run `python scripts/set_repo.py`: stale {stale}"


def test_set_repo_rewrites(tmp_path: Path):
    """The script moves every copy of the address when ``repository.url`` changes."""
    module = _set_repo()
    (tmp_path / "book").mkdir()
    (tmp_path / "_config.yml").write_text(
        "repository:\n  url: https://github.com/new-owner/new-book\n", encoding="utf-8"
    )
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "9.8.7"\n', encoding="utf-8")
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": ['REPO = "https://github.com/old/book"  # set by scripts/set_repo.py\n'],
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (tmp_path / "book" / "x.ipynb").write_text(json.dumps(nb, indent=1), encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "pip install 'posenc @ git+https://github.com/old/book'\n"
        "Site: https://old.github.io/book/ and https://github.com/old/book-extras stays.\n"
        "[Colab](https://colab.research.google.com/github/old/book/blob/main/book/x.ipynb)\n",
        encoding="utf-8",
    )
    (tmp_path / "book" / "intro.md").write_text(
        "git clone https://github.com/old/book\nurl = {https://old.github.io/book/}\n", encoding="utf-8"
    )
    assert module.main(["--root", str(tmp_path), "--check"]) == 1
    assert module.main(["--root", str(tmp_path)]) == 0
    assert module.main(["--root", str(tmp_path), "--check"]) == 0
    source = _source(_load(tmp_path / "book" / "x.ipynb")["cells"][0])
    assert REPO_LINE.findall(source) == ["https://github.com/new-owner/new-book"]
    assert '"v9.8.7"' in source and "remove-cell" in _load(tmp_path / "book" / "x.ipynb")["cells"][0][
        "metadata"]["tags"]
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "git+https://github.com/new-owner/new-book'" in readme
    assert "https://new-owner.github.io/new-book/" in readme
    assert "https://github.com/old/book-extras" in readme
    assert "colab.research.google.com/github/new-owner/new-book/blob" in readme
    intro = (tmp_path / "book" / "intro.md").read_text(encoding="utf-8")
    assert intro == (
        "git clone https://github.com/new-owner/new-book\nurl = {https://new-owner.github.io/new-book/}\n"
    )


def test_workflow_runs_ci_and_is_pinned():
    """The workflow runs .ci/run on pushes and pull requests, pins every action to a commit,
    never keeps the token in the checkout, and gives the trained models their own cache."""
    text = (ROOT / ".github" / "workflows" / "book.yml").read_text(encoding="utf-8")
    workflow = yaml.safe_load(text)
    triggers = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on` as True
    assert "push" in triggers and "pull_request" in triggers
    steps = [step for job in workflow["jobs"].values() for step in job.get("steps", [])]
    assert any(step.get("run", "").strip() == "bash .ci/run" for step in steps)
    for step in steps:
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False
    for line in text.splitlines():
        if "uses:" in line:
            assert re.search(r"@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), f"no version comment: {line}"
    models = [s for s in steps if s.get("with", {}).get("path") == ".posenc_cache"
              and "restore-keys" in s["with"]]
    assert models, "the trained-model cache needs its own key with restore-keys"
    assert "if" not in models[0], "the model cache is restored on every event, pull requests included"


def test_intersphinx_inventories():
    """The offline inventories load with Sphinx, hold the names the API page links, and match
    scripts/make_inventories.py."""
    import posixpath

    inventory = pytest.importorskip("sphinx.util.inventory")
    mapping = _config()["sphinx"]["config"]["intersphinx_mapping"]
    wanted = {
        "python": ["collections.abc.Sequence", "collections.abc.Callable", "typing.Any",
                   "pathlib.Path", "int"],
        "torch": ["torch.Tensor", "torch.nn.Module", "torch.nn.modules.module.Module", "torch.dtype",
                  "torch.device", "torch.Generator", "torch.optim.Optimizer"],
    }  # fmt: skip
    for name, (base, local) in mapping.items():
        assert not str(local).startswith("http"), f"{name}: the build runs offline; use a local file"
        with open(ROOT / local, "rb") as f:
            inv = inventory.InventoryFile.load(f, base, posixpath.join)
        names = {obj: data[2] for objects in inv.values() for obj, data in objects.items()}
        for obj in wanted[name]:
            assert obj in names, f"{local} has no {obj}"
            assert names[obj].startswith(base + "/") and "#" in names[obj], names[obj]
    module = load_script("make_inventories")
    assert module.main(["--check"]) == 0, "run `python scripts/make_inventories.py`"


def test_site_conventions():
    """Logo and favicon drawn by scripts/make_logo.py, the edit button, html.baseurl at the Pages
    address, and the README's Colab badge on chapter 1 of this repository."""
    config = _config()
    for key, path in (("logo", config["logo"]), ("favicon", config["html"]["favicon"])):
        data = (ROOT / path).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), f"{key} {path} is not a PNG"
    assert config["html"]["use_edit_page_button"] is True
    set_repo = _set_repo()
    url = set_repo.config_url(ROOT)
    assert config["html"]["baseurl"] == set_repo.site_url(url)
    owner, repo = set_repo.owner_repo(url)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    badge = re.search(r"\[!\[Open in Colab\]\([^)]*colab-badge\.svg\)\]\(([^)]+)\)", readme)
    assert badge, "README.md has no Open in Colab badge"
    chapter1 = sorted(NOTEBOOKS)[0].name
    assert badge.group(1) == f"https://colab.research.google.com/github/{owner}/{repo}/blob/main/book/{chapter1}"


def test_set_repo_writes_baseurl(tmp_path: Path):
    module = _set_repo()
    (tmp_path / "book").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0.0"\n', encoding="utf-8")
    (tmp_path / "_config.yml").write_text(
        "repository:\n  url: https://github.com/New-Owner/new-book\n\n"
        "html:\n  favicon: x.png\n  baseurl: https://old.github.io/book/   # kept comment\n  x: 1\n",
        encoding="utf-8",
    )
    assert module.main(["--root", str(tmp_path)]) == 0
    config = (tmp_path / "_config.yml").read_text(encoding="utf-8")
    assert "  baseurl: https://new-owner.github.io/new-book/   # kept comment\n" in config
    assert module.main(["--root", str(tmp_path), "--check"]) == 0


def _bib_entries() -> dict[str, str]:
    bib = (BOOK / "references.bib").read_text(encoding="utf-8")
    return {m.group(1): entry for entry in re.split(r"\n(?=@)", bib) if (m := BIB_KEY.search(entry))}


def test_bib_venues_and_credits():
    """Venues as published, and the community posts behind RoPE scaling credited in full."""
    entries = _bib_entries()
    assert "ICLR" in entries["peng2024yarn"] and "year      = {2024}" in entries["peng2024yarn"]
    assert "NeurIPS 2023" in entries["mohtashami2023landmark"]
    for key in ("bloc97_2023ntk", "emozilla2023dynamic", "kaiokendev2023superhot"):
        entry = entries[key]
        assert entry.startswith("@misc"), key
        for field in ("author", "title", "howpublished", "year", "url", "note"):
            assert re.search(rf"^\s*{field}\s*=", entry, re.MULTILINE), f"{key} has no {field}"


def test_bibliography_list_style_matches_the_text():
    """In-text author-year citations and the list's labels come from the same rule."""
    config = _config()
    assert config["sphinx"]["config"]["bibtex_reference_style"] == "author_year"
    assert config["sphinx"]["config"]["bibtex_default_style"] == "author_year"
    assert config["sphinx"]["local_extensions"]["bibstyle"] == "scripts"
    pybtex = pytest.importorskip("pybtex.database")
    bibstyle = load_script("bibstyle")
    db = pybtex.parse_file(str(BOOK / "references.bib"))
    assert bibstyle.author_year(db.entries["vaswani2017attention"]) == "Vaswani et al., 2017"
    assert bibstyle.author_year(db.entries["hochreiter1997long"]) == "Hochreiter and Schmidhuber, 1997"
    assert bibstyle.author_year(db.entries["workshop2022bloom"]) == "BigScience Workshop, 2022"
    labels = list(bibstyle.AuthorYearLabelStyle().format_labels(list(db.entries.values()) * 2))
    assert len(set(labels)) == len(labels), "equal labels get a/b suffixes"



# the oldest major of each action that runs on Node 24 (the Node 20 ones are deprecated)
NODE24_MAJORS = {"actions/checkout": 5, "actions/setup-python": 6, "actions/cache": 5,
                 "actions/cache/restore": 5, "actions/cache/save": 5, "actions/upload-artifact": 6,
                 "actions/download-artifact": 7, "actions/upload-pages-artifact": 4,
                 "actions/deploy-pages": 5}  # fmt: skip


def _workflows() -> dict[str, tuple[str, dict]]:
    folder = ROOT / ".github" / "workflows"
    return {p.name: (p.read_text(encoding="utf-8"), yaml.safe_load(p.read_text(encoding="utf-8")))
            for p in sorted(folder.glob("*.yml"))}  # fmt: skip


def test_actions_pinned_at_current_majors():
    """Every action of every workflow: a full commit SHA, the version in the comment, a major that
    runs on Node 24."""
    seen = set()
    for name, (text, _) in _workflows().items():
        for line in text.splitlines():
            match = re.search(r"uses: ([\w./-]+)@([0-9a-f]+) # v(\d+)\.\d+\.\d+$", line)
            if "uses:" in line:
                assert match and len(match.group(2)) == 40, f"{name}: not pinned by SHA: {line.strip()}"
                action, major = match.group(1), int(match.group(3))
                seen.add(action)
                assert major >= NODE24_MAJORS.get(action, 0), f"{name}: {action} v{major} is an old major"
    assert {"actions/checkout", "actions/setup-python", "pypa/gh-action-pypi-publish",
            "lycheeverse/lychee-action"} <= seen  # fmt: skip


def test_ci_caches():
    """pip's cache, and a model-cache key that hashes what defines the models (the corpus too)."""
    text, workflow = _workflows()["book.yml"]
    steps = workflow["jobs"]["check"]["steps"]
    (setup,) = [s for s in steps if s.get("uses", "").startswith("actions/setup-python@")]
    assert setup["with"]["cache"] == "pip"
    assert "requirements.txt" in setup["with"]["cache-dependency-path"]
    (models,) = [s for s in steps if s.get("id") == "models"]
    key = models["with"]["key"]
    for pattern in ("'posenc/**/*.py'", "'posenc/lab/corpus/*.tar.xz'", "'requirements.txt'"):
        assert pattern in key, pattern
    assert ".gz'" not in key.replace(".tar.xz", ""), "no pattern that matches no file"
    import glob

    assert glob.glob(str(ROOT / "posenc" / "lab" / "corpus" / "*.tar.xz")), "the corpus pattern matches"
    links_key = _workflows()["links.yml"][0]
    assert key in links_key, "the link check restores the same model cache"


def test_dependabot_and_link_check():
    dependabot = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text(encoding="utf-8"))
    ecosystems = {u["package-ecosystem"]: u for u in dependabot["updates"]}
    assert set(ecosystems) == {"github-actions", "pip"}
    assert all(u["directory"] == "/" and u["schedule"]["interval"] == "weekly" for u in ecosystems.values())
    _, links = _workflows()["links.yml"]
    triggers = links[True] if True in links else links["on"]
    (cron,) = [s["cron"] for s in triggers["schedule"]]
    assert len(cron.split()) == 5 and cron.split()[4] not in ("*",), "once a week"
    runs = [s.get("run", "") for s in links["jobs"]["links"]["steps"]]
    assert any("bash scripts/build_site.sh" in r for r in runs)
    uses = [s.get("uses", "") for s in links["jobs"]["links"]["steps"]]
    assert any(u.startswith("lycheeverse/lychee-action@") for u in uses)
