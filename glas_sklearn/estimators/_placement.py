"""Where the estimators compute: ``device`` and ``dtype`` resolved (a prefit module's own device and the dtype of
its trainable weights under "auto")."""

from __future__ import annotations

import torch

from ._constraints import DTYPES
from ._network import trainable_dtype

__all__ = ["PlacementMixin"]


class PlacementMixin:
    """``device`` and ``dtype`` as torch objects, for ``LaplaceActiveSubspaceBase`` (which provides the
    parameters and the user's module)."""

    def _resolve_device(self) -> torch.device:
        """``device`` as a torch device; "auto" is where a prefit module lives, else CUDA when available, else
        the CPU."""
        if self.device == "auto":
            user = self._user_module() if self.prefit else None
            params = [] if user is None else list(user.parameters())
            if params:  # a prefit module stays where it is
                return params[0].device
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"{type(self).__name__}: device {self.device!r} is not a torch device.") from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{type(self).__name__}: device={self.device!r} but CUDA is not available; "
                             "use device='cpu' or 'auto'.")
        return device

    def _resolve_dtype(self) -> torch.dtype:
        """``dtype`` as a torch dtype; "auto" follows a prefit module's trainable parameters, else float32."""
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        user = self._user_module() if self.prefit else None
        weights_dtype = None if user is None else trainable_dtype(user)
        if weights_dtype is None:
            return torch.float32
        if weights_dtype not in DTYPES.values():
            raise ValueError(f"{type(self).__name__}: the prefit module's parameters are {weights_dtype}; the "
                             "posterior needs float32 or float64 weights (cast a copy of the module, e.g. "
                             "net.float()).")
        return weights_dtype
