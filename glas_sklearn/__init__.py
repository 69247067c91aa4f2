"""glas-sklearn: calibrated uncertainty for trained PyTorch networks by generalized Laplace active subspaces."""

from .datasets import load_concrete
from .estimators import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor

__version__ = "0.1.0.dev0"

__all__ = ["LaplaceActiveSubspaceRegressor", "LaplaceActiveSubspaceClassifier", "load_concrete", "__version__"]
