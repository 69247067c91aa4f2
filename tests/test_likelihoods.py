"""The likelihood objects against independent references: output Hessians against autograd Hessians of the
per-record loss, losses against closed forms, β per scaling; the GGN, fit_laplace_subspace and the estimators
driven by likelihood instances (built in and user-defined) against dense matrices and the string spellings."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from sklearn.base import clone
from torch.func import hessian

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import CalibrationWarning
from glas_sklearn.ggn import GGNOperator
from glas_sklearn.laplace import fit_laplace_subspace
from glas_sklearn.likelihoods import Categorical, Gaussian, Likelihood, resolve_likelihood
from tests.reference import grouped

from .reference import dense_jacobian, mlp
from .stubs import AbsoluteResidual

EPS64 = torch.finfo(torch.float64).eps


def _tol(n_terms: int) -> float:
    """Relative tolerance of float64 results that accumulate ``n_terms`` rounded products."""
    return 50 * n_terms * EPS64


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def _randn(*shape, seed):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


class Poisson(Likelihood):
    """A user-defined likelihood: y ~ Poisson(exp(f)), loss exp(f) − y f (up to log y!), H = diag(exp(f)).
    Only the two abstract methods are implemented (the GGN diagonal takes the base class's generic path)."""

    name = "poisson"

    def loss(self, output, target):
        return (torch.exp(output) - target * output).sum(-1).mean()

    def output_hessian_product(self, output, u):
        return torch.exp(output) * u


class PoissonClosedDiagonal(Poisson):
    """The same likelihood with diag(J_nᵀ H_n J_n) = Σ_m exp(f_m) J_mk² in closed form."""

    def output_hessian_diagonal_terms(self, output, jacobian):
        return (torch.exp(output).unsqueeze(-1) * jacobian**2).sum(-2)


class ScaledGaussian(Gaussian):
    """A likelihood with a constructor argument (½ scale ‖f − y‖²), for get_params / set_params / clone."""

    def __init__(self, scale=1.0):
        self.scale = scale

    def loss(self, output, target):
        return self.scale * super().loss(output, target)

    def output_hessian_product(self, output, u):
        return self.scale * u


def _targets(lik: Likelihood, shape, seed):
    """Targets of the likelihood's kind for outputs of ``shape`` (..., M)."""
    g = torch.Generator().manual_seed(seed)
    if lik.is_classification:
        return torch.randint(0, shape[-1], shape[:-1], generator=g)
    if isinstance(lik, Poisson):
        return torch.poisson(torch.full(shape, 2.0, dtype=torch.float64), generator=g)
    return torch.randn(*shape, dtype=torch.float64, generator=g)


def _dense_output_hessians(lik: Likelihood, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """H_n = ∂²/∂f² of each record's loss (the loss of a batch of that one record), (n, M, M), by autograd."""
    return torch.stack([hessian(lambda fn, yn=yn: lik.loss(fn[None], yn[None]))(fn) for fn, yn in zip(f, y,
                                                                                                       strict=True)])


LIKELIHOODS = [Gaussian(), Categorical(), Poisson()]


# ----------------------------------------------------------------------- per-record algebra


@pytest.mark.parametrize("lik", LIKELIHOODS, ids=lambda lik: lik.name)
@pytest.mark.parametrize("lead", [(7,), (2, 3)])
def test_output_hessian_product_matches_autograd_hessian_of_the_record_loss(lik, lead):
    M = 4
    f, u = _randn(*lead, M, seed=1), _randn(*lead, M, seed=2)
    y = _targets(lik, (*lead, M), seed=3)
    H = _dense_output_hessians(lik, f.reshape(-1, M), y.reshape(-1, *y.shape[len(lead):]))
    expected = torch.einsum("nij,nj->ni", H, u.reshape(-1, M)).reshape(u.shape)
    got = lik.output_hessian_product(f, u)
    assert got.shape == u.shape
    assert _rel(got, expected) < _tol(M)


@pytest.mark.parametrize("lik", LIKELIHOODS, ids=lambda lik: lik.name)
def test_output_hessian_diagonal_terms_match_dense_jt_h_j(lik):
    n, M, D = 5, 3, 6
    f, J = _randn(n, M, seed=4), _randn(n, M, D, seed=5)
    H = _dense_output_hessians(lik, f, _targets(lik, (n, M), seed=6))
    expected = torch.einsum("nmd,nmk,nkd->nd", J, H, J)
    got = lik.output_hessian_diagonal_terms(f, J)
    generic = Likelihood.output_hessian_diagonal_terms(lik, f, J)  # the base class's path through H u
    assert got.shape == (n, D)
    assert _rel(got, expected) < _tol(M * M)
    assert _rel(generic, expected) < _tol(M * M)


def test_losses_match_closed_forms():
    f, y = _randn(6, 2, seed=7), _randn(6, 2, seed=8)
    expected = 0.5 * np.mean(np.sum((f.numpy() - y.numpy()) ** 2, axis=1))
    assert float(Gaussian().loss(f, y)) == pytest.approx(expected, rel=_tol(12))

    logits, labels = _randn(2, 3, 4, seed=9), torch.tensor([[0, 3, 1], [2, 2, 0]])
    z, k = logits.reshape(-1, 4).numpy(), labels.reshape(-1).numpy()
    expected = -np.mean(z[np.arange(6), k] - logsumexp(z, axis=1))
    assert float(Categorical().loss(logits, labels)) == pytest.approx(expected, rel=_tol(24))
    assert float(Categorical().loss(logits[0], labels[0])) == pytest.approx(-np.mean(
        z[np.arange(3), k[:3]] - logsumexp(z[:3], axis=1)), rel=_tol(12))


@pytest.mark.parametrize("scaling,factor", [("mean", 1.0), ("standard", 40.0)])
def test_beta_per_scaling(scaling, factor):
    assert Gaussian().beta(scaling, 40, noise_var=0.25) == factor / 0.25
    assert Categorical().beta(scaling, 40) == factor
    assert Categorical().beta(scaling, 40, noise_var=0.25) == factor  # σ² plays no part in classification
    assert Poisson().beta(scaling, 40) == factor  # the base class's default: the record factor


def test_beta_float_scaling_and_errors():
    assert Gaussian().beta(3.5, 10) == 3.5 and Categorical().beta(3.5, 10, noise_var=2.0) == 3.5
    assert Gaussian.needs_noise_variance and not Categorical.needs_noise_variance
    with pytest.raises(ValueError, match="noise_var"):
        Gaussian().beta("mean", 10)
    with pytest.raises(ValueError, match="scaling must be 'mean', 'standard' or a positive float"):
        Categorical().beta("bayes", 10)
    with pytest.raises(ValueError, match="n_records"):
        Categorical().beta("mean", 0)


def test_resolve_likelihood_names_and_instances():
    for name, cls in [("gaussian", Gaussian), ("mse", Gaussian), ("categorical", Categorical),
                      ("cross_entropy", Categorical)]:
        assert type(resolve_likelihood(name)) is cls
    lik = Poisson()
    assert resolve_likelihood(lik) is lik
    with pytest.raises(ValueError, match="loss must be one of 'gaussian', 'mse'.*got 'hinge'"):
        resolve_likelihood("hinge", "loss")
    with pytest.raises(TypeError, match=r"pass Gaussian\(\) instead"):
        resolve_likelihood(Gaussian)
    assert Gaussian().n_outputs(3) == 3 and Categorical().n_outputs(5) == 5
    out = _randn(2, 3, seed=10)
    assert Gaussian().mean_output(out) is out


def test_default_conformity_scores_are_the_calibration_defaults_of_their_task():
    from glas_sklearn.calibration.conformal import resolve_conformity_score
    from glas_sklearn.conformity_scores import LAC, StdNormalizedResidual

    assert type(Gaussian().default_conformity_score()) is StdNormalizedResidual
    assert type(Categorical().default_conformity_score()) is LAC
    for lik in [Gaussian(), Categorical()]:
        assert type(lik.default_conformity_score()) is type(resolve_conformity_score(None, lik))
    with pytest.raises(NotImplementedError, match="Poisson names no default conformity score"):
        Poisson().default_conformity_score()


def test_likelihood_parameters_repr_and_equality():
    lik = ScaledGaussian(scale=2.0)
    assert lik.get_params() == {"scale": 2.0}
    assert repr(lik) == "ScaledGaussian(scale=2.0)" and repr(Categorical()) == "Categorical()"
    assert lik.set_params(scale=3.0) is lik and lik.scale == 3.0
    assert lik == ScaledGaussian(scale=3.0) and lik != ScaledGaussian() and Gaussian() != Categorical()
    with pytest.raises(ValueError, match="Invalid parameter 'sigma' for ScaledGaussian"):
        lik.set_params(sigma=1.0)


# ------------------------------------------------------------------------------ the GGN


def _dense_ggn(lik: Likelihood, model, X: torch.Tensor) -> torch.Tensor:
    """(1/N) Σ_n J_nᵀ H_n J_n with J from torch.func.jacrev and H_n the autograd Hessian of the record loss."""
    with torch.no_grad():
        f = model(X)
    J = dense_jacobian(model, X)  # (n, M, D)
    H = _dense_output_hessians(lik, f, _targets(lik, tuple(f.shape), seed=11))
    return torch.einsum("nmd,nmk,nke->de", J, H, J) / X.shape[0]


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("name,lik,n_out", [("mse", Gaussian(), 2), ("cross_entropy", Categorical(), 3)])
def test_ggn_with_a_likelihood_instance_equals_the_string_and_the_dense_ggn(name, lik, n_out, reuse):
    net, X = mlp(n_out=n_out), _randn(17, 3, seed=12)
    G = _dense_ggn(lik, net, X)
    by_name = GGNOperator(net, X, loss=name, reuse_linearization=reuse)
    by_object = GGNOperator(net, X, loss=lik, reuse_linearization=reuse)
    assert by_object.likelihood is lik and type(by_name.likelihood) is type(lik)
    V = _randn(G.shape[0], 3, seed=13)
    tol = _tol(X.shape[0] * n_out * G.shape[0])
    for op in (by_name, by_object):
        assert _rel(op @ V, G @ V) < tol  # a vectorised block
        assert _rel(op.matvec(V[:, 0]), G @ V[:, 0]) < tol  # one product
        assert _rel(op.diagonal(), G.diagonal()) < tol
    assert torch.equal(by_name @ V, by_object @ V)
    assert torch.equal(by_name.diagonal(), by_object.diagonal())


@pytest.mark.parametrize("reuse", [True, False])
def test_user_defined_likelihood_through_the_ggn(reuse):
    lik = Poisson()
    net, X = mlp(n_out=2), _randn(15, 3, seed=14)
    G = _dense_ggn(lik, net, X)
    op = GGNOperator(net, X, loss=lik, batch_size=6, reuse_linearization=reuse)
    V = _randn(G.shape[0], 4, seed=15)
    tol = _tol(X.shape[0] * 2 * G.shape[0])
    assert _rel(op @ V, G @ V) < tol
    assert _rel(op.matvec(V[:, 1]), G @ V[:, 1]) < tol
    assert _rel(op.diagonal(), G.diagonal()) < tol
    assert "Poisson()" in repr(op)


def test_user_defined_likelihood_through_fit_laplace_subspace():
    lik = Poisson()
    net, X = mlp(n_out=2), _randn(15, 3, seed=16)
    G = _dense_ggn(lik, net, X)
    top = torch.linalg.eigvalsh(G).flip(0)[:4]
    fit = fit_laplace_subspace(net, X, loss=lik, n_components=4, scaling="standard", tol=1e-10, random_state=0)
    assert fit.beta == 15.0 and fit.noise_var is None  # β = N; no noise variance asked of a Poisson likelihood
    assert fit.n_records == 15
    np.testing.assert_allclose(fit.eigen.eigenvalues.numpy(), top.numpy(), rtol=1e-8, atol=1e-10 * float(top[0]))
    # the low-rank + diagonal posterior takes G's diagonal through the base class's generic path; the same
    # likelihood with a closed-form diagonal gives the same predictive variances
    generic = fit_laplace_subspace(net, X, loss=lik, n_components=4, posterior="low_rank_diag", random_state=0)
    closed = fit_laplace_subspace(net, X, loss=PoissonClosedDiagonal(), n_components=4, posterior="low_rank_diag",
                                  random_state=0)
    assert generic.beta == 1.0
    var_generic = generic.posterior.linearized_variance(X, 4)
    var_closed = closed.posterior.linearized_variance(X, 4)
    assert torch.all(var_generic > 0)
    assert _rel(var_generic, var_closed) < _tol(15 * 2 * G.shape[0])


# ---------------------------------------------------------------------------- estimators

SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=30, lr=0.05, batch_size=None,
             n_samples=50, max_components=3, dtype="float64", random_state=0)


def _data(n=50, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    return X, 3.0 * np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.standard_normal(n)


@pytest.mark.parametrize("paper", [True, False], ids=["paper", "default"])
def test_regressor_likelihood_string_and_object_give_identical_fits(paper):
    X, y = _data()
    settings = dict(calibration="coverage", posterior="subspace") if paper else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        by_name = LaplaceActiveSubspaceRegressor(**grouped(likelihood="gaussian", **SMALL, **settings)).fit(X, y)
        by_object = LaplaceActiveSubspaceRegressor(**grouped(likelihood=Gaussian(), **SMALL, **settings)).fit(X, y)
    assert type(by_name.likelihood_) is Gaussian and by_object.likelihood_ == by_object.likelihood  # a copy
    assert by_name.training_loss_ == by_object.training_loss_
    assert by_name.beta_ == by_object.beta_ and by_name.n_components_ == by_object.n_components_
    np.testing.assert_array_equal(by_name.eigenvalues_, by_object.eigenvalues_)
    for a, b in zip(by_name.predict_interval(X[:7]), by_object.predict_interval(X[:7]), strict=True):
        np.testing.assert_array_equal(a, b)
    # the loss trained on is the Gaussian's: ½ squared error of the standardised targets
    assert by_name.training_loss_[0] > by_name.training_loss_[-1] > 0


def test_classifier_holds_the_categorical_likelihood():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 2))
    y = (X[:, 0] > 0).astype(int)
    clf = LaplaceActiveSubspaceClassifier(**grouped(**SMALL)).fit(X, y)
    assert type(clf.likelihood_) is Categorical
    # β of the default "mean" scaling is 1 for a categorical likelihood
    assert clf.beta_ == 1.0


