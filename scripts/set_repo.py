#!/usr/bin/env python
"""Propagate the repository URL from ``_config.yml`` to every place that repeats it.

The book's repository address is written down once, as ``repository.url`` in ``_config.yml``
(for example ``https://github.com/posenc-book/posenc-book``). This script copies it into

* the Colab bootstrap cell of every ``book/**/*.ipynb``: the first code cell, rewritten whole
  from :func:`bootstrap_source` (repository URL and the release tag ``v<version>`` from
  ``pyproject.toml``; the default branch when that tag cannot be installed), tagged
  ``remove-cell`` so the HTML never shows it;
* ``README.md``, ``CHANGELOG.md``, ``CITATION.cff``, the ``[project.urls]`` of ``pyproject.toml``
  and the Markdown pages of the book (``book/**/*.md``): links to the repository
  (``https://github.com/<owner>/<repo>``, also inside ``git+https://...`` and Colab/raw links)
  and to the published site (``https://<owner>.github.io/<repo>/``);
* ``html.baseurl`` in ``_config.yml`` (the site's address, for canonical links), when present.

Usage::

    python scripts/set_repo.py            # rewrite the files in place
    python scripts/set_repo.py --check    # change nothing; exit 1 if a file is out of date
    python scripts/set_repo.py --from https://github.com/old/name   # also replace this address

The addresses to replace in Markdown files are the ones the notebooks currently carry (plus any
``--from``), so the usual workflow is: edit ``_config.yml``, run this script once.
Notebooks are rewritten with ``nbformat``-style JSON (indent 1, as Jupyter writes them).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# The bootstrap line as it appears inside a notebook's JSON text: "REPO = \"https://...\"...
_NB_REPO = re.compile(r'(REPO(?:, REF)? = \\")([^"\\]*)(\\")')
# The same line as Python source (what a cell's source joins to).
SOURCE_REPO = re.compile(r'^REPO(?:, REF)? = "([^"]*)"', re.MULTILINE)
_GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")


def config_url(root: Path = ROOT) -> str:
    """Return ``repository.url`` from ``_config.yml`` (without a trailing slash)."""
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    try:
        url = config["repository"]["url"]
    except (KeyError, TypeError):
        raise SystemExit("_config.yml has no repository.url") from None
    url = str(url).rstrip("/")
    if not _GITHUB.match(url):
        raise SystemExit(f"repository.url must look like https://github.com/<owner>/<repo>, got {url!r}")
    return url


def owner_repo(url: str) -> tuple[str, str]:
    """Split ``https://github.com/<owner>/<repo>`` into ``(owner, repo)``."""
    match = _GITHUB.match(url.rstrip("/"))
    if not match:
        raise ValueError(f"not a GitHub repository URL: {url!r}")
    return match.group(1), match.group(2)


def site_url(url: str) -> str:
    """The GitHub Pages address of the book: ``https://<owner>.github.io/<repo>/``."""
    owner, repo = owner_repo(url)
    return f"https://{owner.lower()}.github.io/{repo}/"


