"""A prefit network's training rows: what they may not be used for, how their reuse is detected, and the checks the
estimators make of a prefit network (calibration rows it was not trained on, a fit better than a constant).

A prefit network was trained on rows the estimator never sees being used; the rows of ``X`` passed to ``fit`` are
taken to be those training rows. Their residuals are training residuals, smaller than on new rows, so they can
neither calibrate the network (``fit`` then needs unseen ``X_cal``) nor evaluate its intervals. The second
happens silently in a cross-validation over a prefit network (``GridSearchCV``, ``cross_validate``): every fold's
test rows were training rows of the one network. :data:`REGISTRY` records, per network (a fingerprint of its
weights), digests of the rows declared as its training rows in ``fit``, so that the estimators can raise a
:class:`PrefitLeakageWarning` when asked for intervals, prediction sets or scores on such rows.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from .._functional import model_outputs
from .._warnings import user_stacklevel, warn

__all__ = ["PrefitLeakageWarning", "PrefitRowRegistry", "PrefitUnderfitWarning", "REGISTRY", "check_rows",
           "declare_training_rows", "module_fingerprint", "no_better_than_a_constant", "row_digests",
           "user_stacklevel", "warn_if_training_rows", "warn_if_underfits"]

# Weight values hashed for a fingerprint: all of them up to this many, a strided sample of this many beyond.
_FINGERPRINT_ELEMENTS = 2**24
_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


class PrefitLeakageWarning(UserWarning):
    """Rows that were declared as a prefit network's training rows are used where unseen rows are needed.

    Raised by the estimators when intervals (``predict_interval``, ``coverage_curve``), probabilities or
    prediction sets (``predict_proba``, ``predict_set``) or ``score`` are asked for on rows that were passed as
    ``X`` to a ``fit`` with ``prefit=True`` and the same network weights (in this process), and by ``fit`` when
    ``X_cal`` holds such rows. The network was trained on them, so its errors there are smaller than on new
    rows: coverage and scores measured on them overstate what new rows get. The usual cause is cross-validating
    a prefit network (``GridSearchCV``, ``cross_validate``), whose every test fold the network was trained on.
    """


class PrefitUnderfitWarning(UserWarning):
    """A prefit network predicts its own training rows no better than a constant.

    Raised by ``fit`` with ``prefit=True`` when, on the rows of ``X`` (taken to be the network's training rows), a
    regression network's mean squared error is at least 95 % of the variance of ``y`` (it explains less than 5 %
    of it; the constant mean would do as well), or a classifier's accuracy is no better than always predicting
    the most frequent class. The usual causes: the network was not trained (or its trained weights were not
    loaded), it was trained on other targets or units (e.g. a standardised y while ``y`` is raw), or the rows
    are not what it was trained on. The estimator still wraps it (uncertainty around a network that learned
    nothing is wide and uninformative).
    """


# Below this share of the variance of y explained on its training rows, a prefit regression network is warned about.
_MIN_EXPLAINED = 0.05
# Rows of X a prefit network is evaluated on for that check (evenly spaced through X when there are more).
_CHECK_ROWS = 2048


def no_better_than_a_constant(likelihood, outputs: torch.Tensor, y: torch.Tensor) -> str | None:
    """What a prefit network's outputs on its training rows say about its fit, when no better than a constant.

    Parameters
    ----------
    likelihood : Likelihood
        The estimator's fitted likelihood: classification compares the accuracy of the argmax of ``outputs``
        with the majority class's share; regression the mean squared error of ``likelihood.mean_output(outputs)``
        with the variance of ``y``, per target.
    outputs : torch.Tensor of shape (n, M)
    y : torch.Tensor
        Class indices (n,) or targets (n, k), in the network's units.

    Returns
    -------
    str or None
        The finding, for a warning; None when the network does better than a constant.
    """
    if likelihood.is_classification:
        labels = y.reshape(-1).to(torch.long)
        accuracy = float((outputs.argmax(dim=1) == labels).to(torch.float64).mean())
        majority = float(torch.bincount(labels).max()) / len(labels)
        if accuracy <= majority:
            return (f"its accuracy on them is {accuracy:.3f}, no better than always predicting the most frequent "
                    f"class ({majority:.3f} of the rows)")
        return None
    mean = likelihood.mean_output(outputs).to(torch.float64)
    target = y.reshape(len(y), -1).to(torch.float64)
    var = target.var(dim=0, unbiased=False)
    mse = ((mean - target) ** 2).mean(dim=0)
    for j in range(target.shape[1]):
        if var[j] > 0 and mse[j] >= (1.0 - _MIN_EXPLAINED) * var[j]:
            which = "" if target.shape[1] == 1 else f" for target {j}"
            return (f"its mean squared error on them{which} is {float(mse[j]):.4g}, {float(mse[j] / var[j]):.2f} times "
                    f"the variance of y ({float(var[j]):.4g}; R² = {float(1 - mse[j] / var[j]):.3f}): predicting "
                    "the mean of y would do as well")
    return None


def check_rows(n: int) -> torch.Tensor:
    """Positions of at most ``_CHECK_ROWS`` rows evenly spaced through n rows."""
    return torch.linspace(0, n - 1, min(n, _CHECK_ROWS)).round().to(torch.long).unique()


def module_fingerprint(module: nn.Module) -> bytes:
    """A digest of the network's weights and buffers (names, shapes, dtypes and values).

    Every value is hashed for networks of up to 2²⁴ values, a strided sample of 2²⁴ values beyond (so large
    models are fingerprinted in one pass over a bounded copy). The module is only read.

    Parameters
    ----------
    module : torch.nn.Module

    Returns
    -------
    bytes
        16 bytes.
    """
    state = module.state_dict()
    total = sum(t.numel() for t in state.values() if isinstance(t, torch.Tensor))
    step = max(1, math.ceil(total / _FINGERPRINT_ELEMENTS))
    digest = hashlib.blake2b(digest_size=16)
    for name, value in state.items():
        digest.update(name.encode())
        if not isinstance(value, torch.Tensor):
            digest.update(repr(value).encode())
            continue
        digest.update(f"{tuple(value.shape)}{value.dtype}".encode())
        flat = value.detach().reshape(-1)[::step]
        digest.update(flat.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.digest()


def row_digests(X: np.ndarray) -> np.ndarray:
    """One 64-bit digest of the bytes of each row of ``X`` (any rank ≥ 1, any fixed-size dtype).

    Parameters
    ----------
    X : ndarray of shape (n, ...)

    Returns
    -------
    ndarray of uint64, shape (n,)
    """
    A = np.ascontiguousarray(X)
    n = A.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    raw = A.reshape(n, -1).view(np.uint8).reshape(n, -1)
    pad = (-raw.shape[1]) % 8
    if pad:
        raw = np.concatenate([raw, np.zeros((n, pad), dtype=np.uint8)], axis=1)
    words = np.ascontiguousarray(raw).view(np.uint64)
    h = np.full(n, _FNV_OFFSET ^ np.uint64(words.shape[1]), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):  # FNV-1a over 64-bit words, with a shift so high bits reach low ones
            h ^= words[:, j]
            h *= _FNV_PRIME
            h ^= h >> np.uint64(29)
        # splitmix64 finaliser
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


class PrefitRowRegistry:
    """Digests of the rows declared as training rows of each prefit network, keyed by its weight fingerprint.

    Bounded in memory: at most ``max_networks`` networks (the least recently used is forgotten) and
    ``max_rows`` digests (8 bytes each) per network; beyond that the smallest digests are kept, a uniform
    sample of the rows, so reused rows are still detected in proportion. Thread-safe; it lives in one process
    and cannot see what other processes (``n_jobs > 1`` with process-based joblib backends) declared.

    Parameters
    ----------
    max_networks : int, default=16
    max_rows : int, default=2**20
    """

    def __init__(self, max_networks: int = 16, max_rows: int = 2**20):
        self.max_networks = max_networks
        self.max_rows = max_rows
        self._rows: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._duplicate_share: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def declare(self, fingerprint: bytes, digests: np.ndarray) -> None:
        """Record ``digests`` as training rows of the network ``fingerprint``."""
        digests = np.asarray(digests, dtype=np.uint64)
        _, counts = np.unique(digests, return_counts=True)
        share = float(counts[counts > 1].sum()) / max(digests.size, 1)  # rows that repeat another row of the data
        with self._lock:
            known = self._rows.pop(fingerprint, np.zeros(0, dtype=np.uint64))
            merged = np.union1d(known, digests)  # sorted, unique
            self._rows[fingerprint] = merged[:self.max_rows]
            self._duplicate_share[fingerprint] = max(self._duplicate_share.get(fingerprint, 0.0), share)
            while len(self._rows) > self.max_networks:
                forgotten, _ = self._rows.popitem(last=False)
                self._duplicate_share.pop(forgotten, None)

    def declared(self, fingerprint: bytes, digests: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``digests`` were declared as training rows of the network ``fingerprint``."""
        digests = np.asarray(digests, dtype=np.uint64)
        with self._lock:
            known = self._rows.get(fingerprint)
            if known is not None:
                self._rows.move_to_end(fingerprint)
        if known is None or known.size == 0 or digests.size == 0:
            return np.zeros(digests.shape, dtype=bool)
        pos = np.minimum(np.searchsorted(known, digests), known.size - 1)
        return known[pos] == digests

    def reused(self, fingerprint: bytes, digests: np.ndarray) -> int:
        """How many of ``digests`` are declared training rows of ``fingerprint``, or 0 when no more of them are
        than repeated values in the data explain.

        Data sets often hold identical rows (UCI concrete: about 4 % of its rows), so a few genuinely unseen rows
        can equal training rows. The share r of the declared rows that repeat another declared row estimates how
        often an unseen row does; the count is returned only when it exceeds n r + 3 sqrt(n r (1 − r)) + 1, the
        upper end of its binomial spread (without repeats: from two rows on).
        """
        seen = int(self.declared(fingerprint, digests).sum())
        with self._lock:
            r = self._duplicate_share.get(fingerprint, 0.0)
        n = int(np.asarray(digests).size)
        return seen if seen > n * r + 3.0 * math.sqrt(n * r * (1.0 - r)) + 1.0 else 0

    def clear(self) -> None:
        """Forget every network."""
        with self._lock:
            self._rows.clear()
            self._duplicate_share.clear()

    def __len__(self) -> int:
        return len(self._rows)


