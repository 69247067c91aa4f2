"""sample_weight: frequency weights in the training loss, the GGN (products and diagonal), σ² and β, through
fit_laplace_subspace and both estimators, with metadata routing through Pipeline and GridSearchCV.

The reference for integer weights is the same computation on the rows repeated that many times (zero: dropped),
in float64; tolerances are multiples of float64's machine epsilon (or of the eigen-solver's tolerance).
"""

from __future__ import annotations

import numpy as np
import pytest
import sklearn
import torch
import torch.nn.functional as F
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.ggn import GGNOperator
from glas_sklearn.laplace import fit_laplace_subspace, residual_noise_variance
from glas_sklearn.training import train_module
from tests.reference import grouped

from .reference import TinyLSTM, assert_unchanged, dense_ggn, mlp, snapshot

#: Prefit networks here are often untrained on purpose; the warning saying so is tested in test_messages.py.
pytestmark = pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")

EPS = torch.finfo(torch.float64).eps


def _randn(*shape, seed):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _weights(n, seed, high=4):
    """Integer weights in {0, ..., high − 1}, with at least one zero and one weight above 1."""
    w = torch.randint(0, high, (n,), generator=torch.Generator().manual_seed(seed))
    w[0], w[1] = 0, high - 1
    return w


def _repeat(w, *tensors):
    return [t.repeat_interleave(w, dim=0) for t in tensors]


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# ------------------------------------------------------------------------------------------------ GGN


