"""Group-conditional (Mondrian) split conformal: the level holds within each bin of the predictive std σ̂(x).

Split conformal pools the calibration scores, so its 90 % is an average over the input space: where σ̂(x)
under-states the noise the intervals under-cover, where it over-states it they over-cover. Mondrian conformal
(Vovk, Gammerman & Shafer 2005, §4.5; Vovk et al. 2003) partitions the rows into groups by a rule fixed before the
calibration targets are seen and takes one conformal quantile per group, so that coverage ≥ 1 − γ holds within
each group. Here the groups are B equal-count bins of σ̂(x) (per output), their edges the quantiles j/B of σ̂ on
the calibration rows (which use X only, never y), and the quantile of bin b is the ⌈(n_b + 1)(1 − γ)⌉-th smallest
of its n_b scores (:func:`~glas_sklearn.calibration.conformal_quantile`). For classification the groups are the
classes (class-conditional conformal: the threshold of class c comes from the calibration rows labelled c).

How many bins. A bin's quantile is finite iff ⌈(n_b + 1)(1 − γ)⌉ ≤ n_b, i.e. (n_b + 1)(1 − γ) ≤ n_b, i.e.
n_b ≥ (1 − γ)/γ = 1/γ − 1, so a bin needs at least m_γ = ⌈1/γ⌉ − 1 rows (9 at 90 %, 19 at 95 %; at the highest
level asked). Finite is not enough to be useful: given its rows, a bin's coverage is Beta(k, n_b + 1 − k)
distributed (k the rank above), with a standard deviation ≈ sqrt(γ(1 − γ)/n_b), 3 % at n_b = 100 and γ = 0.1
(2.1 % at 200),
and its quantile is the noisier the fewer rows. ``n_bins="auto"`` therefore takes
B = max(1, min(``max_bins``, max(⌊n / max(``min_bin_size``, m_γ)⌋, min(``min_bins``, ⌊n / m_γ⌋)))) bins for n
calibration rows: bins of ``min_bin_size`` rows where the rows allow, and otherwise still ``min_bins`` bins of
at least m_γ rows, so that a σ̂ that ranks the errors badly within its range (coverage falling in its middle
fifth, rising at its ends) is corrected on small data as well (69 rows: 5 bins of 13–14); an integer
``n_bins`` is taken as asked. Either way bins are then merged with a neighbour, smallest first, until each
holds at least max(m_γ, 1) rows (ties in σ̂ can leave bins short), so every quantile at the fitted levels is
finite. Measured on the fitted-λ σ̂ (``docs/benchmarks/studies.md#regional-calibration``): 200-row
bins cost 0.0–0.4 % interval score where they act in distribution and save 0.9 % under top-third extrapolation
(800 rows, 4 bins), 100-row bins cost 0.5–0.8 %; σ̂ quintiles 89–90 % at 1,200 rows (one pooled quantile: 87–93 %).

Five bands or one on small data (``min_bins="auto"``). The heteroscedastic predictive (a likelihood with
``noise_per_row``), whose σ̂ carries a learnt noise shape, always takes five: on the four UCI dev sets with
28–144 calibration rows they bring every σ̂ quintile into 87–94 % (82–97 % with one quantile, where σ̂ ranks
energy's errors badly; ``docs/benchmarks/studies.md#small-data-bins``). A predictive without a noise head has a σ̂ of
the epistemic shape alone, which may or may not follow the noise: five bands there cost 1–6 % of interval score
where the scores do not depend on σ̂, and leave wine's quietest σ̂ fifth at 82.6 % where they do. So each output
takes five bands only where the calibration scores differ across them: where :func:`scores_alike_pvalue`, a
Kruskal–Wallis test over those five bands, is below ``BAND_TEST_LEVEL`` = 0.1 (``band_pvalue_``). On the default's
fits of the dev sets (20 splits, ``docs/benchmarks/studies.md#band-selection``) the test takes bands on 7 of wine's 12
Gaussian fits and 4 of concrete's 16, and brings wine's quietest fifth from 84 % to 87 %, at 0.988× split
conformal on concrete (0.993× with one band). Choosing the bands by a test on the calibration scores makes the
partition depend on the targets; the level within a band then holds up to that choice. Simulated where the scores do
not depend on σ̂ (``docs/benchmarks/studies.md#band-test-cost``), the test takes bands in 10 % of fits, and within those
fits coverage falls short of the level on small sets (87.6 % at 45 rows, 89.1 % at 100, 89.9 % at 300; 90.2–90.3 %
for one band in the same fits), while over all fits it is 89.85–89.95 % (without the test: 89.9–90.1 %).

The guarantee. With edges fixed independently of the calibration rows, coverage ≥ 1 − γ holds exactly within
each bin for exchangeable rows. The edges here are the calibration rows' own σ̂ quantiles (no rows are spent on
them); a test row's bin then depends on the calibration rows' σ̂ through the edges, and the within-bin level holds
up to O(1/n_b) (the simulation in ``tests/test_mondrian.py`` measures it). A row whose σ̂ falls below the lowest
calibration σ̂ goes to the first bin; one above the highest takes the larger of the last bin's quantile and the
pooled one: the last bin's rows may be over-covered by σ̂ within the calibrated range, but off it nothing says that
σ̂ over-states the error (under top-third extrapolation the last bin's quantile alone took energy's coverage from
47 % to 31 %, ``docs/benchmarks/studies.md#small-data-bins``).

The quantile. Rounding the rank up, ⌈(n_b + 1)(1 − γ)⌉ (``quantile_method="higher"``), guarantees ≥ 1 − γ and adds up to
1/(n_b + 1) to it: 93.3 % at 90 % in a bin of 14 rows, 91.6 % on average over the four UCI dev sets with bins of
9–29 rows. ``quantile_method="interpolated"`` (the default) interpolates between the ranks around (n_b + 1)(1 − γ)
(:func:`~glas_sklearn.calibration.conformal_quantile`): coverage at least 1 − γ − 1/(n_b + 1) given the rows, on
average 1 − γ (at least that for scores whose density falls in the upper tail). The edges already make the
within-bin level hold only up to O(1/n_b), so the interpolation keeps that order while removing the systematic
excess.
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd
import torch

from .._checks import check_confidence_levels
from .._silenced import silenced
from ..likelihoods import Categorical, Gaussian, Likelihood
from ..predictive import RegressionMoments
from ._bands import (
    BAND_TEST_LEVEL,
    _class_quantiles,
    _std_bands,
    band_quantiles,
    scores_alike_pvalue,
    std_bin_edges,
)
from .conformal import ConformalCalibrator, conformal_quantile

__all__ = ["BAND_TEST_LEVEL", "MondrianConformalCalibrator", "scores_alike_pvalue", "std_bin_edges"]

#: The bands ``min_bins="auto"`` asks for on small calibration sets (as far as each keeps ⌈1/γ⌉ − 1 rows).
AUTO_MIN_BINS = 5


def _calibration_summary(cal, prediction, target, confidence_levels):
    """Per level: the share of calibration rows inside their group's region under the fitted calibrator ``cal``
    (a :class:`MondrianConformalCalibrator`), and the mean width / set size."""
    levels = check_confidence_levels(confidence_levels)
    if cal.conformity_score_.classification:
        sets = cal.region(prediction, levels)
        hit = sets.gather(1, target.reshape(-1, 1, 1).expand(-1, 1, sets.shape[-1]))[:, 0]
        return (hit.to(torch.float64).mean(0).cpu().numpy(),
                sets.sum(1).to(torch.float64).mean(0).cpu().numpy())
    bounds = cal.region(prediction, levels)  # (n, M, 2, k)
    width = (bounds[:, :, 1] - bounds[:, :, 0]).to(torch.float64)
    # inside: a row's score at most its bin's quantile (as the pooled calibrator counts it); comparing y with
    # the bounds instead could drop the row whose score is the quantile itself by round-off
    raw = np.asarray(cal.conformity_score_.score(target, prediction).detach().cpu(), dtype=np.float64)
    raw = raw.reshape(raw.shape[0], -1)
    sd = prediction.std.to(torch.float64).reshape(raw.shape[0], -1).cpu().numpy()
    inside = np.zeros((raw.shape[0], raw.shape[1], len(levels)), dtype=bool)
    for j in range(raw.shape[1]):
        q = cal.band_quantiles(j, levels)  # (B, k)
        index = cal._bands_of(j, sd[:, j])
        inside[:, j] = raw[:, j, None] <= q[index]
    return inside.mean((0, 1)), width.mean((0, 1)).cpu().numpy()


def _band_text(bands: int, p: float, n_rows: int, need: int) -> str:
    """One output's bands and why: the test's p-value where it ran, else the rows (``need`` for two bands)."""
    own = f"{bands} bands of σ̂, each with its own quantile"
    if np.isfinite(p):
        test = f"Kruskal–Wallis p {_pvalue(p)}"
        if p < BAND_TEST_LEVEL:
            return f"{own}, as the scores differ across them ({test})"
        if bands == 1:
            return f"one band of σ̂: the scores are alike across bands ({test})"
        return f"{own}, by the row count (the scores are alike across narrower ones, {test})"
    if bands == 1 and n_rows < need:
        return f"one band of σ̂: bands need {need} calibration rows"
    return "one band of σ̂" if bands == 1 else own


def _pvalue(p: float) -> str:
    """"= 0.43" or "< 0.1": two significant digits, never rounded across the test's level (0.0996 is "< 0.1")."""
    shown = f"{p:.2g}"
    if p < BAND_TEST_LEVEL <= float(shown):
        return f"< {BAND_TEST_LEVEL:g}"
    return f"= {shown}"