#: The process-wide registry the estimators use.
REGISTRY = PrefitRowRegistry()


# Test coverage of 90 % intervals of an overfitting prefit network calibrated on rows held out of its training
# rows, and on unseen rows (default settings, mean (range) over 5 seeds).
_SEEN_COVERAGE, _UNSEEN_COVERAGE = "59 % (52–63 %)", "90 %"


def _prefit_needs_calibration_rows(name: str, classification: bool) -> str:
    """The refusal of a prefit fit without X_cal: what is missing, why (with the measured effect), how to fix it."""
    what = "prediction sets" if classification else "intervals"
    return (f"{name}: prefit=True needs calibration rows that the network was not trained on; pass them as "
            f"fit(X, y, X_cal=..., y_cal=...). With prefit=True the rows of X are taken to be the network's "
            f"training rows, so rows held out of them (calibration_size) would have training residuals, smaller "
            f"than on new rows, and the calibrated {what} would under-cover: on concrete an overfitting "
            f"8-256-256-1 network's 90 % intervals covered {_SEEN_COVERAGE} of new rows calibrated that way, "
            f"{_UNSEEN_COVERAGE} with unseen X_cal (docs/benchmarks/studies.md#prefit-"
            "calibration). Hold rows out "
            "before training the network (e.g. with sklearn.model_selection.train_test_split) and pass them as "
            "X_cal, y_cal; X stays the network's training rows (the curvature is built on them).")



