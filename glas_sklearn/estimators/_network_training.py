"""θ0 in fit: the prefit module as it is, or the estimator's network trained on the training rows (the rows held
out for early stopping, the batch size and learning rate with "auto" resolved, the training record kept as
fitted attributes). The training loop itself is :func:`~glas_sklearn.estimators._training.train_module`."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch import nn

from ._report import training_line
from ._training import AUTO_EARLY_STOPPING_ROWS, auto_batch_size, auto_lr, train_module

__all__ = ["NetworkTrainingMixin"]

logger = logging.getLogger("glas_sklearn.estimators._base")

# Offset of the seed of the early-stopping validation split (within the training rows).
_VALIDATION_SPLIT = 104729


class NetworkTrainingMixin:
    """θ0 built and trained, for ``LaplaceActiveSubspaceBase`` (which provides the parameters, the network
    hooks of :class:`~glas_sklearn.estimators._network.NetworkMixin`, the thread choice and the prefit checks)."""

    def _theta0_module(self, Xt: torch.Tensor, yt: torch.Tensor, n_outputs: int, seed: int,
                       dtype: torch.dtype, sample_weight: torch.Tensor | None = None, *,
                       held_out: np.ndarray | None = None, epochs: int | None = None,
                       n_iter_no_change: int | None = None) -> nn.Module:
        """θ0: the prefit module as it is, or our own network (new or copied) trained on the training rows
        (on the weighted mean loss with ``sample_weight``); ``held_out``, ``epochs`` and ``n_iter_no_change`` as in
        :meth:`_train`."""
        if self.prefit:
            module = self._called_as_network(self._prefit_module(Xt.device, dtype), Xt[:1])
            self._check_trainable(module)
            self._choose_threads(module, Xt.shape[0])
            self.training_loss_ = self.loss_curve_ = []
            self.n_iter_, self.validation_scores_, self.best_validation_score_ = 0, None, None
            self.validation_indices_ = None
        else:
            module = self._build_module(Xt.shape[1], n_outputs, seed).to(device=Xt.device, dtype=dtype)
            module = self._called_as_network(module, Xt[:1])
            self._check_trainable(module)
            self._check_output_shape(module, Xt[:1], n_outputs)  # before training: a module that cannot take X
            self._choose_threads(module, Xt.shape[0])
            t0 = time.perf_counter()
            self._train(module, Xt, yt, seed, sample_weight, held_out=held_out, epochs=epochs,
                        n_iter_no_change=n_iter_no_change)
            self.timings_["training"] = time.perf_counter() - t0
            held = self.validation_indices_
            self._n_rows_trained = Xt.shape[0] - (0 if held is None else len(held))  # for the closing line
            self._report(training_line(self, Xt.shape[0], self.timings_["training"]))
        self._check_output_shape(module, Xt[:1], n_outputs)
        if self.prefit:
            self._warn_if_prefit_underfits(module, Xt, yt)
        return module

    def _train(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, seed: int,
               sample_weight: torch.Tensor | None, *, held_out: np.ndarray | None = None,
               epochs: int | None = None, n_iter_no_change: int | None = None) -> None:
        """Train ``module`` in place on the training rows, less the validation rows held out of them when
        ``early_stopping`` (never calibration rows), and record ``n_iter_``, ``loss_curve_``,
        ``validation_scores_``, ``best_validation_score_`` and ``validation_indices_``.

        ``held_out`` (sorted positions among the training rows) are the validation rows instead, whatever
        ``early_stopping``; ``epochs`` replaces ``max_epochs`` and ``n_iter_no_change`` the estimator's."""
        n_rows = len(yt)
        if held_out is None:
            fit_rows, val_rows = self._split_off_validation_rows(yt, seed)
        else:
            val_rows = np.sort(np.asarray(held_out))
            fit_rows = np.setdiff1d(np.arange(n_rows), val_rows)
        validation = None
        if val_rows is not None:
            fit_index, val_index = (torch.as_tensor(r, device=Xt.device) for r in (fit_rows, val_rows))
            validation = (Xt[val_index], yt[val_index], None if sample_weight is None else sample_weight[val_index])
            Xt, yt = Xt[fit_index], yt[fit_index]
            sample_weight = None if sample_weight is None else sample_weight[fit_index]
        batch_size = self._batch_size(len(Xt))
        result = train_module(
            module, Xt, yt, self.likelihood_.loss, optimizer=self.optimizer, lr=self._lr(len(Xt)),
            weight_decay=self.weight_decay, batch_size=batch_size,
            max_epochs=self.max_epochs if epochs is None else epochs, seed=seed,
            verbose=self.verbose, owner=type(self).__name__, sample_weight=sample_weight, validation=validation,
            validation_loss=self.likelihood_.held_out_loss, tol=self.tol,
            n_iter_no_change=self.n_iter_no_change if n_iter_no_change is None else n_iter_no_change,
            fused=n_rows >= AUTO_EARLY_STOPPING_ROWS)  # fused Adam on large data (same update, ~1.4x faster)
        self.n_iter_ = result.n_iter
        self.loss_curve_ = self.training_loss_ = result.loss_curve
        self.validation_scores_ = result.validation_scores if validation is not None else None
        self.best_validation_score_ = result.best_validation_score
        self.validation_indices_ = val_rows

    def _batch_size(self, n_rows: int) -> int | None:
        """Rows per training step on ``n_rows`` rows: ``batch_size``, with "auto" resolved (None: all rows)."""
        return auto_batch_size(n_rows) if self.batch_size == "auto" else self.batch_size

    def _lr(self, n_rows: int) -> float:
        """The learning rate on ``n_rows`` rows trained on: ``lr``, with "auto" resolved (:func:`auto_lr`)."""
        return auto_lr(n_rows, self._batch_size(n_rows)) if self.lr == "auto" else self.lr

    def _split_off_validation_rows(self, yt: torch.Tensor, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Positions among the n training rows of the rows trained on and of the ``validation_fraction`` held out
        for early stopping (⌈fraction · n⌉, stratified by class where possible; seeded from ``seed``), sorted;
        ``(all rows, None)`` without early stopping ("auto" below ``AUTO_EARLY_STOPPING_ROWS`` rows), or when either
        part would have fewer than 2 rows."""
        n = len(yt)
        n_val = int(np.ceil(self.validation_fraction * n))
        auto = isinstance(self.early_stopping, str)  # "auto", the only string allowed
        if not (n >= AUTO_EARLY_STOPPING_ROWS if auto else self.early_stopping):
            if auto:
                logger.info("%s: early_stopping='auto' is off below %d training rows (%d here): training on all of "
                            "them for max_epochs=%d epochs", type(self).__name__, AUTO_EARLY_STOPPING_ROWS, n,
                            self.max_epochs)
            return np.arange(n), None
        if n_val < 2 or n - n_val < 2:
            logger.info("%s: %d training rows are too few to hold out validation rows for early stopping; training "
                        "for max_epochs=%d epochs", type(self).__name__, n, self.max_epochs)
            return np.arange(n), None
        labels = yt.detach().cpu().numpy() if self.likelihood_.is_classification else None
        stratify = labels if labels is not None and self._can_stratify(labels, n_val) else None
        fit, val = train_test_split(np.arange(n), test_size=n_val, random_state=(seed + _VALIDATION_SPLIT) % 2**31,
                                    stratify=stratify)
        return np.sort(fit), np.sort(val)
