"""The regressor's observation noise σ: where it comes from (``noise_std``: the calibration or training residuals,
a given value, or the network's own σ(x) for a likelihood with the noise in its outputs), its value per output in
internal units for β and intervals, and the fitted ``noise_std_`` in the units of y."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from .._functional import model_outputs
from ..laplace import residual_noise_variance

__all__ = ["NOISE_SOURCES", "ObservationNoiseMixin"]

#: The sources ``noise_std`` names.
NOISE_SOURCES = ("auto", "calibration", "training")
# Below this many held-out rows the residual variance is too noisy to prefer it over the training residuals.
_MIN_CALIBRATION_ROWS_FOR_NOISE = 30


class ObservationNoiseMixin:
    """σ² for β and intervals, for ``LaplaceActiveSubspaceRegressor`` (which provides ``noise_std``,
    ``include_noise``, ``likelihood_``, the calibrator and the targets' scale ``y_scale_``)."""

    def _noise_var(self, module, Xt, yt, Xc, yc, sample_weight=None):
        """σ² for β (pooled over outputs, internal units; training residuals weighted by ``sample_weight``,
        calibration residuals unweighted); the per-output values are kept for intervals. Heteroscedastic: no σ²
        enters β; the mean of σ²(x) over the training rows is kept for ``noise_std_``."""
        if self.likelihood_.noise_in_outputs:
            out = model_outputs(module, Xt)
            self.likelihood_.check_output(out, "the module")
            self.noise_source_ = self.likelihood_.name
            var = self.likelihood_.noise_variance(out).to(torch.float64)
            self._noise_var_out = var.reshape(len(out), -1).mean(0).cpu().numpy()
            return None
        source = self.noise_std
        if source == "auto":
            enough = len(Xc) >= _MIN_CALIBRATION_ROWS_FOR_NOISE
            source = "calibration" if enough and not self._calibrator().requires_fixed_predictor else "training"
        elif source == "calibration" and self._calibrator().requires_fixed_predictor:
            warnings.warn("LaplaceActiveSubspaceRegressor: noise_std='calibration' with calibration='conformal' "
                          "estimates σ from the calibration rows, so the conformal scores depend on those rows "
                          "and the coverage guarantee is only approximate; use noise_std='training' or a "
                          "given σ for the exact guarantee.", UserWarning, stacklevel=4)
        self.noise_source_ = source if isinstance(source, str) else "given"
        if source == "training":
            per_output = residual_noise_variance(module, Xt, yt, per_output=True, sample_weight=sample_weight)
        elif source == "calibration":
            if len(Xc) < 2:
                raise ValueError(f"noise_std='calibration' needs at least 2 calibration rows, got {len(Xc)}.")
            per_output = residual_noise_variance(module, Xc, yc, per_output=True)
        else:
            per_output = (float(self.noise_std) / self.y_scale_) ** 2
        self._noise_var_out = np.asarray(per_output, dtype=np.float64)
        return float(np.mean(self._noise_var_out))

    def _set_noise(self) -> None:
        std = np.sqrt(self._noise_var_out) * self.y_scale_
        if not isinstance(self.noise_std, str):
            std = np.full_like(std, float(self.noise_std))  # a given σ is reported exactly as given
        self.noise_std_ = float(std[0]) if self._y_1d else std

    def _interval_noise_var(self):
        return self._noise_var_out if self.include_noise else 0.0
