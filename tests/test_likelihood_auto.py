"""likelihood="auto": the heteroscedastic likelihood on a network the estimator builds, Gaussian on a user module."""

import numpy as np
import torch
from torch import nn

from glas_sklearn import LaplaceActiveSubspaceRegressor
from glas_sklearn.likelihoods import Gaussian, HeteroscedasticGaussian


def _data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(80, 2))
    return X, X[:, 0] + (0.05 + 0.5 * (X[:, 1] > 0)) * rng.normal(size=80)


def test_auto_is_heteroscedastic_on_the_built_network():
    X, y = _data()
    est = LaplaceActiveSubspaceRegressor(likelihood="auto", max_epochs=3, n_components=2, random_state=0,
                                         device="cpu").fit(X, y)
    assert isinstance(est.likelihood_, HeteroscedasticGaussian)
    sd = est.predict_noise_std(X)
    assert sd.shape == (80,) and np.ptp(sd) > 0  # σ(x) varies with x: the network has a variance head


def test_auto_is_gaussian_on_a_user_module():
    X, y = _data()
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    est = LaplaceActiveSubspaceRegressor(module=module, likelihood="auto", max_epochs=3, n_components=2,
                                         random_state=0, device="cpu").fit(X, y)
    assert isinstance(est.likelihood_, Gaussian)
    assert np.ptp(est.predict_noise_std(X)) == 0  # one noise level