@pytest.mark.parametrize("reuse,vectorize", [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("loss,n_out", [("mse", 2), ("cross_entropy", 3)])
def test_integer_weights_equal_repeated_rows_in_the_ggn(loss, n_out, reuse, vectorize):
    net = mlp(n_out=n_out)
    X = _randn(17, 3, seed=1)
    w = _weights(17, seed=2)
    (X_rep,) = _repeat(w, X)
    G = dense_ggn(net, X_rep, loss)  # independent reference: the dense GGN of the repeated rows
    op = GGNOperator(net, X, loss=loss, sample_weight=w, batch_size=5, reuse_linearization=reuse,
                     vectorize_blocks=vectorize)
    assert op.total_weight == float(w.sum()) and op.n_records == int((w > 0).sum())
    V = _randn(op.shape[0], 3, seed=3)
    assert _rel(op @ V, G @ V) < 100 * EPS
    assert _rel(op.matvec(V[:, 0]), G @ V[:, 0]) < 100 * EPS
    assert _rel(op.diagonal(), torch.diagonal(G)) < 100 * EPS


def test_zero_weights_equal_dropping_rows_and_float_weights_scale_free():
    net = mlp(n_out=2)
    X = _randn(12, 3, seed=4)
    w = torch.tensor([0.0, 0.5, 2.25, 0.0, 1.0, 3.0, 0.75, 1.5, 0.0, 2.0, 1.25, 0.5], dtype=torch.float64)
    keep = w > 0
    dropped = GGNOperator(net, X[keep], sample_weight=w[keep])
    weighted = GGNOperator(net, X, sample_weight=w)
    scaled = GGNOperator(net, X, sample_weight=10 * w)  # G is a weighted mean: the weights' scale cancels
    ones = GGNOperator(net, X[keep])
    V = _randn(weighted.shape[0], 2, seed=5)
    assert weighted.n_records == dropped.n_records == 9
    assert _rel(weighted @ V, dropped @ V) < 100 * EPS
    assert _rel(scaled @ V, weighted @ V) < 100 * EPS
    assert scaled.total_weight == pytest.approx(10 * weighted.total_weight, rel=10 * EPS)
    # the dense weighted mean by hand, and unequal weights really change G
    W = dense_ggn(net, X[keep], "mse", mask=w[keep])
    assert _rel(weighted @ V, W @ V) < 100 * EPS
    assert _rel(ones @ V, W @ V) > 1e-3


@pytest.mark.parametrize("trim", [False, True])
def test_row_weights_on_masked_sequences_equal_repeated_sequences(trim):
    torch.manual_seed(0)
    net = TinyLSTM().double()
    tokens = torch.randint(0, 6, (7, 5), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(7, 5, dtype=torch.bool)
    mask[2, 3:] = False
    mask[5, 1:] = False
    w = _weights(7, seed=7)
    tok_rep, mask_rep = _repeat(w, tokens, mask)
    G = dense_ggn(net, tok_rep, "cross_entropy", mask_rep)
    op = GGNOperator(net, tokens, loss="cross_entropy", mask=mask, sample_weight=w, batch_size=3, trim_padding=trim)
    assert op.total_weight == float((w[:, None] * mask).sum())
    V = _randn(op.shape[0], 2, seed=8)
    assert _rel(op @ V, G @ V) < 100 * EPS
    assert _rel(op.diagonal(), torch.diagonal(G)) < 100 * EPS


def test_subsample_carries_the_weights_of_its_rows():
    net = mlp(n_out=1)
    X = _randn(30, 3, seed=9)
    w = _weights(30, seed=10).double() + 0.5
    op = GGNOperator(net, X, sample_weight=w, subsample=12, random_state=0)
    idx = torch.as_tensor(op.indices_)
    ref = GGNOperator(net, X[idx], sample_weight=w[idx])
    v = _randn(op.shape[0], seed=11)
    assert torch.equal(op @ v, ref @ v)
    assert op.total_weight == ref.total_weight


@pytest.mark.parametrize("bad,match", [
    (torch.ones(5), r"shape \(5,\).*one weight per row, shape \(6,\)"),
    (torch.ones(6, 1), r"shape \(6, 1\)"),
    (torch.tensor([1.0, -1, 1, 1, 1, 1]), "1 negative value"),
    (torch.tensor([1.0, float("nan"), 1, 1, 1, 1]), "NaN or infinite"),
    (torch.tensor([1.0, float("inf"), 1, 1, 1, 1]), "NaN or infinite"),
    (torch.zeros(6), "zero for every row"),
])
def test_bad_weights_raise_clear_errors(bad, match):
    net = mlp()
    X = _randn(6, 3, seed=12)
    with pytest.raises(ValueError, match=match):
        GGNOperator(net, X, sample_weight=bad)
    with pytest.raises(ValueError, match=match):
        residual_noise_variance(net, X, _randn(6, 1, seed=13), sample_weight=bad)
    mask = torch.zeros(6, 2, dtype=torch.bool)
    mask[0] = True
    with pytest.raises(ValueError, match="zero at every unmasked record"):
        GGNOperator(TinyLSTM().double(), torch.zeros(6, 2, dtype=torch.long), loss="cross_entropy", mask=mask,
                    sample_weight=torch.tensor([0.0, 1, 1, 1, 1, 1]))


# ------------------------------------------------------------------------------ posterior and σ²


@pytest.mark.parametrize("scaling", ["mean", "standard"])
@pytest.mark.parametrize("posterior", ["subspace", "low_rank_diag"])
def test_fit_laplace_subspace_with_integer_weights_equals_repeated_rows(scaling, posterior):
    net = mlp(n_out=1)
    X = _randn(25, 3, seed=14)
    y = torch.sin(X[:, :1]) + 0.1 * _randn(25, 1, seed=15)
    w = _weights(25, seed=16)
    X_rep, y_rep = _repeat(w, X, y)
    before = snapshot(net)
    kw = dict(n_components=4, scaling=scaling, tol=1e-12, random_state=0, posterior=posterior)
    weighted = fit_laplace_subspace(net, X, y, sample_weight=w, **kw)
    repeated = fit_laplace_subspace(net, X_rep, y_rep, **kw)
    assert_unchanged(net, before)
    # σ² is the weighted mean squared residual, β follows it (and N = Σ w for "standard")
    residuals = (y - net(X).detach()).squeeze(1)
    sigma2 = float((w * residuals**2).sum() / w.sum())
    assert weighted.noise_var == pytest.approx(sigma2, rel=100 * EPS)
    assert weighted.noise_var == pytest.approx(repeated.noise_var, rel=100 * EPS)
    assert weighted.beta == pytest.approx(repeated.beta, rel=100 * EPS)
    assert weighted.total_weight == repeated.n_records == int(w.sum())
    lam_w, lam_r = weighted.eigen.eigenvalues, repeated.eigen.eigenvalues
    assert torch.allclose(lam_w, lam_r, rtol=1e-9, atol=0)
    # the posterior itself: predictive variances of the linearised network at every d
    X_test = _randn(6, 3, seed=17)
    for d in (1, 4):
        var_w = weighted.posterior.linearized_variance(X_test, d)
        var_r = repeated.posterior.linearized_variance(X_test, d)
        assert torch.allclose(var_w, var_r, rtol=1e-7, atol=0)


def test_per_output_noise_variance_is_weighted_per_column():
    net = mlp(n_out=2)
    X = _randn(10, 3, seed=18)
    y = _randn(10, 2, seed=19)
    w = _weights(10, seed=20).double() * 0.7
    r2 = (y - net(X).detach()) ** 2
    expected = (w[:, None] * r2).sum(0) / w.sum()
    got = residual_noise_variance(net, X, y, per_output=True, sample_weight=w)
    np.testing.assert_allclose(got, expected.numpy(), rtol=100 * EPS)
    assert residual_noise_variance(net, X, y, sample_weight=w) == pytest.approx(float(expected.mean()), rel=100 * EPS)


def test_distributed_refuses_weights():
    with pytest.raises(ValueError, match="sample_weight is not available with distributed=True"):
        fit_laplace_subspace(mlp(), _randn(5, 3, seed=0), _randn(5, 1, seed=1), distributed=True,
                             sample_weight=torch.ones(5))


# ---------------------------------------------------------------------------------------- training


def _mse(out, y):
    return 0.5 * ((out - y) ** 2).sum(-1).mean()


def test_full_batch_training_with_integer_weights_equals_repeated_rows():
    X = _randn(20, 3, seed=21)
    y = torch.cos(X[:, :1])
    w = _weights(20, seed=22)
    X_rep, y_rep = _repeat(w, X, y)
    a, b = mlp(seed=3), mlp(seed=3)
    kw = dict(optimizer="adam", lr=0.01, weight_decay=0.0, batch_size=None, max_epochs=30, seed=0)
    loss_w = train_module(a, X, y, _mse, sample_weight=w.double(), **kw).loss_curve
    loss_r = train_module(b, X_rep, y_rep, _mse, **kw).loss_curve
    np.testing.assert_allclose(loss_w, loss_r, rtol=1e-12)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=0, atol=1e-10)


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_minibatch_epoch_loss_is_the_weighted_mean_with_weights_aligned_to_rows(loss):
    """lr=0 leaves the network at its initial weights: each epoch's reported loss must be Σ w ℓ / Σ w of the
    rows, whatever the shuffled mini-batches (weights misaligned with their rows would change it)."""
    X = _randn(23, 3, seed=23)
    if loss == "mse":
        y, fn, net = _randn(23, 2, seed=24), _mse, mlp(n_out=2)
        per_row = 0.5 * ((net(X) - y) ** 2).sum(-1)
    else:
        y, fn, net = torch.randint(0, 3, (23,), generator=torch.Generator().manual_seed(24)), F.cross_entropy, \
            mlp(n_out=3)
        per_row = F.cross_entropy(net(X), y, reduction="none")
    w = torch.linspace(0.0, 3.0, 23, dtype=torch.float64) ** 2
    expected = float((w * per_row.detach()).sum() / w.sum())
    losses = train_module(net, X, y, fn, optimizer="sgd", lr=0.0, weight_decay=0.0, batch_size=4, max_epochs=3,
                          seed=0, sample_weight=w).loss_curve
    np.testing.assert_allclose(losses, expected, rtol=1e3 * EPS)
    unweighted = train_module(net, X, y, fn, optimizer="sgd", lr=0.0, weight_decay=0.0, batch_size=4,
                              max_epochs=1, seed=0).loss_curve
    assert abs(unweighted[0] - expected) > 1e-3


# -------------------------------------------------------------------------------------- estimators


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)
    return X, y


SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=30, lr=0.05, batch_size=None,
             early_stopping=False, n_samples=20, max_components=3, dtype="float64", random_state=0)


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
def test_prefit_estimator_with_integer_weights_equals_repeated_rows(kind):
    X, y = _data(40)
    X_cal, y_cal = _data(20, seed=1)
    if kind == "classifier":
        y, y_cal = (y > 0).astype(int), (y_cal > 0).astype(int)
        Est, net = LaplaceActiveSubspaceClassifier, mlp(n_out=2, seed=1)
    else:
        Est, net = LaplaceActiveSubspaceRegressor, mlp(n_out=1, seed=1)
    w = _weights(40, seed=25).numpy()
    before = snapshot(net)
    kw = dict(module=net, prefit=True, max_components=4, dtype="float64", random_state=0, n_samples=20)
    weighted = Est(**grouped(**kw)).fit(X, y, sample_weight=w, X_cal=X_cal, y_cal=y_cal)
    repeated = Est(**grouped(**kw)).fit(np.repeat(X, w, axis=0), np.repeat(y, w), X_cal=X_cal, y_cal=y_cal)
    assert_unchanged(net, before)  # a prefit module never changes
    assert weighted.n_records_ == int((w > 0).sum()) and repeated.n_records_ == int(w.sum())
    np.testing.assert_allclose(weighted.eigenvalues_, repeated.eigenvalues_, rtol=1e-6)
    assert weighted.beta_ == pytest.approx(repeated.beta_, rel=1e3 * EPS)
    assert weighted.n_components_ == repeated.n_components_
    X_test, _ = _data(8, seed=2)
    if kind == "classifier":
        np.testing.assert_allclose(weighted.predict_proba(X_test), repeated.predict_proba(X_test), rtol=1e-6)
    else:
        assert weighted.noise_std_ == pytest.approx(repeated.noise_std_, rel=1e3 * EPS)
        _, iw = weighted.predict_interval(X_test)
        _, ir = repeated.predict_interval(X_test)
        np.testing.assert_allclose(iw, ir, rtol=1e-6)