def test_regressor_refuses_classification_and_unknown_likelihoods():
    X, y = _data(n=20)
    with pytest.raises(ValueError, match="use LaplaceActiveSubspaceClassifier"):
        LaplaceActiveSubspaceRegressor(**grouped(likelihood=Categorical(), **SMALL)).fit(X, y)
    with pytest.raises(ValueError, match="likelihood"):
        LaplaceActiveSubspaceRegressor(**grouped(likelihood="poisson", **SMALL)).fit(X, y)
    # a user's regression likelihood the regressor's predictive does not know is refused, not fitted as Gaussian
    with pytest.raises(ValueError, match=r"likelihood Poisson\(\) is not supported"):
        LaplaceActiveSubspaceRegressor(**grouped(likelihood=Poisson(), **SMALL)).fit(X, np.abs(y))


def test_clone_and_get_params_with_a_likelihood_instance():
    lik = ScaledGaussian(scale=2.0)
    reg = LaplaceActiveSubspaceRegressor(likelihood=lik)
    params = reg.get_params(deep=True)
    assert params["likelihood"] is lik and params["likelihood__scale"] == 2.0
    copy = clone(reg)
    assert copy.likelihood == lik and copy.likelihood is not lik  # a fresh, equal likelihood
    reg.set_params(likelihood__scale=5.0)
    assert lik.scale == 5.0 and copy.likelihood.scale == 2.0
    assert "likelihood=ScaledGaussian(scale=5.0)" in repr(reg)


