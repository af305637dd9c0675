"""What an explorable figure puts in a page: its HTML and JSON, plotly.js, the Sphinx extension.

:class:`Explorable` shows itself in a notebook (JupyterLab's plotly renderer, or HTML that loads
plotly.js from the CDN once per page) and on the site, where this module's Sphinx extension
(``setup``, listed in ``_config.yml`` as ``posenc.lab.explore``, which re-exports it) adds
plotly.js to the pages that hold an explorable. :mod:`posenc.lab.explore` re-exports the public
names.
"""

from __future__ import annotations

import html
import importlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Explorable", "PLOTLYJS_ENV", "plotlyjs_version", "plotlyjs_url", "plotlyjs_file",
           "setup", "dedupe_scripts"]

PLOTLYJS_ENV = "POSENC_PLOTLYJS"
"""Environment variable of the site build: ``cdn`` (the default, the published site) or
``local`` (copy ``plotly.min.js`` from the installed package into the build: no network)."""


def plotlyjs_version() -> str:
    """The version of plotly.js that the installed ``plotly`` package bundles."""
    return str(importlib.import_module("plotly.offline").get_plotlyjs_version())


def plotlyjs_url() -> str:
    """The CDN address of the plotly.js that the installed ``plotly`` package bundles."""
    return f"https://cdn.plot.ly/plotly-{plotlyjs_version()}.min.js"


def plotlyjs_file() -> Path:
    """The installed package's ``plotly.min.js`` (what the offline build and the tests serve)."""
    package = Path(str(importlib.import_module("plotly").__file__)).parent
    return package / "package_data" / "plotly.min.js"


@dataclass
class Explorable:
    """A Plotly figure (``.figure``, a dict: data, layout, config) that shows itself in a
    notebook and on the site. ``.values`` are the control's values, one per frame."""

    name: str
    figure: dict[str, Any]
    values: list[Any] = field(default_factory=list)
    height: int = 460

    def to_json(self) -> str:
        return json.dumps(self.figure, ensure_ascii=False, separators=(",", ":"))

    def to_html(self) -> str:
        """A ``<div>``, the figure as JSON and a loader: Plotly from the page (the site), or from
        the CDN, loaded once per page (Colab, the classic notebook)."""
        div_id = "posenc-explorable-" + re.sub(r"[^A-Za-z0-9_-]", "-", self.name)
        spec = self.to_json().replace("</", "<\\/")  # never close the script tag early
        label = html.escape(self.figure["layout"]["meta"]["posenc"]["label"], quote=True)
        return f"""<div class="posenc-explorable" id="{div_id}" data-explorable="{html.escape(self.name)}"
 role="figure" aria-label="{label}" style="width:100%;min-height:{self.height}px"></div>
<script type="application/json" id="{div_id}-spec">{spec}</script>
<script>
(function () {{
  var id = "{div_id}";
  function draw() {{
    var spec = JSON.parse(document.getElementById(id + "-spec").textContent);
    window.Plotly.newPlot(id, spec.data, spec.layout, spec.config);
  }}
  if (window.Plotly) {{ draw(); return; }}
  var s = document.getElementById("posenc-plotlyjs");
  if (!s) {{
    s = document.createElement("script");
    s.id = "posenc-plotlyjs"; s.charset = "utf-8"; s.src = "{plotlyjs_url()}";
    document.head.appendChild(s);
  }}
  s.addEventListener("load", draw);
}})();
</script>"""

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {
            "application/vnd.plotly.v1+json": self.figure,
            "text/html": self.to_html(),
            "text/plain": f"<explorable figure {self.name!r}: {len(self.values)} settings>",
        }


# --- the Sphinx extension: Plotly's JavaScript once per page that holds an explorable ---------

def _page_has_explorable(context: Mapping[str, Any]) -> bool:
    return 'class="posenc-explorable"' in str(context.get("body", ""))


def setup(app: Any) -> dict[str, Any]:
    """Sphinx extension (``sphinx.extra_extensions: [posenc.lab.explore]`` in ``_config.yml``):
    adds plotly.js to the ``<head>`` of every page that holds an explorable, and to no other
    page. From the CDN by default (``posenc_plotlyjs = "cdn"``, the published site); ``"local"``
    (or ``POSENC_PLOTLYJS=local`` in the environment) copies the installed package's
    ``plotly.min.js`` into the build's ``_static/`` instead, for a build that works offline."""
    app.add_config_value("posenc_plotlyjs", os.environ.get(PLOTLYJS_ENV, "cdn"), "html")

    def mode() -> str:
        value = str(os.environ.get(PLOTLYJS_ENV) or app.config.posenc_plotlyjs)
        if value not in ("cdn", "local"):
            raise ValueError(f"{PLOTLYJS_ENV} / posenc_plotlyjs must be 'cdn' or 'local', got "
                             f"{value!r}")
        return value

    def add_plotly(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
        if doctree is None or not _page_has_explorable(context):
            return
        if mode() == "local":
            app.add_js_file("plotly.min.js", charset="utf-8")
        else:
            app.add_js_file(plotlyjs_url(), charset="utf-8")

    def copy_local(app: Any, exception: Exception | None) -> None:
        if exception is None and app.builder.format == "html" and mode() == "local":
            target = Path(app.outdir) / "_static" / "plotly.min.js"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(plotlyjs_file(), target)

    app.connect("html-page-context", add_plotly)
    app.connect("html-page-context", dedupe_scripts, priority=900)  # after every other handler
    app.connect("build-finished", copy_local)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


def _script_key(script: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    attributes = getattr(script, "attributes", None) or {}
    filename = getattr(script, "filename", script) or ""  # an inline script: None or ""
    return (str(filename),
            tuple(sorted((str(k), str(v)) for k, v in attributes.items())))


def dedupe_scripts(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Each script once per page. Jupyter Book 1's extensions register sphinx-thebe's and
    sphinx-togglebutton's inline scripts twice (the same text, once with ``None`` and once with
    ``""`` as the file name), and thebe's declares ``const THEBE_JS_URL``: the second copy threw
    "Identifier 'THEBE_JS_URL' has already been declared" on every page. Pages get a list
    without the repeats (the builder's own list, restored after each page, is left alone)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    unique = []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    if len(unique) < len(scripts):
        context["script_files"] = unique