@pytest.mark.parametrize("Est", [LaplaceActiveSubspaceRegressor, LaplaceActiveSubspaceClassifier])
def test_zero_weights_equal_dropping_rows_and_ones_equal_none(Est):
    X, y = _data(40)
    if Est is LaplaceActiveSubspaceClassifier:
        y = (y > 0).astype(int)
    w = np.where(np.arange(40) % 5 == 0, 0.0, 1.0 + (np.arange(40) % 3))
    X_test, _ = _data(8, seed=3)
    method = "predict_proba" if Est is LaplaceActiveSubspaceClassifier else "predict"
    weighted = Est(**grouped(**SMALL)).fit(X, y, sample_weight=w)
    dropped = Est(**grouped(**SMALL)).fit(X[w > 0], y[w > 0], sample_weight=w[w > 0])
    unweighted = Est(**grouped(**SMALL)).fit(X[w > 0], y[w > 0])
    np.testing.assert_array_equal(getattr(weighted, method)(X_test), getattr(dropped, method)(X_test))
    kept = np.flatnonzero(w > 0)  # the split's positions are in the user's X; zero-weight rows are in neither
    np.testing.assert_array_equal(weighted.train_indices_, kept[dropped.train_indices_])
    np.testing.assert_array_equal(weighted.calibration_indices_, kept[dropped.calibration_indices_])
    assert not np.allclose(getattr(weighted, method)(X_test), getattr(unweighted, method)(X_test))
    ones = Est(**grouped(**SMALL)).fit(X, y, sample_weight=np.ones(40))
    none = Est(**grouped(**SMALL)).fit(X, y)
    np.testing.assert_array_equal(getattr(ones, method)(X_test), getattr(none, method)(X_test))


