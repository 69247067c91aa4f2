import io
import logging

import numpy as np
import pytest

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor, LowRank, Training
from glas_sklearn._progress import LOG_INTERVAL, progress, stage
from glas_sklearn.calibration import MondrianConformalCalibrator
from glas_sklearn.likelihoods import HeteroscedasticGaussian


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_log_file_gets_no_redraws():
    log = io.StringIO()
    for _ in progress(range(500), desc="work", file=log):
        pass
    # The loop is far shorter than LOG_INTERVAL: its final state only, as one plain line.
    assert log.getvalue().startswith("work: 500/500 it [") and log.getvalue().count("\n") == 1
    assert "\r" not in log.getvalue()
    log = io.StringIO()
    for _ in progress(range(500), desc="work", file=log, leave=False):
        pass
    assert log.getvalue() == ""  # leave=False: the caller reports the finished stage


def test_log_file_gets_plain_lines_while_running():
    log = io.StringIO()
    bar = progress(desc="lanczos: top-5 eigenpairs", unit="products", file=log, mininterval=0, miniters=1,
                   leave=False)
    for _ in range(3):
        bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 3 and text.endswith("\n")
    assert lines[-1].startswith("lanczos: top-5 eigenpairs: 3 products ["), lines


def test_terminal_gets_live_bar_with_tqdm_defaults():
    bar = progress(range(3), file=_Terminal())
    assert bar.mininterval < LOG_INTERVAL
    bar.close()
    assert progress(range(3), file=io.StringIO()).mininterval == LOG_INTERVAL


def test_verbose_zero_is_silent():
    log = io.StringIO()
    for _ in progress(range(50), verbose=0, file=log):
        pass
    assert log.getvalue() == ""


def _trained_like_loop(file, steps=400, **kwargs):
    """The training loop's use of the bar: one ``set_postfix`` per step, as in glas_sklearn/training/loop.py."""
    bar = progress(range(steps), desc="training", file=file, **kwargs)
    for step in bar:
        bar.set_postfix(loss=f"{1.0 / (step + 1):.4g}")
        bar.set_description(f"training {step}")
    bar.close()
    return file.getvalue()


def test_set_postfix_does_not_redraw_in_a_log():
    # Shorter than LOG_INTERVAL: nothing per step, no redraw; the final state (with the last postfix) at close.
    text = _trained_like_loop(io.StringIO())
    assert "\r" not in text and text.count("\n") == 1 and "400/400" in text and "loss=0.0025" in text
    # With every update timed, one plain line each, the latest postfix in it.
    text = _trained_like_loop(io.StringIO(), steps=5, mininterval=0, miniters=1, leave=False)
    assert "\r" not in text and len(text.splitlines()) == 5
    assert text.splitlines()[-1].startswith("training 4: 5/5 it [") and "loss=0.2]" in text


def test_stage_line_is_written_when_verbose_and_logged(caplog):
    log = io.StringIO()
    with caplog.at_level(logging.INFO, logger="glas_sklearn.test"):
        logger = logging.getLogger("glas_sklearn.test")
        stage("lanczos: 5 eigenpairs in 40 products", verbose=1, file=log, logger=logger)
        stage("silent", verbose=0, file=log, logger=logger)
    assert log.getvalue() == "lanczos: 5 eigenpairs in 40 products\n"
    assert [r.getMessage() for r in caplog.records] == ["lanczos: 5 eigenpairs in 40 products", "silent"]


def test_set_postfix_redraws_live_in_a_terminal():
    # The same loop in a terminal (with the minimum interval off) redraws on every postfix: the live bar is kept.
    text = _trained_like_loop(_Terminal(), mininterval=0)
    assert text.count("\r") >= 400


def _blobs_or_wave(classifier):
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(120, 2))
    y = (X[:, 0] > 0).astype(int) if classifier else np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(120)
    return X, y


@pytest.mark.parametrize("cls", [LaplaceActiveSubspaceRegressor, LaplaceActiveSubspaceClassifier])
def test_fit_log_in_a_pipe_is_one_line_per_stage(cls, capsys):
    """verbose=1 with standard error captured (not a terminal): no carriage return, one line per finished stage
    with its time, the eigen-solver's line counting products, and a closing line saying what the fit did."""
    X, y = _blobs_or_wave(cls is LaplaceActiveSubspaceClassifier)
    est = cls(random_state=0, verbose=1, training=Training(max_epochs=5),
              posterior=LowRank(max_components=4, n_samples=20)).fit(X, y)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    stages = [line.split(":")[0] for line in lines]
    if getattr(est, "likelihood_support_", None) is not None:  # likelihood="auto": one training, the noise stage's line
        assert stages[:2] == ["training", "likelihood"] and "auto chose" in lines[1], lines
        lines = lines[:1] + lines[2:]
        stages = [line.split(":")[0] for line in lines]
    expected = ["training", "lanczos", "posterior"]
    expected += ["sigma0"] if est.n_sigma0_rows_ else []
    assert stages == expected + ["calibration", cls.__name__], lines
    assert f"in {est.eigen_info_['n_matvecs']} products" in lines[1] and "converged" in lines[1]
    networks = "3 networks of " if cls is LaplaceActiveSubspaceClassifier else ""  # n_networks="auto"
    assert lines[0].startswith(f"training: {networks}5 epochs on {len(est.train_indices_)} rows")
    assert f"at d = {est.n_components_} on {est.n_calibration_rows_} rows" in lines[-2]
    assert lines[-1].startswith(f"{cls.__name__}: fitted in ") and "1 torch thread" in lines[-1]
    assert all(" s" in line for line in lines)  # each with its time