@pytest.mark.parametrize("cls", [LaplaceActiveSubspaceRegressor, LaplaceActiveSubspaceClassifier])
def test_pickles_keep_the_likelihood_object(cls):
    import pickle

    X, y = _data(n=30)
    if cls is LaplaceActiveSubspaceClassifier:
        y = (y > np.median(y)).astype(int)
    est = cls(**grouped(**SMALL)).fit(X, y)
    loaded = pickle.loads(pickle.dumps(est))
    assert loaded.likelihood_ == est.likelihood_ and repr(loaded.get_params()) == repr(est.get_params())
    np.testing.assert_array_equal(loaded.predict(X[:5]), est.predict(X[:5]))
    table = loaded.coverage_curve(X, y, d_max=2)  # asks the likelihood (classification or not)
    assert list(table["d"]) == [1, 2]


def _t_nll_derivatives(lik, scale: float, n: int = 200_001):
    """E_y[∂²ℓ/∂f²] and E_y[(∂ℓ/∂f)²] of the per-record NLL ℓ(f, y) at f = 0, y ~ s·t_ν, by autograd at the
    quantiles y_i = s F⁻¹((i + ½)/n) (the midpoint rule in probability: error O(1/n²) for these smooth, bounded
    integrands)."""
    from scipy import stats
    from torch.func import grad, vmap

    u = (np.arange(n) + 0.5) / n
    y = torch.as_tensor(scale * stats.t.ppf(u, lik.df), dtype=torch.float64)

    def nll(f, yi):
        return lik.nll_terms(f.reshape(1, 1), yi.reshape(1, 1), scale).sum()

    f0 = torch.zeros((), dtype=torch.float64)
    g = vmap(grad(nll), in_dims=(None, 0))(f0, y)
    h = vmap(grad(grad(nll)), in_dims=(None, 0))(f0, y)
    return float(h.mean()), float((g**2).mean())