def notebooks(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


# text files outside book/ that carry the repository's or the site's address
_TEXT_FILES = ("README.md", "CHANGELOG.md", "CITATION.cff", "pyproject.toml")


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md, the changelog, the citation file, pyproject's URLs and the book's Markdown pages."""
    pages = sorted(p for p in (root / "book").rglob("*.md") if ".ipynb_checkpoints" not in p.parts)
    return [root / name for name in _TEXT_FILES if (root / name).exists()] + pages


def package_version(root: Path = ROOT) -> str:
    """``project.version`` from ``pyproject.toml``."""
    with open(root / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


EXTRAS = "lab,plot,hf"  # what the pages import: posenc.lab (tqdm, filelock, ...), matplotlib,
# and transformers >= 5.24 (chapter 10 and the recipes run it; Colab's own may be older)


def bootstrap_source(url: str, version: str) -> str:
    """The one Colab bootstrap cell, identical in every notebook.

    In Colab it installs ``posenc[lab,plot,hf]`` from the release tag ``v<version>``; when that
    install fails (the tag does not exist yet, or the release is missing) it prints one line and
    installs the default branch instead. Anywhere else (nbval, the site build) it does nothing.
    The pinned attempt's own output is kept back, so a reader sees either nothing or that one line
    (and the fallback's output, should the fallback fail too). ``tests/test_bootstrap.py`` runs
    this cell against a local clone without tags.
    """
    return (
        "# Colab bootstrap (written by scripts/set_repo.py): installs posenc in Colab only.\n"
        "import subprocess, sys  # noqa: E401\n"
        "\n"
        f'REPO, REF = "{url}", "v{version}"\n'
        'if "google.colab" in sys.modules:\n'
        '    pip = [sys.executable, "-m", "pip", "install", "-q"]\n'
        f'    pkg = "posenc[{EXTRAS}] @ git+" + REPO\n'
        '    if subprocess.run(pip + [f"{pkg}@{REF}"], capture_output=True).returncode:\n'
        '        print(f"could not install posenc {REF}: installing the default branch instead")\n'
        '        subprocess.run(pip + [pkg], check=True)'
    )


def bootstrap_cell(url: str, version: str) -> dict:
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {"tags": ["remove-cell"]},
        "outputs": [],
        "source": bootstrap_source(url, version).splitlines(keepends=True),
    }


def rewrite_bootstrap(text: str, url: str, version: str) -> str:
    """Replace the first code cell of a notebook (JSON text) by the canonical bootstrap."""
    nb = json.loads(text)
    cell = bootstrap_cell(url, version)
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] == "code":
            if "REPO" in "".join(c["source"]):
                if "id" in c:
                    cell = dict(sorted({"id": c["id"], **cell}.items()))  # nbstripout's key order
                nb["cells"][i] = cell
            else:  # no bootstrap yet: insert one before the first code cell
                nb["cells"].insert(i, cell)
            break
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def notebook_repos(path: Path) -> list[str]:
    """Every ``REPO = "..."`` value in a notebook (as stored: JSON-escaped text)."""
    return [m.group(2) for m in _NB_REPO.finditer(path.read_text(encoding="utf-8"))]


def rewrite_notebook(text: str, url: str) -> str:
    return _NB_REPO.sub(lambda m: m.group(1) + url + m.group(3), text)


def rewrite_markdown(text: str, old_urls: set[str], url: str) -> str:
    """Replace every repository/site address derived from ``old_urls`` by the one of ``url``."""
    new_owner, new_repo = owner_repo(url)
    for old in sorted(old_urls):
        try:
            owner, repo = owner_repo(old)
        except ValueError:
            continue
        end = r"(?![A-Za-z0-9_-])"  # do not match a longer repository name
        o, r = re.escape(owner), re.escape(repo)
        text = re.sub(rf"https://github\.com/{o}/{r}(?:\.git)?{end}", url, text)
        site = rf"https://{o}\.github\.io/{r}(?:/|{end})"  # the slash, if any, is site_url's
        text = re.sub(site, site_url(url), text, flags=re.IGNORECASE)
        text = re.sub(
            rf"colab\.research\.google\.com/github/{o}/{r}{end}",
            f"colab.research.google.com/github/{new_owner}/{new_repo}",
            text,
        )
        text = re.sub(
            rf"raw\.githubusercontent\.com/{o}/{r}{end}",
            f"raw.githubusercontent.com/{new_owner}/{new_repo}",
            text,
        )
    return text


_BASEURL = re.compile(r"^(html:\n(?:[ \t]+.*\n|\n)*?[ \t]+baseurl:[ \t]*)(\S+)", re.MULTILINE)


_REPO_URL = re.compile(r"^(repository:\n(?:[ \t]+.*\n|\n)*?[ \t]+url:[ \t]*)(\S+)", re.MULTILINE)


def rewrite_baseurl(config_text: str, url: str, subpath: str = "") -> str:
    """Set ``html.baseurl`` in ``_config.yml`` text to the site of ``url`` (comments kept);
    ``subpath`` for an edition built into a folder of the site (``"zh/"``)."""
    return _BASEURL.sub(lambda m: m.group(1) + site_url(url) + subpath, config_text, count=1)


def rewrite_repo_url(config_text: str, url: str) -> str:
    """Set ``repository.url`` (the Chinese edition's config repeats the root's)."""
    return _REPO_URL.sub(lambda m: m.group(1) + url, config_text, count=1)


def plan(root: Path = ROOT, extra_old: tuple[str, ...] = ()) -> dict[Path, str]:
    """Return ``{path: new_text}`` for every file whose text would change."""
    url = config_url(root)
    version = package_version(root)
    changes: dict[Path, str] = {}
    old_urls = {u.rstrip("/") for u in extra_old}
    config = root / "_config.yml"
    text = config.read_text(encoding="utf-8")
    new = rewrite_baseurl(text, url)
    if new != text:
        changes[config] = new
    zh_config = root / "book" / "zh" / "_config.yml"
    if zh_config.exists():
        text = zh_config.read_text(encoding="utf-8")
        new = rewrite_repo_url(rewrite_baseurl(text, url, "zh/"), url)
        if new != text:
            changes[zh_config] = new
    for nb in notebooks(root):
        old_urls.update(u.rstrip("/") for u in notebook_repos(nb))
        text = nb.read_text(encoding="utf-8")
        new = rewrite_bootstrap(text, url, version)
        if new != text:
            changes[nb] = new
    old_urls.discard(url)
    if old_urls:
        for page in markdown_files(root):
            text = page.read_text(encoding="utf-8")
            new = rewrite_markdown(text, old_urls, url)
            if new != text:
                changes[page] = new
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report, do not write; exit 1 if stale")
    parser.add_argument(
        "--from",
        dest="old",
        action="append",
        default=[],
        metavar="URL",
        help="an old repository URL to replace in Markdown files (repeatable)",
    )
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    url = config_url(args.root)
    changes = plan(args.root, tuple(args.old))
    for path in changes:
        rel = path.relative_to(args.root)
        print(f"{'stale' if args.check else 'updated'}: {rel}")
        if not args.check:
            path.write_text(changes[path], encoding="utf-8")
    if not changes:
        print(f"up to date: {url} (site {site_url(url)})")
    return 1 if (args.check and changes) else 0


if __name__ == "__main__":
    sys.exit(main())
