"""The estimators' torch thread count: the rule of n_threads="auto", the scope (set, restored, safe under
concurrent and nested calls) and its use in fit and the predict methods."""

import threading

import numpy as np
import pytest
import torch
from torch import nn

from glas_sklearn import Compute, LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor, LowRank, Training
from glas_sklearn._threads import AUTO_WORK_PER_THREAD, adjust_threads, auto_threads, torch_threads


@pytest.fixture
def outside():
    """torch's count outside any scope set to 2 (the suite pins 1), restored after the test."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


def test_auto_rule():
    assert auto_threads(3051, 64, available=8) == 1  # the default MLP on concrete
    assert auto_threads(AUTO_WORK_PER_THREAD // 64 - 1, 64, available=8) == 1
    assert auto_threads(3 * AUTO_WORK_PER_THREAD // 64, 64, available=8) == 3
    assert auto_threads(10**9, 64, available=4) == 4  # never more than available
    assert auto_threads(10**9, 64, available=1) == 1  # a count the user lowered is not raised
    assert auto_threads(0, 0, available=4) == 1


def test_scope_sets_and_restores(outside):
    with torch_threads(1):
        assert torch.get_num_threads() == 1
        with torch_threads(1):  # nested
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1  # the inner exit does not restore under the outer call
    assert torch.get_num_threads() == outside
    with torch_threads(None):  # None leaves torch's setting alone
        assert torch.get_num_threads() == outside


def test_scope_restores_after_an_exception(outside):
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == outside


def test_concurrent_call_is_never_restored_under(outside):
    """A enters, B enters, A leaves first: B still runs at the scope's count; the last to leave restores."""
    a_in, b_in, a_out = (threading.Event() for _ in range(3))
    seen = {}

    def a():
        with torch_threads(1):
            a_in.set()
            b_in.wait()
        a_out.set()

    def b():
        a_in.wait()
        with torch_threads(1):
            b_in.set()
            a_out.wait()
            seen["b_after_a_left"] = torch.get_num_threads()

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start(), tb.start()
    ta.join(), tb.join()
    assert seen["b_after_a_left"] == 1
    assert torch.get_num_threads() == outside  # restored by B, the last to leave


def test_adjust_only_when_alone(outside):
    assert not adjust_threads(1)  # outside any scope
    with torch_threads(1):
        assert adjust_threads(2) and torch.get_num_threads() == 2
        with torch_threads(2):  # a nested call in this thread: no longer alone
            assert not adjust_threads(1)
        entered, release = threading.Event(), threading.Event()

        def other():
            with torch_threads(1):
                entered.set()
                release.wait()

        t = threading.Thread(target=other)
        t.start()
        entered.wait()
        assert not adjust_threads(1)  # a call on another thread shares the scope
        release.set()
        t.join()
        assert adjust_threads(1) and torch.get_num_threads() == 1
    assert torch.get_num_threads() == outside


class _Probe(nn.Module):
    """An MLP that records torch's thread count at every forward call (in a list shared by its copies)."""

    seen: list = []

    def __init__(self, n_in=2, n_out=1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, 16), nn.Tanh(), nn.Linear(16, n_out))

    def forward(self, x):
        _Probe.seen.append(torch.get_num_threads())
        return self.net(x)


def _data(n=80):
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(n, 2))
    return X, np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(n)


@pytest.mark.parametrize("n_threads, expected", [("auto", 1), (2, 2), (None, 2)])
def test_estimator_calls_run_at_their_count(outside, n_threads, expected):
    X, y = _data()
    reg = LaplaceActiveSubspaceRegressor(_Probe(), random_state=0, training=Training(max_epochs=3),
                                         posterior=LowRank(max_components=3, n_samples=20),
                                         compute=Compute(n_threads=n_threads))
    _Probe.seen.clear()
    reg.fit(X, y)
    assert set(_Probe.seen) == {expected}
    assert reg.n_threads_ == (None if n_threads is None else expected)
    assert torch.get_num_threads() == outside
    for call in (lambda: reg.predict(X), lambda: reg.predict_interval(X), lambda: reg.sample_y(X, 2),
                 lambda: reg.score(X, y), lambda: reg.coverage_curve(X, y, d_max=2)):
        _Probe.seen.clear()
        call()
        assert set(_Probe.seen) == {expected} and torch.get_num_threads() == outside


def test_classifier_predict_set_is_scoped(outside):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(90, 2))
    y = (X[:, 0] > 0).astype(int)
    clf = LaplaceActiveSubspaceClassifier(_Probe(n_out=2), random_state=0, training=Training(max_epochs=3),
                                          posterior=LowRank(max_components=3, n_samples=20)).fit(X, y)
    _Probe.seen.clear()
    clf.predict_set(X)
    clf.predict_proba(X)
    assert set(_Probe.seen) == {1} and torch.get_num_threads() == outside


def test_one_estimator_served_from_threads(outside):
    """Several threads predicting with one fitted estimator: every call at the fitted count, the same results as
    one at a time, and torch's count restored once all are done. (The sampled predictive: the linearised one's
    forward-mode JVPs are made safe to call from threads in issue 25.)"""
    X, y = _data()
    reg = LaplaceActiveSubspaceRegressor(_Probe(), random_state=0, training=Training(max_epochs=3),
                                         posterior=LowRank(max_components=3, n_samples=20, predictive="sampled"),
                                         compute=Compute(dtype="float64")).fit(X, y)
    reference = reg.predict_interval(X)[1]
    _Probe.seen.clear()
    results, start = [None] * 6, threading.Barrier(6)

    def work(i):
        start.wait()
        for _ in range(3):
            results[i] = reg.predict_interval(X)[1]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(_Probe.seen) == {1}
    assert torch.get_num_threads() == outside
    for r in results:
        np.testing.assert_allclose(r, reference, rtol=1e-10, atol=1e-12)
