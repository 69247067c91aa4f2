"""The README stays short and its links lead somewhere; shipped text cites nothing that is not shipped."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_is_at_most_120_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 120


def test_readme_opens_without_internals_jargon():
    # a new user reads what they get before how it is computed; the method has its own page
    head = "\n".join(README.read_text(encoding="utf-8").splitlines()[:25])
    jargon = ["GGN", "Gauss-Newton", "Gauss–Newton", "JVP", "VJP", "Lanczos", "empirical Bayes", "split conformal",
              "split-conformal", "exchangeable", "β-NLL", "Kruskal", "eigen"]
    found = [word for word in jargon if word.lower() in head.lower()]
    assert not found, f"internals in the README's first 25 lines: {found}"


def test_readme_shows_the_example_output_and_cites_the_paper():
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"^```(\w*)\n", text, re.M)
    # the example (a python block) is followed by what it prints (a text block; tests/test_docs_examples.py checks
    # that it is what the example prints)
    assert "python\ntext" in "\n".join(b for b in blocks if b in ("python", "text"))
    assert "arxiv.org/abs/2610.11738" in text and "Generalized Laplace Active Subspaces" in text
    assert "make test" in text  # the test command CI runs (.ci/run)


def test_readme_relative_links_exist():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8"))
    relative = [link.split("#")[0] for link in links if not re.match(r"[a-z]+://|#|mailto:", link)]
    assert relative, "the README links into docs/"
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, f"README links to files that are not in the repository: {missing}"


def test_no_reference_to_unshipped_design_files():
    # SPEC.md and DESIGN.md are not part of the repository: docstrings cite the paper or the docs instead.
    pattern = re.compile(r"\bSPEC\b|DESIGN\.md")
    files = [README, *sorted((ROOT / "glas_sklearn").rglob("*.py")), *sorted((ROOT / "docs").glob("**/*.md"))]
    hits = [f"{path.relative_to(ROOT)}:{n}" for path in files if "generated" not in path.parts
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, hits
