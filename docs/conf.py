"""Sphinx configuration of the glas-sklearn documentation.

Three parts of the site are generated here, before Sphinx reads any page, so that they follow the repository:

- ``api/index.rst``: the API reference, one section per public import path in ``API_SECTIONS`` below, listing that
  module's ``__all__`` (autosummary then writes a stub page per name under ``api/generated/``);
- ``gallery/generated/``: the executed notebooks ``notebooks/*.ipynb`` (rendered with their saved outputs, not
  re-executed) and the gallery's list of them;
- ``benchmarks/generated/``: every report ``benchmarks/results/*.md`` and the figures it shows.

All three are rebuilt on every run and ignored by git.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

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
    "numpydoc",
    "myst_nb",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store", "gallery/generated/list.md"]
templates_path = ["_templates"]

# ----------------------------------------------------------------------------------------------- the API reference
# (import path, title, one line on what lives there). A name is documented under the first path that exports it;
# the later ones link to it. To add a module, add a line; the names come from its __all__.
API_SECTIONS = [
    ("glas_sklearn", "Estimators, scorers and helpers",
     "What most users need: the two estimators, the interval scorers, and prediction through Pipelines."),
    ("glas_sklearn.metrics", "Interval metrics", "Coverage, width and the interval (Winkler) score."),
    ("glas_sklearn.regional_coverage", "Coverage per region",
     "Coverage and width per bin of σ̂ or of a column, worst-slab coverage, coverage gap."),
    ("glas_sklearn.compose", "Pipelines", "Intervals and prediction sets through Pipelines and target transforms."),
    ("glas_sklearn.predictive", "Predictive distributions",
     "Sampled and linearised intervals, class probabilities and prediction sets from a posterior."),
    ("glas_sklearn.calibration", "Calibration",
     "Choosing d by coverage (the paper), split-conformal calibration, σ0 by held-out NLL."),
    ("glas_sklearn.posterior", "Posterior", "The Laplace posterior in (or around) the active subspace."),
    ("glas_sklearn.laplace", "From a model to a posterior",
     "One call from a trained model and its data to the eigenpairs and the posterior."),
    ("glas_sklearn.adapters", "Model adapters",
     "How a model is called: transformers / peft keyword inputs and attention masks, ModelOutput → logits."),
    ("glas_sklearn.likelihoods", "Likelihoods",
     "The observation model: training loss, the output Hessian of the curvature, and β per scaling."),
    ("glas_sklearn.ggn", "Curvature", "The generalized Gauss-Newton matrix as a matrix-free operator."),
    ("glas_sklearn.eigen", "Eigen-solvers", "Top eigenpairs of a curvature operator (Lanczos or ARPACK)."),
    ("glas_sklearn.sampling", "Weight samples", "Posterior samples as parameter dicts or perturbed model copies."),
    ("glas_sklearn.diagnostics", "Diagnostics", "Eigenvector alignment across subsamples (paper §2.4)."),
    ("glas_sklearn.distributed", "Distributed runs", "The curvature over a torch.distributed process group."),
    ("glas_sklearn.plotting", "Plotting", "Display classes and plot_* shortcuts (needs matplotlib)."),
    ("glas_sklearn.datasets", "Data sets", "The UCI concrete data, shipped in the package."),
    ("glas_sklearn.contrib.smiles", "SMILES tokens", "A SMILES tokenizer and vocabulary for token models."),
]


def _public_names(module) -> list[str]:
    return [name for name in getattr(module, "__all__", []) if not name.startswith("_")]


def _write_api_reference() -> None:
    """api/index.rst from API_SECTIONS (the stub pages are autosummary's)."""
    out = DOCS / "api"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    lines = ["API reference", "=============", "",
             "Every public name, under the import path to use. The estimators follow scikit-learn's conventions",
             "(``get_params`` / ``set_params``, ``score``, cloning, Pipelines), which are not repeated here.", ""]
    documented: dict[int, str] = {}
    for path, title, blurb in API_SECTIONS:
        module = importlib.import_module(path)
        own, elsewhere = [], []
        for name in _public_names(module):
            obj = getattr(module, name)
            key = id(obj)
            if callable(obj) and key in documented:
                elsewhere.append((name, documented[key]))
            else:
                own.append(name)
                if callable(obj):
                    documented[key] = f"{path}.{name}"
        lines += [f".. _api-{path}:", "", f"``{path}``: {title}", "-" * (len(path) + len(title) + 6), "",
                  f".. automodule:: {path}", "", blurb, "",
                  f".. currentmodule:: {path}", ""]
        if own:
            lines += [".. autosummary::", "   :toctree: generated/", "   :nosignatures:", ""]
            lines += [f"   {name}" for name in own] + [""]
        if elsewhere:
            refs = ", ".join(f":obj:`{name} <{target}>`" for name, target in elsewhere)
            lines += [f"Also importable from here: {refs}.", ""]
    (out / "index.rst").write_text("\n".join(lines), encoding="utf-8")


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


def _copy_benchmark_reports() -> None:
    """benchmarks/generated/: every benchmarks/results/*.md, the images it refers to and every results/*.png."""
    results = ROOT / "benchmarks" / "results"
    out = DOCS / "benchmarks" / "generated"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for report in sorted(results.glob("*.md")):
        text = report.read_text(encoding="utf-8")
        (out / report.name).write_text(text, encoding="utf-8")
        for target in _IMAGE.findall(text):
            image = results / target
            if image.is_file():
                (out / target).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(image, out / target)
    for image in sorted(results.glob("*.png")):  # figures the user guide shows, beside those the reports link
        if not (out / image.name).exists():
            shutil.copy2(image, out / image.name)


_write_api_reference()
_write_gallery()
_copy_benchmark_reports()

# ----------------------------------------------------------------------------------------------- extensions
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types
autodoc_member_order = "groupwise"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
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
    app.add_css_file("custom.css")


# ----------------------------------------------------------------------------------------------- HTML
html_theme = "pydata_sphinx_theme"
html_title = f"glas-sklearn {release}"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"index": [], "getting_started": []}
html_show_sourcelink = False
