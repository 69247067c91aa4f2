"""The training report line names the resolved batch size, also for ``batch_size="auto"`` (the default)."""

import logging
import re

import numpy as np

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, Training


def test_training_line_resolves_auto_batch_size(caplog):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    y = X[:, 0] + 0.1 * rng.normal(size=60)
    with caplog.at_level(logging.INFO, logger="glas_sklearn"):
        est = LaplaceActiveSubspaceRegressor(n_components=2, random_state=0, training=Training(max_epochs=2),
                                             compute=Compute(device="cpu")).fit(X, y)
    assert est.training is not None and est.training.batch_size == "auto"
    n_train = len(est.train_indices_)
    batch = min(Training().batch_rows(n_train) or n_train, n_train)
    assert re.search(rf"training: \d+ epochs on {n_train} rows \(batches of {batch}[;)]", caplog.text)
