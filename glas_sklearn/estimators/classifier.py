"""LaplaceActiveSubspaceClassifier: a torch classification network with GLAS probabilities and prediction sets."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from .._threads import scoped_threads
from ..likelihoods import Categorical
from ..predictive import class_probabilities
from ._base import LaplaceActiveSubspaceBase
from ._docs import ATTRIBUTES_DOC, NOTES_DOC, PARAMETERS_DOC, SAMPLE_WEIGHT_DOC
from ._training import prior_weight_decay

__all__ = ["LaplaceActiveSubspaceClassifier"]


class LaplaceActiveSubspaceClassifier(ClassifierMixin, LaplaceActiveSubspaceBase):
    __doc__ = f"""Classification with a torch network and generalized Laplace active-subspace uncertainty.

    The network returns logits (n, n_classes); the curvature is the generalized Gauss-Newton matrix of
    softmax cross-entropy. A network the estimator trains is the MAP under a standard normal prior on every weight
    (``weight_decay="auto"``, 1/n: the penalty of ``LogisticRegression(C=1)``). Probabilities average the softmax
    over posterior weight samples (``predictive="sampled"``) or push the linearised logit Gaussian through the
    softmax by the probit approximation (``predictive="linearized"``, the default with the low-rank posterior). By
    default (``calibration="conformal"``) half of the calibration rows choose the prior scale σ0 by their predictive NLL
    (``sigma0="nll"``, between the full-space empirical Bayes value and 0, the MAP probabilities) and the
    prediction sets are split-conformal on the other half's labels with the LAC score 1 − p_y, the most probable
    class added to a set that would be empty (``LAC(never_empty=True)``, chosen by measured set size at 90 % on
    digits: benchmarks/results/classifier_sets.md; other scores: ``calibration=ConformalCalibrator(APS())`` etc.,
    :mod:`glas_sklearn.conformity_scores`); with
    ``calibration="coverage"`` (the paper) d is chosen so that the (1 − γ) prediction
    sets cover the calibration labels.

    Parameters
    ----------
{PARAMETERS_DOC}

    Attributes
    ----------
{ATTRIBUTES_DOC}
    classes_ : ndarray of shape (n_classes,)
        The class labels (any sortable labels, strings included).

    Notes
    -----
{NOTES_DOC}

    Labels passed as calibration data (``y_cal``) must be among the classes seen in ``y``. The calibration
    split is stratified when every class has two rows and fits on both sides.

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from glas_sklearn import LaplaceActiveSubspaceClassifier
    >>> X, y = make_blobs(n_samples=150, centers=3, random_state=0)
    >>> clf = LaplaceActiveSubspaceClassifier(max_epochs=50, n_samples=100, max_components=5,
    ...                                       random_state=0).fit(X, y)
    >>> clf.predict_proba(X[:4]).shape
    (4, 3)
    >>> labels, sets = clf.predict_set(X[:4])
    >>> sets.shape
    (4, 3, 1)
    """

    # ------------------------------------------------------------------ hooks
    def _resolve_likelihood(self) -> Categorical:
        return Categorical()

    def _auto_low_rank_sigma0(self) -> str:
        # Probabilities use the scale of σ0 itself; the full-space EB σ0 is still too wide for them (digits MLP and
        # CNN: NLL above the MAP network's), so under conformal calibration σ0 is chosen by the held-out NLL on
        # half of the calibration rows, between that value and 0 (benchmarks/results/digits_ood.md, digits_cnn.md).
        return "nll" if self._calibrator().requires_fixed_predictor else "eb_full"

    def _auto_weight_decay(self, n: float) -> float:
        # The MAP under a N(0, 1) prior on every weight (LogisticRegression's C=1): without it the network of a
        # small table drives its training loss to 0 and gives wrong classes probability 1
        # (benchmarks/results/classifier_small_tables.md).
        return prior_weight_decay(n)

    def _validate_train(self, X, y):
        X, y = self._validate_X(X, y, reset=True)
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"LaplaceActiveSubspaceClassifier needs samples of at least 2 classes, but the data "
                             f"contains only one class: {self.classes_[0]!r}.")
        if X.shape[0] < 3:
            raise ValueError(f"LaplaceActiveSubspaceClassifier needs at least 3 samples, got n_samples={X.shape[0]}.")
        return X, codes

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
        X_cal = self._validate_X(X_cal, reset=False)
        codes = self._encode(y_cal, "y_cal")
        if len(codes) != X_cal.shape[0]:
            raise ValueError(f"X_cal has {X_cal.shape[0]} rows but y_cal has {len(codes)}; they must match.")
        return X_cal, codes

    def _n_outputs(self, y) -> int:
        return self.likelihood_.n_outputs(len(self.classes_))

    def _target_tensor(self, y, device, dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(y, dtype=np.int64)).to(device)

    _calibration_targets = _target_tensor

    def _noise_var(self, module, Xt, yt, Xc, yc, sample_weight=None):
        return None

    def _set_noise(self) -> None:
        pass

    # ------------------------------------------------------------------- API
    def fit(self, X, y, sample_weight=None, *, X_cal=None, y_cal=None) -> "LaplaceActiveSubspaceClassifier":
        """Train the network (unless prefit), build the posterior and choose d.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``
        y : array-like of shape (n_samples,)
            Class labels (``classes_`` are those of all rows, zero-weight rows included).
        sample_weight
        X_cal, y_cal : array-like, optional
            Calibration rows, never used for training: the conformal scores, or the rows d is chosen on. When
            absent, ``calibration_size`` of ``X`` is held out of training
            (stratified when every class has two rows).
            With ``prefit=True`` they are required and must be rows the network was not trained on (``X``
            being its training rows). Inside a Pipeline, rely on ``calibration_size``: ``X_cal`` passed as a
            fit parameter reaches this step without going through the earlier steps' transforms (with
            ``prefit=True`` pass it transformed, or put the preprocessing inside the network).

        Returns
        -------
        self
        """
        return self._fit(X, y, X_cal, y_cal, sample_weight)

    fit.__doc__ = fit.__doc__.replace("        sample_weight\n", SAMPLE_WEIGHT_DOC + "\n")

    def _proba_chunk(self, Xt: torch.Tensor) -> torch.Tensor:
        # sampled: the calibration's weight samples; linearised: probit (the logit variances only)
        return class_probabilities(self.posterior_, Xt, self.n_components_, predictive=self.predictive_,
                                   n_samples=self.n_samples, random_state=self._sample_seed_)

    def _proba_tensor(self, X, method=None) -> torch.Tensor:
        """Class probabilities (n, C), chunk by chunk of rows (bounded memory for large X); ``method`` names the
        public method for the prefit-training-rows warning."""
        rows = self._fitted_rows(X, method)  # made input tensors chunk by chunk (memory)
        return self._predict_in_chunks(rows, len(self.classes_), self._proba_chunk, finite=lambda p: p)

    @scoped_threads
    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities under the GLAS predictive, columns in ``classes_`` order.

        Sampled: the softmax averaged over the posterior weight samples. Linearised: the probit
        approximation of the softmax of the logit Gaussian.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Rows sum to 1 (renormalised in float64, also when the network runs in float32).
        """
        return self._proba_array(X, "predict_proba")

    def _proba_array(self, X, method=None) -> np.ndarray:
        probs = self._proba_tensor(X, method).detach().cpu().double().numpy()
        return probs / probs.sum(axis=1, keepdims=True)

    @scoped_threads
    def predict(self, X) -> np.ndarray:
        """The most probable class label under the GLAS predictive.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``

        Returns
        -------
        ndarray of shape (n_samples,)
            Labels from ``classes_``.
        """
        proba = self._proba_array(X)
        return self.classes_[np.argmax(proba, axis=1)]

    @scoped_threads
    def predict_set(self, X, confidence_level=None) -> tuple[np.ndarray, np.ndarray]:
        """Prediction sets: with ``calibration="conformal"`` the split-conformal sets of the conformity score, by
        default LAC {c : 1 − p_c ≤ q} with the most probable class added to a set that would be empty (coverage
        ≥ the level for exchangeable data; never empty), otherwise for each row the smallest
        set of classes whose probability reaches the level.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``
        confidence_level : float or list of float, optional
            Defaults to the estimator's ``confidence_level``.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            The predicted labels.
        sets : ndarray of bool, shape (n_samples, n_classes, k)
            Membership of each class (``classes_`` order) for each of the k levels.
        """
        check_is_fitted(self, "posterior_")
        levels = self._levels(confidence_level)
        probs = self._proba_tensor(X, "predict_set")
        sets = self.calibrator_.predict_set(probs, levels).detach().cpu().numpy()
        labels = self.classes_[probs.argmax(dim=1).cpu().numpy()]
        return labels, sets

    @scoped_threads
    def score(self, X, y, sample_weight=None) -> float:
        """Accuracy of :meth:`predict` (scikit-learn's ``ClassifierMixin.score``); rows that were training rows of
        a prefit network raise a :class:`~glas_sklearn.PrefitLeakageWarning`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), optional

        Returns
        -------
        float
        """
        check_is_fitted(self, "posterior_")
        self._warn_if_prefit_training_rows(self._validate_X(X, reset=False), "score")
        return super().score(X, y, sample_weight=sample_weight)
