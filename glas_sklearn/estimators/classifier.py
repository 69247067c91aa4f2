"""LaplaceActiveSubspaceClassifier: a torch classification network with GLAS probabilities and prediction sets."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from .._checks import check_class_labels
from .._constraints import Interval
from .._threads import scoped_threads
from ..likelihoods import Categorical
from ..scale_out import is_dask_collection, map_prediction
from ._base import LaplaceActiveSubspaceBase, TaskComponents
from ._data import InputEncoder, LabelTargets
from ._likelihood_choice import NoNoise

__all__ = ["LaplaceActiveSubspaceClassifier"]


class LaplaceActiveSubspaceClassifier(ClassifierMixin, LaplaceActiveSubspaceBase):
    """Classification with a torch network and generalized Laplace active-subspace uncertainty.

    The network returns logits. A network the estimator trains is the MAP under a N(0, 1) prior on every weight
    (``weight_decay="auto"``); below 2,000 training rows it trains three (``n_networks``) and averages their
    probabilities. Probabilities push the linearised logit Gaussian through the softmax (probit) or average it over
    posterior samples. By default half of the calibration rows choose σ0 by their NLL and the sets are
    split-conformal (LAC, never empty) on the other half; ``calibration="coverage"`` (the paper) chooses d by the
    sets' coverage. Calibration labels must be among those of ``y``; the split is stratified where possible.

    Parameters
    ----------
    module : None, torch.nn.Module, skorch net or callable, default=None
        The network, ``(n, *input_shape)`` → ``(n, outputs)`` (logits); None: an MLP. Copied before training.
    prefit : bool, default=False
        Use the trained module as θ0 as it is (never trained or moved); ``fit`` then needs ``X_cal, y_cal``.
    training : Training, optional
        How the network is trained (:class:`~glas_sklearn.Training`); None: ``Training()``.
    posterior : {"low_rank", "low_rank_diag", "subspace"} or Posterior, default="low_rank"
        The posterior kind and its hyperparameters (:class:`~glas_sklearn.LowRank`, ...; a name: the defaults).
    calibration : {"mondrian", "conformal", "coverage"} or Calibrator, default="conformal"
        Split conformal per band of σ̂ (or class), split conformal, or d chosen by coverage (with
        ``posterior="subspace"``: the paper's method).
    scaling : {"auto", "mean", "standard"} or float, default="auto"
        β = 1/σ² ("mean"), N/σ² ("standard") or a given β; "auto": the likelihood's own.
    n_components : "auto" or int, default="auto"
        d. "auto": the smallest reaching the level under "coverage", else ``max_components``.
    sigma0 : {"auto", "eb_subspace", "eb_full", "nll"} or float, default="auto"
        Prior standard deviation: empirical Bayes (subspace, full space) or by held-out NLL (conformal only); 0:
        the network's own (MAP) probabilities.
    confidence_level : float or list of float, default=0.9
        Level(s) 1 − γ; the first is the calibration target.
    calibration_size : float or int, default=0.1
        Share (or number) of rows of ``X`` held out for calibration when ``X_cal`` is not passed.
    compute : Compute, optional
        Device, dtype, threads, prediction memory, padding token (:class:`~glas_sklearn.Compute`).
    random_state : int, RandomState or None, default=None
        Seeds the calibration split, the network's initialisation and the posterior samples.
    verbose : int, default=0
        ≥ 1 writes one line per finished stage to standard error (always logged at INFO level).

    Attributes
    ----------
    module_, likelihood_, posterior_, calibrator_, predictive_
        The fitted components: the network θ0, the likelihood, the posterior, the calibrator, the predictive mode.
    n_components_, sigma0_, beta_ : int, float, float
        d, the prior standard deviation at d and the posterior scaling.
    eigenvalues_, eigen_info_, n_weights_, n_records_, trainable_parameters_
        The curvature's top eigenvalues and solver record; D; N; the parameters the posterior covers.
    calibration_, conformity_scores_, calibration_reached_, calibration_seed_
        The calibration's table, scores, whether "coverage" reached the level, the samples' seed.
    n_calibration_rows_, n_sigma0_rows_, sigma0_rows_, sigma0_search_, train_indices_, calibration_indices_
        Rows scored, rows σ0 was tuned on ("nll"), positions in ``X`` of training and calibration rows.
    n_iter_, loss_curve_, validation_scores_, best_validation_score_, validation_indices_, weight_decay_
        The (first network's) training record (``training_loss_``; held out: a shadow copy's, if one ran).
    timings_, n_threads_, x_mean_, x_scale_, input_shape_, n_features_in_, feature_names_in_
        Stage times, torch threads, the input standardisation and the row shape seen in fit.
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
    def _components(self, posterior) -> TaskComponents:
        """The categorical likelihood, class indices as targets, no noise step."""
        if posterior.include_noise:
            raise ValueError("LaplaceActiveSubspaceClassifier: posterior__include_noise applies to regression; leave "
                             "it False.")
        return TaskComponents(Categorical(), LabelTargets, NoNoise())

    def _auto_low_rank_sigma0(self, calibrator) -> str:
        # Probabilities use the scale of σ0 itself, and the full-space EB σ0 is too wide for them, so under a
        # conformal calibration σ0 is chosen by the held-out NLL on half of the calibration rows.
        return "nll" if calibrator.requires_fixed_predictor else "eb_full"

    def _validate_train(self, X, y, settings):
        X, y, inputs = InputEncoder.from_fit_rows(self, X, y, module=self.module,
                                                  padding_idx=settings.compute.padding_idx)
        if np.asarray(y).dtype == object:
            check_class_labels(y, self._name)
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