@pytest.mark.parametrize("df", [1.0, 4.0, 30.0])
def test_student_t_fisher_output_hessian_matches_the_expected_autograd_hessian(df):
    from glas_sklearn.likelihoods import StudentT

    lik, s = StudentT(df=df), 0.7
    expected_hessian, expected_score_square = _t_nll_derivatives(lik, s)
    # in units of 1/s² (β carries 1/s²); both forms of the Fisher information agree
    H = lik.output_hessian_product(_randn(1, 1, seed=0), torch.ones(1, 1, dtype=torch.float64)).item()
    assert H * s**-2 == pytest.approx(expected_hessian, rel=1e-4)
    assert H * s**-2 == pytest.approx(expected_score_square, rel=1e-4)
    f, J = _randn(5, 3, seed=1), _randn(5, 3, 6, seed=2)
    generic = Likelihood.output_hessian_diagonal_terms(lik, f, J)
    assert _rel(lik.output_hessian_diagonal_terms(f, J), generic) < _tol(3)
    assert _rel(generic, H * (J**2).sum(-2)) < _tol(3)


def test_student_t_ggn_matches_the_dense_fisher_ggn():
    from glas_sklearn.likelihoods import StudentT

    lik = StudentT(df=3.0)
    net, X = mlp(n_out=2), _randn(13, 3, seed=20)
    J = dense_jacobian(net, X)
    G = (lik.df + 1) / (lik.df + 3) * torch.einsum("nmd,nme->de", J, J) / X.shape[0]
    op = GGNOperator(net, X, loss=lik, batch_size=5)
    V = _randn(G.shape[0], 3, seed=21)
    tol = _tol(X.shape[0] * 2 * G.shape[0])
    assert _rel(op @ V, G @ V) < tol and _rel(op.diagonal(), G.diagonal()) < tol
    assert type(resolve_likelihood("student_t")) is StudentT


