"""Sphinx configuration of the glas-sklearn documentation.

Three parts of the site are generated here, before Sphinx reads any page, so that they follow the repository:

- ``api/``: the API reference, one page per topic of ``API_TOPICS`` below, each listing the ``__all__`` of its
  import paths (autosummary then writes a stub page per name under ``api/generated/``), and an index of them all;
- ``gallery/generated/``: the executed notebooks ``notebooks/*.ipynb`` (rendered with their saved outputs, not
  re-executed) and the gallery's list of them;
- ``benchmarks/generated/``: every report ``benchmarks/results/*.md`` and the figures it shows, and their list by
  topic (``BENCHMARK_GROUPS``).

All three are rebuilt on every run and ignored by git.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))  # the site's own extension, numpydoc_signature

import glas_sklearn  # noqa: E402

project = "glas-sklearn"
author = "the glas-sklearn authors"
copyright = "2026, the glas-sklearn authors"
release = glas_sklearn.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax served from the site's own _static/, so formulas render offline
    "numpydoc",
    "numpydoc_signature",  # docs/numpydoc_signature.py: a class's Parameters in its signature's order and defaults
    "myst_nb",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store", "gallery/generated/list.md",
                    "benchmarks/generated/toc.md"]
templates_path = ["_templates"]

# ----------------------------------------------------------------------------------------------- the API reference
# Grouped by topic, as scikit-learn's is: (page, title, one line on what is there, the import paths it documents).
# Each public name of a path's __all__ is documented once, under the listed path whose module defines it (the
# longest matching prefix of its __module__; the top-level package only for what no other path defines); the
# other paths that export it link to it. To add a module, add its import path to a topic (or a new topic); an
# import path whose module does not exist (yet) is left out, and a public module listed nowhere is a warning.
API_TOPICS = [
    ("estimators", "Estimators, Pipelines and model files",
     "The regressor and the classifier, intervals or prediction sets through Pipelines, model files that "
     "hold data only, and predictions over Dask and Spark.",
     ["glas_sklearn", "glas_sklearn.compose", "glas_sklearn.serialization", "glas_sklearn.scale_out"]),
    ("metrics", "Metrics", "Coverage, width and the interval (Winkler) score, and a scorer for model selection.",
     ["glas_sklearn.metrics", "glas_sklearn.regional_coverage"]),
    ("calibration", "Calibration",
     "Choosing d by coverage (the paper), split-conformal calibration and its conformity scores, σ0 by held-out "
     "NLL.",
     ["glas_sklearn.calibration", "glas_sklearn.conformity_scores"]),
    ("likelihoods", "Likelihoods",
     "The observation model: training loss, the output Hessian of the curvature, and β per scaling.",
     ["glas_sklearn.likelihoods"]),
    ("posterior", "Posterior and predictive",
     "From a trained model to the Laplace posterior in (or around) the active subspace, its weight samples, and "
     "the intervals, probabilities and sets it predicts.",
     ["glas_sklearn.laplace", "glas_sklearn.posterior", "glas_sklearn.predictive", "glas_sklearn.sampling"]),
    ("operators", "Curvature operators and eigen-solvers",
     "The generalized Gauss-Newton matrix as a matrix-free operator (on one process or a process group) and its "
     "top eigenpairs.",
     ["glas_sklearn.ggn", "glas_sklearn.eigen", "glas_sklearn.distributed"]),
    ("plotting", "Plotting", "Display classes and plot_* shortcuts (needs matplotlib).", ["glas_sklearn.plotting"]),
    ("utilities", "Utilities",
     "Model adapters, network ensembles, eigenvector diagnostics, the shipped data set, SMILES tokens and "
     "chemistry helpers.",
     ["glas_sklearn.adapters", "glas_sklearn.ensemble", "glas_sklearn.diagnostics", "glas_sklearn.datasets",
      "glas_sklearn.contrib.smiles",
      "glas_sklearn.contrib.chem"]),
]


def _public_names(module) -> list[str]:
    return [name for name in getattr(module, "__all__", []) if not name.startswith("_")]


def _existing(paths: list[str]) -> list[str]:
    """The paths that import here (a module not written yet, or one whose optional dependency is missing, not)."""
    found = []
    for path in paths:
        try:
            importlib.import_module(path)
        except ImportError:
            continue
        found.append(path)
    return found


def _homes(paths: list[str]) -> dict[int, str]:
    """id(object) -> the import path it is documented under."""
    homes: dict[int, tuple[int, str]] = {}
    for path in paths:
        module = importlib.import_module(path)
        for name in _public_names(module):
            obj = getattr(module, name)
            if not callable(obj):
                continue
            defined = getattr(obj, "__module__", "") or ""
            rank = len(path) if path != "glas_sklearn" and (defined == path or defined.startswith(path + ".")) else 0
            if id(obj) not in homes or rank > homes[id(obj)][0]:
                homes[id(obj)] = (rank, path)
    return {key: path for key, (_, path) in homes.items()}


def _unlisted_public_modules(listed: set[str]) -> list[str]:
    import pkgutil

    found = []
    for info in pkgutil.walk_packages(glas_sklearn.__path__, "glas_sklearn."):
        parts = info.name.split(".")
        # the estimators' internals and the training part: their public face is glas_sklearn's Training and the
        # estimators themselves
        internal = parts[1] in {"cli", "estimators", "training"}
        if any(part.startswith("_") for part in parts) or info.name in listed or internal:
            continue
        if parts[1] == "contrib" and importlib.util.find_spec(info.name) is None:
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (rdkit for contrib.chem) is not installed
            continue
        if _public_names(module) and not any(info.name.startswith(p + ".") for p in listed if p != "glas_sklearn"):
            found.append(info.name)
    return found


def _write_api_reference() -> None:
    """api/index.rst and one page per topic of API_TOPICS (the stub pages under api/generated/ are autosummary's)."""
    out = DOCS / "api"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    topics = [(slug, title, blurb, _existing(paths)) for slug, title, blurb, paths in API_TOPICS]
    all_paths = [path for *_, paths in topics for path in paths]
    homes = _homes(all_paths)
    index = ["API reference", "=============", "",
             "Every public name, grouped by topic, under the import path to use. The estimators follow "
             "scikit-learn's conventions",
             "(``get_params`` / ``set_params``, ``score``, cloning, Pipelines), which are not repeated here.", "",
             ".. toctree::", "   :hidden:", ""] + [f"   {slug}" for slug, *_ in topics] + [""]
    for slug, title, blurb, paths in topics:
        page = [title, "=" * len(title), "", blurb, ""]
        index += [title, "-" * len(title), "", f"{blurb} On one page: :doc:`{slug}`.", ""]
        for path in paths:
            module = importlib.import_module(path)
            own, elsewhere = [], []
            for name in _public_names(module):
                obj = getattr(module, name)
                if callable(obj) and homes[id(obj)] != path:
                    elsewhere.append((name, f"{homes[id(obj)]}.{name}"))
                else:
                    own.append(name)
            heading = f"``{path}``"
            page += [f".. _api-{path}:", "", heading, "-" * len(heading), "",
                     f".. automodule:: {path}", "",
                     f".. currentmodule:: {path}", ""]
            if own:
                page += [".. autosummary::", "   :toctree: generated/", "   :nosignatures:", ""]
                page += [f"   {name}" for name in own] + [""]
                index += [f".. currentmodule:: {path}", "", ".. autosummary::", "   :nosignatures:", ""]
                index += [f"   {name}" for name in own] + [""]
            if elsewhere:
                refs = ", ".join(f":obj:`{name} <{target}>`" for name, target in elsewhere)
                page += [f"Also importable from here: {refs}.", ""]
        (out / f"{slug}.rst").write_text("\n".join(page), encoding="utf-8")
    (out / "index.rst").write_text("\n".join(index), encoding="utf-8")
    _UNLISTED[:] = _unlisted_public_modules(set(all_paths))


_UNLISTED: list[str] = []  # warned about once the build starts (a warning, so an error under -W)


def _warn_unlisted(app) -> None:
    if _UNLISTED:
        from sphinx.util import logging as sphinx_logging

        sphinx_logging.getLogger(__name__).warning(
            "public modules missing from the API reference (add them to API_TOPICS in docs/conf.py): %s",
            ", ".join(_UNLISTED))


# ----------------------------------------------------------------------------------------------- the gallery
def _title_and_summary(nb: dict) -> tuple[str, str]:
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"]).strip().splitlines()
        title = next((line[2:].strip() for line in text if line.startswith("# ")), None)
        if title is None:
            continue
        body = []
        for line in text[text.index(f"# {title}") + 1:]:
            if not line.strip():
                if body:
                    break
                continue
            body.append(line.strip())
        summary = _first_sentences(" ".join(body))
        return title, summary[:-1] + "." if summary.endswith(":") else summary
    raise ValueError("a notebook without a '# title' markdown cell")


def _first_sentences(text: str, limit: int = 320) -> str:
    """The sentences of ``text`` that fit in ``limit`` characters (at least the first one)."""
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z(])", text)
    summary = sentences[0]
    for sentence in sentences[1:]:
        if len(summary) + 1 + len(sentence) > limit:
            break
        summary += " " + sentence
    return summary


