"""The conformity scores (glas_sklearn.conformity_scores) against split conformal by hand: scores of known
probabilities written out, sets at known quantiles, each region the inverse of its score, never-empty sets, the
coverage of a simulation with known class probabilities, and the classifier calibrated with each score."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from glas_sklearn import Compute, LaplaceActiveSubspaceClassifier, LowRank, Training
from glas_sklearn.calibration import ConformalCalibrator, conformal_quantile
from glas_sklearn.conformity_scores import APS, LAC, RAPS, ClassificationScore, TopK

EPS64 = torch.finfo(torch.float64).eps
# Three rows of known probabilities; row 2 has a tie (classes 1 and 2), broken by class index.
P = torch.tensor([[0.5, 0.3, 0.2, 0.0],
                  [0.1, 0.6, 0.25, 0.05],
                  [0.4, 0.25, 0.25, 0.1]], dtype=torch.float64)
ALL = [LAC(), LAC(never_empty=True), APS(), APS(include_last=False), RAPS(), RAPS(lam=0.1, k_reg=2),
       RAPS(lam=0.2, k_reg=0, include_last=False), TopK()]


def _every_label_score(score: ClassificationScore, p: torch.Tensor) -> torch.Tensor:
    """(n, C): the score each class would have as the label."""
    return torch.stack([torch.as_tensor(score.score(torch.full((p.shape[0],), c), p)) for c in range(p.shape[1])], 1)


def test_scores_of_known_probabilities():
    y = torch.tensor([2, 0, 2])
    # LAC: 1 − p_y
    np.testing.assert_allclose(LAC().score(y, P), [0.8, 0.9, 0.75], rtol=0, atol=4 * EPS64)
    # APS: mass ranked at or above y. Row 0: 0.5 + 0.3 + 0.2; row 1: 0.6 + 0.25 + 0.1; row 2 (y = 2 ranks after
    # class 1 at the tie): 0.4 + 0.25 + 0.25
    np.testing.assert_allclose(APS().score(y, P), [1.0, 0.95, 0.9], rtol=0, atol=4 * EPS64)
    # the tie broken the other way for label 1: 0.4 + 0.25
    np.testing.assert_allclose(APS().score(torch.tensor([1]), P[2:]), [0.65], rtol=0, atol=4 * EPS64)
    # RAPS λ = 0.1, k_reg = 1: + 0.1 · (rank − 1)⁺, ranks 3, 3, 3
    np.testing.assert_allclose(RAPS(lam=0.1, k_reg=1).score(y, P), [1.2, 1.15, 1.1], rtol=0, atol=8 * EPS64)
    np.testing.assert_allclose(RAPS(lam=0.1, k_reg=3).score(y, P), [1.0, 0.95, 0.9], rtol=0, atol=8 * EPS64)
    np.testing.assert_allclose(RAPS(lam=0.0).score(y, P), APS().score(y, P), rtol=0, atol=0)
    # top-k: the rank
    np.testing.assert_array_equal(TopK().score(y, P), [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(TopK().score(torch.tensor([0, 1, 1]), P), [1.0, 1.0, 2.0])


def test_sets_at_known_quantiles():
    q = [0.7, 0.95]
    # APS include_last: the classes whose mass ranked above them is < q. Row 0: masses before 0, .5, .8, 1.0
    aps = APS().region(P, q)
    assert aps[0, :, 0].tolist() == [True, True, False, False] and aps[0, :, 1].tolist() == [True, True, True, False]
    # exact inverse: mass through the class ≤ q. Row 0: .5, .8, 1.0, 1.0; row 1 (order 1, 2, 0, 3): .7, .6, .95, 1.
    exact = APS(include_last=False).region(P, q)
    assert exact[0, :, 0].tolist() == [True, False, False, False]
    assert exact[1, :, 0].tolist() == [False, True, False, False]  # 0.85 for class 2 > 0.7
    assert exact[1, :, 1].tolist() == [True, True, True, False]
    # RAPS λ = 0.1, k_reg = 1, include_last: mass before + 0.1 (rank − 1)⁺ < q. Row 1: class 1: 0; class 2: 0.6 + 0.1;
    # class 0: 0.85 + 0.2; class 3: 0.95 + 0.3
    raps = RAPS(lam=0.1, k_reg=1).region(P, q)
    assert raps[1, :, 0].tolist() == [False, True, False, False]
    assert raps[1, :, 1].tolist() == [False, True, True, False]
    # top-k: the ⌊q⌋ most probable classes; row 2's tie goes to class 1
    top = TopK().region(P, [2.0])
    assert top[:, :, 0].tolist() == [[True, True, False, False], [False, True, True, False],
                                    [True, True, False, False]]
    # LAC: {c : 1 − p_c ≤ q}; at q = 0.45 rows 0 and 2 (max 0.5, 0.4) are empty, never_empty adds their top class
    lac, lac_ne = LAC().region(P, [0.45]), LAC(never_empty=True).region(P, [0.45])
    assert lac[:, :, 0].sum(1).tolist() == [0, 1, 0]
    assert lac_ne[:, :, 0].tolist() == [[True, False, False, False], [False, True, False, False],
                                       [True, False, False, False]]


@pytest.mark.parametrize("score", ALL, ids=repr)
def test_each_region_is_the_inverse_of_its_score(score):
    """y ∈ region(q) ⇔ score(y) ≤ q for the exact scores; ⊇ for the include-last / never-empty ones, which are
    never empty for q > 0; +inf gives every class; numpy in, numpy out."""
    p = torch.softmax(3 * torch.randn(200, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), 1)
    q = np.array([0.05, 0.5, 0.9, 0.99, 2.0, 3.0, np.inf])
    sets = torch.as_tensor(score.region(p, q))
    inverse = _every_label_score(score, p).unsqueeze(-1) <= torch.as_tensor(q)
    exact = not (getattr(score, "include_last", False) or getattr(score, "never_empty", False))
    if exact:
        assert torch.equal(sets, inverse)
    else:
        assert bool((sets | ~inverse).all()) and bool(sets.sum(1).ge(1).all())
    assert bool(sets[..., -1].all())
    as_numpy = score.region(p.numpy(), q)
    assert isinstance(as_numpy, np.ndarray) and np.array_equal(as_numpy, sets.numpy())


@pytest.mark.parametrize("score", [APS(), RAPS(), TopK()], ids=repr)
def test_never_empty_at_every_quantile_a_calibration_can_give(score):
    """The smallest score any row can have is > 0, so its sets are never empty."""
    p = torch.softmax(5 * torch.randn(300, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1)), 1)
    s = np.asarray(score.score(torch.randint(0, 10, (300,), generator=torch.Generator().manual_seed(2)), p))
    q = conformal_quantile(s, [0.05, 0.5, 0.9])
    assert bool(torch.as_tensor(score.region(p, q)).sum(1).ge(1).all())


@pytest.mark.parametrize("score", ALL, ids=repr)
def test_split_conformal_coverage_with_known_class_probabilities(score):
    """Labels drawn from known probabilities (a predictor that is right about them, but any would do): over
    R = 400 calibration draws of n = 49 rows at 90 %, coverage averages ⌈50 · 0.9⌉ / 50 = 0.9 for a continuous
    score (exactly), and at least that for the conservative and the discrete ones. Tolerance: 4 standard errors of
    the mean of R coverages (each of sd ≤ sqrt(0.9 · 0.1 / 50) + test-row noise)."""
    R, n, m, C = 400, 49, 40, 5
    gen = torch.Generator().manual_seed(3)
    logits = 2.0 * torch.randn(R, n + m, C, dtype=torch.float64, generator=gen)
    p = torch.softmax(logits, -1)
    y = torch.multinomial(p.reshape(-1, C), 1, generator=gen).reshape(R, n + m)
    cov = []
    for r in range(R):
        s = np.asarray(score.score(y[r, :n], p[r, :n]))
        q = conformal_quantile(s, 0.9)
        sets = torch.as_tensor(score.region(p[r, n:], q))[..., 0]
        cov.append(float(sets[torch.arange(m), y[r, n:]].double().mean()))
    mean, se = float(np.mean(cov)), float(np.std(cov, ddof=1) / math.sqrt(R))
    target = math.ceil(50 * 0.9) / 50
    assert mean >= target - 4 * se
    if isinstance(score, LAC) and not score.never_empty or isinstance(score, APS) and not score.include_last:
        assert mean <= target + 4 * se  # continuous scores: exact


def test_raps_checks_and_reprs():
    with pytest.raises(ValueError, match="lam must be a finite number >= 0"):
        RAPS(lam=-1.0)
    with pytest.raises(ValueError, match="k_reg must be an integer >= 0"):
        RAPS(k_reg=1.5)
    assert repr(RAPS()) == "RAPS()" and repr(RAPS(lam=0.1)) == "RAPS(lam=0.1)"
    assert repr(LAC(never_empty=True)) == "LAC(never_empty=True)" and repr(TopK()) == "TopK()"


def _labels(n, seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3, n)
    X = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 1.2]])[codes] + 0.9 * rng.standard_normal((n, 2))
    return X, codes


@pytest.mark.parametrize("score", [APS(), RAPS(lam=0.05), TopK(), LAC(never_empty=True)], ids=repr)
def test_classifier_with_each_score_is_split_conformal_by_hand(score):
    X, codes = _labels(120)
    X_cal, c_cal = _labels(40, seed=1)
    X_test, _ = _labels(30, seed=2)
    clf = LaplaceActiveSubspaceClassifier(random_state=0, sigma0="eb_full", calibration=ConformalCalibrator(score),
                                          training=Training(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=30,
                                                            lr=0.05, batch_size=None),
                                          posterior=LowRank(n_samples=50, max_components=3),
                                          compute=Compute(dtype="float64"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, codes, X_cal=X_cal, y_cal=c_cal)
    proba_cal = torch.as_tensor(clf.predict_proba(X_cal))
    by_hand = np.sort(np.asarray(score.score(torch.as_tensor(c_cal), proba_cal)))
    np.testing.assert_allclose(clf.conformity_scores_, by_hand, rtol=1e-12, atol=1e-12)
    q = by_hand[math.ceil(41 * 0.9 - 1e-9) - 1]
    proba = clf.predict_proba(X_test)
    _, sets = clf.predict_set(X_test)
    np.testing.assert_array_equal(sets[:, :, 0], _sets_by_hand(score, proba, q))
    assert sets[:, :, 0].sum(1).min() >= 1 and sets[:, :, 0].sum(1).max() >= 2  # never empty; not all singletons


def _sets_by_hand(score, proba: np.ndarray, q: float) -> np.ndarray:
    """The score's sets at q, row by row in plain numpy."""
    out = np.zeros(proba.shape, dtype=bool)
    for i, p in enumerate(proba):
        order = sorted(range(len(p)), key=lambda c: (-p[c], c))  # descending, ties by class index
        rank = {c: r + 1 for r, c in enumerate(order)}
        before = {c: sum(p[order[: rank[c] - 1]]) for c in order}
        for c in range(len(p)):
            if isinstance(score, TopK):
                out[i, c] = rank[c] <= q
            elif isinstance(score, LAC):
                out[i, c] = 1 - p[c] <= q
            else:  # APS / RAPS, include_last
                lam, k_reg = (score.lam, score.k_reg) if isinstance(score, RAPS) else (0.0, 0)
                out[i, c] = before[c] + lam * max(rank[c] - k_reg, 0) < q
        if isinstance(score, LAC) and not out[i].any():
            out[i, order[0]] = True
    return out
