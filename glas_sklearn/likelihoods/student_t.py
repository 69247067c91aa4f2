"""The Student-t likelihood y ~ f + s · t_ν: regression with heavy-tailed noise (robust to outlying rows).

Per record and target the negative log-likelihood is (ν + 1)/2 · log(1 + r²/(ν s²)) + log s + const, r = y − f. Its
influence on f is bounded (it falls off as 1/r for ``|r|`` ≫ s), so a few outlying rows do not drag the fitted function
toward them as they do under the squared loss. The expected Hessian in f (the Fisher information, which the GGN
takes as the output Hessian) is (ν + 1) / ((ν + 3) s²), the same on every row: the curvature of the Gaussian
likelihood times (ν + 1)/(ν + 3) with s in the place of σ.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from scipy import stats

from ..predictive import regression_moments
from .gaussian import Gaussian

__all__ = ["StudentT"]

# The predictive of y = f + s·t_ν with f ~ N(ŷ, σ_f²) is integrated over the wider of the two parts, so that the
# integrand (the other part's CDF, analytic) varies on a scale of at least one unit of the integration variable; the
# trapezoid rule on a uniform grid then converges exponentially (to round-off at these steps).
_Z_NODES = np.linspace(-9.0, 9.0, 361)  # z ~ N(0, 1), step 0.05; the mass beyond ±9 is 2e-19
_Z_WEIGHTS = stats.norm.pdf(_Z_NODES) / stats.norm.pdf(_Z_NODES).sum()


def _t_nodes(df: float) -> tuple[np.ndarray, np.ndarray]:
    """Trapezoid nodes and weights for t ~ t_ν in w with t = √ν sinh w (the density decays exponentially in w),
    over ``|t|`` ≤ the 1e-16 tail quantile, step ≤ 0.05 in t near 0."""
    root = math.sqrt(df)
    w_max = math.asinh(stats.t.isf(1e-16, df) / root)
    step = min(0.05, 0.05 / root)
    w = np.linspace(-w_max, w_max, 2 * math.ceil(w_max / step) + 1)
    t = root * np.sinh(w)
    weights = stats.t.pdf(t, df) * root * np.cosh(w)
    return t, weights / weights.sum()


class StudentT(Gaussian):
    """y ~ f(x; θ) + s · t_ν per target: heavy-tailed noise of ν degrees of freedom and scale s.

    To the regressor this is a location model as the Gaussian is (ŷ = f(x), one noise scale per target, β from
    it), which is why it derives from :class:`Gaussian`; what differs is the training loss, the curvature and the
    predictive quantiles of y:

    - **Loss**: s² · (ν + 1)/2 · log(1 + r²/(ν s²)) per target (the NLL times s², so that for ``|r|`` ≪ s it is
      (ν + 1)/ν · ½ r², the Gaussian's loss up to that factor, and learning rates carry over), summed over the
      targets and averaged over the rows. The scale s is re-estimated on every batch, not differentiated: the
      median absolute residual of the batch divided by the t_ν median of ``|t|`` (iteratively reweighted robust
      regression). On a batch of one row (the per-row losses of ``sample_weight``) s is that row's ``|r|`` over the
      t_ν median, and the loss is then a fixed multiple of r² (no robustness: weighted fits lose it).
    - **Output Hessian** (the Fisher information, the GGN's): (ν + 1)/(ν + 3) · I; β = factor / s² for a named
      scaling (:meth:`beta`), with s² from the noise variance σ² the regressor estimates as s² = σ² (ν − 2)/ν, the
      variance of s · t_ν being s² ν/(ν − 2) (ν > 2; for ν ≤ 2, where it is infinite, s² = σ²).
    - **Predictive quantiles** of y = f + s · t_ν with f ~ N(ŷ, σ_f²): :meth:`quantile_interval` (quadrature of
      the CDF, solved by bisection). The posterior's own intervals of y (:meth:`predictive_interval`, what
      ``calibration="coverage"`` judges with ``include_noise=True``) are these, with ŷ, σ_f the posterior moments
      of f (a Gaussian for f also under the sampled predictive) and s² from σ²; without noise (intervals for f)
      they are the Gaussian's.

    Parameters
    ----------
    df : float, default=4.0
        ν > 0, the degrees of freedom: small ν, heavy tails (ν = 1 is the Cauchy); large ν, nearly Gaussian.
        Given here, or fitted by maximum likelihood to residuals with :meth:`from_residuals`.

    Examples
    --------
    >>> import torch
    >>> lik = StudentT(df=4.0)
    >>> lik.output_hessian_product(torch.zeros(1, 2), torch.ones(1, 2))  # (ν + 1)/(ν + 3) = 5/7
    tensor([[0.7143, 0.7143]])
    >>> round(lik.beta("mean", 100, noise_var=2.0), 6)  # 1 / s², s² = σ² (ν − 2)/ν = 1
    1.0
    """

    name = "student_t"
    is_classification = False
    needs_noise_variance = True

    def __init__(self, df: float = 4.0) -> None:
        if not isinstance(df, numbers.Real) or isinstance(df, bool) or not math.isfinite(df) or df <= 0:
            raise ValueError(f"StudentT: df must be a finite number > 0 (the degrees of freedom ν; 1 is the Cauchy, "
                             f"large values approach the Gaussian), got {df!r}.")
        self.df = float(df)

    # ------------------------------------------------------------------ loss
    def batch_scale(self, residuals: torch.Tensor) -> torch.Tensor:
        """s of a batch of residuals (any shape), not differentiated: median ``|r|`` / median ``|t_ν|``."""
        v = residuals.detach().abs().reshape(-1).sort().values
        med = 0.5 * (v[(v.numel() - 1) // 2] + v[v.numel() // 2])  # the median (the mean of the middle two)
        tiny = torch.finfo(residuals.dtype).eps
        return (med / stats.t.ppf(0.75, self.df)).clamp_min(tiny)

    def nll_terms(self, output: torch.Tensor, target: torch.Tensor, scale) -> torch.Tensor:
        """Per record and target the full negative log-likelihood at scale s: shape of ``output``."""
        nu = self.df
        const = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)
        z = (target.reshape(output.shape) - output) / scale
        return 0.5 * (nu + 1) * torch.log1p(z**2 / nu) + torch.log(torch.as_tensor(scale, dtype=output.dtype)) - const

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """s² · (ν + 1)/2 · log(1 + r²/(ν s²)) summed over the outputs, averaged over the rows (s:
        :meth:`batch_scale`)."""
        r = target.reshape(output.shape) - output
        s2 = self.batch_scale(r) ** 2
        terms = s2 * 0.5 * (self.df + 1) * torch.log1p(r**2 / (self.df * s2))
        return terms.reshape(terms.shape[0], -1).sum(-1).mean()

    # ------------------------------------------------------------- curvature
    @property
    def fisher_factor(self) -> float:
        """(ν + 1)/(ν + 3): the Fisher information of the location in units of 1/s²."""
        return (self.df + 1.0) / (self.df + 3.0)

    def output_hessian_product(self, output: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """H = (ν + 1)/(ν + 3) · I: the expected Hessian of the loss (times 1/s², which β carries)."""
        return self.fisher_factor * u

    def output_hessian_diagonal_terms(self, output: torch.Tensor, jacobian: torch.Tensor) -> torch.Tensor:
        """diag(J_nᵀ H J_n) = (ν + 1)/(ν + 3) · Σ_m J_mk² per record."""
        return self.fisher_factor * (jacobian**2).sum(-2)

    def scale_squared(self, noise_var: float) -> float:
        """s² from the noise variance σ² (the mean squared residual): σ² (ν − 2)/ν for ν > 2, else σ²."""
        return noise_var * (self.df - 2.0) / self.df if self.df > 2 else noise_var

    def _named_scaling_beta(self, factor: float, scaling: str, noise_var: float | None) -> float:
        return super()._named_scaling_beta(factor, scaling, noise_var if noise_var is None or noise_var <= 0
                                           else self.scale_squared(noise_var))

    # ------------------------------------------------------------ predictive
    def predictive_interval(self, posterior, X: torch.Tensor, d: int, confidence_levels=None, *,
                            predictive="linearized", n_samples: int = 1000, noise_var=0.0, random_state=None,
                            batch_size: int | None = None):
        """``(mean, std, bounds)`` of y at d: ŷ and σ̂ = sqrt(σ_f² + σ²) as the Gaussian's; with a noise variance σ²
        the bounds are the quantiles of f + s t_ν (:meth:`quantile_interval`, s² = :meth:`scale_squared` of σ², per
        output), without one the Gaussian intervals of f."""
        noise = np.asarray(noise_var, dtype=np.float64)
        if confidence_levels is None or not np.any(noise > 0):
            return super().predictive_interval(posterior, X, d, confidence_levels, predictive=predictive,
                                               n_samples=n_samples, noise_var=noise_var, random_state=random_state,
                                               batch_size=batch_size)
        mean, sd_f = regression_moments(posterior, X, d, predictive=predictive, n_samples=n_samples,
                                        random_state=random_state, batch_size=batch_size)
        scale = np.sqrt(self.scale_squared(np.broadcast_to(noise, mean.shape[-1:])))
        bounds = torch.as_tensor(self.quantile_interval(mean, sd_f, scale, confidence_levels), dtype=mean.dtype,
                                 device=mean.device)
        var = sd_f**2 + torch.as_tensor(noise, dtype=mean.dtype, device=mean.device)
        return mean, var.sqrt(), bounds

    def quantile_interval(self, mean, epistemic_std, scale, confidence_levels) -> np.ndarray:
        """Central intervals of y = f + s · t_ν with f ~ N(ŷ, σ_f²), per row, target and level.

        The half-width h solves P(``|y − ŷ|`` ≤ h) = level by bisection, with P(``|y − ŷ|`` ≤ h) =
        E_z[F_ν((h − σ_f z)/s) − F_ν((−h − σ_f z)/s)], z ~ N(0, 1), where σ_f ≤ s, and
        E_t[Φ((h − s t)/σ_f) − Φ((−h − s t)/σ_f)], t ~ t_ν, where σ_f > s, each by the trapezoid rule on a fine uniform
        grid. σ_f = 0 gives ŷ ± s t_ν quantiles.

        Parameters
        ----------
        mean, epistemic_std : array-like of shape (n, M)
            ŷ and σ_f.
        scale : float or array-like of shape (M,)
            s, the noise scale per target.
        confidence_levels : float or sequence of float

        Returns
        -------
        ndarray of shape (n, M, 2, k), float64
        """
        mu = np.asarray(torch.as_tensor(mean).detach().cpu(), dtype=np.float64)
        sf = np.asarray(torch.as_tensor(epistemic_std).detach().cpu(), dtype=np.float64)
        s = np.broadcast_to(np.asarray(scale, dtype=np.float64), mu.shape)
        levels = np.atleast_1d(np.asarray(confidence_levels, dtype=np.float64))
        if np.any(s <= 0) or np.any(sf < 0) or np.any((levels <= 0) | (levels >= 1)):
            raise ValueError("StudentT.quantile_interval needs scale > 0, epistemic_std >= 0 and levels in (0, 1).")
        out = np.empty(mu.shape + (2, len(levels)))
        z = _Z_NODES
        t, t_weights = _t_nodes(self.df)
        over_t = sf > s  # integrate over t where the epistemic part is the wider one
        s_z, sf_z = s[~over_t][:, None], sf[~over_t][:, None]
        s_t, sf_t = s[over_t][:, None], sf[over_t][:, None]

        def inside(h: np.ndarray) -> np.ndarray:
            p = np.empty(h.shape)
            hz, ht = h[~over_t][:, None], h[over_t][:, None]
            p[~over_t] = (stats.t.cdf((hz - sf_z * z) / s_z, self.df)
                          - stats.t.cdf((-hz - sf_z * z) / s_z, self.df)) @ _Z_WEIGHTS
            p[over_t] = (stats.norm.cdf((ht - s_t * t) / sf_t) - stats.norm.cdf((-ht - s_t * t) / sf_t)) @ t_weights
            return p

        for k, level in enumerate(levels):
            tail = (1 - level) / 4  # P(|f − ŷ| > a) + P(|s t| > b) ≤ 1 − level at these a, b: an upper bracket
            lo = np.zeros(mu.shape)
            hi = s * stats.t.ppf(1 - tail, self.df) + sf * stats.norm.ppf(1 - tail)
            for _ in range(64):
                h = 0.5 * (lo + hi)
                below = inside(h) < level
                lo, hi = np.where(below, h, lo), np.where(below, hi, h)
            half = 0.5 * (lo + hi)
            out[..., 0, k], out[..., 1, k] = mu - half, mu + half
        return out

    # ------------------------------------------------------------ fitting ν
    @classmethod
    def from_residuals(cls, residuals) -> StudentT:
        """A StudentT with ν fitted by maximum likelihood to residuals (location 0, the scale fitted with it).

        Parameters
        ----------
        residuals : array-like
            y − f(x) of a fitted model, any shape (pooled).

        Returns
        -------
        StudentT
        """
        r = np.asarray(torch.as_tensor(residuals).detach().cpu(), dtype=np.float64).reshape(-1)
        if r.size < 3 or not np.all(np.isfinite(r)):
            raise ValueError("StudentT.from_residuals needs at least 3 finite residuals.")
        df, _, _ = stats.t.fit(r, floc=0.0)
        return cls(df=float(df))
