#!/usr/bin/env python
"""Check that a release's version is written the same everywhere, before anything is tagged.

A release ``X.Y.Z`` is consistent when

* the tag (``--tag``, e.g. ``v0.3.0``; optional) is ``v`` + ``project.version`` of ``pyproject.toml``;
* every notebook's Colab bootstrap (``book/**/*.ipynb``, the first code cell) pins ``vX.Y.Z``
  and is ``scripts/set_repo.py``'s cell exactly (run ``python scripts/set_repo.py`` otherwise);
* ``CITATION.cff`` has ``version: X.Y.Z`` and a ``date-released``;
* ``CHANGELOG.md`` has a section ``## [X.Y.Z] - YYYY-MM-DD`` that is not empty, dated the same day
  as ``date-released``, and a link ``[X.Y.Z]: ...`` at the bottom.

Usage::

    python scripts/check_release.py                   # check; one line per problem, exit 1
    python scripts/check_release.py --tag v0.3.0      # also check the tag
    python scripts/check_release.py --notes notes.md  # and write the CHANGELOG section there
    python scripts/check_release.py --version         # print X.Y.Z and exit

The release workflow (``.github/workflows/release.yml``) runs it before it builds, tags or
publishes anything.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import set_repo  # noqa: E402  (scripts/set_repo.py: the bootstrap cell and the version)

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.compile(r"\d+\.\d+\.\d+")
REF_LINE = re.compile(r'^REPO, REF = "[^"]*", "([^"]*)"', re.MULTILINE)
SECTION = re.compile(r"^## \[(?P<version>[^\]]+)\](?P<rest>.*)$", re.MULTILINE)


def changelog_section(text: str, version: str) -> tuple[str | None, str] | None:
    """``(date, body)`` of the ``## [version] - date`` section of a changelog (``date`` is None when
    the heading has no ISO date), or None when there is no such section."""
    matches = list(SECTION.finditer(text))
    for i, match in enumerate(matches):
        if match.group("version") != version:
            continue
        date = re.fullmatch(r"\s+-\s+(\d{4}-\d{2}-\d{2})\s*", match.group("rest"))
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end():end]
        body = re.sub(r"^\[[^\]]+\]: \S+\s*$", "", body, flags=re.MULTILINE)  # the link list
        body = re.sub(r"^### [A-Za-z]+\s*\n(?=\s*(?:### |\Z))", "", body.strip() + "\n", flags=re.MULTILINE)
        return (date.group(1) if date else None), body.strip()
    return None


def _first_code_cell(path: Path) -> str:
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "code":
            src = cell["source"]
            return "".join(src) if isinstance(src, list) else src
    return ""


def check(root: Path = ROOT, tag: str | None = None) -> list[str]:
    """Every disagreement between the tag, ``pyproject.toml``, the notebooks, ``CITATION.cff`` and
    ``CHANGELOG.md``, one message each (empty: ready to release)."""
    problems: list[str] = []
    version = set_repo.package_version(root)
    if not VERSION.fullmatch(version):
        problems.append(f"pyproject.toml: version {version!r} is not X.Y.Z")
    if tag is not None and tag != f"v{version}":
        problems.append(f"tag {tag!r} != 'v' + pyproject.toml's version {version!r}")

    url = set_repo.config_url(root)
    canonical = set_repo.bootstrap_source(url, version)
    notebooks = set_repo.notebooks(root)
    if not notebooks:
        problems.append("no notebooks under book/")
    for path in notebooks:
        rel = path.relative_to(root)
        first = _first_code_cell(path)
        refs = REF_LINE.findall(first)
        if refs != [f"v{version}"]:
            problems.append(f"{rel}: the bootstrap pins {refs or 'nothing'}, not 'v{version}' "
                            "(run python scripts/set_repo.py)")  # fmt: skip
        elif first != canonical:
            problems.append(f"{rel}: the bootstrap is not scripts/set_repo.py's cell (run it)")

    cff_path = root / "CITATION.cff"
    cff = yaml.safe_load(cff_path.read_text(encoding="utf-8")) if cff_path.exists() else {}
    cff_date = cff.get("date-released")
    if str(cff.get("version")) != version:
        problems.append(f"CITATION.cff: version {cff.get('version')!r} != {version!r}")
    if isinstance(cff_date, dt.date):
        cff_date = cff_date.isoformat()
    if not cff_date or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(cff_date)):
        problems.append(f"CITATION.cff: date-released {cff_date!r} is not a YYYY-MM-DD date")

    changelog_path = root / "CHANGELOG.md"
    changelog = changelog_path.read_text(encoding="utf-8") if changelog_path.exists() else ""
    section = changelog_section(changelog, version)
    if section is None:
        problems.append(f"CHANGELOG.md: no section '## [{version}] - YYYY-MM-DD'")
    else:
        date, body = section
        if date is None:
            problems.append(f"CHANGELOG.md: the [{version}] heading has no date: ## [{version}] - YYYY-MM-DD")
        elif cff_date and date != str(cff_date):
            problems.append(f"CHANGELOG.md dates {version} {date}; CITATION.cff's date-released: {cff_date}")
        if not body:
            problems.append(f"CHANGELOG.md: the [{version}] section is empty")
        if not re.search(rf"^\[{re.escape(version)}\]: https://\S+$", changelog, re.MULTILINE):
            problems.append(f"CHANGELOG.md: no link '[{version}]: https://...' at the bottom")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", help="the release tag, e.g. v0.3.0 (default: not checked)")
    parser.add_argument("--notes", type=Path, help="write the CHANGELOG section (release notes) here")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    version = set_repo.package_version(args.root)
    if args.version:
        print(version)
        return 0
    problems = check(args.root, args.tag)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    if args.notes is not None:
        section = changelog_section((args.root / "CHANGELOG.md").read_text(encoding="utf-8"), version)
        assert section is not None
        args.notes.write_text(section[1] + "\n", encoding="utf-8")
    print(f"release {version}: tag, pyproject.toml, notebooks, CITATION.cff and CHANGELOG.md agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