class MondrianConformalCalibrator(ConformalCalibrator):
    """Split conformal within bins of the predictive std σ̂(x) (regression) or within classes (classification).

    ``calibration=MondrianConformalCalibrator()`` or ``calibration="mondrian"`` of the estimators; see the
    module's text for the rule behind ``n_bins="auto"`` and the guarantee. Intervals are ŷ ± q_b σ̂ with q_b the
    conformal quantile of the bin of σ̂(x); any level works at predict time (bins too small for it are merged
    with their neighbours, :meth:`band_quantiles`; infinite intervals, with a
    :class:`~glas_sklearn.calibration.ConformalWarning`, only where all rows together are too few). For
    classification the groups are the classes, never merged: a class with fewer than ⌈1/γ⌉ − 1 calibration rows is
    in every set at that level (one warning names those classes; the classifier raises its calibration share so
    that each class has them, :meth:`class_rows_needed`). Calibration rows are unweighted, as for
    :class:`ConformalCalibrator`. The regressor's default calibration.

    Parameters
    ----------
    n_bins : "auto" or int, default="auto"
        Bins of σ̂ per output: "auto" sets them from the calibration rows (⌊n / max(min_bin_size, ⌈1/γ⌉ − 1)⌋,
        at least ``min_bins`` as far as each keeps ⌈1/γ⌉ − 1 rows, at most ``max_bins``); an integer is taken as
        asked. Bins short of ⌈1/γ⌉ − 1 rows are merged. Ignored for classification (the groups are the classes).
    min_bin_size : int, default=200
        The rows per bin "auto" aims at (a bin's coverage then varies by about sqrt(γ(1 − γ)/200) = 2.1 % at 90 %)
        where that gives more than ``min_bins`` bins (measured in the module's text).
    max_bins : int, default=10
        The most bins "auto" takes.
    conformity_score : ConformityScore, optional
        As for :class:`ConformalCalibrator`; a regression score's regions are taken per bin.
    epistemic_weight : float or "fit", default="fit"
        As for :class:`ConformalCalibrator`: the weight of the epistemic variance in the σ̂ that normalises the
        scores and defines the bins.
    min_bins : int or "auto", default="auto"
        The fewest bins ``n_bins="auto"`` takes, as far as each keeps ⌈1/γ⌉ − 1 rows (1: one pooled quantile
        below 2 × ``min_bin_size`` rows). "auto": 5 for a likelihood whose network predicts the noise per row
        (``noise_per_row``); otherwise 5 for an output whose calibration scores differ across those bands
        (:func:`scores_alike_pvalue` below 0.1) and 1 for the others, which then take ⌊n / ``min_bin_size``⌋ bands
        by the row count (the test runs where five bands are more than that, below 1,000 rows at the defaults; over
        ``max_bins`` bands where that is below 5; the module's text).
    quantile_method : {"interpolated", "higher"}, default="interpolated"
        The within-bin quantile: interpolated between ranks (average coverage 1 − γ) or the rank rounded up (the
        finite-sample guarantee ≥ 1 − γ, up to 1/(n_b + 1) more); see the module's text.

    Attributes
    ----------
    edges_ : list of ndarray
        Per output, the inner bin edges on σ̂ (internal units), B − 1 of them.
    bin_scores_ : list of list of ndarray
        Per output (regression) or per class (classification, one list), each group's sorted scores.
    bins_ : pandas.DataFrame
        One row per output and bin (or class): ``output``, ``bin``, ``low`` and ``high`` (σ̂ on its calibration
        rows), ``n`` and ``quantile`` at the first level.
    min_bins_ : int
        ``min_bins`` as resolved for the fitted likelihood, before the test per output (regression).
    band_pvalue_ : ndarray of shape (M,)
        Per output, :func:`scores_alike_pvalue` where "auto" tested for bands, else NaN (regression).
    class_labels_ : list, optional
        Classification: the class labels (set by the classifier), which warnings name; else class indices.
    std_max_ : ndarray of shape (M,)
        Per output, the highest σ̂ of the calibration rows (regression): above it the pooled quantile is a floor.
    (and those of :class:`ConformalCalibrator`: ``scores_`` holds the pooled sorted scores)

    Examples
    --------
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor
    >>> reg = LaplaceActiveSubspaceRegressor(calibration=MondrianConformalCalibrator(n_bins=3))
    >>> reg.get_params()["calibration__n_bins"]
    3
    """

    SCALE_PRIOR_ROWS = 30
    """Pseudo-rows of the pooled mean square score added to each bin's in :meth:`bin_std_factors`."""

    def __init__(self, n_bins="auto", min_bin_size: int = 200, max_bins: int = 10, conformity_score=None,
                 epistemic_weight="fit", min_bins="auto", quantile_method: str = "interpolated") -> None:
        super().__init__(conformity_score=conformity_score, epistemic_weight=epistemic_weight)
        self.n_bins = n_bins
        self.min_bin_size = min_bin_size
        self.max_bins = max_bins
        self.min_bins = min_bins
        self.quantile_method = quantile_method

    # ------------------------------------------------------------------------------------------- fit
    def _fit_groups(self, prediction, target, confidence_levels, table):
        # the groups from the prediction the pooled scores were computed from (the predictive is computed once)
        self.calibrate_predictions(prediction, target, confidence_levels, self.likelihood_)
        table = table.copy()
        with silenced("few_calibration_rows"):  # calibrate_predictions has said it
            cov, width = _calibration_summary(self, prediction, target, confidence_levels)
        size_col = self.likelihood_.region_size_name
        table["coverage"], table[size_col] = cov, width
        table["n_bins"] = max(len(e) + 1 for e in self.edges_) if not self.conformity_score_.classification else \
            len(self.bin_scores_[0])
        return table

    def check_settings(self, likelihood: Likelihood | None = None) -> None:
        super().check_settings(likelihood)
        self._check_bins()

    def _check_bins(self) -> None:
        if not (self.n_bins == "auto" or (isinstance(self.n_bins, numbers.Integral)
                                          and not isinstance(self.n_bins, bool) and self.n_bins >= 1)):
            raise ValueError(f"n_bins must be 'auto' or an integer >= 1, got {self.n_bins!r}.")
        for name in ("min_bin_size", "max_bins", "min_bins"):
            v = getattr(self, name)
            if name == "min_bins" and v == "auto":
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                also = " or 'auto'" if name == "min_bins" else ""
                raise ValueError(f"{name} must be an integer >= 1{also}, got {v!r}.")
        if self.quantile_method not in ("interpolated", "higher"):
            raise ValueError(f"quantile_method must be 'interpolated' or 'higher', got {self.quantile_method!r}.")

    def resolved_min_bins(self, likelihood: Likelihood | None = None) -> int:
        """``min_bins``; "auto": 5 where ``likelihood`` predicts the noise per row (``noise_per_row``), else 1
        (before the test of :func:`scores_alike_pvalue`, which may take 5 per output)."""
        if self.min_bins != "auto":
            return int(self.min_bins)
        return AUTO_MIN_BINS if getattr(likelihood, "noise_per_row", False) else 1

    def bins_for(self, n_rows: int, confidence_levels, likelihood: Likelihood | None = None, *,
                 min_bins: int | None = None) -> int:
        """The bins asked for with ``n_rows`` calibration rows at ``confidence_levels`` (before merging), with
        ``min_bins`` instead of :meth:`resolved_min_bins` where given."""
        self._check_bins()
        if self.n_bins != "auto":
            return int(self.n_bins)
        smallest = self._min_rows(confidence_levels)
        large = n_rows // max(int(self.min_bin_size), smallest)
        small = min(self.resolved_min_bins(likelihood) if min_bins is None else min_bins, n_rows // smallest)
        return int(max(1, min(int(self.max_bins), max(large, small))))

    def _quantile(self, scores, confidence_levels) -> np.ndarray:
        """:func:`~glas_sklearn.calibration.conformal_quantile` by this calibrator's ``quantile_method``."""
        return conformal_quantile(scores, confidence_levels, method=self.quantile_method)

    def calibrate_predictions(self, prediction, y: torch.Tensor, confidence_levels,
                              likelihood: Likelihood | None = None) -> MondrianConformalCalibrator:
        """The groups and their sorted scores from predictions on the calibration rows and their targets.

        Parameters
        ----------
        prediction : RegressionMoments or torch.Tensor
            The predictive moments (n, M) (regression; the bins are those of ``prediction.std``) or the class
            probabilities (n, C) (classification).
        y : torch.Tensor
            Targets shaped as the mean (regression) or class indices (n,).
        confidence_levels : float or sequence of float
            The levels the bins must serve (their highest sets the fewest rows per bin).
        likelihood : Likelihood, optional
            Whose default conformity score to use when none was given (:meth:`fit` passes its own); None: the
            Gaussian's for predictive moments, the categorical's for class probabilities.

        Returns
        -------
        self
        """
        if likelihood is None and getattr(self, "conformity_score_", None) is None:
            # called on its own: the predictions say what they are
            likelihood = Gaussian() if isinstance(prediction, RegressionMoments) else Categorical()
        self._resolve_score(likelihood)
        raw = np.asarray(self.conformity_score_.score(y, prediction).detach().cpu(), dtype=np.float64)
        min_rows = self._min_rows(confidence_levels)
        levels = check_confidence_levels(confidence_levels)
        records = []
        if self.conformity_score_.classification:
            labels = y.reshape(-1).cpu().numpy()
            n_classes = prediction.shape[1]
            self.edges_ = []
            self.bin_scores_ = [[np.sort(raw[labels == c]) for c in range(n_classes)]]
            quantiles = self.class_quantiles(levels)
            for c, s in enumerate(self.bin_scores_[0]):
                records.append({"output": 0, "bin": c, "low": np.nan, "high": np.nan, "n": int(s.size),
                                "quantile": float(quantiles[c, 0])})
        else:
            raw = raw.reshape(raw.shape[0], -1)
            sd = prediction.std.to(torch.float64).reshape(raw.shape[0], -1).cpu().numpy()
            self.min_bins_ = self.resolved_min_bins(likelihood)
            n_bins = self.bins_for(raw.shape[0], confidence_levels, likelihood)
            # "auto": the wider bands where the scores differ across them (the module's text), per output
            wider = self.bins_for(raw.shape[0], confidence_levels, min_bins=AUTO_MIN_BINS) \
                if self.min_bins == "auto" else n_bins
            self.std_max_ = sd.max(axis=0)
            self.edges_, self.bin_scores_, pvalues = [], [], []
            for j in range(raw.shape[1]):
                edges, p = _std_bands(raw[:, j], sd[:, j], n_bins, wider, min_rows)
                self.edges_.append(edges)
                pvalues.append(p)
                index = self._bands_of(j, sd[:, j])
                self.bin_scores_.append([np.sort(raw[index == b, j]) for b in range(len(edges) + 1)])
                for b, s in enumerate(self.bin_scores_[-1]):
                    in_bin = sd[index == b, j]
                    records.append({"output": j, "bin": b, "low": float(in_bin.min()), "high": float(in_bin.max()),
                                    "n": int(s.size), "quantile": float(self._quantile(s, levels)[0])})
            self.band_pvalue_ = np.array(pvalues)
        self.bins_ = pd.DataFrame.from_records(records, columns=["output", "bin", "low", "high", "n", "quantile"])
        return self

    # ------------------------------------------------------------------------------------- predict
    def region(self, prediction, confidence_levels):
        """The score's regions with each row's group quantile: bounds (n, M, 2, k) or bool sets (n, C, k)."""
        levels = check_confidence_levels(confidence_levels)
        score = self.conformity_score_
        if score.classification:
            quantiles = self.class_quantiles(levels)
            # (n, k) per class: class c in the set at its own threshold
            return torch.stack([score.region(prediction, q)[:, c] for c, q in enumerate(quantiles)], dim=1)
        n = prediction.mean.shape[0]
        if n == 0:
            return prediction.mean.new_zeros((*prediction.mean.shape, 2, len(levels)))
        sd = prediction.std.to(torch.float64).reshape(n, -1).cpu().numpy()
        M = sd.shape[1]
        bounds = None
        for j in range(M):
            index = self._bands_of(j, sd[:, j])
            band_q = self.band_quantiles(j, levels)
            beyond = sd[:, j] > self.std_max_[j]
            if beyond.any():  # off the calibrated σ̂: one more band, at least the pooled quantile (module text)
                band_q = np.vstack([band_q, np.maximum(band_q[-1], self._pooled_quantile(j, levels))])
                index = np.where(beyond, len(band_q) - 1, index)
            for b in range(len(band_q)):
                rows = np.flatnonzero(index == b)
                if rows.size == 0:
                    continue
                q = np.repeat(band_q[b][:, None], M, axis=1)  # (k, M): output j's column used
                at = torch.as_tensor(rows, device=prediction.mean.device)
                part = score.region(RegressionMoments(prediction.mean[at], prediction.std[at]), q)
                part = part.reshape(rows.size, M, 2, len(levels))
                if bounds is None:
                    bounds = torch.empty((n, M, 2, len(levels)), dtype=part.dtype, device=part.device)
                bounds[at, j] = part[:, j]
        return bounds.reshape(*prediction.mean.shape, 2, len(levels))

    def _pooled_quantile(self, output: int, confidence_levels) -> np.ndarray:
        """The quantile of all calibration scores of ``output`` per level, (k,)."""
        with silenced("few_calibration_rows"):  # too few rows: +inf, which the bins' own warning has announced
            return self._quantile(np.concatenate(self.bin_scores_[output]), confidence_levels)

    def class_quantiles(self, confidence_levels) -> np.ndarray:
        """Classification: the conformal quantile of each class's calibration scores per level, (C, k); +inf for
        a class with fewer than ⌈1/γ⌉ − 1 calibration rows (it is then in every set), with one
        :class:`~glas_sklearn.calibration.ConformalWarning` naming those classes."""
        return _class_quantiles(self.bin_scores_[0], check_confidence_levels(confidence_levels), self._quantile,
                                getattr(self, "class_labels_", None))

    def class_rows_needed(self, confidence_levels) -> int:
        """⌈1/γ⌉ − 1 at the highest level: the calibration rows each class needs for a finite class quantile
        (classification; the groups are the classes)."""
        return self._min_rows(confidence_levels)

    def _min_rows(self, confidence_levels) -> int:
        """⌈1/γ⌉ − 1 at the highest level (:meth:`rows_needed`), at least 1: the fewest rows of a bin with a finite
        conformal quantile."""
        return max(1, self.rows_needed(confidence_levels))

    def _bands_of(self, output: int, std) -> np.ndarray:
        """The σ̂ bin of each value of ``std`` (n,) for ``output``: right-closed, as :func:`std_bin_edges` cuts
        them."""
        return np.searchsorted(self.edges_[output], std, side="left")

    def band_quantiles(self, output: int, confidence_levels) -> np.ndarray:
        """The conformal quantile of each σ̂ bin of ``output`` per level, (B, k): :func:`band_quantiles` of its
        bins' scores."""
        return band_quantiles(self.bin_scores_[output], confidence_levels, self._quantile)

    def bin_std_factors(self, std) -> np.ndarray:
        """Per row and output, the root mean square of the scores of the row's σ̂ bin over that of all calibration
        scores, (n, M): ``std`` (σ̂, shape (n, M)) times it, times the pooled scale (the regressor's
        ``std_scale_``), is σ̂ times its own bin's scale.

        A bin's mean square is shrunk towards the pooled one as if it held ``SCALE_PRIOR_ROWS`` more rows of the
        pooled mean square (σ̂ times a scale from a dozen rows would reorder the rows across bins by noise; bins
        of hundreds of rows keep nearly their own); above every calibration row's σ̂ the factor is at least 1,
        as the intervals' quantile there."""
        sd = np.asarray(std.detach().cpu() if isinstance(std, torch.Tensor) else std, dtype=np.float64)
        sd = sd.reshape(sd.shape[0], -1)
        out = np.ones_like(sd)
        k = self.SCALE_PRIOR_ROWS
        for j in range(sd.shape[1]):
            pooled_ms = np.mean(np.concatenate(self.bin_scores_[j]) ** 2)
            ms = np.array([(np.sum(s**2) + k * pooled_ms) / (s.size + k) for s in self.bin_scores_[j]])
            out[:, j] = np.sqrt(ms[self._bands_of(j, sd[:, j])] / max(pooled_ms, 1e-300))
            beyond = sd[:, j] > self.std_max_[j]
            out[beyond, j] = np.maximum(out[beyond, j], 1.0)
        return out

    # ------------------------------------------------------------------------------------- the report
    def _interpolates(self) -> bool:
        return self.quantile_method == "interpolated"

    def _groups_report(self, n_rows: int) -> tuple[str, int]:
        """The bands of σ̂ (regression, :meth:`bands_report`) or the classes with their own quantiles."""
        table = self.table_
        if "n_bins" not in table or not len(table):
            return "", 1
        if self.conformity_score_.classification:
            bands = len(self.bin_scores_[0])
            return f" (pooled; each of the {bands} classes has its own, calibrator_.bins_)", bands
        bands = max(len(e) + 1 for e in self.edges_)
        top = float(table["level"].max())  # the bands serve the highest level
        return f" ({'pooled; ' if bands > 1 else ''}{self.bands_report(top, n_rows)})", bands

    def bands_report(self, level: float, n_rows: int) -> str:
        """The σ̂ bands and why, per output (once where the outputs agree), for ``n_rows`` calibration rows
        serving ``level``, e.g. "5 bands of σ̂, each with its own quantile, as the scores differ across them
        (Kruskal–Wallis p = 0.031)"."""
        if self.n_bins != "auto":
            bands = max(len(e) + 1 for e in self.edges_)
            merged = f", merged to {bands} for {self.rows_needed(level)} rows a band" if bands < self.n_bins else ""
            return f"n_bins={self.n_bins} as set{merged}"
        pvalues = getattr(self, "band_pvalue_", None)
        if self.min_bins == "auto" or self.min_bins_ > 1:
            need = 2 * self.rows_needed(level)
        else:
            need = 2 * max(self.min_bin_size, self.rows_needed(level))
        texts = [_band_text(len(edges) + 1, np.nan if pvalues is None else float(pvalues[j]), n_rows, need)
                 for j, edges in enumerate(self.edges_)]
        if len(set(texts)) == 1:
            return texts[0] + (f", every output of {len(texts)}" if len(texts) > 1 else "")
        if len(texts) > 4:
            counts = [len(e) + 1 for e in self.edges_]
            return f"σ̂ bands per output {counts}, each with its own quantile (band_pvalue_ says why)"
        return "; ".join(f"output {j}: {t}" for j, t in enumerate(texts))

    def predict_interval(self, posterior, X, confidence_levels=None, *, batch_size=None):
        """``(mean, std, bounds)`` as :class:`ConformalCalibrator`'s, but ``std`` is σ̂ times
        :meth:`bin_std_factors` (one scale per σ̂ bin, not one pooled scale: the regressor's
        ``predict(return_std=True)`` multiplies it by ``std_scale_``, the pooled root mean square score), and the
        bounds take each bin's quantile."""
        moments = self.predictive_moments(posterior, X, batch_size=batch_size)
        bounds = None if confidence_levels is None else self.region(moments, confidence_levels)
        if moments.mean.shape[0] == 0:
            return moments.mean, moments.std, bounds
        factor = torch.as_tensor(self.bin_std_factors(moments.std), dtype=moments.std.dtype,
                                 device=moments.std.device).reshape(moments.std.shape)
        return moments.mean, moments.std * factor, bounds

    def predict_set(self, probs, confidence_levels):
        return self.region(probs, confidence_levels)