def test_closing_line_counts_the_rows_trained_on_not_the_curvature_subsample(capsys):
    """With ``subsample`` the curvature sees fewer records than training did; the closing line names the rows the
    network was trained on (the training line's count), not ``n_records_``."""
    X, y = _blobs_or_wave(False)
    est = LaplaceActiveSubspaceRegressor(likelihood="gaussian", random_state=0, verbose=1,
                                         training=Training(max_epochs=5),
                                         posterior=LowRank(max_components=4, subsample=40)).fit(X, y)
    lines = capsys.readouterr().err.splitlines()
    n_train = len(est.train_indices_)
    assert est.n_records_ == 40 < n_train
    assert f"epochs on {n_train} rows" in lines[-1] and "on 40 rows" not in lines[-1], lines[-1]


@pytest.mark.parametrize(("n", "expected"),
                         [(28, "93.1 %"), (18, "94.7 %"), (9, None), (30, None), (200, None), (8, None)])
def test_expected_coverage_note_for_few_calibration_rows(n, expected):
    """⌈(n + 1)(1 − γ)⌉ / (n + 1) at 90 %: 27/29 from 28 rows, 18/19 from 18; a point or less above the level
    (9 rows: 9/10; 30: 28/31) says nothing, nor does a level the rows cannot reach (8 rows: infinite intervals,
    warned elsewhere)."""
    from glas_sklearn.calibration.conformal import expected_coverage_note as _expected_coverage

    note = _expected_coverage(n, 0.9)
    if expected is None:
        assert note == ""
    else:
        assert f"with {n} rows conformal intervals cover {expected} on average" in note


@pytest.mark.parametrize(("likelihood", "calibration", "says", "overshoot"),
                         [(HeteroscedasticGaussian(), "mondrian", "3 bands of σ̂", False),
                          ("gaussian", "mondrian", "Kruskal–Wallis p = ", False),
                          ("gaussian", "conformal", "quantile", True),
                          ("heteroscedastic", MondrianConformalCalibrator(min_bins=1, quantile_method="higher"),
                           "one band of σ̂: bands need 400", True),
                          ("heteroscedastic", MondrianConformalCalibrator(min_bins=2), "2 bands of σ̂", False)])
def test_calibration_line_says_the_bands_and_the_overshoot(capsys, likelihood, calibration, says, overshoot):
    """28 calibration rows: the default takes 3 bands of σ̂ (⌊28/9⌋) for a variance head's predictive, and for
    the Gaussian 3 or one as the Kruskal–Wallis test of its scores across those bands says (its p-value quoted),
    with interpolated quantiles, which cover the level on average; the rank rounded up (one pooled quantile)
    covers 27/29 = 93.1 % on average, and says so."""
    X, y = _blobs_or_wave(False)
    reg = LaplaceActiveSubspaceRegressor(likelihood=likelihood, calibration_size=28, calibration=calibration,
                                         random_state=0, verbose=1, training=Training(max_epochs=5),
                                         posterior=LowRank(max_components=4)).fit(X, y)
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("calibration: "))
    assert says in line and ("cover 93.1 % on average" in line) == overshoot, line
    p = reg.calibrator_.band_pvalue_[0] if hasattr(reg.calibrator_, "band_pvalue_") else np.nan
    shown = f"< {0.1:g}" if p < 0.1 <= float(f"{p:.2g}") else f"= {p:.2g}"  # never rounded across the level
    assert (f"Kruskal–Wallis p {shown}" in line) == bool(np.isfinite(p)), line
    if np.isfinite(p):
        assert ("3 bands of σ̂" in line) == (p < 0.1) and ("the scores are alike" in line) == (p >= 0.1), line


def test_fit_is_silent_with_verbose_zero(capsys):
    X, y = _blobs_or_wave(False)
    LaplaceActiveSubspaceRegressor(random_state=0, training=Training(max_epochs=5),
                                   posterior=LowRank(max_components=4, n_samples=20)).fit(X, y)
    assert capsys.readouterr().err == ""
