"""Sphinx extension: each inline ``<script>`` appears once per built page.

With Jupyter Book 1.0.4 (sphinx-book-theme 1.3, sphinx-thebe 0.3.1,
sphinx-togglebutton 0.4.5) every page came out with two inline scripts repeated
at the end of its head: togglebutton's ``var togglebuttonSelector`` and
sphinx-thebe's ``const THEBE_JS_URL ...``. Redeclaring a ``const`` is a
SyntaxError, so every reader's browser logged "Identifier 'THEBE_JS_URL' has
already been declared". Each event handler that registers them runs once (we
checked), and the repeats are not in the ``script_files`` that the
``html-page-context`` event sees, so the duplication happens later, in theme
rendering. This extension therefore removes, after the build, an inline script
element that is byte-for-byte identical to an earlier one in the same page: such a
repeat can only redeclare what the first already did. Scripts with a ``src`` are
left alone (Sphinx already de-duplicates those).
"""

from __future__ import annotations

import re
from pathlib import Path

_INLINE_SCRIPT = re.compile(r"[ \t]*<script>(?P<body>[^<]*)</script>\n?")


def drop_repeated_inline_scripts(html: str) -> str:
    seen: set[str] = set()

    def keep_first(match: re.Match) -> str:
        body = match["body"]
        if body in seen:
            return ""
        seen.add(body)
        return match[0]

    return _INLINE_SCRIPT.sub(keep_first, html)


def _rewrite_pages(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        fixed = drop_repeated_inline_scripts(text)
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")


def setup(app):
    app.connect("build-finished", _rewrite_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
