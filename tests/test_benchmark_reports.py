"""Each committed benchmark report is what its script renders from the committed results (no hand edits, no drift).

The scripts compute and write JSON; their ``render`` functions turn that JSON (and, for the SMILES study, its
alignment CSV) into the markdown report. Here each render function runs on the committed results and its output
must equal the committed ``.md`` (for paper_concrete, up to the hand-written discussion after its marker).
Nothing is computed and no figure is drawn.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARK = "<!-- discussion -->"


@pytest.fixture
def script(monkeypatch):
    """Import a benchmark script as ``python benchmarks/x.py`` would (benchmarks/ first on sys.path)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))

    def load(name):
        return importlib.import_module(name)

    return load


def _results(stem):
    return json.loads((RESULTS / f"{stem}.json").read_text())


def _report(stem):
    return (RESULTS / f"{stem}.md").read_text()


@pytest.mark.parametrize("stem", ["bench_ggn", "uci", "paper_1d", "regional_coverage", "serving", "paper_scale",
                                  "serialization", "classifier_small_tables",
                                  "ensemble_fit", "scale_out"])
def test_report_is_rendered_from_its_json(stem, script):
    assert script(stem).render(_results(stem)) == _report(stem)


def test_paper_concrete_report_is_rendered_from_its_json(script):
    module = script("paper_concrete")
    rendered = module.render(_results("paper_concrete"), "paper_concrete")
    committed = _report("paper_concrete")
    assert rendered.endswith(MARK + "\n") and MARK in committed
    assert rendered.split(MARK)[0] == committed.split(MARK)[0]
    assert committed.split(MARK)[1].strip().startswith("## Discussion")  # the hand-written part is still there


def test_default_fit_report_is_rendered_from_its_json(script):
    rendered = script("default_fit").render(_results("default_fit"))
    committed = _report("default_fit")
    assert rendered.endswith(MARK + "\n") and MARK in committed
    assert rendered.split(MARK)[0] == committed.split(MARK)[0]
    assert committed.split(MARK)[1].strip().startswith("## ")  # the hand-written part is still there


def test_paper_smiles_report_is_rendered_from_its_json(script):
    pd = pytest.importorskip("pandas")
    module = script("paper_smiles")
    table = pd.read_csv(RESULTS / "paper_smiles_alignment.csv")
    assert module.render(_results("paper_smiles"), table) == _report("paper_smiles")


def test_results_carry_command_and_machine():
    for path in sorted(RESULTS.glob("*.json")):
        R = json.loads(path.read_text())
        assert R["command"].startswith("python benchmarks/"), path.name
        assert isinstance(R["machine"], dict) and R["machine"].get("threads"), path.name


def test_every_report_has_its_script_and_its_json():
    """results/ holds the outputs of the maintained scripts only: each report's stem is a script of benchmarks/
    (run by benchmarks/run.py) with its JSON beside it, and every file belongs to one of those scripts."""
    scripts = {path.stem for path in (ROOT / "benchmarks").glob("*.py") if not path.stem.startswith("_")}
    for report in RESULTS.glob("*.md"):
        if report.stem == "digits_cnn":  # written by notebooks/04_digits_cnn.py in full mode
            continue
        assert report.stem in scripts and (RESULTS / f"{report.stem}.json").exists(), report.name
    strays = [p.name for p in RESULTS.iterdir() if not any(p.name.startswith(s) for s in scripts | {"digits_cnn"})]
    assert not strays, f"results/ files no maintained script writes: {strays}"


def test_the_entry_point_knows_every_script():
    run = (ROOT / "benchmarks" / "run.py").read_text(encoding="utf-8")
    scripts = {path.stem for path in (ROOT / "benchmarks").glob("*.py") if not path.stem.startswith("_")} - {"run"}
    missing = sorted(name for name in scripts if f'"{name}": Benchmark(' not in run)
    assert not missing, f"benchmarks/run.py does not run {missing}"


def test_no_benchmark_imports_another():
    import ast

    scripts = {path.stem for path in (ROOT / "benchmarks").glob("*.py")}
    for path in (ROOT / "benchmarks").glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
        others = {name for name in imported & scripts if not name.startswith("_")}
        assert not others, f"{path.name} imports the benchmark script(s) {others}; share code through _common.py"


def test_the_entry_point_builds_each_command_and_skips_what_is_missing(script, monkeypatch, tmp_path, capsys):
    run = script("run")
    import argparse

    quick = run.command("uci", argparse.Namespace(report_only=False, quick=True, out_dir=tmp_path))
    assert quick[1].endswith("uci.py") and quick[2:5] == ["--quick", "--out-dir", str(tmp_path)]
    assert "--datasets" in quick  # the smoke run's own small options
    monkeypatch.setenv(run.DATA_ENV, str(tmp_path / "nowhere"))
    assert "needs the uci data" in run.missing(run.BENCHMARKS["uci"])
    assert run.missing(run.BENCHMARKS["paper_1d"]) is None  # no data, no optional package
    # a benchmark whose data is missing is skipped with the reason, not run, and is no failure
    assert run.main(["--quick", "--out-dir", str(tmp_path), "uci"]) == 0
    assert "uci: skipped, needs the uci data" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run.main(["no_such_benchmark"])


