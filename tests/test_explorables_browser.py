"""The explorable figures in a real browser, on the built site, both editions.

Headless chromium (Debian's ``chromium``, driven by Playwright with ``executable_path``; never
``playwright install``) opens every page of ``_build/html`` whose notebook holds an explorable
(``posenc.lab.explore``), in English and in Chinese, on a desktop and on a phone (touch), and

- operates every control (it taps each step of the slider; for a menu whose entries bring their
  own sliders, ``posenc.lab.explore_menu``, it picks each entry and taps each step of its slider)
  and reads the plotted data back from the page's Plotly graph div (``gd.data``): after each step
  the changing traces hold the values that posenc computes for that setting, computed here from
  posenc's public functions (:data:`EXPECTED`), not copied from the notebook;
- checks that the page logs no script error (uncaught exceptions, console errors);
- checks that the static figure is still there: ``<figure id="fig-<name>">`` with its image
  loaded and its caption (an explorable is named after its static twin's label);
- checks the budget: the explorables' HTML plus plotly.js as the CDN sends it (gzip) stay under
  4 MB per page.

The site is the one ``scripts/build_site.sh`` writes (the published pages: plotly.js from the
CDN); the test answers the CDN's request with the installed ``plotly`` package's own
``plotly.min.js`` (the same version), so it runs offline. It reuses ``_build/html`` when that is
newer than the notebooks and the explorable code; otherwise it SKIPS (the README's test command,
before any build) unless ``POSENC_BUILD_SITE=1``, which makes it build the site first (minutes).
With ``POSENC_REQUIRE_BROWSER=1`` (``.ci/run``, after its build) a skip is a failure instead:
no chromium, no Playwright or no fresh build.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import posenc

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
REQUIRE = os.environ.get("POSENC_REQUIRE_BROWSER") == "1"
BUILD = os.environ.get("POSENC_BUILD_SITE") == "1"
BUDGET = 4 * 1024 * 1024  # bytes per page: explorables + plotly.js


def _unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"POSENC_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


# --- what posenc computes for each explorable and setting (one function per explorable) --------
# Each takes the control's value and the x values the page plots, and returns the expected y of
# every changing trace, in order. An explorable with no entry here fails the test: add one.

def _ch03_offset(base: float, x: list[list[float]]) -> list[torch.Tensor]:
    out = []
    for xs, width in zip(x, (128, 32), strict=True):
        k = torch.tensor(xs, dtype=torch.float64)
        assert torch.equal(k, torch.arange(-600, 601, dtype=torch.float64))
        table = posenc.sinusoidal_table(1201, width, base=base, dtype=torch.float64)
        out.append(table @ table[600] / (width / 2))  # PE(600) . PE(600 + k) / f(0)
    return out


def _ch04_decay(base: float, x: list[list[float]]) -> list[torch.Tensor]:
    (xs,) = x
    distance = torch.tensor(xs, dtype=torch.float64)
    assert torch.equal(distance, distance.round()) and distance.min() >= 1
    assert distance.max() == 20000
    theta, _ = posenc.rope_inv_freq(128, base=base)
    # RoFormer's relative upper bound (1 / (d/2)) sum_j |sum_{l<j} e^{i x theta_l}|
    phase = torch.exp(1j * distance[:, None] * theta.double()[None, :])
    return [phase.cumsum(dim=1).abs().mean(dim=1)]


def _ch05_slopes(heads: float, x: list[list[float]]) -> list[torch.Tensor]:
    count = int(heads)
    for xs in x:  # the head indices 0..heads-1, for both traces
        assert torch.equal(torch.tensor(xs, dtype=torch.float64),
                           torch.arange(count, dtype=torch.float64))
    article = 2.0 ** -torch.arange(count, dtype=torch.float64)  # the article's 1 / 2**i
    return [posenc.alibi_slopes(count).double(), article]


def _ch05_heatmaps(head: float, x: list[list[float]]) -> list[torch.Tensor]:
    (xs,) = x  # a heatmap: the key positions n; the expected value is its z, [query, key]
    assert torch.equal(torch.tensor(xs, dtype=torch.float64),
                       torch.arange(32, dtype=torch.float64))
    return [posenc.alibi_bias(8, 32)[int(head)].double()]  # -inf (undrawn) above the diagonal


def _mrope_ids(grid: float | str, x: list[list[float]]) -> list[torch.Tensor]:
    """Chapter 9: the (t, h, w) ids of "three text tokens, <vision_start>, the image's tokens,
    <vision_end>, two text tokens", from posenc.mrope_position_ids for the image grid
    ``"1,h,w"`` (in patches, merged 2 x 2); the slots past the sequence's end are blank."""
    (xs,) = x  # a heatmap: the token slots; the expected value is its z, [t/h/w, slot]
    t, h, w = (int(v) for v in str(grid).split(","))
    image, start, end = 7, 5, 6  # token ids of <image>, <vision_start>, <vision_end>
    tokens = [101, 102, 103, start] + [image] * (t * h * w // 4) + [end, 104, 105]
    ids, _ = posenc.mrope_position_ids(torch.tensor([tokens]), torch.tensor([[t, h, w]]),
                                       image_token_id=image, vision_start_token_id=start)
    assert torch.equal(torch.tensor(xs, dtype=torch.float64),
                       torch.arange(len(xs), dtype=torch.float64))
    blank = torch.full((3, len(xs) - len(tokens)), float("-inf"), dtype=torch.float64)
    return [torch.cat([ids[:, 0].double(), blank], dim=1)]


def _ch07_rules(factor: float, x: list[list[float]]) -> list[torch.Tensor]:
    """New over original frequency of each of the 64 pairs (d_h = 128, base 10,000,
    L = 4096) against its wavelength, for PI, NTK, dynamic NTK at n = sL, YaRN, Llama 3 and
    LongRoPE with the chapter's made-up divisors 1 + (s - 1) (i / 63)^2, in that order."""
    d, base, L, s = 128, 10_000.0, 4096, float(factor)
    ell = posenc.rope_wavelengths(d, base=base, context_len=L).wavelength.double()
    for xs in x:  # every trace against the pairs' wavelengths
        torch.testing.assert_close(torch.tensor(xs, dtype=torch.float64), ell, rtol=1e-6,
                                   atol=0)
    plain, _ = posenc.rope_inv_freq(d, base=base)
    rho = 1 + (s - 1) * (torch.arange(d // 2) / (d // 2 - 1)) ** 2
    long_ = {"original_max_position_embeddings": L, "max_position_embeddings": int(s * L)}
    configs = [
        {"rope_type": "linear", "factor": s},
        {"rope_type": "ntk", "factor": s},
        {"rope_type": "dynamic", "factor": s, "max_position_embeddings": L},
        {"rope_type": "yarn", "factor": s, **long_},
        {"rope_type": "llama3", "factor": s, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, **long_},
        {"rope_type": "longrope", "factor": s, "short_factor": [1.0] * (d // 2),
         "long_factor": rho.tolist(), **long_},
    ]
    return [(posenc.rope_inv_freq(d, base=base, scaling=c, seq_len=int(s * L))[0]
             / plain).double() for c in configs]


def _ch10_visibility(layout: float, x: list[list[float]]) -> list[torch.Tensor]:
    """Who sees whom among 12 tokens: the distance m - n between the positions each token
    gets, -inf (undrawn) where the query may not see the key. The rule as posenc.attend's
    docstring states it (causal by slot; window m - W < n; the same document; a real key),
    and, for the sinks, the slots prod.streaming_keep leaves in a cache step after step."""
    (xs,) = x  # a heatmap: the key slots; the expected value is its z, [query, key]
    L, W, S = 12, 4, 2  # tokens, window, sinks
    slots = torch.arange(L)
    assert torch.equal(torch.tensor(xs, dtype=torch.float64), slots.double())
    name = ("causal", "padded", "packed", "window", "sinks")[int(layout)]
    real = (slots >= 3) if name == "padded" else torch.ones(L, dtype=torch.bool)
    docs = torch.tensor([0] * 5 + [1] * 4 + [2] * 3) if name == "packed" else slots * 0
    pos = slots
    if name == "padded":
        pos = posenc.positions_from_mask(real[None].long())[0]
    elif name == "packed":
        pos = posenc.packed_positions(docs[None])[0]
    m, n = pos[:, None], pos[None, :]
    seen = (slots[None, :] <= slots[:, None]) & (docs[:, None] == docs[None, :]) & real[None, :]
    if name == "window":
        seen &= n > m - W
    if name == "sinks":  # a StreamingLLM cache, token by token
        from posenc.lab.production import streaming_keep

        seen = torch.zeros(L, L, dtype=torch.bool)
        held = torch.zeros(0, dtype=torch.long)  # the slots the cache holds
        for t in range(L):
            held = torch.cat([held, torch.tensor([t])])
            seen[t, held] = True
            if len(held) >= S + W:
                held = held[streaming_keep(len(held), S, W)[0]]
    return [(m - n).double().masked_fill(~seen, float("-inf"))]


def _ch11_tree(value: float | str, x: list[list[float]]) -> list[torch.Tensor]:
    """A speculative-decoding draft tree after a prefix (chapter 11): the value is
    ``"P:parents"``; the distance m - n between the positions the tokens get (the prefix at
    0 .. P - 1, a node at P + its depth), -inf (undrawn) where the query may not see the key
    (the prefix is causal; a node sees the prefix, its ancestors and itself); blank padding
    past the tree. The rule written out here, and the boolean mask it makes given to
    posenc.attend, whose one-hot outputs must agree."""
    (xs,) = x  # a heatmap: the token slots; the expected value is its z, [query, key]
    head, _, tail = str(value).partition(":")
    P, parents = int(head), [int(p) for p in tail.split(",")]
    N, size = len(parents), len(xs)
    assert torch.equal(torch.tensor(xs, dtype=torch.float64),
                       torch.arange(size, dtype=torch.float64))
    depth, ancestors = [0] * N, [{i} for i in range(N)]
    for i, p in enumerate(parents):
        if p >= 0:
            depth[i], ancestors[i] = depth[p] + 1, ancestors[p] | {i}
    pos = torch.tensor(list(range(P)) + [P + d for d in depth])
    T = P + N
    allowed = torch.tensor([[n <= m if m < P else (n < P or (n - P) in ancestors[m - P])
                             for n in range(T)] for m in range(T)])
    zeros = torch.zeros(1, 1, T, T)
    seen = posenc.attend(zeros, zeros, torch.eye(T)[None, None], positions=pos,
                         attention_mask=allowed[None], backend="math")[0, 0] > 0
    assert torch.equal(seen, allowed)
    z = torch.full((size, size), float("-inf"), dtype=torch.float64)
    z[:T, :T] = (pos[:, None] - pos[None, :]).double().masked_fill(~allowed, float("-inf"))
    return [z]


def _your_model_pairs(value: tuple[str, int], x: list[list[float]]) -> list[torch.Tensor]:
    """"Your model's positions": for the family picked in the menu and the target context set
    on its slider, each pair's wavelength as trained and after the model's scaling, then the
    training length and the target as two flat lines over the pairs (posenc.explain)."""
    from posenc.rope_families import family

    key, target = value
    report = posenc.explain(family(key)["config"], context=int(target))
    pairs = torch.arange(report.num_pairs, dtype=torch.float64)
    ends = torch.tensor([0.0, report.num_pairs - 1.0], dtype=torch.float64)
    for xs, want in zip(x, (pairs, pairs, ends, ends), strict=True):
        assert torch.equal(torch.tensor(xs, dtype=torch.float64), want)
    flat = [float(report.training_length), float(target)]
    return [report.wavelength.double(), report.scaled_wavelength.double(),
            torch.tensor(flat[:1] * 2, dtype=torch.float64),
            torch.tensor(flat[1:] * 2, dtype=torch.float64)]


EXPECTED: dict[str, Callable[[Any, list[list[float]]], list[torch.Tensor]]] = {
    "ch03-offset": _ch03_offset,
    "ch04-decay": _ch04_decay,
    "ch05-slopes": _ch05_slopes,
    "ch05-heatmaps": _ch05_heatmaps,
    "ch07-rules": _ch07_rules,
    "ch10-visibility": _ch10_visibility,
    "ch11-tree": _ch11_tree,
    "mrope-ids": _mrope_ids,  # chapter 9 (its static figure is fig-mrope-ids)
    "your-model-pairs": _your_model_pairs,  # a menu of families, a slider per family
}


# --- the pages ------------------------------------------------------------------------------

def _notebooks() -> list[Path]:
    return sorted(p for p in [*ROOT.glob("book/*.ipynb"), *ROOT.glob("book/zh/*.ipynb")]
                  if any(call in p.read_text(encoding="utf-8")
                         for call in ("explore.explorable(", "explore.heatmap(",
                                      "explore.speculative_tree(", "menu_slider(")))


def _page(notebook: Path) -> Path:
    """The built page of a notebook: book/NN.ipynb -> book/NN.html, book/zh/NN -> zh/NN.html."""
    if notebook.parent.name == "zh":
        return HTML / "zh" / notebook.with_suffix(".html").name
    return HTML / "book" / notebook.with_suffix(".html").name


def _stale(pages: dict[Path, Path]) -> list[str]:
    """Pages missing or older than their notebook. (Only the notebook counts: the build's
    execution cache reruns a notebook when its code changes, not when the lab's does.)"""
    stale = []
    for notebook, page in pages.items():
        if not page.exists():
            stale.append(f"{page.relative_to(ROOT)} is missing")
        elif page.stat().st_mtime < notebook.stat().st_mtime:
            stale.append(f"{page.relative_to(ROOT)} is older than {notebook.relative_to(ROOT)}")
    return stale


@pytest.fixture(scope="module")
def site() -> Path:
    pages = {nb: _page(nb) for nb in _notebooks()}
    assert pages, "no notebook holds an explorable (explore.explorable/heatmap(...))"
    stale = _stale(pages)
    if stale and BUILD:
        subprocess.run(["bash", "scripts/build_site.sh"], cwd=ROOT, check=True)
        stale = _stale(pages)
    if stale:
        _unavailable("no fresh site build (" + "; ".join(stale[:2]) + "): run `bash "
                     "scripts/build_site.sh` first, or set POSENC_BUILD_SITE=1 to let this test "
                     "build it")
    return HTML


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium = os.environ.get("POSENC_CHROMIUM") or next(
        (found for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
         if (found := shutil.which(name))), None)
    if chromium is None:
        _unavailable("no chromium on PATH (Debian: `apt-get install chromium`)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright is not installed (`pip install playwright`; its browsers are "
                     "not needed: the test drives Debian's chromium)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium,
                                     args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


def _plotly_js() -> Path:
    from posenc.lab import explore

    return explore.plotlyjs_file()


def _cases() -> list[tuple[str, str]]:
    names = [str(_page(nb).relative_to(HTML)) for nb in _notebooks()]
    return [(name, device) for name in names for device in ("desktop", "phone")]


VIEWPORTS = {"desktop": {"width": 1280, "height": 1000}, "phone": {"width": 390, "height": 844}}


def _open(browser, server: str, page_name: str, device: str):
    context = browser.new_context(viewport=VIEWPORTS[device], has_touch=device == "phone",
                                  is_mobile=device == "phone", device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))

    def console(message) -> None:
        if message.type != "error":
            return
        url = (message.location or {}).get("url", "")
        if message.text.startswith("Failed to load resource") and not url.startswith(server):
            return  # an external resource this offline test aborted on purpose (MathJax)
        errors.append(f"console: {message.text} ({url})")

    page.on("console", console)
    plotly_js = _plotly_js()
    from posenc.lab import explore

    cdn = explore.plotlyjs_url()
    served: list[str] = []

    def route(r) -> None:
        url = r.request.url
        if url == cdn:  # the published page's plotly.js: the same version, from the package
            served.append(url)
            r.fulfill(path=str(plotly_js), content_type="text/javascript; charset=utf-8")
        elif url.startswith(server):
            r.continue_()
        else:  # offline: MathJax and any other CDN are not needed to operate the figures
            r.abort()

    page.route("**/*", route)
    page.goto(server + page_name, wait_until="load")
    return context, page, errors, served


def _click_step(page, div_id: str, step: int, device: str) -> None:
    """Tap (phone) or click (desktop) the slider at step ``step``: above its tick label, on the
    rail's touch area, where a reader's thumb goes."""
    graph = page.locator(f"#{div_id}")
    # the slider in the middle of the screen (clicks land on what the viewport shows)
    graph.locator(".slider-rail-touch-rect").first.evaluate(
        "e => e.scrollIntoView({block: 'center', inline: 'nearest'})")
    # one tick per step (on a phone Plotly labels only every other step when labels would
    # overlap, so the labels do not locate the steps)
    tick = graph.locator(".slider-tick-rect").nth(step).bounding_box()
    rail = graph.locator(".slider-rail-touch-rect").first.bounding_box()
    assert tick is not None and rail is not None
    assert rail["height"] >= 40, f"the slider's touch area is {rail['height']} px tall"
    x, y = tick["x"] + tick["width"] / 2, rail["y"] + 10
    if device == "phone":
        page.touchscreen.tap(x, y)
    else:
        page.mouse.click(x, y)


@pytest.mark.parametrize(("page_name", "device"), _cases())
def test_explorables(server: str, browser, page_name: str, device: str) -> None:
    context, page, errors, served = _open(browser, server, page_name, device)
    try:
        page.wait_for_function(
            "() => { const d = document.querySelectorAll('.posenc-explorable');"
            " return d.length > 0 && Array.from(d).every(g => g._fullLayout); }", timeout=30000)
        assert len(served) == 1, f"plotly.js requested {len(served)} times (once per page)"
        graphs = page.evaluate(
            "() => Array.from(document.querySelectorAll('.posenc-explorable')).map(gd => ({"
            " id: gd.id, meta: gd.layout.meta.posenc, width: gd.getBoundingClientRect().width,"
            " viewport: window.innerWidth, sliders: (gd.layout.sliders || []).length }))")
        html = (HTML / page_name).read_text(encoding="utf-8")
        extra = _explorable_bytes(html) + len(gzip.compress(_plotly_js().read_bytes(), 6))
        assert extra <= BUDGET, f"{page_name}: {extra / 2**20:.2f} MB of explorables + plotly.js"
        for graph in graphs:
            meta, div_id = graph["meta"], graph["id"]
            name = meta["name"]
            assert name in EXPECTED, f"no expected values for explorable {name!r}: add to EXPECTED"
            assert graph["width"] <= graph["viewport"], f"{name} is wider than the screen"
            assert graph["sliders"] == 1, f"{name}: one slider"
            _check_static_twin(page, name)
            kind = meta.get("kind", "lines")  # lines: the traces' y; a heatmap: its z
            assert kind in _READ, f"{name}: unknown explorable kind {kind!r}"
            page.evaluate(  # count the updates the controls make (Plotly's own event)
                f"() => {{ const gd = document.getElementById('{div_id}'); gd.__updates = 0;"
                " gd.on('plotly_update', () => { gd.__updates += 1; }); }")
            if meta["control"] == "slider":
                _operate_slider(page, div_id, meta, device, meta["values"], 0)
                continue
            assert meta["control"] == "menu+slider", f"{name}: unknown control"
            _operate_menu(page, div_id, meta, device)
        assert not errors, f"{page_name} logged script errors: {errors[:5]}"
    finally:
        context.close()


def _check_data(page, div_id: str, meta: dict, value: Any, where: str) -> None:
    """The changing traces' data on the page equal what posenc computes for ``value``."""
    name, kind = meta["name"], meta.get("kind", "lines")
    data = page.evaluate(
        f"() => {{ const gd = document.getElementById('{div_id}');"
        f" return {json.dumps(meta['traces'])}.map(i => ({{"
        f" x: Array.from(gd.data[i].x), v: {_READ[kind]} }})); }}")
    expected = EXPECTED[name](value, [t["x"] for t in data])
    for trace, want in zip(data, expected, strict=True):
        torch.testing.assert_close(_tensor(trace["v"]), want, rtol=2e-6, atol=2e-6,
                                   msg=lambda m: f"{name}, {where}: {m}")


def _operate_slider(page, div_id: str, meta: dict, device: str, values: list,
                    updates: int, value_of: Callable[[Any], Any] = lambda v: v) -> int:
    """Every other step of the slider, then back to the first drawn (each click changes the
    step), reading the data back after each; returns the updates counted so far."""
    name = meta["name"]
    active = page.evaluate(
        f"() => document.getElementById('{div_id}')._fullLayout.sliders[0].active")
    order = [k for k in range(len(values)) if k != active] + [active]
    assert len(order) > 1, f"{name}: a control with one setting"
    for step in order:
        updates += 1
        _click_step(page, div_id, step, device)
        page.wait_for_function(  # the update done, to this step
            f"() => {{ const gd = document.getElementById('{div_id}');"
            f" return gd.__updates === {updates} &&"
            f" gd._fullLayout.sliders[0].active === {step}; }}", timeout=5000)
        _check_data(page, div_id, meta, value_of(values[step]), f"step {step}")
    return updates


def _pick_entry(page, div_id: str, entry: int, device: str) -> None:
    """Open the drop-down menu and pick ``entry``: a tap on a phone, a click on a desktop."""
    graph = page.locator(f"#{div_id}")
    header = graph.locator(".updatemenu-header").first
    header.evaluate("e => e.scrollIntoView({block: 'center', inline: 'nearest'})")
    header.tap() if device == "phone" else header.click()
    button = graph.locator(".updatemenu-dropdown-button").nth(entry)
    button.tap() if device == "phone" else button.click()


def _operate_menu(page, div_id: str, meta: dict, device: str) -> None:
    """A menu whose entries each bring their own slider: pick every entry (the first drawn
    last), check the data of the entry's first frame and that the slider now has the entry's
    steps, then operate that slider over every step."""
    menu, name = meta["menu"], meta["name"]
    first = menu["active"]
    order = [k for k in range(len(menu["values"])) if k != first] + [first]
    assert len(order) > 1, f"{name}: a menu with one entry"
    updates = 0
    for entry in order:
        updates += 1
        _pick_entry(page, div_id, entry, device)
        page.wait_for_function(
            f"() => {{ const gd = document.getElementById('{div_id}');"
            f" return gd.__updates === {updates} &&"
            f" gd._fullLayout.updatemenus[0].active === {entry}; }}", timeout=5000)
        steps = menu["steps"][entry]
        shown = page.evaluate(
            f"() => {{ const s = document.getElementById('{div_id}')._fullLayout.sliders[0];"
            " return {active: s.active, labels: s.steps.map(t => t.label)}; }")
        assert shown["labels"] == menu["step_labels"][entry], f"{name}: entry {entry}'s slider"
        key = menu["values"][entry]
        _check_data(page, div_id, meta, (key, steps[shown["active"]]), f"entry {key}")
        updates = _operate_slider(page, div_id, meta, device, steps, updates,
                                  value_of=lambda v, k=key: (k, v))


# how the page's data are read back, per kind of explorable (JavaScript on trace i of gd)
_READ = {"lines": "Array.from(gd.data[i].y)",
         "heatmap": "Array.from(gd.data[i].z, row => Array.from(row))"}


def _tensor(values: list) -> torch.Tensor:
    """Plotted numbers as float64; a heatmap's undrawn (null) cells are -inf, as posenc's
    masked entries are."""
    if values and isinstance(values[0], list):
        values = [[float("-inf") if v is None else v for v in row] for row in values]
    return torch.tensor(values, dtype=torch.float64)


def _explorable_bytes(html: str) -> int:
    """Bytes of the explorables' markup, JSON and loader scripts in a page."""
    total, start = 0, 0
    while (i := html.find('<div class="posenc-explorable"', start)) >= 0:
        end = html.find("</script>", html.find("</script>", i) + 1) + len("</script>")
        total += end - i
        start = end
    return total


def _check_static_twin(page, name: str) -> None:
    figure = page.locator(f"figure#fig-{name}")
    assert figure.count() == 1, f"the static figure fig-{name} is missing"
    ok = page.evaluate(
        f"() => {{ const f = document.getElementById('fig-{name}'); const img = f.querySelector('img');"
        " return !!img && img.complete && img.naturalWidth > 0 && !!img.alt &&"
        " !!f.querySelector('figcaption'); }")
    assert ok, f"fig-{name}: its image, alt text or caption is missing"