def test_student_t_loss_beta_and_checks():
    from scipy import stats

    from glas_sklearn.likelihoods import StudentT

    lik = StudentT(df=4.0)
    f, y = _randn(9, 2, seed=22), _randn(9, 2, seed=23)
    r = (y - f).numpy()
    s = np.median(np.abs(r)) / stats.t.ppf(0.75, 4.0)
    expected = np.mean(np.sum(s**2 * 2.5 * np.log1p(r**2 / (4 * s**2)), axis=1))
    assert float(lik.loss(f, y)) == pytest.approx(expected, rel=_tol(18))
    # the loss is s² times the NLL (up to its constant) at the batch's scale: the NLL's gradient times s²
    nll = lambda out: lik.nll_terms(out, y, float(s)).sum(-1).mean()  # noqa: E731
    g_loss = torch.func.grad(lambda out: lik.loss(out, y))(f)
    assert _rel(g_loss, s**2 * torch.func.grad(nll)(f)) < 1e3 * EPS64
    # outliers barely move the loss's gradient; under the squared loss they dominate it
    y_out = y.clone()
    y_out[0, 0] += 1e3
    assert torch.func.grad(lambda out: lik.loss(out, y_out))(f)[0, 0].abs() < 1.0
    # β = factor / s², s² = σ² (ν − 2)/ν
    assert lik.beta("standard", 10, noise_var=3.0) == pytest.approx(10 / (3.0 * 2 / 4))
    assert StudentT(df=1.5).beta("mean", 10, noise_var=3.0) == pytest.approx(1 / 3.0)
    with pytest.raises(ValueError, match="noise_var"):
        lik.beta("mean", 10)
    for bad in (0.0, -1.0, float("inf"), "4", True):
        with pytest.raises(ValueError, match="df must be a finite number > 0"):
            StudentT(df=bad)
    assert repr(lik) == "StudentT(df=4.0)" and lik != Gaussian() and lik == StudentT(4.0)


