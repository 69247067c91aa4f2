"""The generalized Laplace posterior on the leading eigenvectors of the GGN, one class per kind.

Every kind derives from :class:`ActiveSubspacePosterior`, which holds what they share (eigenpairs, β, σ0 by
empirical Bayes, spectra, activity scores, z draws, sampling, the evaluation engine and its caches, pickling); a
kind supplies only what differs (how draws become weight perturbations, the trace of its empirical Bayes
condition, the output covariance from Jacobian projections, its default σ0 and predictive):

- :class:`SubspacePosterior` (``"subspace"``, the paper): θ = θ0 + P z.
- :class:`LowRankPosterior` (``"low_rank"``): + σ0² (I − P Pᵀ), the prior's variance off span(P).
- :class:`LowRankDiagPosterior` (``"low_rank_diag"``): the curvature P Λ Pᵀ + G's residual diagonal (Woodbury).

``posterior=`` (of :func:`~glas_sklearn.laplace.fit_laplace_subspace`, of the estimators and of
``ActiveSubspacePosterior(...)``) takes one of these names or a kind's class, a subclass of
:class:`ActiveSubspacePosterior` (a user's own kind, e.g.); :func:`resolve_posterior` turns either into the class.
A class rather than an instance: a kind is built from the curvature at fit time, so the unfitted choice is the
class itself (as ``optimizer=torch.optim.SGD``); ``clone`` and ``get_params`` keep it as it is.

A kind of one's own sets ``default_sigma0``, ``default_predictive`` and ``off_subspace`` and implements the three
hooks; here Σ = P diag(σ_j²) Pᵀ + τ σ0² (I − P Pᵀ), the prior's variance off span(P) shrunk by τ:

>>> import numpy as np, torch
>>> class ShrunkComplement(ActiveSubspacePosterior):
...     tau = 0.25
...     default_sigma0, default_predictive, off_subspace = "eb_full", "linearized", True
...
...     def _perturbations_from_draws(self, z, eps):  # P z + √τ σ0 (ε − P Pᵀ ε)
...         P = self.eigenvectors[:, :z.shape[1]]
...         return self.perturbations(z) + (self.tau * self.fit_sigma0(z.shape[1]) ** 2) ** 0.5 * (eps - eps @ P @ P.T)
...
...     def _trace_condition(self, d):  # tr Σ(α) = Σ_j 1/(βλ_j + α) + τ (D − d)/α = ‖θ0‖²
...         blam = self.beta * self.eigenvalues[:d].double().cpu().numpy()
...         trace = lambda a: float(np.sum(1 / (blam + a))) + self.tau * (self.n_weights - d) / a
...         return trace_condition(trace, self.n_weights, float(self.theta0.double().square().sum()), d)
...
...     def _output_covariance(self, X, jp, d, full_cov, batch_size):  # the variances only, for brevity
...         gram = self.jacobian_gram(X, batch_size=batch_size)
...         comp = self.tau * self.fit_sigma0(d) ** 2 * (gram - (jp.double() ** 2).sum(-1))
...         return ((jp.double() ** 2 * self.variances(d).double()).sum(-1) + comp).to(self.dtype)
>>> net = torch.nn.Linear(2, 1).double()
>>> post = ShrunkComplement(net, torch.tensor([2.0, 1.0], dtype=torch.float64), torch.eye(3, 2, dtype=torch.float64),
...                         beta=1.0)
>>> post.linearized_variance(torch.ones(4, 2, dtype=torch.float64), 2).shape
torch.Size([4, 1])

``fit_laplace_subspace(..., posterior=ShrunkComplement)`` and ``LaplaceActiveSubspaceRegressor(
posterior=ShrunkComplement)`` build it from the curvature (tests/test_posterior_kinds.py checks such a kind against
dense matrices).
"""

from __future__ import annotations

import inspect

from ._base import ActiveSubspacePosterior
from ._evaluation import memory_budget
from ._noise import estimate_noise_variance
from ._prior import LogAlphaCondition, low_rank_condition, subspace_condition, trace_condition
from .low_rank import LowRankPosterior
from .low_rank_diag import LowRankDiagPosterior
from .subspace import SubspacePosterior

__all__ = ["POSTERIOR_KINDS", "ActiveSubspacePosterior", "LogAlphaCondition", "LowRankDiagPosterior", "memory_budget",
           "LowRankPosterior", "SubspacePosterior", "estimate_noise_variance", "low_rank_condition",
           "resolve_posterior", "subspace_condition", "trace_condition"]

#: The built-in kinds by name: the names ``posterior=`` accepts as strings.
POSTERIOR_KINDS: dict[str, type[ActiveSubspacePosterior]] = {
    kind.name: kind for kind in (LowRankPosterior, LowRankDiagPosterior, SubspacePosterior)
}


def resolve_posterior(posterior) -> type[ActiveSubspacePosterior]:
    """The posterior kind's class for a name or a class: the one place where a kind's name becomes its class.

    Parameters
    ----------
    posterior : {"subspace", "low_rank", "low_rank_diag"} or type
        A built-in kind's name (:data:`POSTERIOR_KINDS`) or a concrete subclass of :class:`ActiveSubspacePosterior`.

    Returns
    -------
    type
        The subclass of :class:`ActiveSubspacePosterior`.

    Examples
    --------
    >>> resolve_posterior("low_rank").__name__
    'LowRankPosterior'
    >>> resolve_posterior(SubspacePosterior) is SubspacePosterior
    True
    """
    if isinstance(posterior, str) and posterior in POSTERIOR_KINDS:
        return POSTERIOR_KINDS[posterior]
    if isinstance(posterior, type) and issubclass(posterior, ActiveSubspacePosterior):
        if inspect.isabstract(posterior):
            missing = ", ".join(sorted(posterior.__abstractmethods__))
            raise TypeError(f"posterior={posterior.__name__} does not implement {missing}: a posterior kind sets "
                            "default_sigma0 and default_predictive and implements the hooks of "
                            "ActiveSubspacePosterior (see its Notes).")
        return posterior
    hint = (f" (a fitted posterior is not a kind: pass its class, {type(posterior).__name__})"
            if isinstance(posterior, ActiveSubspacePosterior) else "")
    raise ValueError(f"posterior must be one of {sorted(POSTERIOR_KINDS)} or a subclass of ActiveSubspacePosterior, "
                     f"got {posterior!r}{hint}.")