def _first_image(nb: dict) -> str | None:
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png:
                return png if isinstance(png, str) else "".join(png)
    return None


def _write_gallery() -> None:
    """gallery/generated/: the executed notebooks, a thumbnail of each (its first figure) and their list."""
    import base64

    out = DOCS / "gallery" / "generated"
    shutil.rmtree(out, ignore_errors=True)
    (out / "thumbnails").mkdir(parents=True)
    # list.md is included by gallery/index.md, so its paths are relative to gallery/.
    entries = ["```{toctree}", ":hidden:", ""]
    cards = []
    for source in sorted((ROOT / "notebooks").glob("*.ipynb")):
        shutil.copy2(source, out / source.name)
        nb = json.loads(source.read_text(encoding="utf-8"))
        title, summary = _title_and_summary(nb)
        entries.append(f"generated/{source.stem}")
        png = _first_image(nb)
        card = [f"## [{title}](generated/{source.stem}.ipynb)", ""]
        if png is not None:
            (out / "thumbnails" / f"{source.stem}.png").write_bytes(base64.b64decode(png))
            card += [f"```{{image}} generated/thumbnails/{source.stem}.png", f":alt: {title}",
                     ":class: gallery-thumbnail", f":target: generated/{source.stem}.html", "```", ""]
        card += [summary, "", f"Source: `notebooks/{source.stem}.py`.", ""]
        cards += card
    (out / "list.md").write_text("\n".join(entries + ["```", ""] + cards), encoding="utf-8")


