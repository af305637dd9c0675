"""Sphinx extension (a ``local_extensions`` entry of both ``_config.yml`` files): what search
engines and link previews read in each page's ``<head>``, derived from ``html.baseurl``.

* ``hreflang`` alternates: every page that exists in both editions links to itself and to its
  twin, ``<link rel="alternate" hreflang="en" ...>``, ``hreflang="zh-CN"`` and ``x-default`` (the
  English page). The English book's chapters are ``book/<name>``, the Chinese ones ``<name>``
  under ``zh/`` (the two books' layouts, as ``book/_static/lang-switch.js`` maps them); a page
  gets alternates only when the other edition has a source file for it.
* the Chinese edition's search: Sphinx splits Chinese text into words with jieba, whose own
  dictionary lacks many of the book's terms (外推 becomes 外 / 推, and one-character words are
  not indexed, so a search for 外推 found nothing). The terms of the Chinese glossary
  (``glossary.md``'s tables) and :data:`EXTRA_TERMS` go into a jieba user dictionary
  (``html_search_options["dict"]``), written next to the doctrees;
* the settings of sphinxext-opengraph (``ogp_site_url``, the social card ``ogp_image``),
  sphinx-notfound-page (``notfound_urls_prefix``, the 404 page's text in the edition's language)
  and sphinx-sitemap (one ``<loc>`` per page, no language folder added) follow from
  ``html_baseurl``, so ``scripts/set_repo.py`` keeps writing the address in one place. A value
  set in ``_config.yml`` wins.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

SHARED_PAGES = ("genindex", "search", "py-modindex")  # at the root of both editions
SOCIAL_CARD = "_static/social-card.png"  # drawn by scripts/make_social_card.py
SOURCE_SUFFIXES = (".md", ".ipynb", ".rst")

# words the Chinese chapters use that jieba's dictionary does not hold and the glossary's tables
# do not list on their own
EXTRA_TERMS = ("外推", "内插", "位置外推", "长度外推", "旋转角", "相对位置", "绝对位置", "注意力头",
               "上下文窗口", "微调", "词元")  # fmt: skip
_CJK = re.compile(r"^[\u3400-\u4dbf\u4e00-\u9fff]{2,}$")

NOT_FOUND = {
    "en": ("Page not found",
           "<h1>Page not found</h1><p>There is no page at this address. The book starts at "
           '<a href="{en}book/intro.html">its introduction</a>; the Chinese edition is at '
           '<a href="{zh}intro.html">中文版</a>.</p>'),
    "zh": ("页面不存在",
           "<h1>页面不存在</h1><p>这个地址没有页面。本书从<a href=\"{zh}intro.html\">前言</a>开始；"
           '英文版见 <a href="{en}book/intro.html">English edition</a>。</p>'),
}  # fmt: skip


def edition(language: str | None) -> str:
    """``"zh"`` for the Chinese edition (``language: zh_CN``), else ``"en"``."""
    return "zh" if (language or "").lower().startswith("zh") else "en"


def bases(html_baseurl: str, lang: str) -> tuple[str, str]:
    """The English and the Chinese site roots, from one edition's ``html_baseurl``."""
    base = html_baseurl.rstrip("/") + "/"
    if lang == "zh":
        if not base.endswith("/zh/"):
            raise ValueError(f"the Chinese edition's html.baseurl must end in zh/, got {html_baseurl!r}")
        return base[: -len("zh/")], base
    return base, base + "zh/"


def twin(pagename: str, lang: str) -> str | None:
    """The other edition's page name for ``pagename``, by the books' layouts."""
    if pagename in SHARED_PAGES:
        return pagename
    if lang == "en":
        return pagename[len("book/"):] if pagename.startswith("book/") and "/" not in pagename[5:] else None
    return None if "/" in pagename or pagename in ("404", "index") else "book/" + pagename


def _has_source(srcdir: Path, pagename: str) -> bool:
    return any((srcdir / f"{pagename}{suffix}").exists() for suffix in SOURCE_SUFFIXES)


