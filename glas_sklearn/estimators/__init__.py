"""The scikit-learn estimators."""

from ._prefit import PrefitLeakageWarning, PrefitUnderfitWarning
from .classifier import LaplaceActiveSubspaceClassifier
from .regressor import LaplaceActiveSubspaceRegressor

__all__ = ["LaplaceActiveSubspaceRegressor", "LaplaceActiveSubspaceClassifier", "PrefitLeakageWarning",
           "PrefitUnderfitWarning"]