# ----------------------------------------------------------------------------------------------- benchmark reports
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
# The benchmark pages by topic: (caption, report stems in order). A report listed nowhere goes under the last caption.
BENCHMARK_GROUPS = [
    ("Regression intervals", ["uci", "regional_coverage"]),
    ("The paper's studies", ["paper_1d", "paper_concrete", "paper_smiles"]),
    ("Speed and serving", ["bench_ggn", "default_fit", "serving", "scale_out"]),
    ("Classification", ["digits_cnn"]),
    ("Other measurements", []),
]


def _mark_tables(text: str) -> str:
    """Each markdown table gets the class benchmark-table (custom.css: cells on one line, the table scrolls)."""
    lines, out = text.split("\n"), []
    for i, line in enumerate(lines):
        starts = line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1]) \
            and not (i > 0 and lines[i - 1].startswith("|"))
        if starts:
            out += ["", "{.benchmark-table}"]
        out.append(line)
    return "\n".join(out)


def _write_benchmark_toc(stems: list[str], out: Path) -> None:
    """generated/toc.md, included by benchmarks/index.md: one toctree per group of BENCHMARK_GROUPS."""
    listed = {stem for _, group in BENCHMARK_GROUPS for stem in group}
    lines = []
    for caption, group in BENCHMARK_GROUPS:
        members = [s for s in group if s in stems] + ([s for s in stems if s not in listed]
                                                      if caption == BENCHMARK_GROUPS[-1][0] else [])
        if members:
            lines += ["```{toctree}", ":maxdepth: 1", f":caption: {caption}", ""]
            lines += [f"generated/{stem}" for stem in members] + ["```", ""]
    (out / "toc.md").write_text("\n".join(lines), encoding="utf-8")


def _copy_benchmark_reports() -> None:
    """benchmarks/generated/: every benchmarks/results/*.md, the images it refers to and every results/*.png."""
    results = ROOT / "benchmarks" / "results"
    out = DOCS / "benchmarks" / "generated"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for report in sorted(results.glob("*.md")):
        text = report.read_text(encoding="utf-8")
        (out / report.name).write_text(_mark_tables(text), encoding="utf-8")
        for target in _IMAGE.findall(text):
            image = results / target
            if image.is_file():
                (out / target).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(image, out / target)
    for image in sorted(results.glob("*.png")):  # figures the user guide shows, beside those the reports link
        if not (out / image.name).exists():
            shutil.copy2(image, out / image.name)
    _write_benchmark_toc([report.stem for report in sorted(results.glob("*.md"))], out)


_write_api_reference()
_write_gallery()
_copy_benchmark_reports()

# ----------------------------------------------------------------------------------------------- extensions
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types
autodoc_member_order = "groupwise"
toc_object_entries_show_parents = "hide"  # "fit", not "LaplaceActiveSubspaceRegressor.fit", in a page's toc
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "attrs_block"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # the notebooks are executed and committed (make notebooks)
nb_merge_streams = True
# The benchmark reports are generated markdown whose tables start at ### under a # title.
suppress_warnings = ["myst.header"]


def _skip_foreign_members(app, what, name, obj, skip, options):
    """Members inherited from scikit-learn, torch or Python itself are theirs to document, not ours."""
    if what not in ("class", "exception"):
        return None
    owner = (getattr(obj, "__module__", None) or getattr(getattr(obj, "__func__", None), "__module__", None)
             or getattr(getattr(obj, "__objclass__", None), "__module__", None) or "")  # the last: C methods
    if name.startswith("set_") and name.endswith("_request"):
        return True  # scikit-learn's metadata-routing setters
    if owner.split(".")[0] in {"sklearn", "torch", "builtins", "abc", "typing", "enum"}:
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_foreign_members)
    app.connect("builder-inited", _warn_unlisted)
    app.add_css_file("custom.css")


# ----------------------------------------------------------------------------------------------- HTML
html_theme = "pydata_sphinx_theme"
html_title = f"glas-sklearn {release}"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
    # A page's table of contents goes under the site's navigation, in one column beside the article, so that at
    # 1280 px the article is wide enough for a 100-character code line (two side columns left it 645 px); the two
    # pages without the navigation column keep it on the right.
    "secondary_sidebar_items": {"**": [], "index": ["page-toc"], "getting_started": ["page-toc"]},
}
html_sidebars = {"**": ["sidebar-nav-bs", "page-toc"], "index": [], "getting_started": []}
html_show_sourcelink = False