def test_student_t_quantile_interval_against_closed_forms_and_simulation():
    from scipy import stats

    from glas_sklearn.likelihoods import StudentT

    lik = StudentT(df=3.0)
    mean, levels = np.array([[1.0, -2.0], [0.5, 0.0]]), [0.5, 0.9]
    # σ_f = 0: ŷ ± s t_ν quantile, exactly
    b = lik.quantile_interval(mean, np.zeros((2, 2)), [0.4, 2.0], levels)
    half = np.array([0.4, 2.0])[:, None] * stats.t.ppf(0.5 + np.array(levels) / 2, 3.0)  # (M, k)
    np.testing.assert_allclose(b[:, :, 1, :] - mean[..., None], np.broadcast_to(half, (2, 2, 2)), rtol=1e-10)
    np.testing.assert_allclose(b[:, :, 0, :] + b[:, :, 1, :], 2 * np.repeat(mean[..., None], 2, -1), atol=1e-12)
    # large ν: the Gaussian of variance σ_f² + s²
    sf = np.array([[0.3, 1.0], [2.0, 0.1]])
    g = StudentT(df=1e7).quantile_interval(mean, sf, 0.5, levels)
    z = stats.norm.ppf(0.5 + np.array(levels) / 2)
    np.testing.assert_allclose(g[:, :, 1, :] - mean[..., None], np.sqrt(sf**2 + 0.25)[..., None] * z, rtol=1e-6)
    # the general case against 2·10⁶ draws of f + s t_ν: coverage within 5 standard errors
    got = lik.quantile_interval(mean, sf, 0.5, levels)
    rng = np.random.default_rng(0)
    n = 2_000_000
    for i, j in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        draws = mean[i, j] + sf[i, j] * rng.standard_normal(n) + 0.5 * rng.standard_t(3.0, n)
        for k, level in enumerate(levels):
            cov = np.mean((draws >= got[i, j, 0, k]) & (draws <= got[i, j, 1, k]))
            assert abs(cov - level) < 5 * np.sqrt(level * (1 - level) / n)


def test_student_t_df_fitted_to_residuals():
    from glas_sklearn.likelihoods import StudentT

    r = 0.3 * np.random.default_rng(1).standard_t(3.0, 20_000)
    assert StudentT.from_residuals(r).df == pytest.approx(3.0, rel=0.1)
    with pytest.raises(ValueError, match="at least 3 finite residuals"):
        StudentT.from_residuals([0.1, np.nan, 0.2])


def test_regressor_takes_the_student_t_likelihood():
    """Added without an edit in estimators/: the regressor fits it as a location model (ŷ = f, β = 1/s²), its GGN
    scaled by (ν + 1)/(ν + 3), and the default conformal intervals are split conformal on its predictive."""
    from glas_sklearn.likelihoods import StudentT

    X, y = _data(n=60)
    est = LaplaceActiveSubspaceRegressor(**grouped(likelihood=StudentT(df=3.0), **SMALL)).fit(X, y)
    assert type(est.likelihood_) is StudentT and est.likelihood_ == StudentT(df=3.0)
    noise_var = (est.noise_std_ / est.y_scale_[0]) ** 2  # the mean squared residual, internal units
    assert est.beta_ == pytest.approx(1 / (noise_var * (3.0 - 2) / 3.0), rel=1e-10)
    _, pis = est.predict_interval(X[:5])
    assert pis.shape == (5, 2, 1) and np.all(pis[:, 1] > pis[:, 0])


