"""The training report line names the resolved batch size, also for ``batch_size="auto"`` (the default)."""

import numpy as np

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, Training
from glas_sklearn.estimators._report import training_line


def test_training_line_resolves_auto_batch_size():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    y = X[:, 0] + 0.1 * rng.normal(size=60)
    est = LaplaceActiveSubspaceRegressor(n_components=2, random_state=0, training=Training(max_epochs=2),
                                         compute=Compute(device="cpu")).fit(X, y)
    assert est.batch_size == "auto"
    line = training_line(est, 54, 0.1)
    assert f"(batches of {min(est._batch_size(54) or 54, 54)})" in line
