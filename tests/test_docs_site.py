"""The documentation site's structure: benchmark pages named for what they measure, the README's list of the
user guide complete, formulas rendered by the site's own MathJax."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


# ----------------------------------------------------------------------------------------- the user's pages
USER_PAGES = sorted((ROOT / "docs" / "user_guide").glob("*.md")) + [ROOT / "docs" / "getting_started.md"]
#: Longest a user page may be: a task, its code, the settings and their cost in a screen or two.
MAX_USER_PAGE_LINES = 220
#: Words of a lab notebook, which belong in docs/benchmarks/studies.md and the reports, not on a user's page.
LAB_NOTEBOOK = re.compile(
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"  # a commit hash
    r"|exploratory|not kept|did not replicate|stopped at \d[\d,]* of \d|at commit|git show|not merged|on a branch"
    r"|(?<![\w.])/tmp/|/work/",
    re.I)


def lab_notebook_markers(text: str) -> list[str]:
    return [f"{n}: {m.group(0)!r}" for n, line in enumerate(text.splitlines(), 1)
            for m in LAB_NOTEBOOK.finditer(line)]


def test_the_marker_check_sees_hashes_and_working_notes():
    text = ("its report at commit b69d756\n(exploratory scripts, not kept)\nit did not replicate\n"
            "stopped at 69 of 80\nwritten to /tmp/s8/rc\n")
    assert len(lab_notebook_markers(text)) == 7
    assert lab_notebook_markers("d = 50; 0.0827 against 0.0815; 1e-4; the 1,347 rows; 2f6cef6") == ["1: '2f6cef6'"]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.name)
def test_user_pages_are_short_and_say_what_to_do(page):
    text = page.read_text(encoding="utf-8")
    n = len(text.splitlines())
    assert n <= MAX_USER_PAGE_LINES, (f"{page.relative_to(ROOT)} has {n} lines (at most {MAX_USER_PAGE_LINES}): "
                                      "move measurements and their history to docs/benchmarks/studies.md")
    markers = lab_notebook_markers(text)
    assert not markers, (f"{page.relative_to(ROOT)} reads like a lab notebook (move it to "
                         f"docs/benchmarks/studies.md or a report): {markers}")


# ------------------------------------------------------------------------------------- defaults, stated once
#: Where the pages a user reads state a default: "`name=value`, the default", "the default `name=value`", "the
#: classifier's defaults (`name=value`)". Group 1 or 3: the code; group 2 or 4: the estimator it is said of.
_CODE = r"`([^`]*\w=[^`]*)`"
_OWNER = r"(?:(classifier|regressor)'s )?"
DEFAULT_CLAIM = re.compile(
    rf"{_CODE}[^.;`|]{{0,30}}?\b(?:the|is|by) {_OWNER}defaults?\b"
    rf"|\b{_OWNER}defaults?\b[,:]?(?: is| setting)?[ (]{{0,3}}{_CODE}", re.I)
_SETTING = re.compile(r"(\w+)=(\"[^\"]*\"|'[^']*'|[-\w.]+)")
CLAIM_PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md", *USER_PAGES]


def default_claims(text: str) -> list[tuple[int, str, str, str | None]]:
    """``(line, name, value as written, "classifier" / "regressor" / None)`` of every default a text states."""
    out = []
    for m in DEFAULT_CLAIM.finditer(text):
        code, owner = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        line = text.count("\n", 0, m.start()) + 1
        out += [(line, name, value, owner and owner.lower()) for name, value in _SETTING.findall(code)]
    return out


def _defaults() -> dict[str, dict[str, object]]:
    """Each settings class a page may state a default of → its ``get_params()``."""
    import glas_sklearn
    from glas_sklearn.calibration import ConformalCalibrator, MondrianConformalCalibrator

    classes = {"regressor": glas_sklearn.LaplaceActiveSubspaceRegressor,
               "classifier": glas_sklearn.LaplaceActiveSubspaceClassifier,
               "Training": glas_sklearn.Training, "Compute": glas_sklearn.Compute, "LowRank": glas_sklearn.LowRank,
               "ConformalCalibrator": ConformalCalibrator, "MondrianConformalCalibrator": MondrianConformalCalibrator}
    return {key: cls().get_params(deep=False) for key, cls in classes.items()}


def _same(written: str, value: object) -> bool:
    if isinstance(value, str):
        return written.strip("\"'") == value
    return written == repr(value) or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and re.fullmatch(r"-?[\d.]+(e-?\d+)?", written) and float(written) == value)


def test_the_claim_finder_reads_the_phrasings():
    text = ('`scaling="mean"`, the default, needs a few.\nthe classifier\'s defaults (`sigma0="auto"`)\n'
            'The default, `likelihood="auto"`, compares\n`Training(n_networks="auto")` is the default\n')
    assert default_claims(text) == [(1, "scaling", '"mean"', None), (2, "sigma0", '"auto"', "classifier"),
                                    (3, "likelihood", '"auto"', None), (4, "n_networks", '"auto"', None)]


def test_the_defaults_the_docs_state_are_the_codes():
    """A page that says a setting is the default says what ``get_params()`` says (issue: "`scaling="mean"`, the
    default" while the default is "auto")."""
    defaults = _defaults()
    wrong, checked = [], 0
    for page in CLAIM_PAGES:
        for line, name, written, owner in default_claims(page.read_text(encoding="utf-8")):
            holders = {key: params[name] for key, params in defaults.items() if name in params
                       and (owner is None or key == owner or key not in ("regressor", "classifier"))}
            if not holders:
                continue  # not a setting of the estimators (e.g. a conformity score's own parameter)
            checked += 1
            if not any(_same(written, value) for value in holders.values()):
                wrong.append(f"{page.relative_to(ROOT)}:{line}: {name}={written} said to be the default; "
                             f"get_params() gives {holders}")
    assert checked >= 15, f"only {checked} default claims found: the pattern misses the pages' phrasing"
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", ["LaplaceActiveSubspaceRegressor", "LaplaceActiveSubspaceClassifier"])
def test_the_api_page_lists_each_parameter_once_in_signature_order_with_its_default(name, monkeypatch):
    """What the site's extension (docs/numpydoc_signature.py) hands numpydoc for an estimator: one entry per
    parameter ("random_state : ...; verbose : ..." on one line was one mangled entry), in the signature's order,
    each stating the default get_params() gives."""
    import inspect

    import glas_sklearn

    monkeypatch.syspath_prepend(str(ROOT / "docs"))
    from numpydoc_signature import parameters_as_signature

    cls = getattr(glas_sklearn, name)
    lines = parameters_as_signature(cls, inspect.cleandoc(cls.__doc__).splitlines())
    start = lines.index("Parameters") + 2
    end = lines.index("Attributes")
    headers = [line for line in lines[start:end] if line.strip() and not line.startswith(" ")]
    names = [header.split(" : ")[0] for header in headers]
    assert names == list(inspect.signature(cls.__init__).parameters)[1:]
    params = cls().get_params(deep=False)
    for header, param in zip(headers, names, strict=True):
        value, stated = params[param], re.search(r"default=(.*)$", header)
        if stated is None:
            assert value is None and header.endswith("optional"), header
        else:
            assert stated.group(1) == (f'"{value}"' if isinstance(value, str) else repr(value)), header


#: The widest code line the site's content column shows without a scrollbar at 1280 px (docs/conf.py puts a
#: page's table of contents beside the navigation, leaving one side column, for that).
MAX_CODE_LINE = 100


def test_code_on_the_pages_a_user_reads_fits_the_column():
    fence = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)
    long = [f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start(2)) + 1 + k}: {len(line)} characters"
            for page in CLAIM_PAGES for text in [page.read_text(encoding="utf-8")]
            for m in fence.finditer(text) for k, line in enumerate(m.group(2).splitlines())
            if len(line) > MAX_CODE_LINE]
    assert not long, f"code lines wider than {MAX_CODE_LINE} characters (clipped at 1280 px):\n" + "\n".join(long)
