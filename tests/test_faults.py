"""The fault suite: a fitted estimator served from threads, hostile inputs, faulty networks, refit / clone / pickle
state, and determinism. Every case gives a correct result or a clear error naming the cause; none is silent.

The thread tests hammer one fitted estimator from several threads and compare every result with the
single-threaded one; on the code before the fix (torch's ``functional_call`` swapping weights into one shared
module, forward-mode AD levels shared by the process) they raised in most calls and returned wrong numbers in some.
"""

from __future__ import annotations

import pickle
import threading
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from torch import nn

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import CalibrationWarning
from glas_sklearn.posterior import ActiveSubspacePosterior

SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(16,)), max_epochs=20, lr=0.02, max_components=5, n_samples=40,
             random_state=0)
N_THREADS, N_CALLS = 4, 6
# Results of threads are compared with the single-threaded ones: the same operations on the same data, so any
# difference beyond float64 round-off of the user-unit conversion is a fault.
RTOL, ATOL = 1e-10, 1e-12


@pytest.fixture(autouse=True)
def _quiet_calibration():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)  # tiny networks rarely reach the level
        yield


def _regression(n=160, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 4))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * (1 + np.abs(X[:, 2])) * rng.standard_normal(n)
    return X, y


def _classes(n=160, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    return X, (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5)


def _hammer(call, n_threads=N_THREADS, n_calls=N_CALLS):
    """Run ``call(thread, i)`` n_calls times in each of n_threads threads started together; returns the results
    and the exceptions raised."""
    barrier = threading.Barrier(n_threads)
    results, errors = {}, []

    def work(t):
        barrier.wait()
        for i in range(n_calls):
            try:
                results[t, i] = call(t, i)
            except Exception as err:  # noqa: BLE001 - every exception is a fault, collected and reported
                errors.append(f"thread {t} call {i}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    return results, errors


def _assert_same(got, ref, what):
    for g, r in zip(got if isinstance(got, tuple) else (got,), ref if isinstance(ref, tuple) else (ref,),
                    strict=True):
        np.testing.assert_allclose(np.asarray(g, dtype=float), np.asarray(r, dtype=float), rtol=RTOL, atol=ATOL,
                                   err_msg=what)


REGRESSORS = {
    "linearized low_rank": dict(),
    "sampled subspace (paper)": dict(calibration="coverage", posterior="subspace"),
    "linearized subspace": dict(posterior="subspace", predictive="linearized"),
    "low_rank_diag": dict(posterior="low_rank_diag"),
    "heteroscedastic": dict(likelihood="heteroscedastic"),
    "heteroscedastic sampled": dict(likelihood="heteroscedastic", posterior="subspace", predictive="sampled"),
}
CLASSIFIERS = {
    "linearized low_rank": dict(),
    "sampled subspace": dict(posterior="subspace", predictive="sampled"),
    "linearized subspace": dict(posterior="subspace", predictive="linearized"),
}


@pytest.fixture(scope="module")
def regressors():
    X, y = _regression()
    return {name: LaplaceActiveSubspaceRegressor(**SMALL, **kw).fit(X, y) for name, kw in REGRESSORS.items()}


@pytest.fixture(scope="module")
def classifiers():
    X, y = _classes()
    return {name: LaplaceActiveSubspaceClassifier(**SMALL, **kw).fit(X, y) for name, kw in CLASSIFIERS.items()}


def _regressor_calls(est, Xs):
    """Every predict-time method of a regressor, on per-thread inputs (different row counts per thread)."""
    return [
        lambda t: est.predict_interval(Xs[t], confidence_level=[0.5, 0.9]),
        lambda t: est.predict(Xs[t], return_std=True),
        lambda t: est.sample_y(Xs[t], n_samples=3, random_state=t),
        lambda t: est.predict_noise_std(Xs[t]),
    ]


# ------------------------------------------------------------------------------------------------ concurrency


@pytest.mark.parametrize("name", list(REGRESSORS))
def test_threads_share_a_fitted_regressor(regressors, name):
    """4 threads calling every predict method of one fitted regressor: no exception, the single-threaded results,
    and the estimator still right afterwards."""
    est = regressors[name]
    rng = np.random.default_rng(1)
    Xs = [rng.uniform(-3, 3, size=(17 + 9 * t, 4)) for t in range(N_THREADS)]
    calls = _regressor_calls(est, Xs)
    refs = {(t, k): call(t) for t in range(N_THREADS) for k, call in enumerate(calls)}
    results, errors = _hammer(lambda t, i: calls[i % len(calls)](t))
    assert not errors, f"{len(errors)} of {N_THREADS * N_CALLS} calls raised:\n" + "\n".join(errors[:5])
    for (t, i), got in results.items():
        _assert_same(got, refs[t, i % len(calls)], f"{name}: thread {t} call {i}")
    for t in range(N_THREADS):  # usable afterwards, single-threaded
        _assert_same(calls[0](t), refs[t, 0], f"{name}: after the threads")


@pytest.mark.parametrize("name", list(CLASSIFIERS))
def test_threads_share_a_fitted_classifier(classifiers, name):
    est = classifiers[name]
    rng = np.random.default_rng(2)
    Xs = [rng.normal(size=(15 + 11 * t, 4)) for t in range(N_THREADS)]
    calls = [lambda t: est.predict_proba(Xs[t]),
             lambda t: est.predict_set(Xs[t], confidence_level=[0.5, 0.8])]
    refs = {(t, k): call(t) for t in range(N_THREADS) for k, call in enumerate(calls)}
    results, errors = _hammer(lambda t, i: calls[i % len(calls)](t))
    assert not errors, f"{len(errors)} of {N_THREADS * N_CALLS} calls raised:\n" + "\n".join(errors[:5])
    for (t, i), got in results.items():
        _assert_same(got, refs[t, i % len(calls)], f"{name}: thread {t} call {i}")
    _assert_same(calls[0](0), refs[0, 0], f"{name}: after the threads")


def test_threads_calling_the_model_read_their_own_weights():
    """Two threads inside the network's forward at once, at different weights: each output is the one of its own
    weights. (torch.func.functional_call swaps the weights into the module it is given; on one shared module one
    thread computed with the other's sampled weights, silently.)"""
    barrier = threading.Barrier(2, timeout=10)

    class Meeting(nn.Module):  # both threads read the weight while both are inside forward
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(1, 1, bias=False, dtype=torch.float64)

        def forward(self, x):
            if threading.current_thread() is threading.main_thread():
                return self.lin(x)
            barrier.wait()  # both threads are inside forward, their weights given
            out = self.lin(x)
            barrier.wait()  # both have read their weight before either returns
            return out

    net = Meeting().eval()
    post = ActiveSubspacePosterior(net, torch.ones(1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
                                   beta=1.0, sigma0=1.0)
    fm = post.functional_model
    x = torch.ones(1, 1, dtype=torch.float64)
    out = {}

    def call(w):
        out[w] = float(fm(x, {"lin.weight": torch.full((1, 1), w, dtype=torch.float64)}))

    threads = [threading.Thread(target=call, args=(w,)) for w in (2.0, 3.0)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert out == {2.0: 2.0, 3.0: 3.0}
    assert float(net.lin.weight.detach()) == float(post.theta0[0])  # the user's module was never written into


def test_threads_forward_mode_jacobian_projections():
    """J P by forward-mode JVPs (the subspace kind) from 4 threads at once: the single-threaded values. torch keeps
    forward-mode AD state per process; unguarded, concurrent JVPs raised or mixed up their tangents."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    D = sum(p.numel() for p in net.parameters())
    P, _ = torch.linalg.qr(torch.randn(D, 4, dtype=torch.float64))
    post = ActiveSubspacePosterior(net, torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64), P, beta=1.0,
                                   sigma0=1.0)
    Xs = [torch.randn(5 + t, 3, dtype=torch.float64) for t in range(N_THREADS)]
    # reference: dense Jacobians by reverse mode, times P
    refs = [torch.func.jacrev(lambda th, x=x: torch.func.functional_call(
        net, post.layout.unflatten(th), (x,)))(post.theta0).reshape(-1, D) @ P for x in Xs]
    results, errors = _hammer(lambda t, i: post.jacobian_projections(Xs[t], 4))
    assert not errors, "\n".join(errors[:5])
    tol = 1e3 * torch.finfo(torch.float64).eps
    for (t, _), got in results.items():
        torch.testing.assert_close(got.reshape(-1, 4), refs[t], rtol=tol, atol=tol)


def test_autodiff_flags_restored_after_interleaved_threads():
    """The global attention-kernel and oneDNN flags set inside autodiff sections come back as they were, whatever
    the order in which threads enter and leave."""
    from glas_sklearn._functional import autodiff_context

    before = (torch.backends.mkldnn.enabled, torch.backends.cuda.flash_sdp_enabled(),
              torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    rnn = nn.LSTM(2, 2)
    inside = threading.Barrier(3, timeout=10)
    leave = [threading.Event() for _ in range(3)]
    seen = []

    def section(k):
        with autodiff_context(rnn, torch.device("cpu")):
            inside.wait()
            seen.append((torch.backends.mkldnn.enabled, torch.backends.cuda.flash_sdp_enabled()))
            leave[k].wait(10)

    threads = [threading.Thread(target=section, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    for k in (1, 0, 2):  # leave in another order than entered
        leave[k].set()
    for th in threads:
        th.join(timeout=30)
    assert seen == [(False, False)] * 3  # the settings held while any thread was inside
    assert (torch.backends.mkldnn.enabled, torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before


def test_an_exception_in_one_thread_leaves_the_others_right(regressors):
    """One thread passing bad rows (the wrong number of features) while others predict: it gets its error, the
    others their single-threaded results."""
    est = regressors["linearized low_rank"]
    X = np.random.default_rng(3).uniform(-2, 2, size=(30, 4))
    ref = est.predict_interval(X)

    def call(t, i):
        if t == 0:
            with pytest.raises(ValueError, match="features"):
                est.predict_interval(X[:, :3])
            return None
        return est.predict_interval(X)

    results, errors = _hammer(call)
    assert not errors, "\n".join(errors[:5])
    for (t, i), got in results.items():
        if t:
            _assert_same(got, ref, f"thread {t} call {i}")


def test_pickled_copies_in_threads(regressors):
    """A pickled and a cloned-then-refitted copy predict as the original, also from threads."""
    est = regressors["sampled subspace (paper)"]
    X = np.random.default_rng(4).uniform(-2, 2, size=(25, 4))
    ref = est.predict_interval(X)
    loaded = pickle.loads(pickle.dumps(est))
    results, errors = _hammer(lambda t, i: (est if t % 2 else loaded).predict_interval(X))
    assert not errors, "\n".join(errors[:5])
    for got in results.values():
        _assert_same(got, ref, "pickled copy")
    refit = clone(est).fit(*_regression())  # same data, same random_state: the same fit
    _assert_same(refit.predict_interval(X), ref, "clone refitted")