def declare_training_rows(module: nn.Module, X: np.ndarray, X_cal: np.ndarray | None, owner: str,
                          classification: bool) -> bytes:
    """Prefit: the rows of X are the network's training rows, so calibration needs unseen ``X_cal`` (refused
    without it). The rows are recorded in :data:`REGISTRY` under the network's fingerprint (returned); X_cal rows
    among them are warned about."""
    if X_cal is None:
        raise ValueError(_prefit_needs_calibration_rows(owner, classification))
    fingerprint = module_fingerprint(module)
    REGISTRY.declare(fingerprint, row_digests(X))
    seen = REGISTRY.reused(fingerprint, row_digests(X_cal))
    if seen:
        warn(f"{owner}.fit: {seen} of the {len(X_cal)} X_cal rows are rows declared as training rows of this "
             "prefit network (rows of X in this or an earlier fit with the same weights). Their residuals "
             "are training residuals, so the calibrated intervals or sets will under-cover new rows; pass as "
             "X_cal only rows the network was not trained on.", PrefitLeakageWarning)
    return fingerprint


def warn_if_training_rows(fingerprint: bytes | None, X: np.ndarray, owner: str, method: str) -> None:
    """Warn (:class:`PrefitLeakageWarning`) when validated rows ``X`` passed to ``method`` were declared as
    training rows of the prefit network ``fingerprint`` (None: not prefit)."""
    if fingerprint is None:
        return
    seen = REGISTRY.reused(fingerprint, row_digests(X))
    if seen:
        warn(
            f"{owner}.{method}: {seen} of the {len(X)} rows were declared as training rows of this prefit network "
            "(rows of X in a fit with prefit=True and the same weights). The network was trained on them, so its "
            "errors there are smaller than on new rows, and coverage or scores measured on them overstate what new "
            "rows get. This happens when a prefit network is cross-validated (GridSearchCV, cross_validate): every "
            "test fold was training data of the one network. Evaluate on rows held out before the network was "
            "trained.", PrefitLeakageWarning)


def warn_if_underfits(module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, likelihood, owner: str) -> None:
    """A :class:`PrefitUnderfitWarning` when the prefit network predicts its training rows (those of X, at most
    2048 of them evenly spaced) no better than a constant."""
    rows = check_rows(Xt.shape[0]).to(Xt.device)
    finding = no_better_than_a_constant(likelihood, model_outputs(module, Xt[rows], batch_size=256), yt[rows])
    if finding:
        warn(f"{owner}.fit: the prefit network predicts its training rows (the rows of X) no better than a "
             f"constant: {finding}. prefit=True uses the network as it is; check that it was trained and its "
             "trained weights loaded, on these targets in these units (y is not standardised for a prefit "
             "network), and that X holds the rows it was trained on.", PrefitUnderfitWarning)
