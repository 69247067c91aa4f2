"""How a network is trained (floor 2, below the estimators: it needs a loss, nothing else of a likelihood).

- :mod:`~glas_sklearn.training.settings`: :class:`Training`, the settings, and their "auto" rules;
- :mod:`~glas_sklearn.training.fitting`: what a training runs around the loop, written once for one network and
  for several: the ``weight_decay="cv"`` search, early stopping on held-out rows, the shadow copy;
- :mod:`~glas_sklearn.training.loop`: :func:`~glas_sklearn.training.loop.run`, the one training loop;
- :mod:`~glas_sklearn.training.networks`: what the loop trains, one network in place or several stacked;
- :mod:`~glas_sklearn.training.optim`: the optimizer step (fused Adam) and the learning-rate schedule;
- :mod:`~glas_sklearn.training.pieces`: batches, the seeded RNG, per-row and held-out losses, the stopping rule.

Which network to build (the default MLP, the user's module) is the estimators' (``estimators/_training.py``).
"""

from .fitting import CV_FOLDS, CV_PRIOR_PRECISIONS, SHADOW_PATIENCE_RATIO, Objective
from .loop import TrainingResult, run, train_module, train_stacked
from .optim import OPTIMIZERS, SCHEDULES, WARMUP_SHARE, build_optimizer, lr_factor
from .pieces import batch_slices, held_out_loss, seeded_torch
from .settings import (
    AUTO_EARLY_STOPPING_ROWS,
    STOPPING_MODES,
    Training,
    auto_batch_size,
    auto_lr,
    can_stratify,
    prior_weight_decay,
)

__all__ = ["AUTO_EARLY_STOPPING_ROWS", "CV_FOLDS", "CV_PRIOR_PRECISIONS", "OPTIMIZERS", "SCHEDULES",
           "SHADOW_PATIENCE_RATIO", "STOPPING_MODES", "WARMUP_SHARE", "Objective", "Training", "TrainingResult",
           "auto_batch_size", "auto_lr", "batch_slices", "build_optimizer", "can_stratify", "held_out_loss",
           "lr_factor", "prior_weight_decay", "run", "seeded_torch", "train_module", "train_stacked"]
