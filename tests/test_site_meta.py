"""The site is found, searched and shared: ``scripts/site_meta.py`` (the Sphinx extension that
writes the ``hreflang`` alternates and derives the sitemap/OpenGraph/404 settings from
``html.baseurl``) and ``scripts/check_site_meta.py`` (the check of the built site).

The check runs on a tiny fake site here (one that passes, and the same with each thing broken);
``.ci/run`` runs it on the real build. The last tests read the real build when there is one
(``bash scripts/build_site.sh``) and skip otherwise: the Chinese search index holds 旋转 and 外推.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _scripts import load_script

pytest.importorskip("bs4")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
EN = "https://o.github.io/r/"
ZH = "https://o.github.io/r/zh/"


def _meta():
    return load_script("site_meta")


def _check():
    return load_script("check_site_meta")


# --- the extension --------------------------------------------------------------------------


def test_bases_and_twins():
    meta = _meta()
    assert meta.bases(EN, "en") == (EN, ZH)
    assert meta.bases(ZH, "zh") == (EN, ZH)
    assert meta.bases("https://o.github.io/r", "en") == (EN, ZH)
    with pytest.raises(ValueError, match="must end in zh/"):
        meta.bases(EN, "zh")
    assert meta.edition("zh_CN") == "zh" and meta.edition(None) == "en" and meta.edition("en") == "en"
    assert meta.twin("book/04_rope", "en") == "04_rope"
    assert meta.twin("04_rope", "zh") == "book/04_rope"
    assert meta.twin("genindex", "en") == "genindex" and meta.twin("search", "zh") == "search"
    assert meta.twin("_modules/posenc/rope", "en") is None
    assert meta.twin("404", "zh") is None


def test_alternates_need_the_twin_source(tmp_path: Path):
    meta = _meta()
    (tmp_path / "book" / "zh").mkdir(parents=True)
    (tmp_path / "book" / "04_rope.ipynb").write_text("{}")
    (tmp_path / "book" / "zh" / "04_rope.ipynb").write_text("{}")
    (tmp_path / "book" / "only_en.md").write_text("x")
    want = [("en", EN + "book/04_rope.html"), ("zh-CN", ZH + "04_rope.html"),
            ("x-default", EN + "book/04_rope.html")]  # fmt: skip
    assert meta.alternates("book/04_rope", "en", EN, ZH, tmp_path) == want
    assert meta.alternates("04_rope", "zh", EN, ZH, tmp_path / "book" / "zh") == want
    assert meta.alternates("book/only_en", "en", EN, ZH, tmp_path) == [], "no twin, no alternates"


class _Opt:
    def __init__(self, default):
        self.default = default


class _Config:
    """The attributes of a Sphinx config that the extension reads and writes."""

    def __init__(self, **values):
        defaults = {"ogp_site_url": "", "ogp_image": None, "notfound_urls_prefix": "/en/latest/",
                    "notfound_context": {"title": "Page not found", "body": "x"},
                    "sitemap_url_scheme": "{lang}{version}{link}", "ogp_site_name": None}  # fmt: skip
        self.values = {k: _Opt(v) for k, v in defaults.items()}
        for key, value in {**defaults, "language": None, "html_title": "The Book", "project": "p",
                           **values}.items():
            setattr(self, key, value)


@pytest.mark.parametrize(("lang", "base", "prefix"), [(None, EN, "/r/"), ("zh_CN", ZH, "/r/zh/")])
def test_settings_follow_the_baseurl(lang, base, prefix):
    config = _Config(html_baseurl=base, language=lang)
    _meta()._config_inited(None, config)
    assert config.ogp_site_url == base
    assert config.ogp_site_name == "The Book"
    assert config.ogp_image == base + "_static/social-card.png"
    assert config.notfound_urls_prefix == prefix
    assert config.sitemap_url_scheme == "{link}"
    assert f'href="{EN}book/intro.html"' in config.notfound_context["body"]
    assert f'href="{ZH}intro.html"' in config.notfound_context["body"]
    assert config.notfound_context["title"] == ("页面不存在" if lang else "Page not found")


def test_settings_from_the_config_win():
    config = _Config(html_baseurl=EN, ogp_image="https://x.example/card.png", notfound_urls_prefix="/")
    _meta()._config_inited(None, config)
    assert config.ogp_image == "https://x.example/card.png" and config.notfound_urls_prefix == "/"


def test_both_configs_load_the_extensions():
    configs = ((ROOT / "_config.yml", "scripts"), (ROOT / "book" / "zh" / "_config.yml", "../../scripts"))
    for path, local in configs:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        sphinx = config["sphinx"]
        for ext in ("sphinx_sitemap", "sphinxext.opengraph", "notfound.extension"):
            assert ext in sphinx["extra_extensions"], (path.name, ext)
        assert sphinx["local_extensions"]["site_meta"] == local
        footer = config["html"]["extra_footer"]
        assert "CC BY 4.0" in footer and "MIT" in footer, path
        assert sphinx["config"]["ogp_social_cards"] == {"enable": False}
    assert (ROOT / "book" / "_static" / "social-card.png").read_bytes().startswith(b"\x89PNG")
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    assert text.count("html_static_path:") == 1, "one html_static_path key"


def test_social_card_size():
    image = pytest.importorskip("PIL.Image")
    with image.open(ROOT / "book" / "_static" / "social-card.png") as im:
        assert im.size == (1200, 630)


# --- the check of the built site ------------------------------------------------------------


def _page(lang: str, name: str, twin: str, *, footer: str = "CC BY 4.0 · MIT") -> str:
    base, other = (EN, ZH) if lang == "en" else (ZH, EN)
    en_url, zh_url = (base + name, other + twin) if lang == "en" else (other + twin, base + name)
    return f"""<html><head>
