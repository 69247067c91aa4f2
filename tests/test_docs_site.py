"""The documentation site's structure: benchmark pages named for what they measure, the README's list of the
user guide complete, formulas rendered by the site's own MathJax."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _title(path: Path) -> str:
    return path.read_text(encoding="utf-8").splitlines()[0]


def test_benchmark_report_titles_are_distinct_and_carry_no_issue_numbers():
    titles = {path.name: _title(path) for path in sorted(RESULTS.glob("*.md"))}
    assert all(title.startswith("# ") for title in titles.values()), titles
    numbered = {name: title for name, title in titles.items() if re.search(r"\(issue \d+\)", title)}
    assert not numbered, f"internal issue numbers in report titles: {numbered}"
    seen: dict[str, str] = {}
    for name, title in titles.items():
        assert title not in seen, f"{name} and {seen.get(title)} share the title {title!r}"
        seen[title] = name


def test_readme_lists_every_user_guide_page():
    toctree = (ROOT / "docs" / "user_guide" / "index.md").read_text(encoding="utf-8")
    body = toctree.split("```{toctree}")[1].split("```")[0]
    pages = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith(":")]
    assert "heteroscedastic" in pages
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [page for page in pages if f"(docs/user_guide/{page}.md)" not in readme]
    assert not missing, f"user-guide pages the README's documentation list does not link: {missing}"


def test_math_is_served_by_the_site_itself():
    # a CDN's MathJax leaves every formula as raw TeX offline; docs/check_math.py checks the built site in a browser
    conf = (ROOT / "docs" / "conf.py").read_text(encoding="utf-8")
    assert '"sphinx-mathjax-offline"' in conf and "mathjax_path" not in conf.replace("# mathjax_path", "")
    assert "sphinx-mathjax-offline" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
