"""Check that the built site typesets its formulas with no network: ``python docs/check_math.py [HTML_DIR]``.

Opens pages of the built site (default ``docs/_build/html``) in headless Chromium with every network request
refused, lets MathJax run, and reads the resulting DOM: every formula of the page (Sphinx writes each as a
``math`` span or div holding its TeX between ``\\(`` ``\\)`` or ``\\[`` ``\\]``) must have become a MathJax
container, with no TeX delimiter left in the text. A screenshot of each page is written beside the build
(``<HTML_DIR>/../math-check/*.png``) to look at. Exits non-zero on a page whose math did not render.
``make docs-check`` runs it after ``make docs``; it needs Chromium (``apt-get install chromium``, or set
``CHROMIUM`` to the browser's path).
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Pages with inline and display math, in headings too (the notebook: "Intervals for $y$").
PAGES = ["user_guide/what_it_computes.html", "user_guide/classification.html", "user_guide/heteroscedastic.html",
         "gallery/generated/02_concrete.html"]
_NO_NETWORK = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"]
_MATH_ELEMENT = re.compile(r'<(span|div) class="math[^"]*"[^>]*>(.*?)</\1>', re.S)


def _chromium() -> str:
    for name in filter(None, [os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"]):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("check_math: no Chromium found; install it (apt-get install chromium) or set CHROMIUM=/path/to/it")


def _run(browser: str, profile: str, *args: str) -> str:
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
               "--virtual-time-budget=20000", *_NO_NETWORK, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def check_page(browser: str, page: Path, screenshot: Path) -> list[str]:
    """The problems found on one page (an empty list when every formula was typeset)."""
    with tempfile.TemporaryDirectory() as profile:
        dom = _run(browser, profile, "--dump-dom", page.as_uri())
        _run(browser, profile, "--window-size=1280,1400", f"--screenshot={screenshot}", page.as_uri())
    elements = _MATH_ELEMENT.findall(dom)
    problems = []
    if not elements:
        problems.append("no math element on the page")
    raw = [html.unescape(re.sub(r"<[^>]+>", "", inner))[:60] for _, inner in elements if "<mjx-container" not in inner]
    if raw:
        problems.append(f"{len(raw)} of {len(elements)} formulas left as TeX, e.g. {raw[0]!r}")
    text = re.sub(r"<script.*?</script>", "", dom, flags=re.S)
    if re.search(r"\\\(|\\\[", re.sub(r"<[^>]+>", "", text)):
        problems.append("TeX delimiters \\( or \\[ left in the page's text")
    return problems


def main(argv: list[str]) -> int:
    site = Path(argv[0] if argv else "docs/_build/html").resolve()
    shots = site.parent / "math-check"
    shots.mkdir(exist_ok=True)
    browser = _chromium()
    failed = False
    for name in PAGES:
        page = site / name
        if not page.is_file():
            print(f"{name}: not built (run make docs first)")
            failed = True
            continue
        screenshot = shots / (name.replace("/", "_").removesuffix(".html") + ".png")
        problems = check_page(browser, page, screenshot)
        failed |= bool(problems)
        print(f"{name}: {'; '.join(problems) if problems else 'every formula typeset, offline'} "
              f"(screenshot {screenshot})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
