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


@pytest.mark.parametrize("stem", ["bench_ggn", "bench_fit", "bench_calibration", "uci", "uci_epochs500", "paper_1d",
                                  "prefit_calibration", "threads_under_load",
                                  "quintile_sampling", "heldout_shapes", "band_test_cost", "serialization"])
def test_report_is_rendered_from_its_json(stem, script):
    module = script(stem.split("_epochs")[0])
    assert module.render(_results(stem)) == _report(stem)


@pytest.mark.parametrize("stem, name", [("uci_heteroscedastic", "uci_heteroscedastic"),
                                        ("uci_heteroscedastic_shift", "uci_heteroscedastic"),
                                        ("uci_heteroscedastic_shift_gap", "uci_heteroscedastic"),
                                        ("synthetic_heteroscedastic", "synthetic_heteroscedastic"),
                                        ("calibrated_std", "calibrated_std"),
                                        ("regional_coverage", "regional_coverage")])
def test_heteroscedastic_reports_are_rendered_from_their_json(stem, name, script):
    assert script(name).render(_results(stem)) == _report(stem)


def test_paper_concrete_report_is_rendered_from_its_json(script):
    module = script("paper_concrete")
    rendered = module.render(_results("paper_concrete"), "paper_concrete")
    committed = _report("paper_concrete")
    assert rendered.endswith(MARK + "\n") and MARK in committed
    assert rendered.split(MARK)[0] == committed.split(MARK)[0]
    assert committed.split(MARK)[1].strip().startswith("## Discussion")  # the hand-written part is still there


def test_digits_rotation_report_is_rendered_from_its_json(script):
    module = script("digits_rotation")
    rendered = module.render(_results("digits_rotation"))
    committed = _report("digits_rotation")
    assert rendered.endswith(MARK + "\n") and MARK in committed
    assert rendered.split(MARK)[0] == committed.split(MARK)[0]
    assert committed.split(MARK)[1].strip().startswith("## ")  # the hand-written part is still there


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


@pytest.mark.parametrize("stem,module_name,renderer", [("uci_intervals", "uci", "render"),
                                                      ("uci_shift", "uci", "render_shift"),
                                                      ("digits_ood", "digits_ood", "render")])
def test_interval_studies_are_rendered_from_their_json(stem, module_name, renderer, script):
    module = script(module_name)
    assert getattr(module, renderer)(_results(stem)) == _report(stem)


def test_small_data_bins_report_is_rendered_from_its_json(script):
    rendered = script("small_data_bins").render(_results("small_data_bins"))
    committed = _report("small_data_bins")
    assert rendered.endswith(MARK + "\n") and MARK in committed
    assert rendered.split(MARK)[0] == committed.split(MARK)[0]


@pytest.mark.parametrize("stem", ["ranking_probes", "band_selection", "class_conditional"])
def test_discussed_reports_are_rendered_from_their_json(script, stem):
    rendered = script(stem).render(_results(stem))
    committed = _report(stem)
    assert rendered.endswith(MARK + "\n") and MARK in committed
    assert rendered.split(MARK)[0] == committed.split(MARK)[0]


def test_quintile_oracle_matches_a_direct_simulation(script):
    """quintile_sampling's oracle draws the conformal quantile from its Beta law and the covered rows per quintile
    as binomials; a direct simulation (uniform calibration and test scores, the ⌈(n+1)γ⌉-th smallest as the
    quantile) must give the same mean coverage, ⌈(n+1)γ⌉/(n+1), and the same spread of the pooled quintiles."""
    import numpy as np

    module = script("quintile_sampling")
    rng = np.random.default_rng(0)
    n_cal, counts, reps = [28] * 20, [[6, 6, 7, 6, 6]] * 20, 4000
    fast = module.oracle_quintiles(n_cal, counts, reps, rng)
    direct = np.zeros((reps, 5))
    k = 27  # ⌈29 × 0.9⌉
    for _ in range(20):
        q = np.sort(rng.random((reps, 28)), axis=1)[:, k - 1]
        direct += np.stack([(rng.random((reps, c)) <= q[:, None]).sum(1) for c in counts[0]], axis=1)
    direct /= 20 * np.asarray(counts[0])
    se = 0.1 / np.sqrt(reps)  # a generous bound on the standard error of a mean coverage over reps studies
    assert abs(fast.mean() - 27 / 29) < 5 * se and abs(direct.mean() - 27 / 29) < 5 * se
    # the spread of the highest quintile: the same law, so medians agree within Monte Carlo error
    assert abs(np.median(fast.max(1)) - np.median(direct.max(1))) < 0.01
    assert abs(fast.std(0).mean() - direct.std(0).mean()) < 0.1 * direct.std(0).mean()


def test_ranking_probes_variance_model_recovers_group_variances(script):
    """ranking_probes' log-linear variance model without ridge on one binary feature: the Gaussian NLL is
    minimised by the log of each group's mean squared residual (a closed form), a = log mean r²|z=0 and
    a + w = log mean r²|z=1."""
    import numpy as np

    module = script("ranking_probes")
    rng = np.random.default_rng(1)
    z = (rng.random(4000) < 0.3).astype(float)
    r = rng.standard_normal(4000) * np.where(z > 0, 3.0, 0.5)
    a, w = module.log_linear_variance(r, z[:, None], ridge=0.0)
    ref0, ref1 = np.log(np.mean(r[z == 0] ** 2)), np.log(np.mean(r[z == 1] ** 2))
    assert abs(a - ref0) < 1e-4 and abs(a + w - ref1) < 1e-4
    # a ridge penalty shrinks w towards 0 (the groups' variances closer together), never past it
    _, w_ridge = module.log_linear_variance(r, z[:, None], ridge=0.1)
    assert 0 < w_ridge < w