def test_student_t_intervals_of_y_under_coverage_calibration_are_its_quantiles():
    """calibration="coverage" with include_noise=True judges and predicts the likelihood's own intervals of y: the
    quantiles of f + s t_ν with f ~ N(f(x; θ0), σ_f²) (linearised) and s² = σ² (ν − 2)/ν, by hand from the network,
    the posterior's J Σ Jᵀ and quantile_interval; the table's coverage is theirs on the calibration rows."""
    from glas_sklearn.likelihoods import StudentT

    lik = StudentT(df=3.0)
    X, y = _data(n=60)
    X_cal, y_cal = _data(n=30, seed=5)
    est = LaplaceActiveSubspaceRegressor(**grouped(likelihood=lik, calibration="coverage", include_noise=True,
                                                   n_components=2, predictive="linearized", standardize=False, **SMALL))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        est.fit(X, y, X_cal=X_cal, y_cal=y_cal)

    def by_hand(A):
        At = torch.as_tensor(A)
        with torch.no_grad():
            mean = est.module_(At)[:, :1].numpy()
        sd_f = est.posterior_.linearized_variance(At, 2)[:, :1].sqrt().numpy()
        s = np.sqrt(est.noise_std_**2 * (3.0 - 2.0) / 3.0)
        return mean[:, 0], lik.quantile_interval(mean, sd_f, s, 0.9)[:, 0]

    mean, expected = by_hand(X_cal[:8])
    y_pred, pis = est.predict_interval(X_cal[:8])
    np.testing.assert_allclose(y_pred, mean, rtol=1e-12)
    np.testing.assert_allclose(pis, expected, rtol=1e-9)
    _, b = by_hand(X_cal)
    inside = (y_cal >= b[:, 0, 0]) & (y_cal <= b[:, 1, 0])
    assert est.calibration_["coverage"].iloc[0] == pytest.approx(inside.mean(), abs=1e-12)


# ------------------------------------------------------- a likelihood and a score plugged in from outside


def test_a_likelihood_and_a_score_from_outside_the_package_plug_into_the_regressor():
    """A user's regression likelihood (½-squared loss, β = 1 / N without σ²) naming its own conformity score |y − ŷ|
    fits, calibrates and predicts through the regressor with no edit in the package: its intervals are ŷ ± q with q
    the ⌈(n + 1) 0.9⌉-th smallest |y − ŷ| of the calibration rows, computed here by hand."""
    import math

    class HalfSquared(Likelihood):
        name = "half_squared"

        def loss(self, output, target):
            return 0.5 * ((output - target) ** 2).sum(-1).mean()

        def output_hessian_product(self, output, u):
            return u

        def default_conformity_score(self):
            return AbsoluteResidual()

    X, y = _data(n=60)
    reg = LaplaceActiveSubspaceRegressor(**grouped(likelihood=HalfSquared(), calibration="conformal",
                                                   **SMALL)).fit(X, y)
    assert type(reg.calibrator_.conformity_score_) is AbsoluteResidual and reg.beta_ == 1.0
    cal = reg.calibration_indices_
    residuals = np.sort(np.abs(y[cal] - reg.predict(X[cal])))
    q = residuals[int(math.ceil((len(cal) + 1) * 0.9 - 1e-9)) - 1]
    y_pred, bounds = reg.predict_interval(X[:5])
    np.testing.assert_allclose(bounds[:, 0, 0], y_pred - q, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(bounds[:, 1, 0], y_pred + q, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("calibration", ["coverage", "conformal"])
def test_student_t_by_name_through_the_regressor(calibration):
    """``likelihood="student_t"`` (by name, through resolve_likelihood) fits and calibrates with either calibrator;
    its coverage-calibrated intervals with ``include_noise=True`` are its own t quantiles
    (StudentT.quantile_interval of ŷ, σ_f and the noise scale), checked against the likelihood called directly."""
    from glas_sklearn.likelihoods import StudentT

    X, y = _data(n=60)
    reg = LaplaceActiveSubspaceRegressor(**grouped(likelihood="student_t", calibration=calibration, include_noise=True,
                                                   **SMALL)).fit(X, y)
    assert type(reg.likelihood_) is StudentT and reg.calibrator_ is not None
    y_pred, bounds = reg.predict_interval(X[:7])
    assert bounds.shape == (7, 2, 1) and np.all(bounds[:, 0, 0] < y_pred) and np.all(y_pred < bounds[:, 1, 0])
    if calibration == "coverage":
        Xt = reg._check_fitted_X(X[:7])
        lik, c = reg.likelihood_, reg.calibrator_
        mean, sd_f = lik.predictive_moments(reg.posterior_, Xt, c.n_components_, predictive=c.predictive_,
                                            n_samples=c.n_samples_, random_state=c.sample_seed_)
        scale = np.sqrt(lik.scale_squared(np.asarray(c.noise_var_)))
        ref = lik.quantile_interval(mean, sd_f, scale, 0.9) * reg.y_scale_[0] + reg.y_mean_[0]
        np.testing.assert_allclose(bounds[:, :, 0], ref[:, 0, :, 0], rtol=1e-8)