def alternates(pagename: str, lang: str, en_base: str, zh_base: str, srcdir: Path) -> list[tuple[str, str]]:
    """``[(hreflang, url), ...]`` for a page of edition ``lang`` built from ``srcdir``: itself,
    its twin and ``x-default``; empty when the other edition has no such page."""
    other = twin(pagename, lang)
    if other is None:
        return []
    if other not in SHARED_PAGES:
        # the English book's root is the repository (its pages are book/<name>); the Chinese one's
        # is book/zh, two levels down
        other_src = srcdir / "book" / "zh" if lang == "en" else srcdir.parent.parent
        if not _has_source(other_src, other):
            return []
    en_page, zh_page = (pagename, other) if lang == "en" else (other, pagename)
    en_url, zh_url = f"{en_base}{en_page}.html", f"{zh_base}{zh_page}.html"
    return [("en", en_url), ("zh-CN", zh_url), ("x-default", en_url)]


def glossary_terms(glossary: Path) -> list[str]:
    """The Chinese terms of the glossary's tables (first column, split at 、 and ，), Chinese
    characters only, two or more of them, in order of first appearance."""
    terms: list[str] = []
    if not glossary.exists():
        return terms
    for line in glossary.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        first = line.strip("|").split("|")[0].strip()
        for part in re.split(r"[、，,/（）()\s]+", first):
            if _CJK.match(part) and part not in terms:
                terms.append(part)
    return terms


def write_search_dict(srcdir: Path, outdir: Path) -> Path:
    """A jieba user dictionary (one word a line; jieba picks a frequency that keeps each one whole)."""
    words = list(dict.fromkeys([*glossary_terms(srcdir / "glossary.md"), *EXTRA_TERMS]))
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "jieba-user-dict.txt"
    path.write_text("".join(f"{word}\n" for word in words), encoding="utf-8")
    return path


def _is_default(config: Any, name: str) -> bool:
    """True when ``_config.yml`` left ``name`` at its extension's default."""
    opt = config.values.get(name)
    default = opt.default if hasattr(opt, "default") else opt[0]
    return getattr(config, name) == default


def _config_inited(app: Any, config: Any) -> None:
    baseurl = config.html_baseurl
    if not baseurl:
        return
    lang = edition(config.language)
    en_base, zh_base = bases(baseurl, lang)
    own = en_base if lang == "en" else zh_base
    if _is_default(config, "ogp_site_url"):
        config.ogp_site_url = own
    if _is_default(config, "ogp_site_name"):  # else "Project name not set": Jupyter Book sets no project
        config.ogp_site_name = config.html_title or config.project
    if _is_default(config, "ogp_image"):
        config.ogp_image = own + SOCIAL_CARD
    if _is_default(config, "notfound_urls_prefix"):
        config.notfound_urls_prefix = urlparse(own).path or "/"
    if _is_default(config, "notfound_context"):
        title, body = NOT_FOUND[lang]
        config.notfound_context = {"title": title, "body": body.format(en=en_base, zh=zh_base)}
    if _is_default(config, "sitemap_url_scheme"):
        config.sitemap_url_scheme = "{link}"  # html_baseurl already holds the edition's folder
    if lang == "zh" and app is not None and "dict" not in (config.html_search_options or {}):
        path = write_search_dict(Path(app.srcdir), Path(app.doctreedir))
        config.html_search_options = {**(config.html_search_options or {}), "dict": str(path)}


def _page_context(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    baseurl = app.config.html_baseurl
    if not baseurl:
        return
    lang = edition(app.config.language)
    en_base, zh_base = bases(baseurl, lang)
    links = alternates(pagename, lang, en_base, zh_base, Path(app.srcdir))
    if links:
        tags = "".join(
            f'<link rel="alternate" hreflang="{code}" href="{html.escape(url, quote=True)}" />\n'
            for code, url in links
        )
        context["metatags"] = context.get("metatags", "") + tags


def setup(app: Any) -> dict[str, Any]:
    for ext in ("sphinxext.opengraph", "notfound.extension", "sphinx_sitemap"):
        app.setup_extension(ext)
    app.connect("config-inited", _config_inited)
    app.connect("html-page-context", _page_context)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
