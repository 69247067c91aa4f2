"""The estimators on inputs other than 2-D float tables: images (n, C, H, W), integer token sequences (n, T)
with padding, fitted skorch nets; against dense GGN references, the lower-level API, the same network on
flattened inputs, and the module's own outputs; and the errors users meet with such inputs."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor, LowRank
from glas_sklearn.calibration import CalibrationWarning
from glas_sklearn.laplace import fit_laplace_subspace
from tests.reference import grouped

from .reference import assert_unchanged, dense_ggn, snapshot

#: Prefit networks here are often untrained on purpose; the warning saying so is tested in test_messages.py.
pytestmark = pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")

FAST = dict(n_samples=20, max_components=3, dtype="float64", random_state=0)


@pytest.fixture(autouse=True)
def _quiet_calibration():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)  # tiny networks rarely reach the level
        yield


def _images(n=48, seed=0):
    """(n, 1, 6, 6) images: a bright 2×2 blob on the left (class 1) or the right (class 0), plus noise; the
    regression target is the mean brightness of the left half."""
    rng = np.random.default_rng(seed)
    X = 0.2 * rng.standard_normal((n, 1, 6, 6))
    label = rng.integers(0, 2, n)
    for i in range(n):
        r, c = rng.integers(0, 5), rng.integers(0, 2) + (0 if label[i] else 3)
        X[i, 0, r:r + 2, c:c + 2] += 1.0
    return X, label, X[:, 0, :, :3].mean(axis=(1, 2))


def _cnn(n_out, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(2 * 4 * 4, n_out)).double()


def _eigvals(G: torch.Tensor, k: int) -> np.ndarray:
    return np.linalg.eigvalsh(G.numpy())[::-1][:k]


# ------------------------------------------------------------------------------------------- images


@pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitLeakageWarning")  # its own rows, for the mechanics
def test_image_classifier_curvature_is_the_dense_ggn_and_matches_the_flattened_network():
    X, label, _ = _images()
    net = _cnn(2)
    before = snapshot(net)
    X_cal, y_cal = X[:12], label[:12]
    est = LaplaceActiveSubspaceClassifier(net, **grouped(prefit=True, predictive="linearized", **FAST)).fit(
        X[12:], label[12:], X_cal=X_cal, y_cal=y_cal)
    assert est.input_shape_ == (1, 6, 6) and est.n_features_in_ == 36 and est.n_records_ == 36
    # classification, "mean" scaling: β = 1 and the eigenvalues are those of G on the 36 training images
    ref = _eigvals(dense_ggn(net, torch.as_tensor(X[12:]), "cross_entropy"), 3)
    np.testing.assert_allclose(est.eigenvalues_, ref, rtol=1e-7)
    # the same network behind an Unflatten, on the flattened table: the same posterior and predictions
    flat_net = nn.Sequential(nn.Unflatten(1, (1, 6, 6)), *net)
    flat = LaplaceActiveSubspaceClassifier(flat_net, **grouped(prefit=True, predictive="linearized", **FAST)).fit(
        X[12:].reshape(36, -1), label[12:], X_cal=X_cal.reshape(12, -1), y_cal=y_cal)
    np.testing.assert_allclose(est.eigenvalues_, flat.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(est.predict_proba(X), flat.predict_proba(X.reshape(48, -1)), rtol=1e-10, atol=1e-14)
    labels, sets = est.predict_set(X, confidence_level=[0.5, 0.9])
    assert sets.shape == (48, 2, 2) and labels.shape == (48,)
    assert_unchanged(net, before)


@pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitLeakageWarning")  # its own rows, for the mechanics
def test_image_regressor_matches_the_flattened_network_in_every_method():
    X, _, target = _images()
    net = _cnn(1)
    common = dict(prefit=True, noise_std=0.1, **FAST)
    est = LaplaceActiveSubspaceRegressor(net,
                                         **grouped(**common)).fit(X[12:], target[12:], X_cal=X[:12], y_cal=target[:12])
    flat = LaplaceActiveSubspaceRegressor(nn.Sequential(nn.Unflatten(1, (1, 6, 6)), *net), **grouped(**common)).fit(
        X[12:].reshape(36, -1), target[12:], X_cal=X[:12].reshape(12, -1), y_cal=target[:12])
    Xf = X.reshape(48, -1)
    tol = dict(rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(est.eigenvalues_, flat.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(est.predict_interval(X, [0.5, 0.9])[1], flat.predict_interval(Xf, [0.5, 0.9])[1], **tol)
    np.testing.assert_allclose(est.predict(X, return_std=True)[1], flat.predict(Xf, return_std=True)[1], **tol)
    np.testing.assert_allclose(est.sample_y(X, 3), flat.sample_y(Xf, 3), **tol)
    np.testing.assert_allclose(est.coverage_curve(X, target).to_numpy(), flat.coverage_curve(Xf, target).to_numpy(),
                               **tol)


def test_image_estimators_train_their_own_copy_of_a_cnn_without_standardising_the_images():
    X, label, target = _images()
    net = _cnn(2)
    before = snapshot(net)
    clf = LaplaceActiveSubspaceClassifier(net, **grouped(max_epochs=60, lr=0.05, batch_size=None, **FAST)).fit(X, label)
    assert clf.x_mean_ is None and clf.module_ is not net and clf.training_loss_[-1] < clf.training_loss_[0]
    assert clf.score(X, label) > 0.8
    assert_unchanged(net, before)
    reg = LaplaceActiveSubspaceRegressor(lambda: _cnn(1), **grouped(max_epochs=5, **FAST)).fit(
        X[12:], target[12:], X_cal=X[:12], y_cal=target[:12])
    assert reg.x_mean_ is None and reg.y_scale_[0] == pytest.approx(target[12:].std(), rel=1e-12)  # y: "auto"


def test_image_input_errors():
    X, label, target = _images()
    est = LaplaceActiveSubspaceClassifier(_cnn(2), **grouped(prefit=True, **FAST)).fit(X[12:], label[12:], X_cal=X[:12],
                                                                            y_cal=label[:12])
    msg = ("X has rows of shape (1, 6, 5), but LaplaceActiveSubspaceClassifier was fitted on rows of shape "
           "(1, 6, 6): pass X of shape (n, 1, 6, 6).")
    for method in (est.predict, est.predict_proba, est.predict_set):
        with pytest.raises(ValueError, match=re.escape(msg)):
            method(X[:, :, :, :5])
    with pytest.raises(ValueError, match=re.escape("rows of shape (36,)")):
        est.predict(X.reshape(48, -1))
    bad = X.copy()
    bad[3, 0, 2, 2] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN"):
        est.predict(bad)
    bad[3, 0, 2, 2] = np.inf
    with pytest.raises(ValueError, match="Input X contains infinity"):
        LaplaceActiveSubspaceClassifier(_cnn(2), **grouped(prefit=True, **FAST)).fit(bad, label)
    with pytest.raises(ValueError, match=re.escape("the default network is an MLP on 2-D tables; pass a network "
                                                   "that takes (n, 1, 6, 6) inputs as module=")):
        LaplaceActiveSubspaceRegressor(**grouped(**FAST)).fit(X, target)
    with pytest.raises(ValueError, match=r"standardize=True applies to 2-D tables of floats, but X has rows of shape "
                                         r"\(1, 6, 6\)"):
        LaplaceActiveSubspaceRegressor(_cnn(1), **grouped(standardize=True, max_epochs=1, **FAST)).fit(X, target)
    with pytest.raises(ValueError, match="padding_idx=0 applies to integer token sequences"):
        LaplaceActiveSubspaceRegressor(_cnn(1), **grouped(padding_idx=0, max_epochs=1, **FAST)).fit(X, target)


# ----------------------------------------------------------------------------------- token sequences

PAD, VOCAB, T = 0, 7, 8
SEEN_DTYPES: set = set()  # the input dtypes _SeqClassifier was called with (also through eval-mode views)


class _SeqClassifier(nn.Module):
    """Embedding (padding row fixed at zero) → mean over the real tokens → linear logits: one per sequence."""

    def __init__(self, n_out=2, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, 3, padding_idx=PAD)
        self.head = nn.Linear(3, n_out)

    def forward(self, tokens):
        SEEN_DTYPES.add(tokens.dtype)
        real = (tokens != PAD).unsqueeze(-1).to(self.head.weight.dtype)
        pooled = (self.emb(tokens) * real).sum(1) / real.sum(1).clamp_min(1)
        return self.head(pooled)


def _tokens(n=40, seed=0):
    """(n, T) int64 ids right-padded with PAD, lengths 2..T; label: whether token 3 occurs."""
    rng = np.random.default_rng(seed)
    X = np.full((n, T), PAD, dtype=np.int64)
    for i in range(n):
        L = rng.integers(2, T + 1)
        X[i, :L] = rng.integers(1, VOCAB, L)
    return X, (X == 3).any(axis=1).astype(int)


def test_token_classifier_curvature_counts_sequences_and_equals_the_lower_level_api():
    X, label = _tokens()
    net = _SeqClassifier().double()
    SEEN_DTYPES.clear()
    est = LaplaceActiveSubspaceClassifier(net, **grouped(prefit=True, padding_idx=PAD, **FAST)).fit(
        X[10:], label[10:], X_cal=X[:10], y_cal=label[:10])
    assert SEEN_DTYPES == {torch.int64}  # token ids reach the module as torch.long, never as floats
    assert est.input_shape_ == (T,) and est.x_mean_ is None
    # one prediction per sequence: the 30 sequences are the records, whatever their number of real tokens
    assert est.n_records_ == 30 < int((X[10:] != PAD).sum())
    Xt = torch.as_tensor(X[10:])
    ref = fit_laplace_subspace(net, Xt, loss="cross_entropy", n_components=3, random_state=0)
    assert ref.n_records == 30
    np.testing.assert_allclose(est.eigenvalues_, ref.eigen.eigenvalues.numpy(), rtol=1e-8)
    np.testing.assert_allclose(est.eigenvalues_, _eigvals(dense_ggn(net, Xt, "cross_entropy"), 3), rtol=1e-7)


@pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitLeakageWarning")  # its own rows, for the mechanics
def test_token_sequences_of_other_padded_lengths_are_brought_to_the_fitted_length():
    X, label = _tokens()
    unseen = dict(X_cal=X[:10], y_cal=label[:10])
    est = LaplaceActiveSubspaceClassifier(_SeqClassifier().double(),
                                          **grouped(prefit=True, padding_idx=PAD, **FAST)).fit(
        X[10:], label[10:], **unseen)
    short = X[:, :T - 1][(X[:, T - 1] == PAD)]  # rows whose last position is padding, one column shorter
    rows = X[X[:, T - 1] == PAD]
    longer = np.concatenate([rows, np.full((len(rows), 3), PAD)], axis=1)
    expected = est.predict_proba(rows)
    # padding or cutting only padding gives back the very same array: the same computation, bit for bit
    np.testing.assert_array_equal(est.predict_proba(short), expected)
    np.testing.assert_array_equal(est.predict_proba(longer), expected)
    longer[2, T + 1] = 4
    with pytest.raises(ValueError, match=rf"rows \[2\] hold tokens other than padding_idx=0 beyond the fitted "
                                         rf"length {T}"):
        est.predict(longer)
    # without padding_idx another length is a wrong row shape
    strict = LaplaceActiveSubspaceClassifier(_SeqClassifier().double(),
                                             **grouped(prefit=True, **FAST)).fit(X[10:], label[10:],
                                                                                                **unseen)
    with pytest.raises(ValueError, match=re.escape(f"X has rows of shape ({T - 1},), but")):
        strict.predict(short)


def test_token_regressor_and_token_errors():
    X, label = _tokens()
    # the share of token 3 among the real tokens, which the mean-pooling network can represent
    y = (X == 3).sum(axis=1) / (X != PAD).sum(axis=1) + 0.02 * np.random.default_rng(1).standard_normal(len(X))
    reg = LaplaceActiveSubspaceRegressor(_SeqClassifier(n_out=1).double(),
                                         **grouped(padding_idx=PAD, max_epochs=80, lr=0.05, batch_size=None,
                                                   **FAST)).fit(X, y)
    assert reg.x_mean_ is None and reg.input_shape_ == (T,)
    y_pred, y_pis = reg.predict_interval(X)
    assert y_pis.shape == (40, 2, 1) and np.corrcoef(y_pred, y)[0, 1] > 0.8
    with pytest.raises(ValueError, match=re.escape("X has float64 values, but LaplaceActiveSubspaceRegressor was "
                                                   "fitted on integer token ids")):
        reg.predict(X.astype(float))
    with pytest.raises(ValueError, match="standardize=True applies to 2-D tables of floats, but X has integer token"):
        LaplaceActiveSubspaceRegressor(_SeqClassifier(n_out=1).double(), **grouped(standardize=True, **FAST)).fit(X, y)
    # a per-position model (logits (n, T, V)) is pointed to the lower-level API and its mask
    per_token = nn.Sequential(nn.Embedding(VOCAB, 3), nn.Linear(3, 2)).double()
    with pytest.raises(ValueError, match=re.escape("fit_laplace_subspace(model, X, mask=X != padding_idx)")):
        LaplaceActiveSubspaceClassifier(per_token, **grouped(prefit=True, padding_idx=PAD, **FAST)).fit(
            X[10:], label[10:], X_cal=X[:10], y_cal=label[:10])
    # integer X for a network on floats: a clear error with the way out
    with pytest.raises(ValueError, match=r"cannot be evaluated on rows of shape \(8,\) and dtype torch.int64.*"
                                         r"X.astype\(float\)"):
        LaplaceActiveSubspaceRegressor(nn.Linear(T, 1).double(),
                                       **grouped(prefit=True, **FAST)).fit(X[10:], y[10:], X_cal=X[:10],
                                                                                        y_cal=y[:10])


def test_integer_table_for_the_default_mlp_is_a_table_of_numbers():
    X, _ = _tokens()
    y = X[:, 0] * 0.5 + X[:, 1]
    small = dict(module_kwargs=dict(hidden_layer_sizes=(4,)), max_epochs=5, **FAST)
    as_int = LaplaceActiveSubspaceRegressor(**grouped(**small)).fit(X, y)
    as_float = LaplaceActiveSubspaceRegressor(**grouped(**small)).fit(X.astype(float), y)
    assert as_int.x_mean_ is not None  # standardised like any float table
    # the int table is cast to the float64 table before anything else: the same computation, bit for bit
    np.testing.assert_array_equal(as_int.x_mean_, as_float.x_mean_)
    np.testing.assert_array_equal(as_int.predict(X), as_float.predict(X.astype(float)))


# ------------------------------------------------------------------------------------------- skorch


def _skorch_data(n=80, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3)).astype(np.float32)  # skorch's own requirement: float32 inputs
    return X, (np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]).astype(np.float32)


def _mlp32(n_out, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, n_out))


@pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitLeakageWarning")  # its own rows, for the mechanics
def test_fitted_skorch_regressor_as_prefit_module():
    skorch = pytest.importorskip("skorch")
    X, y = _skorch_data()
    net = skorch.NeuralNetRegressor(_mlp32(1), max_epochs=30, lr=0.05, optimizer=torch.optim.Adam,
                                    train_split=None, verbose=0, batch_size=-1).fit(X, y[:, None])
    before = snapshot(net.module_)
    X_cal, y_cal = _skorch_data(n=20, seed=1)  # rows the skorch net was not trained on
    est = LaplaceActiveSubspaceRegressor(net, prefit=True, n_components=2, random_state=0,
                                         posterior=LowRank(predictive="linearized")).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    ours, ours64 = est.predict(X), est.predict(X.astype(np.float64))
    _, y_pis = est.predict_interval(X)
    assert_unchanged(net.module_, before)  # (before skorch's own predict, which switches it to eval mode)
    assert est.module_ is net.module_  # the skorch net's trained module, used as it is
    # linearised predictive mean = the network at θ0: skorch's predictions, to float32 round-off
    np.testing.assert_allclose(ours, net.predict(X)[:, 0], rtol=0, atol=1e-5)
    # float64 inputs (which skorch itself refuses) are converted to the module's float32 by the estimator
    np.testing.assert_allclose(ours64, net.predict(X)[:, 0], rtol=0, atol=1e-5)
    assert np.all(y_pis[:, 0, 0] < y_pis[:, 1, 0])


@pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitLeakageWarning")  # its own rows, for the mechanics
def test_fitted_skorch_classifier_as_prefit_module():
    skorch = pytest.importorskip("skorch")
    X, f = _skorch_data()
    label = (f > 0).astype(np.int64)
    net = skorch.NeuralNetClassifier(_mlp32(2), criterion=nn.CrossEntropyLoss, max_epochs=30, lr=0.05,
                                     optimizer=torch.optim.Adam, train_split=None, verbose=0, batch_size=-1)
    net.fit(X, label)
    before = snapshot(net.module_)
    X_cal, f_cal = _skorch_data(n=20, seed=1)  # rows the skorch net was not trained on
    est = LaplaceActiveSubspaceClassifier(net, prefit=True, n_components=2, random_state=0,
                                          posterior=LowRank(n_samples=50)).fit(
        X, label, X_cal=X_cal, y_cal=(f_cal > 0).astype(np.int64))
    proba, pred = est.predict_proba(X), est.predict(X)
    assert_unchanged(net.module_, before)  # (before skorch's own predict, which switches it to eval mode)
    assert est.module_ is net.module_
    # the posterior mean's logits through the softmax are skorch's probabilities (float32 round-off)
    logits = est.posterior_.predict_mean(torch.as_tensor(X)).detach().numpy()
    np.testing.assert_allclose(np.exp(logits) / np.exp(logits).sum(1, keepdims=True), net.predict_proba(X),
                               rtol=0, atol=1e-5)
    assert proba.shape == (80, 2)
    sure = np.abs(net.predict_proba(X)[:, 1] - 0.5) > 0.2  # rows far from the boundary keep skorch's label
    assert sure.sum() > 40
    np.testing.assert_array_equal(pred[sure], net.predict(X)[sure])
