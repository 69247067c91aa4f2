"""LaplaceActiveSubspaceClassifier: a torch classification network with GLAS probabilities and prediction sets."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from .._constraints import Interval
from .._threads import scoped_threads
from ..likelihoods import Categorical
from ..scale_out import is_dask_collection, map_prediction
from ._base import ATTRIBUTES_DOC, PARAMETERS_DOC, LaplaceActiveSubspaceBase
from ._data import InputEncoder, LabelTargets

__all__ = ["LaplaceActiveSubspaceClassifier"]


class LaplaceActiveSubspaceClassifier(ClassifierMixin, LaplaceActiveSubspaceBase):
    __doc__ = f"""Classification with a torch network and generalized Laplace active-subspace uncertainty.

    The network returns logits. A network the estimator trains is the MAP under a N(0, 1) prior on every weight
    (``weight_decay="auto"``); below 2,000 training rows it trains three (``n_networks``) and averages their
    probabilities. Probabilities push the linearised logit Gaussian through the softmax (probit) or average it over
    posterior samples. By default half of the calibration rows choose σ0 by their NLL and the sets are
    split-conformal (LAC, never empty) on the other half; ``calibration="coverage"`` (the paper) chooses d by the
    sets' coverage. Calibration labels must be among those of ``y``; the split is stratified where possible.

    Parameters
    ----------
{PARAMETERS_DOC}

    Attributes
    ----------
{ATTRIBUTES_DOC}
    classes_ : ndarray of shape (n_classes,)
        The class labels (any sortable labels, strings included).

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from glas_sklearn import LaplaceActiveSubspaceClassifier, LowRank, Training
    >>> X, y = make_blobs(n_samples=150, centers=3, random_state=0)
    >>> clf = LaplaceActiveSubspaceClassifier(training=Training(max_epochs=50),
    ...                                       posterior=LowRank(max_components=5, n_samples=100),
    ...                                       random_state=0).fit(X, y)
    >>> clf.predict_proba(X[:4]).shape
    (4, 3)
    >>> labels, sets = clf.predict_set(X[:4])
    >>> sets.shape
    (4, 3, 1)
    """

    def __init__(self, module=None, *, prefit=False, training=None, posterior="low_rank", calibration="conformal",
                 scaling="auto", n_components="auto", sigma0="auto", confidence_level=0.9, calibration_size=0.1,
                 compute=None, random_state=None, verbose=0):
        super().__init__(module, prefit=prefit, training=training, posterior=posterior, calibration=calibration,
                         scaling=scaling, n_components=n_components, sigma0=sigma0,
                         confidence_level=confidence_level, calibration_size=calibration_size, compute=compute,
                         random_state=random_state, verbose=verbose)

    # sigma0=0.0 is allowed here: the network's own (MAP) probabilities, one argument away. The regressor refuses it,
    # since a zero predictive std leaves its normalised conformity scores undefined.
    _parameter_constraints = {**LaplaceActiveSubspaceBase._parameter_constraints,
                              "sigma0": [*(c for c in LaplaceActiveSubspaceBase._parameter_constraints["sigma0"]
                                           if not isinstance(c, Interval)),
                                         Interval(numbers.Real, 0, None, closed="left")]}

    # A network trained on a small table without a prior drives its training loss to 0 and gives wrong classes
    # probability 1; the N(0, 1) prior is LogisticRegression(C=1)'s penalty.
    _weight_prior_std = 1.0

    # ------------------------------------------------------------------------------------------ hooks
    def _resolve_likelihood(self, posterior) -> Categorical:
        if posterior.include_noise:
            raise ValueError("LaplaceActiveSubspaceClassifier: posterior__include_noise applies to regression; leave "
                             "it False.")
        return Categorical()

    def _auto_low_rank_sigma0(self, calibrator) -> str:
        # Probabilities use the scale of σ0 itself, and the full-space EB σ0 is too wide for them, so under a
        # conformal calibration σ0 is chosen by the held-out NLL on half of the calibration rows.
        return "nll" if calibrator.requires_fixed_predictor else "eb_full"

    def _validate_train(self, X, y, settings):
        X, y, inputs = InputEncoder.from_fit_rows(self, X, y, module=self.module,
                                                  padding_idx=settings.compute.padding_idx)
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"LaplaceActiveSubspaceClassifier needs samples of at least 2 classes, but the data "
                             f"contains only one class: {self.classes_[0]!r}.")
        if X.shape[0] < 3:
            raise ValueError(f"LaplaceActiveSubspaceClassifier needs at least 3 samples, got n_samples={X.shape[0]}.")
        return X, codes, inputs

    def _encode(self, y, name: str = "y") -> np.ndarray:
        """Class indices of the labels ``y`` in ``classes_``; labels not seen in fit raise a ValueError."""
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise ValueError(f"{name} must be a 1-D array of class labels, got shape {y.shape}.")
        index = {label: i for i, label in enumerate(self.classes_.tolist())}
        codes = np.fromiter((index.get(label, -1) for label in y.tolist()), dtype=np.int64, count=len(y))
        if (codes < 0).any():
            unseen = sorted({repr(label) for label, c in zip(y.tolist(), codes, strict=True) if c < 0})
            raise ValueError(f"{name} contains labels not seen during fit: {', '.join(unseen)}; the classes seen in y "
                             f"are {self.classes_.tolist()}. Calibration labels must be among the training classes.")
        return codes

    def _validate_calibration(self, X_cal, y_cal):
        X_cal = self._validate_X(X_cal)
        codes = self._encode(y_cal, "y_cal")
        if len(codes) != X_cal.shape[0]:
            raise ValueError(f"X_cal has {X_cal.shape[0]} rows but y_cal has {len(codes)}; they must match.")
        return X_cal, codes

    def _class_labels(self):
        return self.classes_.tolist()

    def _fit_targets(self, y, weight, standardize: bool) -> LabelTargets:
        return LabelTargets()

    def _targets_tensor(self, y, device, dtype, inputs) -> torch.Tensor:
        return LabelTargets.to_tensor(y, device, dtype)

    def _n_outputs(self, data, likelihood) -> int:
        return likelihood.n_outputs(len(self.classes_))

    def _fit_noise(self, module, data, settings):
        return None

    # -------------------------------------------------------------------------------------------- API
    def fit(self, X, y, sample_weight=None, *, X_cal=None, y_cal=None) -> "LaplaceActiveSubspaceClassifier":
        """Train the network (unless prefit), build the posterior and calibrate; returns self. ``y``: class labels
        (``classes_`` are those of all rows); ``sample_weight``: frequency weights of the training rows;
        ``X_cal, y_cal``: calibration rows never trained on (default: ``calibration_size`` of ``X``, stratified)."""
        return self._fit(X, y, X_cal, y_cal, sample_weight)


    def _proba_tensor(self, X, method=None) -> torch.Tensor:
        """Class probabilities (n, C), chunk by chunk of rows (bounded memory); ``method`` names the public method
        for the prefit-training-rows warning."""
        rows = self._fitted_rows(X, method)  # made input tensors chunk by chunk (memory)
        return self._predict_in_chunks(rows, len(self.classes_), self._posterior_probabilities, finite=lambda p: p)

    @scoped_threads
    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities under the GLAS predictive, (n_samples, n_classes) in ``classes_`` order, rows
        summing to 1 (renormalised in float64); ``X`` of shape (n_samples, n_features) or
        ``(n_samples, *input_shape_)``."""
        if is_dask_collection(X):  # a Dask Array computed on the workers (glas_sklearn.scale_out)
            return map_prediction(self, X, "predict_proba")
        return self._proba_array(X, "predict_proba")

    def _proba_array(self, X, method=None) -> np.ndarray:
        probs = self._proba_tensor(X, method).detach().cpu().double().numpy()
        return probs / probs.sum(axis=1, keepdims=True)

    @scoped_threads
    def predict(self, X) -> np.ndarray:
        """The most probable class label under the GLAS predictive, shape (n_samples,)."""
        if is_dask_collection(X):  # a Dask Array computed on the workers (glas_sklearn.scale_out)
            return map_prediction(self, X, "predict")
        proba = self._proba_array(X)
        return self.classes_[np.argmax(proba, axis=1)]

    @scoped_threads
    def predict_set(self, X, confidence_level=None) -> tuple[np.ndarray, np.ndarray]:
        """Prediction sets at ``confidence_level`` (default: the estimator's): ``labels`` (n_samples,) and ``sets``,
        bool (n_samples, n_classes, k), each class's membership (``classes_`` order) per level. Split-conformal
        under a conformal calibration (LAC by default, never empty), else the smallest set of classes whose
        probability reaches the level."""
        if is_dask_collection(X):  # Dask Arrays computed on the workers (glas_sklearn.scale_out)
            return map_prediction(self, X, "predict_set", confidence_level=confidence_level)
        check_is_fitted(self, "posterior_")
        levels = self._levels(confidence_level)
        probs = self._proba_tensor(X, "predict_set")
        sets = self._calibrated_sets(probs, levels).detach().cpu().numpy()
        labels = self.classes_[probs.argmax(dim=1).cpu().numpy()]
        return labels, sets

    @scoped_threads
    def score(self, X, y, sample_weight=None) -> float:
        """Accuracy of :meth:`predict` (a prefit network's training rows raise a PrefitLeakageWarning)."""
        self._score_rows(X)
        return super().score(X, y, sample_weight=sample_weight)
