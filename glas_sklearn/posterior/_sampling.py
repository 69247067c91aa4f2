"""Posterior draws and what the network makes of them: z and the weight normals with their seeds, weight
perturbations, sampled and linearised predictive draws.

:class:`PosteriorSampling` is a mixin of :class:`~glas_sklearn.posterior.ActiveSubspacePosterior`, shared by every
kind; how a draw becomes a weight perturbation is the kind's ``_perturbations_from_draws``.
"""

from __future__ import annotations

import numpy as np
import torch

from .._checks import check_positive_int, make_generator, numpy_rng
from ._evaluation import PosteriorEvaluation

__all__ = ["PosteriorSampling"]


class PosteriorSampling(PosteriorEvaluation):
    """z ~ N(0, diag σ_j²), weight normals ε ∈ R^D per sample (kinds ``off_subspace``), weight perturbations, and
    the sampled and linearised predictive draws.

    The host class provides ``off_subspace``, ``variances`` and the kind's hook ``_perturbations_from_draws(z, eps)``.
    """

    off_subspace: bool

    def _check_z(self, z) -> torch.Tensor:
        if not isinstance(z, torch.Tensor):
            raise TypeError(f"z must be a torch.Tensor, got {type(z).__name__}.")
        if z.ndim not in (1, 2):
            raise ValueError(f"z must have shape (d,) or (n, d), got {tuple(z.shape)}.")
        self._check_d(z.shape[-1])
        return z.to(self.dtype) if z.dtype != self.dtype else z

    def sample(self, n_samples: int, d: int, random_state=None) -> torch.Tensor:
        """Draw z ~ N(0, diag(σ_j²)) in the leading d directions; shape (n_samples, d).

        Standard normals ε of shape (n_samples, K) are drawn in one go and z = ε[:, :d] σ, so for a fixed
        integer ``random_state`` every d uses the same ε (common random numbers across d). They are drawn
        from a CPU generator (unless a torch.Generator on another device is passed) and then moved to the
        model's device, so a seed gives the same draws on every device.

        Parameters
        ----------
        n_samples : int
        d : int
        random_state : int, numpy Generator, torch.Generator or None
            Pass an int for reproducible draws shared across d.
        """
        n_samples = check_positive_int("n_samples", n_samples)
        d = self._check_d(d)
        gen = make_generator(random_state, "cpu")
        eps = torch.randn(n_samples, self.max_components, generator=gen, dtype=self.dtype, device=gen.device)
        return eps.to(self.device)[:, :d] * self.variances(d).sqrt()

    def perturbations(self, z: torch.Tensor) -> torch.Tensor:
        """Weight perturbations P_d z for rows z of shape (n, d) (or (d,)): shape (n, D) (or (D,)).

        For many samples of a large network, call it on row chunks of ``z``.
        """
        z = self._check_z(z)
        return z @ self.eigenvectors[:, : z.shape[-1]].T

    def parameters(self, z_row: torch.Tensor) -> dict:
        """θ0 + P z for one z of shape (d,), as a name → tensor dict for ``torch.func.functional_call``."""
        z_row = self._check_z(z_row)
        if z_row.ndim != 1:
            raise ValueError(f"z_row must have shape (d,), got {tuple(z_row.shape)}; "
                             "use perturbations() for many rows.")
        return self.layout.unflatten(self.theta0 + self.perturbations(z_row))

    def _draws(self, n_samples: int, d: int, random_state) -> tuple[torch.Tensor, np.ndarray | None]:
        """z of shape (n_samples, d), and for the kinds ``off_subspace`` one seed per sample for its weight
        normals ε_s ∈ R^D (None otherwise: the draws stay those of :meth:`sample`)."""
        if not self.off_subspace:
            return self.sample(n_samples, d, random_state), None
        if isinstance(random_state, torch.Generator):
            z = self.sample(n_samples, d, random_state)
            base = int(torch.randint(0, 2**62, (1,), generator=random_state))
        else:
            rng = numpy_rng(random_state)
            z_seed, base = (int(v) for v in rng.integers(0, 2**62, size=2))
            z = self.sample(n_samples, d, z_seed)
        # a seed per sample: sample s gets the same ε_s whatever the number of samples or the chunking
        return z, np.random.default_rng(base).integers(0, 2**62, size=n_samples)

    def _perturbation_block(self, z: torch.Tensor, seeds: np.ndarray | None, start: int, stop: int) -> torch.Tensor:
        """Weight perturbations of samples start … stop − 1 (the kind's ``_perturbations_from_draws``), each
        sample's ε drawn on the CPU from its own seed."""
        eps = None
        if seeds is not None:
            eps = torch.stack([
                torch.randn(self.n_weights, generator=torch.Generator().manual_seed(int(seeds[s])), dtype=self.dtype)
                for s in range(start, stop)
            ]).to(self.device)
        return self._perturbations_from_draws(z[start:stop], eps)

    def sample_perturbations(self, n_samples: int, d: int, random_state=None) -> torch.Tensor:
        """Weight perturbations θ − θ0 drawn from the posterior at dimension d; shape (n_samples, D).

        An int ``random_state`` gives the same z-normals for every d (common random numbers, as :meth:`sample`)
        and, for the kinds ``off_subspace``, the same ε ∈ R^D for every d; each sample's ε is drawn on the CPU
        from its own seed, so it does not depend on the device, on ``n_samples`` or on how the samples are
        chunked. For large D and many samples the (n_samples, D) result is large: :meth:`predict_samples`
        never forms it whole.
        """
        n_samples = check_positive_int("n_samples", n_samples)
        d = self._check_d(d)
        z, seeds = self._draws(n_samples, d, random_state)
        return self._perturbation_block(z, seeds, 0, n_samples)

    def _weights_into(self, z: torch.Tensor, seeds: np.ndarray | None, start: int, stop: int,
                      out: torch.Tensor) -> torch.Tensor:
        """θ0 + δ_s for samples start … stop − 1, written into ``out`` (stop − start, D)."""
        return torch.add(self.theta0, self._perturbation_block(z, seeds, start, stop), out=out)


    def predict_samples(self, X: torch.Tensor, d: int, n_samples: int = 1000, random_state=None,
                        batch_size: int | None = None) -> torch.Tensor:
        """Sampled Laplace: f(x; θ0 + δ_s) through the real, non-linear network (eq. 43–44).

        Parameters
        ----------
        X : torch.Tensor of shape (n, ...)
            Inputs on the model's device.
        d : int
            Subspace dimension.
        n_samples : int, default=1000
            S, the number of posterior samples.
        random_state : int, numpy Generator, torch.Generator or None
            Seeds :meth:`sample`; an int gives the same standard normals for every d. The weights are those of
            :meth:`sample_perturbations` (θ0 + P z for ``posterior="subspace"``).
        batch_size : int, optional
            Input rows per forward pass (all at once when None). Samples are evaluated in memory-bounded
            chunks, vectorised with ``torch.func.vmap`` where the model allows it.

        Returns
        -------
        torch.Tensor of shape ``(S, n, *out)``
        """
        X = self._check_X(X)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        z, seeds = self._draws(n_samples, d, random_state)
        rows = self._row_batches(X.shape[0], batch_size)
        chunk = self._chunk(rows[0].stop - rows[0].start, n_samples, X)
        # θ0 + δ for a chunk of samples, written into one buffer reused by every chunk
        # (a fresh (chunk, D) tensor per chunk costs page faults comparable to the product itself)
        weights = torch.empty(chunk, self.n_weights, dtype=self.dtype, device=self.device)
        out = None  # (S, n, *out), allocated once and filled (no per-chunk results pinning the heap)
        with torch.no_grad():
            for s in range(0, n_samples, chunk):
                stop = min(s + chunk, n_samples)
                w = self._weights_into(z, seeds, s, stop, weights[:stop - s])
                for sl in rows:
                    f = self._forward_weights(w, X[sl])
                    if out is None:
                        out = torch.empty(n_samples, X.shape[0], *f.shape[2:], dtype=f.dtype, device=f.device)
                    out[s:stop, sl] = f
        return out

    def linearized_samples(self, X: torch.Tensor, d: int, n_samples: int = 1000, random_state=None,
                           batch_size: int | None = None) -> torch.Tensor:
        """Draws of the linearised network f(x; θ0) + J(x)(θ − θ0) at the weight draws of
        :meth:`sample_perturbations` (same seed, same draws); shape ``(S, n, *out)``.

        Their distribution is the linearised predictive N(f(x; θ0), J Σ Jᵀ) of ``linearized_variance``, which for
        the kinds ``off_subspace`` is the one to draw from: their perturbations of every weight are meaningful
        for the linearised network, not for the non-linear one.
        """
        X = self._check_X(X)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        n_samples = check_positive_int("n_samples", n_samples)
        d = self._check_d(d)
        z, seeds = self._draws(n_samples, d, random_state)
        mean = self.predict_mean(X, batch_size=batch_size)
        rows = self._row_batches(X.shape[0], batch_size)
        chunk = self._chunk(rows[0].stop - rows[0].start, n_samples, X)
        out = []
        for s in range(0, n_samples, chunk):
            delta = self._perturbation_block(z, seeds, s, min(s + chunk, n_samples))
            out.append(torch.cat([self.tangent_products(X[sl], delta) for sl in rows], 1))
        return mean + torch.cat(out, 0)
