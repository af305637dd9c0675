#!/usr/bin/env python
"""Check what search engines, link previews and the search box get from the built site.

Run after ``bash scripts/build_site.sh`` (``.ci/run`` does)::

    python scripts/check_site_meta.py          # _build/html (English) and _build/html/zh (中文)

One line per problem, ``<file>: <what>``; exit 1 when there is any. For each edition:

* ``sitemap.xml`` lists every page of the edition, each under the edition's ``html.baseurl``
  (``_config.yml``, ``book/zh/_config.yml``), and nothing of the other edition;
* every page with a twin carries ``hreflang`` alternates ``en``, ``zh-CN`` and ``x-default``
  (``scripts/site_meta.py``), the twin exists in the built site and links back;
* OpenGraph: ``og:title``, ``og:url`` under the base URL and ``og:image``, the social card, which
  exists in the build;
* ``404.html`` exists and its links start with the site's path (they work from any folder);
* the footer names the licences (CC BY 4.0, MIT);
* the search index of the Chinese edition holds Chinese words (``旋转``, ``外推``: jieba split the
  text), and the English one holds ``rope``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlparse

import yaml
from bs4 import BeautifulSoup, Tag

ROOT = Path(__file__).resolve().parents[1]
SEARCH_WORDS = {"en": ("rope",), "zh": ("旋转", "外推")}  # English terms are stems
_SKIP_DIRS = {"_static", "_sources", "_images", "_modules", "_downloads", "zh"}
_NOT_PAGES = {"genindex.html", "search.html", "py-modindex.html", "404.html"}
SITEMAP_NS = "{http://www.sitemaps.org/schemas/sitemap/0.9}"


def baseurl(config: Path) -> str:
    """``html.baseurl`` of a Jupyter Book config, with one trailing slash."""
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    return str(data["html"]["baseurl"]).rstrip("/") + "/"


def pages(edition_dir: Path) -> list[Path]:
    """The reader's pages of one edition (not the generated ones, not the other edition's,
    not the English root's redirect ``index.html``)."""
    found = []
    for path in sorted(edition_dir.rglob("*.html")):
        rel = path.relative_to(edition_dir)
        if _SKIP_DIRS & set(rel.parts[:-1]) or rel.name in _NOT_PAGES:
            continue
        text = path.read_text(encoding="utf-8")
        if rel.as_posix() == "index.html" and 'http-equiv="Refresh"' in text.replace("refresh", "Refresh"):
            continue  # jupyter-book's redirect to the root page
        found.append(path)
    return found


def search_terms(searchindex: Path) -> set[str]:
    """The words of a Sphinx ``searchindex.js`` (``Search.setIndex({...})``)."""
    text = searchindex.read_text(encoding="utf-8")
    match = re.search(r"Search\.setIndex\((.*)\)\s*;?\s*$", text, re.DOTALL)
    if not match:
        raise ValueError(f"{searchindex}: not a Sphinx search index")
    data = json.loads(match.group(1))
    return set(data.get("terms", {})) | set(data.get("titleterms", {}))


def _url_to_file(url: str, bases: dict[str, tuple[str, Path]]) -> Path | None:
    for base, folder in bases.values():
        if url.startswith(base):
            return folder / url[len(base):]
    return None