<meta property="og:title" content="t" /><meta property="og:url" content="{base + name}" />
<meta property="og:image" content="{base}_static/social-card.png" />
<link rel="alternate" hreflang="en" href="{en_url}" />
<link rel="alternate" hreflang="zh-CN" href="{zh_url}" />
<link rel="alternate" hreflang="x-default" href="{en_url}" />
</head><body><article>text</article><footer>{footer}</footer></body></html>"""


def _sitemap(base: str, names: list[str]) -> str:
    urls = "".join(f"<url><loc>{base}{n}</loc></url>" for n in names)
    return f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'


def _index(words: list[str]) -> str:
    return "Search.setIndex(" + json.dumps({"terms": {w: 0 for w in words}, "titleterms": {}}) + ")"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    html = tmp_path / "html"
    for folder, lang, name, twin, words in (
        (html, "en", "book/04_rope.html", "04_rope.html", ["rope"]),
        (html / "zh", "zh", "04_rope.html", "book/04_rope.html", ["旋转", "外推"]),
    ):
        (folder / Path(name).parent).mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(_page(lang, name, twin), encoding="utf-8")
        (folder / "_static").mkdir(exist_ok=True)
        (folder / "_static" / "social-card.png").write_bytes(b"\x89PNG")
        base = EN if lang == "en" else ZH
        (folder / "sitemap.xml").write_text(_sitemap(base, [name]), encoding="utf-8")
        prefix = "/r/" if lang == "en" else "/r/zh/"
        (folder / "404.html").write_text(f'<link rel="stylesheet" href="{prefix}_static/x.css">')
        (folder / "searchindex.js").write_text(_index(words), encoding="utf-8")
    (html / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=book/intro.html" />')
    return html


def test_a_good_site_passes(site: Path):
    assert _check().check(site, EN, ZH) == []


def test_search_terms(tmp_path: Path):
    path = tmp_path / "searchindex.js"
    path.write_text(_index(["旋转", "rope"]), encoding="utf-8")
    assert _check().search_terms(path) == {"旋转", "rope"}
    path.write_text("var x = 1;")
    with pytest.raises(ValueError, match="not a Sphinx search index"):
        _check().search_terms(path)


def _break(site: Path, rel: str, old: str, new: str) -> None:
    path = site / rel
    text = path.read_text(encoding="utf-8")
    assert old in text, (rel, old)
    path.write_text(text.replace(old, new), encoding="utf-8")


@pytest.mark.parametrize(
    ("rel", "old", "new", "expected"),
    [
        ("zh/searchindex.js", '"\\u5916\\u63a8": 0', '"x": 0', "the search index has no '外推'"),
        ("sitemap.xml", "book/04_rope.html", "book/other.html", "does not list https://o.github.io/r/book/04_rope"),
        ("sitemap.xml", EN + "book/04_rope.html", ZH + "04_rope.html", "is not a page of this edition"),
        ("book/04_rope.html", 'hreflang="x-default"', 'hreflang="fr"', "hreflang alternates"),
        ("zh/04_rope.html", f'href="{EN}book/04_rope.html"', f'href="{EN}book/missing.html"',
         "is not in the built site"),
        ("book/04_rope.html", 'property="og:image"', 'property="og:x"', "no og:image"),
        ("book/04_rope.html", "CC BY 4.0", "", "the footer does not name the licences"),
        ("404.html", "/r/_static/", "_static/", "does not start with /r/"),
    ],
    ids=["zh-search", "sitemap-missing", "sitemap-other-edition", "hreflang", "twin-missing", "og-image",
         "footer", "404-prefix"],
)  # fmt: skip
def test_a_broken_site_fails(site: Path, rel: str, old: str, new: str, expected: str):
    _break(site, rel, old, new)
    problems = _check().check(site, EN, ZH)
    assert problems and any(expected in p for p in problems), problems


def test_missing_files(site: Path):
    (site / "zh" / "sitemap.xml").unlink()
    (site / "404.html").unlink()
    problems = _check().check(site, EN, ZH)
    assert any(p.endswith("zh/sitemap.xml: missing") for p in problems), problems
    assert any(p.endswith("/404.html: missing") for p in problems), problems


# --- the real build, when there is one ------------------------------------------------------

BUILT = ROOT / "_build" / "html"


@pytest.mark.skipif(not (BUILT / "zh" / "searchindex.js").exists(), reason="the site is not built")
def test_built_chinese_search_finds_chinese_words():
    terms = _check().search_terms(BUILT / "zh" / "searchindex.js")
    assert {"旋转", "外推"} <= terms


@pytest.mark.skipif(not (BUILT / "zh" / "sitemap.xml").exists(), reason="the site is not built")
def test_built_site_meta():
    check = _check()
    en, zh = check.baseurl(ROOT / "_config.yml"), check.baseurl(ROOT / "book" / "zh" / "_config.yml")
    problems = check.check(BUILT, en, zh)
    assert problems == []


def test_chinese_search_dictionary(tmp_path: Path):
    """The glossary's terms (and the extra ones) become a jieba user dictionary, and with it
    jieba keeps 外推 whole (its own dictionary cuts it into 外 / 推, which the index drops)."""
    meta = _meta()
    (tmp_path / "glossary.md").write_text(
        "# 术语\n\n| 中文 | English |\n|---|---|\n| 位置插值 | position interpolation |\n"
        "| 注意力分数、logits | attention score |\n| 长度泛化（外推） | length generalisation |\n",
        encoding="utf-8",
    )
    terms = meta.glossary_terms(tmp_path / "glossary.md")
    assert terms == ["中文", "位置插值", "注意力分数", "长度泛化", "外推"]
    path = meta.write_search_dict(tmp_path, tmp_path / "doctrees")
    words = path.read_text(encoding="utf-8").splitlines()
    assert words[:5] == terms and "长度外推" in words and len(words) == len(set(words))
    assert {"位置编码", "旋转位置编码"} <= set(meta.glossary_terms(ROOT / "book" / "zh" / "glossary.md"))
    jieba = pytest.importorskip("jieba")
    tokenizer = jieba.Tokenizer()
    assert "外推" not in tokenizer.lcut_for_search("模型的长度外推能力")
    tokenizer.load_userdict(str(path))
    assert "外推" in tokenizer.lcut_for_search("模型的长度外推能力")


def test_config_points_search_at_the_dictionary(tmp_path: Path):
    class App:
        srcdir = tmp_path
        doctreedir = tmp_path / ".doctrees"

    config = _Config(html_baseurl=ZH, language="zh_CN", html_search_options={})
    _meta()._config_inited(App(), config)
    assert Path(config.html_search_options["dict"]).is_file()
    config = _Config(html_baseurl=EN, language=None, html_search_options={})
    _meta()._config_inited(App(), config)
    assert config.html_search_options == {}, "English: no Chinese dictionary"
