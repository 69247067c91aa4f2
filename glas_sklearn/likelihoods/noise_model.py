"""The noise stage: σ²(x) fitted after the mean network, on its residuals, and the test of constant σ against σ(x).

The mean network is trained alone (the ½-squared error, the Gaussian's), so its mean is the Gaussian network's.
Then the noise level is modelled from its residuals r = y − μ(x): per target, gradient-boosted trees
(scikit-learn's ``HistGradientBoostingRegressor``) with the Gamma deviance and a log link on ``|r|``, whose mean is
σ(x) √(2/π) for r = σ(x) ε, ε ~ N(0, 1); σ²(x) = (π/2) ``E[|r| | x]``². The Gamma deviance on r² would be the
Gaussian likelihood of σ² itself, but r² has no finite variance under heavy-tailed noise (Student t₃), while ``|r|``
has one whenever the noise has a variance (for Gaussian noise the two are about as efficient: the relative
variance of a mean of ``|r|`` is 0.57/m in log σ against 0.5/m for r²).
A least-squares fit of log r² is pulled by log r² → −∞ near r = 0; the Gamma deviance is not.

The residuals are those of the rows the estimator trains on (its calibration rows are never looked at, so the
conformal guarantee holds whatever the noise model).

:func:`noise_support` decides between one constant σ and σ(x) by cross-fitting: the rows are split into
``folds`` parts, a noise model fitted on the other parts predicts σ²(x) on each part, and per row the
negative log-likelihood of its residual under N(0, c σ²(x)) is compared with that under N(0, s²) (c and s² the one
scale each that maximises the likelihood on all the rows: one fitted constant each). σ(x) is *supported* when the
mean gain d̄ = mean(NLL_const − NLL_σ(x)) exceeds ``SUPPORT_Z`` standard errors and ``MIN_SUPPORT_GAIN`` nats.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.ensemble import HistGradientBoostingRegressor
from threadpoolctl import threadpool_limits

__all__ = ["FOLDS", "MIN_SUPPORT_GAIN", "MIN_SUPPORT_ROWS", "SUPPORT_Z", "BoostedNoiseModel", "fit_noise_model",
           "noise_support"]

#: Standard errors by which σ(x)'s mean cross-fitted NLL gain over a constant σ must exceed zero.
SUPPORT_Z = 2.0
#: The smallest mean gain per row (nats) that counts as support, whatever its standard error: with the true σ(x)
#: the gain is ½ log E σ² − E log σ, about Var(log σ(x)) for log-normal σ, so 0.02 nats asks for a noise level
#: that varies by about ±14 %.
MIN_SUPPORT_GAIN = 0.02
#: Fewer rows than this: no test (too few to tell), a constant σ.
MIN_SUPPORT_ROWS = 100
#: Cross-fitting folds of the test.
FOLDS = 2
#: The boosted trees' settings (Gamma deviance on |r|: each |r| carries little information, hence large leaves).
BOOSTING = {"loss": "gamma", "max_iter": 100, "learning_rate": 0.05, "max_leaf_nodes": 15, "min_samples_leaf": 40,
            "l2_regularization": 1.0, "early_stopping": False}
# Offset of the seed of the cross-fitting split.
_FOLD_SPLIT = 7919
# Rows per block when the trees are evaluated (memory: a few node indices per row and tree).
_PREDICT_ROWS = 4096


class BoostedNoiseModel:
    """A fitted σ²(x): per target, boosted trees of ``|r|`` on the flattened inputs, σ² = (π/2) × their prediction²
    (:func:`fit_noise_model`). The trees are held as plain arrays (a model file stores them as data) and evaluated
    here, as ``HistGradientBoostingRegressor.predict`` does on numeric features.

    Parameters
    ----------
    trees : list of dict
        Per target, the node table of all its trees: ``feature``, ``threshold``, ``left``, ``right`` (positions in
        the table), ``is_leaf``, ``value``, ``missing_left`` (rows with NaN go left), ``roots`` (each tree's first
        node) and ``baseline`` (the log-link intercept).
    floor : ndarray of shape (k,)
        The smallest variance returned per target (a small share of the mean r²: σ² stays positive).
    """

    def __init__(self, trees: list, floor: np.ndarray) -> None:
        self.trees = trees
        self.floor = np.asarray(floor, dtype=np.float64)

    @classmethod
    def from_boosted(cls, models: list, floor: np.ndarray) -> BoostedNoiseModel:
        """The noise model of fitted ``HistGradientBoostingRegressor`` models of ``|r|`` (Gamma deviance, log link;
        one per target, numeric features)."""
        trees = []
        for model in models:
            nodes = [predictor.nodes for (predictor,) in model._predictors]
            sizes = np.array([len(n) for n in nodes], dtype=np.int64)
            roots = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            table = np.concatenate(nodes)
            offset = np.repeat(roots, sizes)
            trees.append({"feature": table["feature_idx"].astype(np.int64), "threshold": table["num_threshold"].copy(),
                          "left": table["left"].astype(np.int64) + offset,
                          "right": table["right"].astype(np.int64) + offset,
                          "is_leaf": table["is_leaf"].astype(bool), "value": table["value"].astype(np.float64),
                          "missing_left": table["missing_go_to_left"].astype(bool), "roots": roots,
                          "baseline": float(np.asarray(model._baseline_prediction).ravel()[0])})
        return cls(trees, floor)

    def mean_abs_residual(self, F: np.ndarray) -> np.ndarray:
        """``E[|r| | x]`` per row and target, (n, k), on the flattened inputs ``F``: every (row, tree) pair walks
        down its tree one level a pass, the pairs still at an inner node only."""
        out = np.empty((len(F), len(self.trees)))
        for j, t in enumerate(self.trees):
            n_trees = len(t["roots"])
            for start in range(0, len(F), _PREDICT_ROWS):
                rows = F[start:start + _PREDICT_ROWS]
                node = np.tile(t["roots"], len(rows))  # pair r · n_trees + i: row r in tree i
                row_of = np.repeat(np.arange(len(rows)), n_trees)
                active = np.flatnonzero(~t["is_leaf"][node])
                while active.size:
                    at = node[active]
                    x = rows[row_of[active], t["feature"][at]]
                    left = np.where(np.isnan(x), t["missing_left"][at], x <= t["threshold"][at])
                    at = np.where(left, t["left"][at], t["right"][at])
                    node[active] = at
                    active = active[~t["is_leaf"][at]]
                values = t["value"][node].reshape(len(rows), n_trees)
                out[start:start + len(rows), j] = np.exp(t["baseline"] + values.sum(1))
        return out

    def variance(self, X: torch.Tensor) -> torch.Tensor:
        """σ²(x) per row and target, shape (n, k), in the network's units, in X's dtype and device."""
        var = np.maximum(0.5 * np.pi * self.mean_abs_residual(_features(X))**2, self.floor)
        return torch.as_tensor(var, dtype=X.dtype if X.is_floating_point() else torch.float64, device=X.device)


def _features(X: torch.Tensor) -> np.ndarray:
    return X.detach().reshape(X.shape[0], -1).cpu().to(torch.float64).numpy()


def _squared_residuals(y: torch.Tensor, mean: torch.Tensor) -> np.ndarray:
    r = (y.detach().to(torch.float64).reshape(len(y), -1) - mean.detach().to(torch.float64).reshape(len(y), -1))
    return (r**2).cpu().numpy()


def _fit_boosted(F: np.ndarray, r2: np.ndarray, weight: np.ndarray | None, seed: int) -> BoostedNoiseModel:
    models = []
    floor = 1e-6 * np.maximum(r2.mean(0), np.finfo(np.float64).tiny)
    with threadpool_limits(limits=max(1, torch.get_num_threads()), user_api="openmp"):
        for j in range(r2.shape[1]):
            target = np.sqrt(np.maximum(r2[:, j], floor[j]))  # |r|; the Gamma deviance needs it > 0
            models.append(HistGradientBoostingRegressor(**BOOSTING, random_state=seed % 2**31).fit(
                F, target, sample_weight=weight))
    return BoostedNoiseModel.from_boosted(models, floor)


def _weights(sample_weight: torch.Tensor | None) -> np.ndarray | None:
    return None if sample_weight is None else sample_weight.detach().to(torch.float64).cpu().numpy()


def fit_noise_model(X: torch.Tensor, y: torch.Tensor, mean: torch.Tensor, *, sample_weight: torch.Tensor | None = None,
                    seed: int = 0) -> BoostedNoiseModel:
    """σ²(x) fitted on the residuals y − μ(x) of the rows (X, y), μ the mean network's outputs ``mean``.

    Parameters
    ----------
    X : torch.Tensor of shape (n, ...)
        The inputs in the network's units (flattened for the trees).
    y, mean : torch.Tensor of shape (n, k)
        Targets and the mean network's outputs on those rows.
    sample_weight : torch.Tensor of shape (n,), optional
        Row weights of the fit.
    seed : int, default=0

    Returns
    -------
    BoostedNoiseModel
    """
    return _fit_boosted(_features(X), _squared_residuals(y, mean), _weights(sample_weight), seed)


def noise_support(X: torch.Tensor, y: torch.Tensor, mean: torch.Tensor, *, sample_weight: torch.Tensor | None = None,
                  seed: int = 0, folds: int = FOLDS, z: float = SUPPORT_Z,
                  min_gain: float = MIN_SUPPORT_GAIN) -> dict:
    """Whether the residuals y − μ(x) support a noise level σ(x) that varies with x (cross-fitted, see the module
    docstring).

    Parameters
    ----------
    X, y, mean : torch.Tensor
        As for :func:`fit_noise_model`.
    sample_weight : torch.Tensor of shape (n,), optional
        Row weights of the noise models and of the mean gain.
    seed : int, default=0
        Seeds the split into folds and the trees.
    folds : int, default=FOLDS
    z : float, default=SUPPORT_Z
        The one-sided threshold in standard errors of the mean gain.
    min_gain : float, default=MIN_SUPPORT_GAIN
        The smallest mean gain per row (nats) that counts, however small its standard error.

    Returns
    -------
    dict
        ``supported`` (bool), ``nll_gain`` (mean NLL_const − NLL_σ(x) per row, nats; > 0 favours σ(x)),
        ``nll_gain_se`` (its standard error), ``z``, ``min_gain``, ``n_rows``, ``folds``, ``noise_scale`` (c per
        target) and ``constant_std`` (s per target, in the network's units).
    """
    n = len(y)
    F, r2, w = _features(X), _squared_residuals(y, mean), _weights(sample_weight)
    result = {"supported": False, "nll_gain": float("nan"), "nll_gain_se": float("nan"), "z": float(z),
              "min_gain": float(min_gain), "n_rows": int(n), "folds": int(folds)}
    if n < max(MIN_SUPPORT_ROWS, 2 * folds):
        return result
    part = np.empty(n, dtype=np.int64)
    part[np.random.default_rng((seed + _FOLD_SPLIT) % 2**31).permutation(n)] = np.arange(n) % folds
    var = np.empty_like(r2)
    for f in range(folds):
        rest = part != f
        model = _fit_boosted(F[rest], r2[rest], None if w is None else w[rest], seed + f)
        var[~rest] = model.variance(torch.as_tensor(F[~rest])).numpy()
    weight = np.ones(n) if w is None else w / w.mean()
    tiny = np.finfo(np.float64).tiny
    c = np.maximum(np.average(r2 / var, axis=0, weights=weight), tiny)
    s2 = np.maximum(np.average(r2, axis=0, weights=weight), tiny)
    nll_var = 0.5 * (r2 / (c * var) + np.log(c * var)).sum(1)
    nll_const = 0.5 * (r2 / s2 + np.log(s2)).sum(1)
    d = weight * (nll_const - nll_var)
    gain, se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(n))
    result.update(supported=bool(gain - z * se > 0 and gain > min_gain), nll_gain=gain, nll_gain_se=se,
                  noise_scale=c, constant_std=np.sqrt(s2))
    return result