def test_weighted_standardisation_and_training_equal_repeated_rows():
    """The estimator's own network, full-batch in float64, on given calibration rows: integer weights give the
    network, σ and intervals of the repeated rows (Adam in float64 round-off)."""
    X, y = _data(30)
    X_cal, y_cal = _data(15, seed=4)
    w = _weights(30, seed=26).numpy()
    weighted = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(X, y, sample_weight=w, X_cal=X_cal, y_cal=y_cal)
    repeated = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(np.repeat(X, w, axis=0), np.repeat(y, w),
                                                           X_cal=X_cal, y_cal=y_cal)
    np.testing.assert_allclose(weighted.x_mean_, repeated.x_mean_, rtol=1e3 * EPS)
    np.testing.assert_allclose(weighted.y_scale_, repeated.y_scale_, rtol=1e3 * EPS)
    np.testing.assert_allclose(weighted.training_loss_, repeated.training_loss_, rtol=1e-9)
    assert weighted.noise_std_ == pytest.approx(repeated.noise_std_, rel=1e-8)
    X_test, _ = _data(8, seed=5)
    np.testing.assert_allclose(weighted.predict_interval(X_test)[1], repeated.predict_interval(X_test)[1],
                               rtol=1e-6)


@pytest.mark.parametrize("bad,match", [
    (np.ones(39), r"sample_weight has shape \(39,\), but X has 40 rows: pass one weight per row"),
    (np.ones((40, 2)), r"sample_weight has shape \(40, 2\)"),
    (-np.ones(40), r"40 negative value\(s\) \(rows \[0, 1, 2, 3, 4\] ...\); weights must be >= 0"),
    (np.r_[np.nan, np.ones(39)], r"1 NaN or infinite value\(s\) \(rows \[0\]\)"),
    (np.r_[np.ones(39), np.inf], r"1 NaN or infinite value\(s\) \(rows \[39\]\)"),
    (np.zeros(40), "zero for every row; at least one row needs a positive weight"),
    (np.r_[np.ones(2), np.zeros(38)], "at least 3 rows of positive sample_weight"),
])
def test_estimator_refuses_bad_weights(bad, match):
    X, y = _data(40)
    with pytest.raises(ValueError, match=match):
        LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(X, y, sample_weight=bad)


