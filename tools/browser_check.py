"""Check the built HTML book in headless Chromium, as a reader's browser shows it.

For every page: no JavaScript errors, every local resource loads, every image
decodes, all math is typeset by MathJax (no raw TeX left, no MathJax errors), and
every glued value that the page's source asks for is present.

The browser is Debian's Chromium driven by Playwright; it never touches the
network. Pages are served from the build folder through request interception on a
made-up origin, and the MathJax CDN URL the book uses is answered from a local
copy of MathJax 3 (the ``django-static-mathjax`` package), so the check also
works offline.

    python tools/browser_check.py _build/html            # all pages
    python tools/browser_check.py _build/html book/ch01_attention_is_nw.html
"""

from __future__ import annotations

import argparse
import importlib.util
import mimetypes
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ORIGIN = "http://book.invalid"
MATHJAX_CDN = re.compile(r"^https://cdn\.jsdelivr\.net/npm/mathjax@3/es5/(?P<path>.*)$")
# Glue references in a page's MyST source, and how each renders in HTML.
GLUE_INLINE = re.compile(r"\{glue(?::text|:any)?\}`[^`]+`")
GLUE_BLOCK = re.compile(r"^(```+|:::+)\{glue\}", re.MULTILINE)
SKIPPED_PAGES = {"genindex.html", "search.html", "py-modindex.html"}


@dataclass
class PageReport:
    page: str
    problems: list[str] = field(default_factory=list)
    math_elements: int = 0
    charts: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def local_mathjax_dir() -> Path | None:
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        return None
    es5 = Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"
    return es5 if (es5 / "tex-mml-chtml.js").is_file() else None


def _is_redirect(page: Path) -> bool:
    """Jupyter Book's root index.html only redirects (meta refresh) to the first page."""
    head = page.read_text(encoding="utf-8", errors="replace")[:2000].lower()
    return 'http-equiv="refresh"' in head


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError("no Chromium found: install Debian's 'chromium' package")


def expected_glue(html_dir: Path, page: str) -> tuple[int, int]:
    """Inline and block glue references in the page's source (Sphinx copies it to _sources/)."""
    stem = page[: -len(".html")]
    for suffix in (".md", ".ipynb"):
        source = html_dir / "_sources" / f"{stem}{suffix}"
        if source.is_file():
            text = source.read_text(encoding="utf-8")
            if suffix == ".ipynb":
                return 0, 0  # notebooks glue into themselves; their outputs are checked as rendered
            return len(GLUE_INLINE.findall(text)), len(GLUE_BLOCK.findall(text))
    return 0, 0


# Runs in the page once MathJax (if any) has finished typesetting.
PAGE_PROBE = """
() => {
  const article = document.querySelector('article') || document.body;
  const raw = [];
  for (const el of article.querySelectorAll('.math, span.math, div.math')) {
    if (!el.querySelector('mjx-container') && /\\\\\\(|\\\\\\[|\\$\\$/.test(el.textContent)) raw.push(el.textContent.slice(0, 60));
  }
  const errors = [...article.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || e.textContent);
  const images = [...document.querySelectorAll('article img')].map(img => ({
      src: img.getAttribute('src'), ok: img.complete && img.naturalWidth > 0}));
  const pasted = [...article.querySelectorAll('.pasted-text')].map(e => e.textContent.trim());
  // What a cross-page {glue} directive can paste: an output image (myst-nb names it by its
  // SHA-256), an equation from nwlib.book.glue_math, a block from nwlib.book.glue_code, or an HTML
  // table (pandas DataFrame or Styler), or an interactive figure from nwlib.book.glue_chart.
  const pastedBlocks = [...article.querySelectorAll('img')].filter(i => /_images\\/[0-9a-f]{64}\\./.test(i.getAttribute('src') || '')).length
      + article.querySelectorAll('.glued-math, .glued-code, table.dataframe, table[id^="T_"], .nwlib-chart').length;
  // Literal roles left in prose mean MyST did not parse them; code listings may quote them.
  const prose = article.cloneNode(true);
  prose.querySelectorAll('pre, code, .highlight, .cell_input').forEach(e => e.remove());
  return {
    raw, errors, images, pasted, pastedBlocks,
    math: article.querySelectorAll('mjx-container').length,
    leftoverRoles: (prose.textContent.match(/\\{glue[^}]*\\}|\\{prf:ref\\}|\\{cite:p\\}/g) || []),
    problematic: article.querySelectorAll('.problematic, .system-message').length,
  };
}
"""


def check_pages(
    html_dir: Path,
    pages: list[str] | None = None,
    *,
    mathjax_dir: Path | None | str = "auto",
    timeout_ms: int = 30000,
) -> list[PageReport]:
    """Load each page in headless Chromium and collect what a reader would see broken.

    Parameters
    ----------
    html_dir : Path
        The built book (``_build/html``).
    pages : list of str, optional
        Pages relative to ``html_dir``; default every ``*.html`` except Sphinx's
        generated index and search pages.
    mathjax_dir : Path, None or "auto"
        Local MathJax 3 ``es5/`` folder served for the CDN URL; ``None`` serves
        nothing (as offline without a local copy), ``"auto"`` finds the package.
    """
    from playwright.sync_api import sync_playwright

    html_dir = Path(html_dir).resolve()
    if mathjax_dir == "auto":
        mathjax_dir = local_mathjax_dir()
    if pages is None:
        pages = sorted(
            str(p.relative_to(html_dir))
            for p in html_dir.rglob("*.html")
            if p.name not in SKIPPED_PAGES
            and "_static" not in p.parts
            and "_sources" not in p.parts
            and not _is_redirect(p)
        )
    reports = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=find_chromium(),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic"],
        )
        try:
            for page_name in pages:
                reports.append(_check_one(browser, html_dir, page_name, mathjax_dir, timeout_ms))
        finally:
            browser.close()
    return reports