def check_edition(lang: str, folder: Path, bases: dict[str, tuple[str, Path]]) -> list[str]:
    """Problems of one edition; ``bases`` maps ``"en"``/``"zh"`` to (base URL, built folder)."""
    base = bases[lang][0]
    other_base = bases["zh" if lang == "en" else "en"][0]
    problems: list[str] = []
    rel = {p: p.relative_to(folder).as_posix() for p in pages(folder)}
    if not rel:
        return [f"{folder}: no pages (build the site first?)"]

    sitemap = folder / "sitemap.xml"
    if not sitemap.exists():
        problems.append(f"{sitemap}: missing")
    else:
        locs = [(el.text or "").strip() for el in ET.parse(sitemap).getroot().iter(f"{SITEMAP_NS}loc")]
        for loc in locs:
            if not loc.startswith(base) or (other_base.startswith(base) and loc.startswith(other_base)):
                problems.append(f"{sitemap}: {loc} is not a page of this edition (base {base})")
        for name in rel.values():
            if base + name not in locs:
                problems.append(f"{sitemap}: does not list {base + name}")

    for path, name in rel.items():
        soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
        head = soup.head if isinstance(soup.head, Tag) else soup
        alts = {str(link.get("hreflang")): str(link.get("href"))
                for link in head.find_all("link", rel="alternate") if link.get("hreflang")}  # fmt: skip
        where = f"{path}"
        if alts:
            if set(alts) != {"en", "zh-CN", "x-default"}:
                problems.append(f"{where}: hreflang alternates {sorted(alts)}, want en, zh-CN, x-default")
            own = alts.get("en" if lang == "en" else "zh-CN")
            if own != base + name:
                problems.append(f"{where}: its own hreflang link is {own}, not {base + name}")
            if alts.get("x-default") != alts.get("en"):
                problems.append(f"{where}: x-default is not the English page")
            twin_url = alts.get("zh-CN" if lang == "en" else "en", "")
            twin = _url_to_file(twin_url, bases)
            if twin is None or not twin.exists():
                problems.append(f"{where}: the twin {twin_url} is not in the built site")
            else:
                back = BeautifulSoup(twin.read_text(encoding="utf-8"), "html.parser")
                if not back.find("link", rel="alternate", href=base + name):
                    problems.append(f"{where}: the twin {twin_url} does not link back")
        elif not name.startswith("_"):
            problems.append(f"{where}: no hreflang alternates")

        og = {str(m.get("property")): str(m.get("content")) for m in head.find_all("meta", property=True)}
        for key in ("og:title", "og:url", "og:image"):
            if not og.get(key):
                problems.append(f"{where}: no {key}")
        if og.get("og:url") and not og["og:url"].startswith(base):
            problems.append(f"{where}: og:url {og['og:url']} is not under {base}")
        image = og.get("og:image", "")
        if image:
            local = _url_to_file(image, bases)
            if local is None or not local.exists():
                problems.append(f"{where}: og:image {image} is not in the built site")

        footer = " ".join(f.get_text(" ") for f in soup.find_all("footer"))
        if "CC BY 4.0" not in footer or "MIT" not in footer:
            problems.append(f"{where}: the footer does not name the licences (CC BY 4.0, MIT)")

    not_found = folder / "404.html"
    if not not_found.exists():
        problems.append(f"{not_found}: missing")
    else:
        prefix = urlparse(base).path
        soup = BeautifulSoup(not_found.read_text(encoding="utf-8"), "html.parser")
        for tag in soup.find_all(["link", "script"]):
            ref = str(tag.get("href") or tag.get("src") or "")
            if "_static/" in ref and not (ref.startswith(prefix) or ref.startswith("http")):
                problems.append(f"{not_found}: {ref} does not start with {prefix}")
                break

    index = folder / "searchindex.js"
    if not index.exists():
        problems.append(f"{index}: missing")
    else:
        terms = search_terms(index)
        for word in SEARCH_WORDS[lang]:
            if word not in terms:
                problems.append(f"{index}: the search index has no {word!r}")
    return problems


def check(html_dir: Path, en_base: str, zh_base: str) -> list[str]:
    bases = {"en": (en_base, html_dir), "zh": (zh_base, html_dir / "zh")}
    problems = check_edition("en", html_dir, bases)
    if (html_dir / "zh").is_dir():
        problems += check_edition("zh", html_dir / "zh", bases)
    else:
        problems.append(f"{html_dir / 'zh'}: the Chinese edition is not built")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html", help="the built site")
    parser.add_argument("--root", type=Path, default=ROOT, help="where _config.yml and book/zh/ are")
    args = parser.parse_args(argv)
    if not args.html.is_dir():
        parser.error(f"--html {args.html} does not exist (build the site first)")
    en_base = baseurl(args.root / "_config.yml")
    zh_base = baseurl(args.root / "book" / "zh" / "_config.yml")
    problems = check(args.html, en_base, zh_base)
    for problem in problems:
        print(problem)
    print(f"site meta check: {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