@pytest.mark.parametrize("Est", [LaplaceActiveSubspaceRegressor, LaplaceActiveSubspaceClassifier])
def test_weights_of_any_scale_fit_as_their_normalised_version(Est):
    """Uniform weights of 1e39, 1e300 or 1e-50 (beyond float32's range, or below it) fit as no weights, bit for
    bit; unequal weights scaled by 1e300 fit as the unscaled ones (the weights are divided by their mean, in
    float64, once)."""
    X, y = _data(40)
    if Est is LaplaceActiveSubspaceClassifier:
        y = (y > 0).astype(int)
    settings = grouped(**{**SMALL, "dtype": "float32", "max_epochs": 5})
    method = "predict_proba" if Est is LaplaceActiveSubspaceClassifier else "predict"
    X_test, _ = _data(8, seed=3)
    none = getattr(Est(**settings).fit(X, y), method)(X_test)
    for scale in (1e39, 1e300, 1e-50, 5e-324):
        got = getattr(Est(**settings).fit(X, y, sample_weight=np.full(40, scale)), method)(X_test)
        np.testing.assert_array_equal(got, none, err_msg=f"uniform weights {scale}")
    w = 1.0 + (np.arange(40) % 3)
    unscaled = getattr(Est(**settings).fit(X, y, sample_weight=w / w.mean()), method)(X_test)
    for scale in (1e300, 1e-300):
        got = getattr(Est(**settings).fit(X, y, sample_weight=w * scale), method)(X_test)
        np.testing.assert_allclose(got, unscaled, rtol=1e-6, err_msg=f"weights scaled by {scale}")