CHART_PROBE = """
async () => {
  const charts = [...document.querySelectorAll('.nwlib-chart')];
  const problems = [];
  for (const chart of charts) {
    const svg = chart.querySelector('svg');
    if (!svg || !svg.querySelector('path, rect, line, circle, text')) {
      problems.push(`interactive figure ${chart.id} did not render`);
      continue;
    }
    const controls = [...chart.querySelectorAll('.vega-bind input, .vega-bind select')];
    if (!controls.length) { problems.push(`interactive figure ${chart.id} has no control`); continue; }
    const before = svg.innerHTML;
    const control = controls[0];
    if (control.tagName === 'SELECT') {
      control.selectedIndex = (control.selectedIndex + 1) % control.options.length;
      control.dispatchEvent(new Event('change', {bubbles: true}));
    } else if (control.type === 'checkbox' || control.type === 'radio') {
      control.click();
    } else {
      control.value = control.value === control.max ? control.min : control.max;
      control.dispatchEvent(new Event('input', {bubbles: true}));
    }
    await new Promise(r => setTimeout(r, 400));
    if (chart.querySelector('svg').innerHTML === before) problems.push(`the control of ${chart.id} does not change it`);
  }
  return {count: charts.length, problems};
}
"""


def _check_charts(page, timeout_ms: int) -> dict:
    """Every interactive figure on the page renders, and its first control changes it."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    count = page.evaluate("() => document.querySelectorAll('.nwlib-chart').length")
    if not count:
        return {"count": 0, "problems": []}
    try:
        page.wait_for_function(
            "n => document.querySelectorAll('.nwlib-chart svg').length >= n", arg=count, timeout=timeout_ms // 3
        )
    except PlaywrightTimeout:
        pass  # reported by the probe
    return page.evaluate(CHART_PROBE)


def _check_one(browser, html_dir: Path, page_name: str, mathjax_dir, timeout_ms: int) -> PageReport:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    report = PageReport(page_name)
    context = browser.new_context()
    page = context.new_page()
    missing: list[str] = []

    def serve(route):
        url = route.request.url
        cdn = MATHJAX_CDN.match(url)
        if cdn:
            target = (Path(mathjax_dir) / cdn["path"]) if mathjax_dir else None
        elif url.startswith(ORIGIN + "/"):
            target = html_dir / url[len(ORIGIN) + 1 :].split("#")[0].split("?")[0]
        else:
            return route.abort()  # the check never uses the network
        if target is None or not target.is_file():
            if not cdn:
                missing.append(url[len(ORIGIN) + 1 :])
            return route.fulfill(status=404, body="not found")
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        return route.fulfill(status=200, body=target.read_bytes(), headers={"content-type": ctype})

    context.route("**/*", serve)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{ORIGIN}/{page_name}", wait_until="load", timeout=timeout_ms)
        if page.evaluate("() => document.querySelector('.math') !== null"):
            try:  # MathJax (deferred, then loading its own components) may still be starting
                page.wait_for_function(
                    "() => window.MathJax && window.MathJax.startup && window.MathJax.startup.promise",
                    timeout=timeout_ms // 3,
                )
                page.evaluate("() => window.MathJax.startup.promise")
            except PlaywrightTimeout:
                pass  # reported below as unrendered math
        probe = page.evaluate(PAGE_PROBE)
        charts = _check_charts(page, timeout_ms)
    finally:
        context.close()

    report.math_elements = probe["math"]
    report.charts = charts["count"]
    report.problems += charts["problems"]
    report.problems += [f"JavaScript error: {e}" for e in errors]
    report.problems += [f"missing resource: {m}" for m in missing]
    report.problems += [f"broken image: {img['src']}" for img in probe["images"] if not img["ok"]]
    if probe["raw"]:
        report.problems.append(f"unrendered math ({len(probe['raw'])} elements), e.g. {probe['raw'][0]!r}")
    report.problems += [f"MathJax error: {e}" for e in probe["errors"]]
    report.problems += [f"unprocessed markup: {r}" for r in probe["leftoverRoles"]]
    if probe["problematic"]:
        report.problems.append(f"{probe['problematic']} Sphinx error node(s) rendered in the page")
    inline_refs, block_refs = expected_glue(html_dir, page_name)
    empty = [t for t in probe["pasted"] if not t or t.lower() in {"nan", "none"}]
    if len(probe["pasted"]) < inline_refs:
        report.problems.append(
            f"missing glued value: the source quotes {inline_refs} glued values, the page shows {len(probe['pasted'])}"
        )
    if empty:
        report.problems.append(f"empty or NaN glued value(s): {empty}")
    if block_refs and probe["pastedBlocks"] < block_refs:
        report.problems.append(
            f"missing glued figure/equation: the source pastes {block_refs}, the page shows {probe['pastedBlocks']}"
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("html_dir", type=Path)
    parser.add_argument("pages", nargs="*")
    args = parser.parse_args(argv)
    reports = check_pages(args.html_dir, args.pages or None)
    bad = [r for r in reports if not r.ok]
    for r in reports:
        status = "ok " if r.ok else "BAD"
        print(f"{status} {r.page} ({r.math_elements} math)")
        for p in r.problems:
            print(f"      {p}")
    print(f"{len(reports) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
