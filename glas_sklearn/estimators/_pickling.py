"""Pickling the estimators: torch state through ``torch.save`` (loadable on a CPU-only machine), stamped with the
package version and the pickle format; states of another format (made before this version included) are refused."""

from __future__ import annotations

import io
import logging

import torch

from .._version import __version__

__all__ = ["PicklingMixin"]

logger = logging.getLogger("glas_sklearn.estimators._base")

# Fitted attributes (and the module parameter) that hold torch objects, saved through torch.save.
_TORCH_STATE = ("module", "module_", "posterior_")
#: The layout of the pickled state (``__getstate__``); a pickle of another format is refused, not migrated.
_PICKLE_FORMAT = 1


class PicklingMixin:
    """``__getstate__`` / ``__setstate__`` of ``LaplaceActiveSubspaceBase``."""

    def __getstate__(self) -> dict:
        """Torch objects (the module, the posterior) are stored through ``torch.save`` so that ``__setstate__``
        can map their tensors to the CPU when the pickle is loaded on a machine without CUDA. The state carries
        the package version and the pickle format; ``__setstate__`` refuses other formats (states made before
        this version included) with a message naming the version, rather than migrating them."""
        state = dict(super().__getstate__())
        state["_glas_pickle"] = (__version__, _PICKLE_FORMAT)
        torch_part = {k: state.pop(k) for k in _TORCH_STATE if k in state}
        if any(v is not None for v in torch_part.values()):
            buffer = io.BytesIO()
            torch.save(torch_part, buffer)
            state["_torch_state"] = buffer.getvalue()
            post = torch_part.get("posterior_")
            state["_torch_device"] = str(post.device) if post is not None else None
        else:
            state.update(torch_part)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        stamp = state.pop("_glas_pickle", None)
        if stamp is None or tuple(stamp)[1:] != (_PICKLE_FORMAT,):
            made = ("an earlier development build of glas-sklearn" if stamp is None
                    else f"glas-sklearn {stamp[0]} (pickle format {stamp[1]})")
            raise ValueError(f"This {type(self).__name__} was pickled by {made}; glas-sklearn {__version__} loads only "
                             f"pickles of its own format ({_PICKLE_FORMAT}): states made before this version are not "
                             f"migrated. Refit the estimator with glas-sklearn {__version__} and pickle it again (or "
                             "load it with the version that saved it).")
        blob = state.pop("_torch_state", None)
        saved_device = state.pop("_torch_device", None)
        if blob is not None:
            map_location = None if torch.cuda.is_available() else "cpu"
            if map_location == "cpu" and saved_device is not None and saved_device != "cpu":
                logger.info("%s was fitted on %s; CUDA is not available here, so it is loaded on the CPU.",
                            type(self).__name__, saved_device)
            state.update(torch.load(io.BytesIO(blob), map_location=map_location, weights_only=False))
        super().__setstate__(state)
