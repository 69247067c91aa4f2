"""glas-sklearn: calibrated uncertainty for trained PyTorch networks by generalized Laplace active subspaces."""
__version__ = "0.1.0.dev0"
