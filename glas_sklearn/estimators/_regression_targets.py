"""The regressor's targets: y validated (its outputs recorded as ``_y_1d`` and ``_n_out``, the network outputs it
calls for), calibration targets validated against the shape of y, the targets' standardisation
(``y_mean_``, ``y_scale_``, weighted by ``sample_weight``), the tensors in internal units, and results back in the
units of y."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["RegressionTargetsMixin"]


class RegressionTargetsMixin:
    """Regression targets validated and in and out of the internal units, for ``LaplaceActiveSubspaceRegressor``
    (which provides ``likelihood``, ``include_noise`` and ``likelihood_``)."""

    def _validate_train(self, X, y):
        X, y = self._validate_X(X, y, reset=True, multi_output=True, y_numeric=True)
        if X.shape[0] < 3:
            raise ValueError(f"LaplaceActiveSubspaceRegressor needs at least 3 samples (training and calibration "
                             f"rows), got n_samples={X.shape[0]}.")
        y = np.asarray(y, dtype=np.float64)
        if y.ndim == 2 and y.shape[1] == 0:
            raise ValueError("y has 0 columns; at least one target is needed.")
        self._y_1d = y.ndim == 1
        self._n_out = 1 if y.ndim == 1 else y.shape[1]
        if self.include_noise and self.likelihood_.noise_per_row:
            raise ValueError("LaplaceActiveSubspaceRegressor: include_noise applies to a likelihood with a constant "
                             f"noise; with likelihood={self.likelihood!r} the intervals and std are always for y (the "
                             "σ(x) is the noise): leave include_noise=False.")
        return X, y

    def _n_outputs(self, y) -> int:
        return self.likelihood_.n_outputs(1 if y.ndim == 1 else y.shape[1])

    def _validate_calibration(self, X_cal, y_cal):
        X_cal, y_cal = self._validate_X(X_cal, y_cal, reset=False, multi_output=True, y_numeric=True)
        y_cal = np.asarray(y_cal, dtype=np.float64)
        expected = (X_cal.shape[0],) if self._y_1d else (X_cal.shape[0], self._n_out)
        if y_cal.shape != expected and not (self._y_1d and y_cal.shape == (X_cal.shape[0], 1)):
            raise ValueError(f"y_cal has shape {y_cal.shape}, but y had {self._n_out} output(s): expected {expected}.")
        return X_cal, y_cal.reshape(expected)

    def _fit_scalers(self, X, y, sample_weight=None) -> None:
        super()._fit_scalers(X, y, sample_weight)
        Y = y.reshape(len(y), -1)
        if self.standardize is not False and not self.prefit:
            self.y_mean_, scale = self._standardisation(Y, sample_weight, "y")
            scale[~(scale > 0)] = 1.0
            self.y_scale_ = scale
        else:
            self.y_mean_ = np.zeros(Y.shape[1])
            self.y_scale_ = np.ones(Y.shape[1])

    def _target_tensor(self, y, device, dtype) -> torch.Tensor:
        Y = (y.reshape(len(y), -1) - self.y_mean_) / self.y_scale_
        return self._to_tensor(Y, device, dtype, "y")

    _calibration_targets = _target_tensor

    def _table_in_user_units(self, table):
        if len(self.y_scale_) == 1 and "mean_width" in table:
            table = table.assign(mean_width=table["mean_width"] * float(self.y_scale_[0]))
        return table

    def _to_user_units(self, t: torch.Tensor, shift: bool = True) -> np.ndarray:
        out = t.detach().cpu().double().numpy() * self.y_scale_.reshape((-1,) + (1,) * (t.ndim - 2))
        if shift:
            out = out + self.y_mean_.reshape((-1,) + (1,) * (t.ndim - 2))
        return out
