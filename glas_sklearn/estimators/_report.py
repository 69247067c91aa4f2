"""The lines an estimator's ``fit`` reports: one per finished stage with its time and key figures, and a closing
line saying what the fit did (written with ``verbose ≥ 1``, logged at INFO level always; see
:func:`glas_sklearn._progress.stage`). Each function reads the fitted attributes of the estimator it is given."""

from __future__ import annotations

import numbers

import numpy as np

from ..calibration.conformal import conformal_rank
from ..calibration.mondrian import BAND_TEST_LEVEL

__all__ = ["calibration_line", "fit_line", "posterior_line", "sigma0_line", "training_line"]


def _pct(level: float) -> str:
    return f"{100 * float(level):g} %"


def _threads(est) -> str:
    n = getattr(est, "n_threads_", None)
    if n is None:
        return "torch's own thread count"
    how = "auto" if est.n_threads == "auto" else "n_threads"
    return f"{n} torch thread{'s' if n != 1 else ''} ({how})"


def _calibration_name(est) -> str:
    return est.calibration if isinstance(est.calibration, str) else type(est.calibration).__name__


def training_line(est, n_rows: int, seconds: float) -> str:
    """E.g. "training: 500 epochs on 696 rows (batches of 64), 12.3 s, loss 0.0123 (first epoch 0.912);
    1 torch thread (auto)", or with early stopping "training: 37 epochs on 36,000 rows (batches of 200; 4,000
    held out, stopped early, best held-out loss 0.123), ..."."""
    losses = est.training_loss_
    held_out = getattr(est, "validation_indices_", None)
    n_fit = n_rows - (0 if held_out is None else len(held_out))
    batch = min(est._batch_size(n_fit) or n_fit, n_fit)
    detail = f"batches of {batch}"
    if held_out is not None:
        stopped = "stopped early" if len(losses) < est.max_epochs else "ran max_epochs"
        detail += (f"; {len(held_out):,} held out, {stopped}, best held-out loss "
                   f"{est.best_validation_score_:.4g}")
    text = f"training: {len(losses)} epochs on {n_fit:,} rows ({detail}), {seconds:.1f} s"
    if losses:
        text += f", loss {losses[-1]:.4g} (first epoch {losses[0]:.4g})"
    return f"{text}; {_threads(est)}"


def posterior_line(est, seconds: float) -> str:
    """E.g. "posterior: low_rank on the top 50 eigendirections of 2,951 weights, sigma0 = 0.412 (eb_subspace),
    beta = 12.3, 1.6 s (curvature and eigenpairs)"."""
    kind = est.posterior if isinstance(est.posterior, str) else est.posterior.__name__
    setting, K = est._resolved_sigma0(), len(est.eigenvalues_)
    how = "given" if isinstance(setting, numbers.Real) else setting
    return (f"posterior: {kind} on the top {K} eigendirections of {est.n_weights_:,} weights, sigma0 = "
            f"{float(est.posterior_.fit_sigma0(K)):.4g} at d = {K} ({how}), beta = {est.beta_:.4g}, {seconds:.1f} s "
            "(curvature and eigenpairs)")


def sigma0_line(est, n_rows: int, seconds: float) -> str:
    """E.g. "sigma0: 0.0123 chosen by the NLL of 45 calibration rows (full-space EB 0.41), 0.3 s"."""
    search = est.sigma0_search_
    return (f"sigma0: {search.sigma0:.4g} chosen by the predictive NLL of {n_rows} calibration rows "
            f"(full-space empirical Bayes {search.sigma0_upper:.4g}), {seconds:.1f} s")


def calibration_line(est, seconds: float) -> str:
    """E.g. "calibration: conformal at d = 50 on 78 rows, 0.4 s: quantile 1.64 at 90 %" or "calibration:
    coverage chose d = 12 on 78 rows, 0.9 s: coverage 0.91 at 90 % (reached)"."""
    table, d, n = est.calibration_, est.n_components_, est.n_calibration_rows_
    text = f"calibration: {_calibration_name(est)} at d = {d} on {n} rows, {seconds:.1f} s"
    if "quantile" in table and "level" in table:
        text += ": " + ", ".join(f"quantile {row.quantile:.3g} at {_pct(row.level)}" for row in table.itertuples())
        cal, level = est.calibrator_, float(table["level"].iloc[0])
        bands = 1
        if "n_bins" in table and len(table):
            if est.likelihood_.is_classification:
                bands = len(cal.bin_scores_[0])
                text += f" (pooled; each of the {bands} classes has its own, calibrator_.bins_)"
            else:
                bands = max(len(e) + 1 for e in cal.edges_)
                top = float(table["level"].max())  # the bands serve the highest level
                text += f" ({'pooled; ' if bands > 1 else ''}{_bands_text(cal, top, n)})"
        if getattr(cal, "quantile_method", "higher") == "higher" and bands == 1:  # interpolated: the level on average
            text += _expected_coverage(n, level)
    elif "coverage" in table and len(table):
        level = est._levels(None)[0]
        row = table[table["d"] == d].iloc[-1] if (table["d"] == d).any() else table.iloc[-1]
        reached = {True: " (reached)", False: " (not reached)", None: ""}[est.calibration_reached_]
        text += f": coverage {row['coverage']:.3f} of the {_pct(level)} target{reached}"
    return text


