"""The heteroscedastic Gaussian likelihood: per target the network gives a mean and a variance parameter.

Per record and target, y ~ N(μ(x), σ²(x)), with the loss ℓ = ½ (y − μ)²/σ² + ½ log σ² (the NLL up to ½ log 2π).
Two output layouts (``output=``), both with 2k outputs for k targets, means (or η1) first:

- ``"mean_logvar"``: [μ_1 … μ_k, s_1 … s_k] with s = log σ². The Fisher (expected Hessian of ℓ) in (μ, s) is
  H = diag(1/σ², ½), positive definite; it is the GGN's output Hessian.
- ``"natural"``: [η1_1 … η1_k, η2_1 … η2_k], the natural parameters η1 = μ/σ², η2 = −1/(2σ²) < 0 (Immer et al.
  2023). ℓ = −η1 y − η2 y² + A(η) is convex in η; its Hessian ∇²A = Cov(y, y²) = [[σ², 2μσ²], [2μσ², 4μ²σ² + 2σ⁴]]
  does not depend on y, so the GGN is exact there.

Training with the plain NLL lets the network explain hard rows by a large σ² and stop fitting their mean; β-NLL
(Seitzer et al. 2022) weights each record's loss by stopgrad(σ²)^b (``beta_nll``; b = 0 is the NLL, b = 1 gives
the mean the gradient of the squared error).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .._functional import model_outputs
from ..conformity_scores import StdNormalizedResidual
from ..predictive import resolve_predictive
from ._base import Likelihood
from ._row_noise import RowNoisePredictive

__all__ = ["HeteroscedasticGaussian", "NaturalParameterHead"]

_LAYOUTS = ("mean_logvar", "natural")
# log σ² is clipped here before exponentiating (σ² between 1e-13 and 1e13 in the network's units): an untrained
# or extrapolating variance head must not overflow the loss, the curvature or the predictive.
_LOGVAR_CLIP = 30.0


class NaturalParameterHead(nn.Module):
    """Maps 2k unconstrained outputs (a, r) to natural parameters (η1, η2) = (a, −½ exp(r)), η2 < 0: the last
    layer of the default network for ``output="natural"`` (r is the log precision)."""

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        k = out.shape[-1] // 2
        r = out[..., k:].clamp(-_LOGVAR_CLIP, _LOGVAR_CLIP)
        return torch.cat([out[..., :k], -0.5 * torch.exp(r)], dim=-1)


class HeteroscedasticGaussian(RowNoisePredictive, Likelihood):
    """Heteroscedastic Gaussian likelihood for k targets on 2k network outputs.

    Parameters
    ----------
    output : {"mean_logvar", "natural"}, default="mean_logvar"
        The network's output layout (see the module docstring); a prefit module declares its layout here.
    beta_nll : float, default=0.5
        The β-NLL exponent b of the training loss ℓ · stopgrad(σ²)^b (0: plain NLL). Only training uses it; the
        curvature and the predictive are those of the likelihood itself.

    Examples
    --------
    >>> import torch
    >>> lik = HeteroscedasticGaussian()
    >>> out = torch.tensor([[0.5, 0.0]])          # μ = 0.5, log σ² = 0
    >>> lik.mean_output(out), lik.noise_variance(out)
    (tensor([[0.5000]]), tensor([[1.]]))
    >>> lik.output_hessian_product(out, torch.tensor([[1.0, 1.0]]))  # diag(1/σ², ½) u
    tensor([[1.0000, 0.5000]])
    """

    name = "heteroscedastic"
    is_classification = False
    needs_noise_variance = False  # β = 1 ("mean") or N ("standard"): the likelihood carries σ(x)
    default_scaling = "standard"
    noise_in_outputs = True
    ensemble_combine = None
    noise_per_row = True

    def __init__(self, output: str = "mean_logvar", beta_nll: float = 0.5) -> None:
        if output not in _LAYOUTS:
            raise ValueError(f"HeteroscedasticGaussian: output must be one of {list(_LAYOUTS)} (the network's "
                             f"output layout: means then log-variances, or natural parameters η1 then η2 < 0), "
                             f"got {output!r}.")
        if not isinstance(beta_nll, numbers.Real) or isinstance(beta_nll, bool) or not 0 <= beta_nll <= 1:
            raise ValueError(f"HeteroscedasticGaussian: beta_nll must be a number in [0, 1] (0: the plain NLL, "
                             f"0.5: Seitzer et al.'s β-NLL), got {beta_nll!r}.")
        self.output = output
        self.beta_nll = float(beta_nll)

    # ---------------------------------------------------------------- layout
    def n_outputs(self, n_targets: int) -> int:
        """2k network outputs for k targets."""
        return 2 * int(n_targets)

    def check_output(self, output: torch.Tensor, where: str = "the network") -> None:
        """Raise a ValueError naming the problem when ``output`` is not a valid 2k-output layout."""
        if output.shape[-1] % 2:
            raise ValueError(f"The heteroscedastic likelihood needs 2k outputs per row (k means, then k "
                             f"{'log-variances' if self.output == 'mean_logvar' else 'η2 < 0'}), but {where} "
                             f"returns {output.shape[-1]}; give the network an even number of outputs.")
        _, second = self._split(output)
        if not bool(torch.isfinite(output).all()):
            raise ValueError(f"{where} returns non-finite outputs (NaN or inf) for the heteroscedastic likelihood; "
                             "the variance head must give a finite variance on every row.")
        if self.output == "natural" and bool((second >= 0).any()):
            raise ValueError(f"{where} returns η2 ≥ 0 on some rows, but output='natural' needs η2 = −1/(2σ²) < 0 "
                             "(end the network with glas_sklearn.likelihoods.NaturalParameterHead, or declare "
                             "output='mean_logvar' if the second half holds log-variances).")

    def _split(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = output.shape[-1] // 2
        return output[..., :k], output[..., k:]

    def mean_and_variance(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """μ(x) and σ²(x) from the outputs, shapes (..., k) each."""
        a, b = self._split(output)
        if self.output == "mean_logvar":
            return a, torch.exp(b.clamp(-_LOGVAR_CLIP, _LOGVAR_CLIP))
        var = -0.5 / b
        return a * var, var

    def mean_output(self, output: torch.Tensor) -> torch.Tensor:
        """μ(x): the part of the output whose posterior uncertainty the predictive reports."""
        return self.mean_and_variance(output)[0]

    def noise_variance(self, output: torch.Tensor) -> torch.Tensor:
        """σ²(x), the aleatoric variance the network predicts."""
        return self.mean_and_variance(output)[1]

    def row_noise_variance(self, module, X: torch.Tensor) -> torch.Tensor:
        """σ²(x; θ0) of the network ``module`` on the rows X, (n, k)."""
        out = model_outputs(module, X)
        self.check_output(out, "the module")
        return self.noise_variance(out)

    def default_conformity_score(self):
        """The std-normalised residual ``|y − μ̂| / σ̂`` with σ̂² = σ_ale² + σ_epi²
        (:class:`~glas_sklearn.conformity_scores.StdNormalizedResidual`)."""
        return StdNormalizedResidual()

    def wrap_module(self, module: nn.Module) -> nn.Module:
        """For ``output="natural"`` the estimators' MLP ends in :class:`NaturalParameterHead` ((a, r) ↦ (a, −½ eʳ))."""
        return nn.Sequential(module, NaturalParameterHead()) if self.output == "natural" else module

    def check_module_output(self, output: torch.Tensor, n_outputs: int) -> None:
        """A user's module must return an even number (2k) of outputs per row."""
        if output.ndim == 2 and output.shape[1] % 2:
            raise ValueError(f"likelihood='heteroscedastic' needs 2k outputs per row for k targets (k means, then k "
                             f"variance parameters, layout {self.output!r}), but the module returns "
                             f"{output.shape[1]} (an odd number); {n_outputs} are needed here.")

    def draw_y(self, samples: torch.Tensor, noise_var, generator: torch.Generator) -> torch.Tensor:
        """Draws of y = μ(x; θ) + σ(x; θ) ε, ε ~ N(0, 1), from output samples (S, n, 2k); ``noise_var`` is unused
        (the network's σ(x) is the noise)."""
        mu, var = self.mean_and_variance(samples)
        return mu + var.sqrt() * torch.randn(mu.shape, generator=generator, dtype=mu.dtype, device=mu.device)

    def mean_gradient(self, output: torch.Tensor) -> torch.Tensor:
        """∂μ/∂(outputs of its target), shape (..., k, 2): (1, 0) for "mean_logvar"; (σ², 2 μ σ²) for "natural"
        (μ = −η1/(2η2): ∂μ/∂η1 = −1/(2η2) = σ², ∂μ/∂η2 = η1/(2η2²) = 2μσ²)."""
        mu, var = self.mean_and_variance(output)
        if self.output == "mean_logvar":
            return torch.stack([torch.ones_like(mu), torch.zeros_like(mu)], dim=-1)
        return torch.stack([var, 2 * mu * var], dim=-1)

    # ------------------------------------------------------------------ loss
    def nll_terms(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per record and target ½ (y − μ)²/σ² + ½ log σ² (the Gaussian NLL less ½ log 2π), shape (..., k)."""
        a, b = self._split(output)
        target = target.reshape(a.shape)
        if self.output == "mean_logvar":
            s = b.clamp(-_LOGVAR_CLIP, _LOGVAR_CLIP)
            return 0.5 * (target - a) ** 2 * torch.exp(-s) + 0.5 * s
        # natural: −η1 y − η2 y² − η1²/(4η2) − ½ log(−2η2)
        return -a * target - b * target**2 - a**2 / (4 * b) - 0.5 * torch.log(-2 * b)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean training loss: Σ_k ℓ · stopgrad(σ²)^b per row, averaged over rows (β-NLL; b = ``beta_nll``)."""
        terms = self.nll_terms(output, target)
        if self.beta_nll > 0:
            terms = terms * self.noise_variance(output).detach() ** self.beta_nll
        return terms.reshape(terms.shape[0], -1).sum(-1).mean()

    def held_out_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean NLL Σ_k ½ (y − μ)²/σ² + ½ log σ² per row (less ½ log 2π): held-out rows judge the training
        by the likelihood itself, not by the β-NLL weighting that only shapes its gradients."""
        terms = self.nll_terms(output, target)
        return terms.reshape(terms.shape[0], -1).sum(-1).mean()

    # ------------------------------------------------------------- curvature
    def output_hessian_matrix(self, output: torch.Tensor) -> torch.Tensor:
        """H_n per record as a dense (..., 2k, 2k) matrix (block-diagonal per target)."""
        output = output.detach()
        k = output.shape[-1] // 2
        h_aa, h_ab, h_bb = self._blocks(output)
        H = output.new_zeros(output.shape + (2 * k,))
        idx = torch.arange(k, device=output.device)
        H[..., idx, idx] = h_aa
        H[..., idx + k, idx + k] = h_bb
        H[..., idx, idx + k] = h_ab
        H[..., idx + k, idx] = h_ab
        return H

    def _blocks(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The three entries of each target's 2×2 block of H_n: (first, first), (first, second), (second, second)."""
        mu, var = self.mean_and_variance(output)
        if self.output == "mean_logvar":
            return 1.0 / var, torch.zeros_like(var), torch.full_like(var, 0.5)
        return var, 2 * mu * var, 4 * mu**2 * var + 2 * var**2

    def output_hessian_product(self, output: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """H_n(output) u per record; ``u`` has shape (..., 2k) or (c, ..., 2k) (columns of a block in front)."""
        h_aa, h_ab, h_bb = self._blocks(output.detach())
        ua, ub = self._split(u)
        return torch.cat([h_aa * ua + h_ab * ub, h_ab * ua + h_bb * ub], dim=-1)

    def output_hessian_diagonal_terms(self, output: torch.Tensor, jac: torch.Tensor) -> torch.Tensor:
        """``Σ_{m,m'} J_mw H_mm' J_m'w`` per record and weight w, for per-record Jacobians ``jac``
        ``(c, *out, D)`` (the GGN's exact diagonal): shape ``(c, *out[:-1], D)``."""
        h_aa, h_ab, h_bb = (h.unsqueeze(-1).to(jac.dtype) for h in self._blocks(output.detach()))
        k = jac.shape[-2] // 2
        ja, jb = jac[..., :k, :], jac[..., k:, :]
        return (h_aa * ja**2 + 2 * h_ab * ja * jb + h_bb * jb**2).sum(-2)

    # ------------------------------------------------------------ predictive
    def predictive_parts(self, posterior, X: torch.Tensor, d: int, *, predictive="linearized",
                         n_samples: int = 1000, random_state=None,
                         batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """μ̂, σ_ale² and σ_epi² of each row and target, (n, k) each, in the network's units.

        The predictive for y is N(μ̂, σ_ale² + σ_epi²); the predictive mode (a name or a
        :class:`~glas_sklearn.predictive.PredictiveMode`) asks :meth:`linearized_parts` or :meth:`sampled_parts`.
        """
        return resolve_predictive(predictive).likelihood_parts(self, posterior, X, d, n_samples=n_samples,
                                                               random_state=random_state, batch_size=batch_size)

    def sampled_parts(self, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The law of total variance over posterior samples ``(S, n, 2k)``: μ̂ = E[μ], σ_ale² = E[σ²],
        σ_epi² = Var[μ]."""
        mu, var = self.mean_and_variance(samples)
        return mu.mean(0), var.mean(0), mu.var(0, unbiased=False)

    def linearized_parts(self, posterior, X: torch.Tensor, d: int, *,
                         batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """μ̂ = μ(x; θ0), σ_epi² = Var[μ] = J_μ Σ J_μᵀ (for natural parameters by the delta method on the
        linearised (η1, η2) covariance), σ_ale² = σ²(x; θ0) (the variance head's own posterior uncertainty is not
        propagated: under β = N it is negligible in distribution)."""
        out = posterior.predict_mean(X, batch_size=batch_size)
        mu, ale = self.mean_and_variance(out)
        k = mu.shape[-1]
        if self.output == "mean_logvar":
            epi = posterior.linearized_variance(X, d, batch_size=batch_size).clamp_min(0)[..., :k]
        else:  # natural parameters: Var[μ] ≈ gᵀ C g with g = ∂μ/∂(η1, η2) and C the 2×2 block of each target
            cov = posterior.linearized_variance(X, d, full_cov=True, batch_size=batch_size)  # (n, 2k, 2k)
            g = self.mean_gradient(out)  # (n, k, 2)
            idx = torch.arange(k, device=cov.device)
            c11, c12, c22 = cov[:, idx, idx], cov[:, idx, idx + k], cov[:, idx + k, idx + k]
            epi = (g[..., 0] ** 2 * c11 + 2 * g[..., 0] * g[..., 1] * c12 + g[..., 1] ** 2 * c22).clamp_min(0)
        return mu, ale, epi

    def gaussian_nll(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The full per-record Gaussian NLL (with ½ log 2π), shape (..., k)."""
        return self.nll_terms(output, target) + 0.5 * math.log(2 * math.pi)
