"""Likelihoods p(y | f) of a network's output: the training loss, the output Hessian H_n of the GGN and β.

:class:`Gaussian` (homoscedastic regression, the ½-squared loss), :class:`HeteroscedasticGaussian` (a mean and a
variance per target), :class:`FittedNoiseGaussian` (the Gaussian's network and a noise model σ²(x) fitted after
it, :func:`fit_noise_model`), :class:`StudentT` (heavy-tailed noise) and :class:`Categorical` (softmax
cross-entropy) are built in; a subclass of
:class:`Likelihood` plugs in anywhere a likelihood is taken (:class:`~glas_sklearn.ggn.GGNOperator`,
:func:`~glas_sklearn.laplace.fit_laplace_subspace`, the regressor's ``likelihood=``).
:func:`resolve_likelihood` is the one place where their names become objects.
"""

from __future__ import annotations

from ._base import Likelihood, match_regression
from .categorical import Categorical
from .fitted_noise import FittedNoiseGaussian
from .gaussian import Gaussian
from .heteroscedastic import HeteroscedasticGaussian, NaturalParameterHead
from .noise_model import BoostedNoiseModel, fit_noise_model, noise_support
from .student_t import StudentT

__all__ = ["REGRESSION_LIKELIHOODS", "BoostedNoiseModel", "Categorical", "FittedNoiseGaussian", "Gaussian",
           "HeteroscedasticGaussian", "Likelihood", "NaturalParameterHead", "StudentT", "fit_noise_model",
           "match_regression", "noise_support", "resolve_likelihood"]

# Names → classes. "mse" and "cross_entropy" are the loss names GGNOperator(loss=...) has always taken.
_NAMES = {"gaussian": Gaussian, "mse": Gaussian, "categorical": Categorical, "cross_entropy": Categorical,
          "heteroscedastic": HeteroscedasticGaussian, "student_t": StudentT}
#: The names of the built-in regression likelihoods (the regressor's ``likelihood=``), from the registry.
REGRESSION_LIKELIHOODS = ("gaussian", "heteroscedastic", "student_t")


def resolve_likelihood(likelihood: str | Likelihood, name: str = "likelihood") -> Likelihood:
    """A :class:`Likelihood` from a name ("gaussian" or "mse"; "categorical" or "cross_entropy") or an instance,
    which is returned as it is.

    Parameters
    ----------
    likelihood : str or Likelihood
    name : str, default="likelihood"
        The argument's name in the error message.

    Returns
    -------
    Likelihood

    Examples
    --------
    >>> resolve_likelihood("mse")
    Gaussian()
    >>> resolve_likelihood(Categorical())
    Categorical()
    """
    if isinstance(likelihood, Likelihood):
        return likelihood
    if isinstance(likelihood, str) and likelihood in _NAMES:
        return _NAMES[likelihood]()
    if isinstance(likelihood, type) and issubclass(likelihood, Likelihood):
        raise TypeError(f"{name} must be a Likelihood instance, got the class {likelihood.__name__}; "
                        f"pass {likelihood.__name__}() instead.")
    raise ValueError(f"{name} must be one of {', '.join(map(repr, _NAMES))} or a "
                     f"glas_sklearn.likelihoods.Likelihood instance, got {likelihood!r}.")
