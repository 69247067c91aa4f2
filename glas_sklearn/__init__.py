"""glas-sklearn: calibrated uncertainty for trained PyTorch networks by generalized Laplace active subspaces."""

from ._version import __version__
from .compose import predict_interval, predict_set
from .datasets import load_concrete
from .estimators import (
    Compute,
    LaplaceActiveSubspaceClassifier,
    LaplaceActiveSubspaceRegressor,
    LowRank,
    LowRankDiag,
    Posterior,
    PrefitLeakageWarning,
    PrefitUnderfitWarning,
    Subspace,
    Training,
)
from .metrics import coverage_score, interval_score, make_interval_scorer, mean_width_score
from .serialization import load, save

__all__ = [
    "LaplaceActiveSubspaceRegressor",
    "LaplaceActiveSubspaceClassifier",
    "PrefitLeakageWarning",
    "PrefitUnderfitWarning",
    "Training",
    "LowRank",
    "LowRankDiag",
    "Subspace",
    "Posterior",
    "Compute",
    "coverage_score",
    "interval_score",
    "make_interval_scorer",
    "mean_width_score",
    "predict_interval",
    "predict_set",
    "load_concrete",
    "save",
    "load",
    "__version__",
]