def test_a_scalar_weight_is_every_rows_weight():
    X, y = _data(40)
    X_test, _ = _data(8, seed=3)
    settings = grouped(**{**SMALL, "max_epochs": 5})
    np.testing.assert_array_equal(LaplaceActiveSubspaceRegressor(**settings).fit(X, y, sample_weight=3.0)
                                  .predict(X_test), LaplaceActiveSubspaceRegressor(**settings).fit(X, y)
                                  .predict(X_test))


# --------------------------------------------------------------------------------------- routing


def _predictions_without_routing(X, y, w, X_test):
    pipe = Pipeline([("scale", StandardScaler()), ("reg", LaplaceActiveSubspaceRegressor(**grouped(**SMALL)))])
    return pipe.fit(X, y, reg__sample_weight=w).predict(X_test)


def test_sample_weight_reaches_the_estimator_through_a_pipeline_without_routing():
    X, y = _data(40)
    w = 1.0 + np.arange(40) % 4
    X_test, _ = _data(8, seed=6)
    direct = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(StandardScaler().fit_transform(X), y,
                                                                     sample_weight=w)
    scaler = StandardScaler().fit(X)
    np.testing.assert_array_equal(_predictions_without_routing(X, y, w, X_test),
                                  direct.predict(scaler.transform(X_test)))


def test_metadata_routing_through_pipeline_and_grid_search():
    X, y = _data(40)
    w = 1.0 + np.arange(40) % 4
    X_test, _ = _data(8, seed=7)
    expected = _predictions_without_routing(X, y, w, X_test)
    with sklearn.config_context(enable_metadata_routing=True):
        # weights requested for fit, and for the weighted R² of the search's scores
        reg = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).set_fit_request(sample_weight=True).set_score_request(
            sample_weight=True)
        pipe = Pipeline([("scale", StandardScaler().set_fit_request(sample_weight=False)), ("reg", reg)])
        np.testing.assert_array_equal(pipe.fit(X, y, sample_weight=w).predict(X_test), expected)
        search = GridSearchCV(pipe, {"reg__posterior__max_components": [2, 3]}, cv=KFold(2)).fit(X, y, sample_weight=w)
        best_pred = search.best_estimator_.predict(X_test)
        # not requested: the weights are refused loudly rather than silently dropped
        plain = Pipeline([("scale", StandardScaler().set_fit_request(sample_weight=False)),
                          ("reg", LaplaceActiveSubspaceRegressor(**grouped(**SMALL)))])
        with pytest.raises(Exception, match="sample_weight"):
            plain.fit(X, y, sample_weight=w)
    # the search's refit on all rows got the weights: the same network as the weighted fit by hand
    best = search.best_params_["reg__posterior__max_components"]
    refit = Pipeline([("scale", StandardScaler()),
                      ("reg", LaplaceActiveSubspaceRegressor(**grouped(**{**SMALL, "max_components": best})))])
    np.testing.assert_array_equal(best_pred, refit.fit(X, y, reg__sample_weight=w).predict(X_test))
    # and each cross-validation fit got its fold's weights: the fold's score by hand (weighted R²)
    train, test = next(iter(KFold(2).split(X)))
    fold = refit.fit(X[train], y[train], reg__sample_weight=w[train])
    assert search.cv_results_["split0_test_score"][search.best_index_] == pytest.approx(
        fold.score(X[test], y[test], sample_weight=w[test]), rel=1e-12)
    unweighted = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(StandardScaler().fit_transform(X), y)
    assert not np.allclose(unweighted.predict(StandardScaler().fit(X).transform(X_test)), expected)
