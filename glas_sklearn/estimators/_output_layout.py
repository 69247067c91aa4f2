"""The regressor's network outputs in its likelihood's layout: the default MLP wrapped by the likelihood (e.g. the
heteroscedastic variance head), and a module's outputs checked against the layout the likelihood reads."""

from __future__ import annotations

import torch
from torch import nn

from .._functional import eval_view

__all__ = ["OutputLayoutMixin"]


class OutputLayoutMixin:
    """The likelihood's hooks on the network for ``LaplaceActiveSubspaceRegressor``: they extend
    :class:`~glas_sklearn.estimators._network.NetworkMixin`'s ``_build_module`` and ``_check_output_shape``."""

    def _build_module(self, n_features: int, n_outputs: int, seed: int) -> nn.Module:
        module = super()._build_module(n_features, n_outputs, seed)
        return module if self.module is not None else self.likelihood_.wrap_module(module)

    def _check_output_shape(self, module, x1, n_outputs) -> None:
        try:
            with torch.no_grad():
                out = eval_view(module)(x1)
        except (RuntimeError, TypeError, IndexError, ValueError):  # reported by the base check
            out = None
        if isinstance(out, torch.Tensor):
            try:
                self.likelihood_.check_module_output(out, n_outputs)
            except ValueError as err:
                raise ValueError(f"LaplaceActiveSubspaceRegressor: {err}") from err
        super()._check_output_shape(module, x1, n_outputs)
