"""Conformity scores: how badly a target fits a prediction, and the regions {y : score ≤ q} they give.

A conformity score (in the spirit of MAPIE's ``conformity_scores``) is a small object with
``score(y, prediction)`` (large: y fits the prediction badly) and ``region(prediction, quantiles)``, its
inverse: the intervals or sets {y : score(y, prediction) ≤ q}. Regression scores (:class:`RegressionScore`)
take the predictive moments (:class:`~glas_sklearn.predictive.RegressionMoments`) and give bounds; classification
scores (:class:`ClassificationScore`) take class probabilities and give sets. Built in:
:class:`StdNormalizedResidual` ``|y − ŷ|`` / σ̂ per output; for classes :class:`LAC` 1 − p_y, :class:`APS` (the
probability mass ranked at or above y), :class:`RAPS` (APS with a penalty on the rank) and :class:`TopK` (the rank
of y). Subclass one of the two bases for another score.

Empty prediction sets: LAC's sets {c : 1 − p_c ≤ q} are empty on rows where no class is probable enough. APS and
RAPS (with ``include_last=True``, their default) and TopK never return an empty set; ``LAC(never_empty=True)``
adds the most probable class to a set that would be empty. Both only enlarge sets, so coverage stays ≥ 1 − γ.

This module sits below the likelihoods (each names its default score) and the calibrators (which compute the
scores' quantiles): it knows tensors only. :mod:`glas_sklearn.calibration` re-exports every public name here.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod

import numpy as np
import torch

from .predictive import conformal_interval, conformal_sets, mean_interval_width, mean_set_size

__all__ = [
    "APS",
    "LAC",
    "RAPS",
    "ClassificationScore",
    "ConformityScore",
    "RegressionScore",
    "StdNormalizedResidual",
    "TopK",
]


class ConformityScore(ABC):
    """A conformity score and its inverse; subclass :class:`RegressionScore` or :class:`ClassificationScore`.

    ``score(y, prediction)`` gives one score per calibration row (regression: per row and output), larger
    where y fits the prediction worse; ``region(prediction, quantiles)`` gives, for each quantile q_k,
    {y : score(y, prediction) ≤ q_k}. Scores hold no fitted state (hyperparameters only).
    """

    #: Takes class probabilities and gives prediction sets (True), or takes regression moments and gives
    #: intervals (False).
    classification: bool = False

    @abstractmethod
    def score(self, y: torch.Tensor, prediction):
        """Scores of shape (n,) or (n, M) (tensor or array; computed in float64 by the built-in ones)."""

    @abstractmethod
    def region(self, prediction, quantiles):
        """Bounds (n, M, 2, k) (regression) or bool sets (n, C, k) (classification) for quantiles of shape
        (k,) or (k, M); an infinite quantile gives an infinite interval or every class."""

    def mean_size(self, prediction, quantiles) -> np.ndarray:
        """Mean width (regression) or set size (classification) of the regions, one per quantile: shape (k,)."""
        region = self.region(prediction, quantiles)
        return mean_set_size(region) if self.classification else mean_interval_width(region)

    def __repr__(self) -> str:
        # the hyperparameters a subclass stores that differ from its constructor's defaults (as scikit-learn prints)
        defaults = {name: par.default for name, par in inspect.signature(type(self).__init__).parameters.items()}
        changed = {k: v for k, v in vars(self).items()
                   if k not in defaults or (defaults[k] is not v and defaults[k] != v)}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


class RegressionScore(ConformityScore):
    """Base of regression scores: ``prediction`` is a :class:`~glas_sklearn.predictive.RegressionMoments`
    (``mean``, ``std``, tensors (n, M)); ``y`` has the mean's shape and dtype; ``region`` returns bounds
    (n, M, 2, k) with [..., 0, :] the lower and [..., 1, :] the upper bound."""

    classification = False


class ClassificationScore(ConformityScore):
    """Base of classification scores: ``prediction`` holds class probabilities (n, C) (float64 at calibration,
    the model's dtype at prediction); ``y`` the class indices (n,) as int64; ``region`` returns bool sets
    (n, C, k)."""

    classification = True


class StdNormalizedResidual(RegressionScore):
    """``|y − ŷ|`` / σ̂ per output: conformal intervals ŷ ± q σ̂ (:func:`~glas_sklearn.predictive.conformal_interval`).

    Examples
    --------
    >>> import torch
    >>> from glas_sklearn.predictive import RegressionMoments
    >>> m = RegressionMoments(torch.zeros(2, 1, dtype=torch.float64), torch.full((2, 1), 2.0, dtype=torch.float64))
    >>> StdNormalizedResidual().score(torch.tensor([[1.0], [-3.0]], dtype=torch.float64), m).ravel().tolist()
    [0.5, 1.5]
    """

    def score(self, y, prediction):
        n = y.shape[0]
        sd = prediction.std.to(torch.float64).reshape(n, -1)
        res = (y - prediction.mean).abs().to(torch.float64).reshape(n, -1)
        if bool((sd <= 0).any()):
            raise ValueError("The predictive standard deviation is 0 on some calibration rows, so the normalised "
                             "scores |y − ŷ| / σ̂ are undefined; use include_noise / a positive noise_var.")
        return res / sd

    def region(self, prediction, quantiles):
        return conformal_interval(prediction.mean, prediction.std, quantiles)

    def mean_size(self, prediction, quantiles) -> np.ndarray:
        # width 2 q σ̂ in closed form (infinite q: infinite width)
        sd = prediction.std.to(torch.float64).reshape(prediction.std.shape[0], -1).cpu().numpy()
        return np.array([np.mean(2 * q * sd) for q in np.asarray(quantiles, dtype=np.float64)])


def _probabilities(prediction) -> tuple[torch.Tensor, bool]:
    """Class probabilities (n, C) as a floating tensor, and whether they came as a numpy array."""
    was_numpy = isinstance(prediction, np.ndarray)
    p = torch.as_tensor(prediction)
    if not p.is_floating_point():
        p = p.to(torch.float64)
    if p.ndim != 2:
        raise ValueError(f"class probabilities must have shape (n, C), got {tuple(p.shape)}.")
    return p, was_numpy


def _thresholds(quantiles, like: torch.Tensor) -> torch.Tensor:
    """Quantiles of shape (k,) as a float64 tensor on ``like``'s device (+inf allowed; NaN is not)."""
    q = torch.as_tensor(np.asarray(quantiles, dtype=np.float64).reshape(-1), device=like.device)
    if q.numel() == 0 or bool(torch.isnan(q).any()):
        raise ValueError(f"quantiles must have shape (k,) with k >= 1 and no NaN, got {q.cpu().numpy()!r}.")
    return q


def _ranked(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row and class: the rank r_c (1 for the most probable class; ties broken by class index) and the
    probability mass of the classes ranked above c, m_c = Σ_{c': r_c' < r_c} p_c', both (n, C), the mass in float64."""
    p64 = p.to(torch.float64)
    sorted_p, order = torch.sort(p64, dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(1, p.shape[-1] + 1, device=p.device).expand_as(order))
    before = torch.zeros_like(p64)
    before.scatter_(-1, order, torch.cumsum(sorted_p, -1) - sorted_p)
    return ranks, before


def _at_label(values: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return values.gather(1, y.reshape(-1, 1).to(device=values.device, dtype=torch.long))[:, 0]


def _sets(inside: torch.Tensor, was_numpy: bool):
    """Bool sets (n, C, k) from a membership test (n, C, k), as the prediction came (tensor or numpy)."""
    return inside.cpu().numpy() if was_numpy else inside


class LAC(ClassificationScore):
    """The least-ambiguous-class score 1 − p_y: sets {c : 1 − p_c ≤ q}
    (:func:`~glas_sklearn.predictive.conformal_sets`).

    The smallest sets on average of the scores here, but a row on which no class is probable enough gets an empty
    set (coverage holds on average all the same).

    Parameters
    ----------
    never_empty : bool, default=False
        Add the most probable class to a set that would be empty. The sets only grow, so coverage stays
        ≥ 1 − γ (the guarantee holds for the sets before the addition).

    Examples
    --------
    >>> import torch
    >>> LAC().score(torch.tensor([1, 0]), torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)).tolist()
    [0.25, 0.5]
    >>> LAC(never_empty=True).region(torch.tensor([[0.3, 0.7]]), [0.2])[0, :, 0].tolist()  # 1 − 0.7 > 0.2
    [False, True]
    """

    def __init__(self, never_empty: bool = False) -> None:
        self.never_empty = never_empty

    def score(self, y, prediction):
        return 1.0 - prediction.gather(1, y[:, None])[:, 0].to(torch.float64)

    def region(self, prediction, quantiles):
        sets = conformal_sets(prediction, quantiles)
        if not self.never_empty:
            return sets
        p, was_numpy = _probabilities(prediction)
        inside = torch.as_tensor(sets, device=p.device)
        top = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).bool().unsqueeze(-1)
        return _sets(inside | (top & ~inside.any(-2, keepdim=True)), was_numpy)


class APS(ClassificationScore):
    """Adaptive prediction sets (Romano et al. 2020): the probability mass of the classes ranked at or above y,
    s = Σ_{c : r_c ≤ r_y} p_c (r_c the rank of class c by descending probability, ties by class index).

    The sets hold the most probable classes until their mass reaches the quantile q. With ``include_last=True``
    (the default) the class whose mass crosses q joins too: {c : m_c < q}, m_c the mass ranked above c. Those sets
    contain the exact inverse {c : s_c ≤ q}, so coverage stays ≥ 1 − γ, and they are never empty (the top class has
    m = 0 < q; q > 0 whenever any calibration row has a positive score). ``include_last=False`` gives the exact
    inverse, which may be empty.

    Parameters
    ----------
    include_last : bool, default=True
        Include the class whose cumulative mass crosses q (never-empty, conservative sets).

    Examples
    --------
    >>> import torch
    >>> p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    >>> APS().score(torch.tensor([1]), p).tolist()  # 0.5 + 0.3
    [0.8]
    >>> APS().region(p, [0.75])[0, :, 0].tolist(), APS(include_last=False).region(p, [0.75])[0, :, 0].tolist()
    ([True, True, False], [True, False, False])
    """

    def __init__(self, include_last: bool = True) -> None:
        self.include_last = include_last

    def _penalty(self, ranks: torch.Tensor) -> torch.Tensor:
        """A penalty per class rank added to the mass (none here; RAPS adds one)."""
        return torch.zeros(ranks.shape, dtype=torch.float64, device=ranks.device)

    def score(self, y, prediction):
        p, _ = _probabilities(prediction)
        ranks, before = _ranked(p)
        through = before + p.to(torch.float64) + self._penalty(ranks)
        return _at_label(through, y)

    def region(self, prediction, quantiles):
        p, was_numpy = _probabilities(prediction)
        q = _thresholds(quantiles, p)
        ranks, before = _ranked(p)
        penalty = self._penalty(ranks)
        if self.include_last:
            inside = (before + penalty).unsqueeze(-1) < q
        else:
            inside = (before + p.to(torch.float64) + penalty).unsqueeze(-1) <= q
        return _sets(inside, was_numpy)


class RAPS(APS):
    """Regularised adaptive prediction sets (Angelopoulos et al. 2021): the APS score plus a penalty on the rank,
    s = Σ_{c : r_c ≤ r_y} p_c + λ (r_y − k_reg)⁺, which keeps the long tail of unlikely classes out of the sets.

    Sets as :class:`APS` (``include_last=True``: {c : m_c + λ (r_c − k_reg)⁺ < q}, never empty).

    Parameters
    ----------
    lam : float, default=0.01
        λ ≥ 0, the penalty per rank beyond ``k_reg`` (0: APS).
    k_reg : int, default=1
        The ranks that go unpenalised.
    include_last : bool, default=True

    Examples
    --------
    >>> import torch
    >>> p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    >>> RAPS(lam=0.1, k_reg=1).score(torch.tensor([2]), p).tolist()  # 1.0 + 0.1 · (3 − 1)
    [1.2]
    """

    def __init__(self, lam: float = 0.01, k_reg: int = 1, include_last: bool = True) -> None:
        if not np.isfinite(lam) or lam < 0:
            raise ValueError(f"RAPS: lam must be a finite number >= 0 (the penalty per rank), got {lam!r}.")
        if int(k_reg) != k_reg or k_reg < 0:
            raise ValueError(f"RAPS: k_reg must be an integer >= 0 (the ranks left unpenalised), got {k_reg!r}.")
        self.lam = lam
        self.k_reg = k_reg
        super().__init__(include_last=include_last)

    def _penalty(self, ranks: torch.Tensor) -> torch.Tensor:
        return float(self.lam) * (ranks - int(self.k_reg)).clamp_min(0).to(torch.float64)


class TopK(ClassificationScore):
    """The rank of y by descending probability (1: the most probable class; ties by class index): sets
    {c : r_c ≤ q}, the q most probable classes on every row.

    Every set has the same size ⌊q⌋ (≥ 1, never empty), so the sets do not adapt to how hard a row is; the
    quantile is the smallest k whose top-k sets cover the calibration rows at the level.

    Examples
    --------
    >>> import torch
    >>> p = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    >>> TopK().score(torch.tensor([0]), p).tolist()
    [3.0]
    >>> TopK().region(p, [2.0])[0, :, 0].tolist()
    [False, True, True]
    """

    def score(self, y, prediction):
        p, _ = _probabilities(prediction)
        return _at_label(_ranked(p)[0], y).to(torch.float64)

    def region(self, prediction, quantiles):
        p, was_numpy = _probabilities(prediction)
        q = _thresholds(quantiles, p)
        return _sets(_ranked(p)[0].to(torch.float64).unsqueeze(-1) <= q, was_numpy)