def _bands_text(cal, level: float, n_rows: int) -> str:
    """The σ̂ bands of a fitted MondrianConformalCalibrator and why, per output (once where the outputs agree), e.g.
    "5 bands of σ̂, each with its own quantile, as the scores differ across them (Kruskal–Wallis p = 0.031)"."""
    if cal.n_bins != "auto":
        bands = max(len(e) + 1 for e in cal.edges_)
        merged = f", merged to {bands} for {cal.rows_needed(level)} rows a band" if bands < cal.n_bins else ""
        return f"n_bins={cal.n_bins} as set{merged}"
    pvalues = getattr(cal, "band_pvalue_", None)
    if cal.min_bins == "auto" or cal.min_bins_ > 1:
        need = 2 * cal.rows_needed(level)
    else:
        need = 2 * max(cal.min_bin_size, cal.rows_needed(level))
    texts = []
    for j, edges in enumerate(cal.edges_):
        bands = len(edges) + 1
        p = np.nan if pvalues is None else float(pvalues[j])
        own = f"{bands} bands of σ̂, each with its own quantile"
        if np.isfinite(p):
            test = f"Kruskal–Wallis p {_pvalue(p)}"
            if p < BAND_TEST_LEVEL:
                texts.append(f"{own}, as the scores differ across them ({test})")
            elif bands == 1:
                texts.append(f"one band of σ̂: the scores are alike across bands ({test})")
            else:
                texts.append(f"{own}, by the row count (the scores are alike across narrower ones, {test})")
        elif bands == 1 and n_rows < need:
            texts.append(f"one band of σ̂: bands need {need} calibration rows")
        elif bands == 1:
            texts.append("one band of σ̂")
        else:
            texts.append(own)
    if len(set(texts)) == 1:
        return texts[0] + (f", every output of {len(texts)}" if len(texts) > 1 else "")
    if len(texts) > 4:
        counts = [len(e) + 1 for e in cal.edges_]
        return f"σ̂ bands per output {counts}, each with its own quantile (band_pvalue_ says why)"
    return "; ".join(f"output {j}: {t}" for j, t in enumerate(texts))


def _pvalue(p: float) -> str:
    """"= 0.43" or "< 0.1": two significant digits, never rounded across the test's level (0.0996 is "< 0.1")."""
    shown = f"{p:.2g}"
    if p < BAND_TEST_LEVEL <= float(shown):
        return f"< {BAND_TEST_LEVEL:g}"
    return f"= {shown}"


def _expected_coverage(n: int, level: float) -> str:
    """With few calibration rows a conformal interval covers ⌈(n + 1)(1 − γ)⌉ / (n + 1) on average, above the level:
    said when that is a point or more (e.g. 93.1 % from 28 rows at 90 %), so that the overshoot is not a surprise."""
    if n < 1:
        return ""
    k = int(conformal_rank(n, level)[0])
    expected = k / (n + 1)
    if k > n or expected - level < 0.01:
        return ""
    return (f"; with {n} rows conformal intervals cover {100 * expected:.1f} % on average (⌈(n + 1)(1 − γ)⌉/(n + 1); "
            "more calibration rows bring it to the level)")


def fit_line(est) -> str:
    """The closing line, e.g. "LaplaceActiveSubspaceRegressor: fitted in 15.2 s: trained an MLP of 2,951 weights for
    500 epochs on 696 rows; posterior low_rank, d = 50; conformal intervals at 90 % from 78 calibration rows;
    1 torch thread (auto)"."""
    name = type(est).__name__
    what = "prediction sets" if est.likelihood_.is_classification else "intervals"
    if est.prefit:
        network = f"used the prefit network ({est.n_weights_:,} trainable weights) as it is"
    else:
        network = (f"trained the network ({est.n_weights_:,} weights) for {len(est.training_loss_)} epochs on "
                   f"{getattr(est, '_n_rows_trained', est.n_records_):,} rows")
    kind = est.posterior if isinstance(est.posterior, str) else est.posterior.__name__
    levels = ", ".join(_pct(v) for v in est._levels(None))
    return (f"{name}: fitted in {est.timings_['total']:.1f} s: {network}; posterior {kind}, d = {est.n_components_}; "
            f"{_calibration_name(est)} {what} at {levels} from {est.n_calibration_rows_} calibration rows; "
            f"{_threads(est)}")