def test_the_shift_partition_tests_on_the_top_third_of_one_feature(script):
    """regional_coverage's top-third extrapolation: the test rows are exactly those above the feature's two-thirds
    order statistic (ties kept by a stable sort), the rest split 90/10 into fitting and calibration rows, disjoint,
    together every row once; the split is seeded by the feature."""
    rc = script("regional_coverage")
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=301), rng.integers(0, 5, size=301)])  # a continuous and a tied feature
    for f in (0, 1):
        fit, cal, test = rc.shift_partition(X, f)
        assert np.array_equal(np.sort(np.concatenate([fit, cal, test])), np.arange(len(X)))
        assert len(test) == len(X) - 2 * len(X) // 3
        assert X[test, f].min() >= X[np.concatenate([fit, cal]), f].max()
        assert len(cal) == round(0.1 * (len(fit) + len(cal)))
        again = rc.shift_partition(X, f)
        assert all(np.array_equal(a, b) for a, b in zip((fit, cal, test), again, strict=True))
    order = np.argsort(X[:, 0])  # no ties: the test rows are the top third by value
    assert np.array_equal(np.sort(rc.shift_partition(X, 0)[2]), np.sort(order[2 * len(X) // 3:]))


def test_the_default_row_takes_flat_settings(script):
    """regional_coverage's ``--default-params``: a JSON dict of flat settings reaches the `default` row's estimator,
    training settings gathered into ``Training`` (two networks here: an ensemble of two members)."""
    from glas_sklearn.ensemble import NetworkEnsemble

    rc = script("regional_coverage")
    args = rc.parse_args(["--study", "shift", "--default-params", '{"n_networks": 2, "max_epochs": 3}'])
    assert args.default_params == {"n_networks": 2, "max_epochs": 3}
    assert rc.parse_args(["--study", "shift"]).default_params is None
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 3))
    y = X @ np.array([1.0, -0.5, 0.2]) + 0.1 * rng.normal(size=80)
    est = rc.fit_default(X[:60], y[:60], X[60:], y[60:], 0, args.default_params)
    assert isinstance(est.module_, NetworkEnsemble) and len(est.module_.members) == 2
    assert est.training.n_networks == 2 and est.training.max_epochs == 3 and est.random_state == 0
    plain = rc.fit_default(X[:60], y[:60], X[60:], y[60:], 0)
    assert not isinstance(plain.module_, NetworkEnsemble) and plain.training is None
    # the report says so: its `default` row is not the default
    head = rc._methods_header({"config": {"shift": vars(args)}, "shift": [{"methods": {"default": {}}}]})
    assert '--default-params` {"n_networks": 2, "max_epochs": 3}' in head and "as it is when run" not in head
    runs = [{"methods": {"default": {}}}]
    plain_head = rc._methods_header({"config": {"shift": vars(rc.parse_args([]))}, "shift": runs})
    assert "as it is when run" in plain_head


def test_the_small_tables_gap_is_the_paired_difference(script):
    """classifier_small_tables' ``nll_gap``: mean and standard error of the default's NLL less the baseline's over
    the splits the default fitted (a failed fit, with no default row, is left out), as numpy computes them."""
    cst = script("classifier_small_tables")
    rng = np.random.default_rng(1)
    default, logreg = rng.uniform(0.05, 0.1, 6), rng.uniform(0.05, 0.1, 6)
    rows = [{"methods": {"default": {"nll": a}, "logreg": {"nll": b}}} for a, b in zip(default, logreg, strict=True)]
    rows.append({"failure": "ValueError: ...", "methods": {"logreg": {"nll": 9.0}}})
    gap = cst.nll_gap(rows, "logreg")
    diff = default - logreg
    assert gap["baseline"] == "logreg" and gap["n"] == 6
    np.testing.assert_allclose(gap["mean"], diff.mean(), rtol=1e-12)
    np.testing.assert_allclose(gap["se"], diff.std(ddof=1) / np.sqrt(6), rtol=1e-12)


def test_the_logistic_model_table_is_drawn_from_a_logistic_regression(script):
    """classifier_small_tables' generated ``logistic_model`` table: the same rows every call, both classes, labels
    whose log-odds are the drawing model's x·β + b (an unpenalised logistic regression on a large draw recovers β
    and b to a few per cent), and noisy (the true model's NLL above 0.5: no table a network could fit exactly)."""
    from sklearn.linear_model import LogisticRegression

    cst = script("classifier_small_tables")
    X, y = cst.load_logistic_model()
    X2, y2 = cst.load_logistic_model()
    assert X.shape == (400, 8) and np.array_equal(X, X2) and np.array_equal(y, y2) and set(y) == {0, 1}
    big_X, big_y, beta, intercept = cst.load_logistic_model(n_rows=100_000, return_coef=True)
    model = LogisticRegression(C=1e6, max_iter=10_000).fit(big_X, big_y)
    assert np.linalg.norm(model.coef_[0] - beta) < 0.05 * np.linalg.norm(beta)
    assert abs(model.intercept_[0] - intercept) < 0.05 * max(1.0, abs(intercept))
    logits = big_X @ beta + intercept
    true_nll = np.mean(np.log1p(np.exp(-np.where(big_y == 1, logits, -logits))))
    assert true_nll > 0.5
