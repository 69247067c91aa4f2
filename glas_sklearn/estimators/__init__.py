"""The scikit-learn estimators."""

from .classifier import LaplaceActiveSubspaceClassifier
from .regressor import LaplaceActiveSubspaceRegressor

__all__ = ["LaplaceActiveSubspaceRegressor", "LaplaceActiveSubspaceClassifier"]
