"""The scikit-learn estimators and the settings objects of their components."""

from ._base import Compute
from ._posterior import LowRank, LowRankDiag, Posterior, Subspace
from ._prefit import PrefitLeakageWarning, PrefitUnderfitWarning
from ._training import Training
from .classifier import LaplaceActiveSubspaceClassifier
from .regressor import LaplaceActiveSubspaceRegressor

__all__ = ["Compute", "LaplaceActiveSubspaceClassifier", "LaplaceActiveSubspaceRegressor", "LowRank", "LowRankDiag",
           "Posterior", "PrefitLeakageWarning", "PrefitUnderfitWarning", "Subspace", "Training"]
