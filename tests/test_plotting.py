"""glas_sklearn.plotting: each plot, rendered headless (Agg) on tiny fitted models, holds the model's numbers."""

import importlib
import sys
import warnings

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs
from sklearn.exceptions import NotFittedError

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor, plotting
from glas_sklearn.calibration import CalibrationWarning, choose_dimension
from glas_sklearn.plotting import (
    ActivityDisplay,
    CoverageDisplay,
    IntervalDisplay,
    SpectrumDisplay,
    plot_activity,
    plot_calibration,
    plot_intervals,
    plot_spectrum,
)
from glas_sklearn.posterior import ActiveSubspacePosterior
from tests.reference import grouped

# The calibration curves are those of the paper's method (d by coverage), whose settings are passed explicitly.
TINY = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=20, n_samples=50, max_components=4,
            random_state=0, calibration="coverage", posterior="subspace")


@pytest.fixture(scope="module")
def plt():
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg", force=True)
    import matplotlib.pyplot as pyplot

    yield pyplot
    pyplot.close("all")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    if "matplotlib.pyplot" in sys.modules and sys.modules["matplotlib.pyplot"] is not None:
        sys.modules["matplotlib.pyplot"].close("all")


def _fit_quietly(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        return est.fit(X, y)


@pytest.fixture(scope="module")
def data_1d():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(60, 1))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(60)
    return X, y


@pytest.fixture(scope="module")
def reg_1d(data_1d):
    return _fit_quietly(LaplaceActiveSubspaceRegressor(**grouped(**TINY)), *data_1d)


@pytest.fixture(scope="module")
def data_2d():
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, size=(60, 2))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.standard_normal(60)
    return X, y


@pytest.fixture(scope="module")
def reg_2d(data_2d):
    return _fit_quietly(LaplaceActiveSubspaceRegressor(**grouped(predictive="linearized", **TINY)), *data_2d)


@pytest.fixture(scope="module")
def clf():
    X, y = make_blobs(n_samples=60, centers=3, random_state=0)
    return _fit_quietly(LaplaceActiveSubspaceClassifier(**grouped(**TINY)), X, y)


# ----------------------------------------------------------------------------- optional dependency


def test_import_and_call_without_matplotlib(monkeypatch, reg_1d):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    importlib.reload(plotting)  # the module itself must import without matplotlib
    with pytest.raises(ImportError, match=r"pip install glas-sklearn\[plot\]"):
        plotting.plot_calibration(reg_1d)
    with pytest.raises(ImportError, match=r"pip install glas-sklearn\[plot\]"):
        plotting.plot_spectrum(reg_1d.posterior_)


def test_displays_without_matplotlib_say_how_to_install(monkeypatch, reg_1d):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    importlib.reload(plotting)
    hint = r"pip install glas-sklearn\[plot\]"
    with pytest.raises(ImportError, match=r"CoverageDisplay.from_estimator needs matplotlib.*" + hint):
        plotting.CoverageDisplay.from_estimator(reg_1d)
    with pytest.raises(ImportError, match=r"SpectrumDisplay.from_posterior needs matplotlib.*" + hint):
        plotting.SpectrumDisplay.from_posterior(reg_1d.posterior_)
    # a display built from numbers needs matplotlib only to draw
    disp = plotting.ActivityDisplay(ranks=[1, 2], kappa=[0.5, 1.0], d=1, n_weights=2)
    with pytest.raises(ImportError, match=r"ActivityDisplay.plot needs matplotlib.*" + hint):
        disp.plot()


# ----------------------------------------------------------------------------- calibration


def test_plot_calibration_regressor(plt, reg_1d):
    ax = plot_calibration(reg_1d)
    table = reg_1d.calibration_
    curve = ax.lines[0]
    np.testing.assert_array_equal(curve.get_xdata(), table["d"].to_numpy())
    np.testing.assert_array_equal(curve.get_ydata(), table["coverage"].to_numpy())
    target = [ln for ln in ax.lines if ln.get_gid() == plotting._TARGET_GID]
    assert len(target) == 1 and np.allclose(target[0].get_ydata(), 0.9)
    star = [ln for ln in ax.lines if ln.get_marker() == "*"]
    assert len(star) == 1
    d = reg_1d.n_components_
    assert star[0].get_xdata()[0] == d
    assert star[0].get_label().startswith("chosen d" if reg_1d.calibration_reached_ else "not reached")
    assert star[0].get_ydata()[0] == pytest.approx(table.loc[table["d"] == d, "coverage"].iloc[0])
    assert ax.get_xlabel() == "subspace dimension d"
    assert ax.get_ylabel() == "coverage of calibration data"
    assert isinstance(ax, plt.Axes)


def test_plot_calibration_classifier(plt, clf):
    ax = plot_calibration(clf)
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), clf.calibration_["coverage"].to_numpy())
    assert ax.get_ylabel() == "coverage of prediction sets"


def _full_curve(reg, data, confidence_level):
    """choose_dimension's full coverage curve of ``reg``'s posterior on the first 20 rows of ``data``, in the
    units the posterior works in (transformed X, standardised y)."""
    post = reg.posterior_
    Xc = torch.as_tensor(reg._inputs.transform(data[0][:20]), dtype=post.dtype)
    yc = torch.as_tensor((data[1][:20] - reg.y_mean_[0]) / reg.y_scale_[0], dtype=post.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        return choose_dimension(post, Xc, yc, predictive="linearized", confidence_level=confidence_level,
                                full_curve=True)


def test_plot_calibration_result_overlay(plt, reg_1d, data_1d):
    # Two full curves on one Axes (what the benchmarks do): one target line, one star per curve.
    results = [_full_curve(reg_1d, data_1d, lvl) for lvl in (0.5, 0.9545)]
    _, ax = plt.subplots()
    assert plot_calibration(results[0], ax=ax, label="a") is ax
    plot_calibration(results[1], ax=ax, label="b")
    assert [ln.get_label() for ln in ax.lines if ln.get_marker() == "o"] == ["a", "b"]
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), np.arange(1, 5))
    assert sum(ln.get_gid() == plotting._TARGET_GID for ln in ax.lines) == 1
    stars = [ln for ln in ax.lines if ln.get_marker() == "*"]
    assert len(stars) == 2
    for res, star in zip(results, stars, strict=True):
        assert star.get_xdata()[0] == res.n_components
        assert star.get_label().startswith("chosen d" if res.reached else "not reached")


# ----------------------------------------------------------------------------- intervals


def test_plot_intervals_band_1d(plt, reg_1d, data_1d):
    X, y = data_1d
    ax = plot_intervals(reg_1d, X, y)
    pred, pis = reg_1d.predict_interval(X)
    order = np.argsort(X[:, 0], kind="stable")
    mean_line = [ln for ln in ax.lines if ln.get_label() == "predictive mean"][0]
    np.testing.assert_allclose(mean_line.get_xdata(), X[order, 0])
    np.testing.assert_allclose(mean_line.get_ydata(), pred[order])
    points = ax.collections[-1]
    np.testing.assert_allclose(points.get_offsets(), np.column_stack([X[:, 0], y]))
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(pis[:, 0, 0].min())
    assert band[:, 1].max() == pytest.approx(pis[:, 1, 0].max())
    covered = np.mean((y >= pis[:, 0, 0]) & (y <= pis[:, 1, 0]))
    assert f"{covered:.1%}" in ax.get_title()
    assert ax.get_xlabel() == "x" and ax.get_ylabel() == "y"


def test_plot_intervals_parity(plt, reg_2d, data_2d):
    X, y = data_2d
    _, ax_in = plt.subplots()
    ax = plot_intervals(reg_2d, X, y, ax=ax_in, confidence_level=0.5)
    assert ax is ax_in
    pred, pis = reg_2d.predict_interval(X, confidence_level=0.5)
    segments = np.asarray(ax.collections[0].get_segments())  # (n, 2, 2): [[x, lo], [x, hi]]
    assert segments.shape == (len(y), 2, 2)
    np.testing.assert_allclose(segments[:, 0, 0], pred)
    np.testing.assert_allclose(segments[:, 0, 1], pis[:, 0, 0])
    np.testing.assert_allclose(segments[:, 1, 1], pis[:, 1, 0])
    np.testing.assert_allclose(ax.collections[-1].get_offsets(), np.column_stack([pred, y]))
    assert ax.get_xlabel() == "predicted mean" and ax.get_ylabel() == "observed y"
    assert "50 % intervals" in ax.get_title()
    assert "50 % interval for f" in [t.get_text() for t in ax.get_legend().get_texts()]
    # the label follows the fitted intervals, not a parameter changed since the fit
    reg_2d.set_params(posterior__include_noise=True)
    try:
        ax = plot_intervals(reg_2d, X, y, confidence_level=0.5)
        assert "50 % interval for f" in [t.get_text() for t in ax.get_legend().get_texts()]
    finally:
        reg_2d.set_params(posterior__include_noise=False)


@pytest.mark.parametrize("settings, label", [
    (dict(calibration="coverage", posterior="subspace", include_noise=True), "90 % interval for y"),
    (dict(calibration="coverage", posterior="subspace"), "90 % interval for f"),
    (dict(), "90 % conformal interval for y"),  # the defaults: split-conformal intervals for y
    (dict(likelihood="heteroscedastic"), "90 % conformal interval for y"),
    (dict(likelihood="heteroscedastic", calibration="coverage"), "90 % interval for y"),
])
def test_plot_intervals_label_follows_the_fitted_intervals(plt, data_2d, settings, label):
    X, y = data_2d
    tiny = {**TINY, "calibration": "conformal", "posterior": "low_rank", **settings}
    reg = _fit_quietly(LaplaceActiveSubspaceRegressor(**grouped(**tiny)), X, y)
    ax = plot_intervals(reg, X, y)
    assert label in [t.get_text() for t in ax.get_legend().get_texts()]


def test_plot_intervals_rejects(plt, clf, reg_2d, data_2d):
    X, y = data_2d
    with pytest.raises(TypeError, match="regression"):
        plot_intervals(clf, X, y)
    with pytest.raises(ValueError, match="single number"):
        plot_intervals(reg_2d, X, y, confidence_level=[0.5, 0.9])
    with pytest.raises(TypeError, match="CalibrationResult"):
        plot_calibration(reg_2d.calibration_)
    with pytest.raises(ValueError, match="rows of X"):
        plot_intervals(reg_2d, X, y[:-1])
    with pytest.raises(NotFittedError):
        plot_intervals(LaplaceActiveSubspaceRegressor(), X, y)
    two = _fit_quietly(LaplaceActiveSubspaceRegressor(**grouped(predictive="linearized",
                                                                **TINY)), X, np.column_stack([y, y]))
    with pytest.raises(ValueError, match="single output"):
        plot_intervals(two, X, y)


# ----------------------------------------------------------------------------- spectrum


def test_plot_spectrum_estimator(plt, reg_1d):
    axes = plot_spectrum(reg_1d)
    assert axes.shape == (3,)
    post, d = reg_1d.posterior_, reg_1d.n_components_
    np.testing.assert_allclose(axes[0].lines[0].get_ydata(), reg_1d.eigenvalues_, rtol=1e-6)
    np.testing.assert_allclose(axes[1].lines[0].get_ydata(), post.variances(d).double().numpy(), rtol=1e-6)
    np.testing.assert_allclose(axes[2].lines[0].get_ydata(), post.contraction(d).double().numpy(), rtol=1e-6)
    assert len(axes[1].lines[0].get_xdata()) == d
    assert axes[0].get_yscale() == "log" and axes[1].get_yscale() == "log" and axes[2].get_yscale() == "linear"
    assert axes[0].lines[1].get_xdata()[0] == d  # the chosen d is marked
    assert axes[1].lines[1].get_ydata()[0] == pytest.approx(reg_1d.sigma0_**2)
    assert axes[2].get_ylabel() == "contraction ratio c_j"


def test_plot_spectrum_posterior_and_classifier(plt, clf):
    axes = plot_spectrum(clf.posterior_)  # a bare posterior: d = K
    assert len(axes[2].lines[0].get_ydata()) == clf.posterior_.max_components
    _, given = plt.subplots(3, 1)
    axes = plot_spectrum(clf, ax=given, d=2)
    assert all(a is b for a, b in zip(axes, given, strict=True))
    np.testing.assert_allclose(axes[2].lines[0].get_ydata(), clf.posterior_.contraction(2).double().numpy(),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="3 Axes"):
        plot_spectrum(clf, ax=given[:2])
    with pytest.raises(ValueError, match="between 1 and K"):
        plot_spectrum(clf, d=99)
    with pytest.raises(NotFittedError):
        plot_spectrum(LaplaceActiveSubspaceClassifier())
    with pytest.raises(TypeError, match="ActiveSubspacePosterior"):
        plot_spectrum(np.ones(3))


# ----------------------------------------------------------------------------- activity


def test_plot_activity_estimator(plt, reg_2d):
    ax = plot_activity(reg_2d)
    d = reg_2d.n_components_
    kappa = reg_2d.posterior_.cumulative_activity(d).double().numpy()
    curve = ax.lines[0]
    ranks = np.asarray(curve.get_xdata())
    assert ranks[0] == 1 and ranks[-1] == kappa.size and np.all(np.diff(ranks) > 0)
    np.testing.assert_allclose(curve.get_ydata(), kappa[ranks - 1])
    assert curve.get_ydata()[-1] == pytest.approx(1.0)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert curve.get_label() == f"d = {d}"
    mark = ax.lines[1]  # top 0.1 % of D weights (one weight for this tiny net)
    assert mark.get_xdata()[0] == 1 and mark.get_ydata()[0] == pytest.approx(kappa[0])


def test_plot_activity_posterior_overlay(plt):
    net = torch.nn.Linear(6, 1, bias=False).double()
    P = torch.eye(6, 3, dtype=torch.float64)
    post = ActiveSubspacePosterior(net, torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64), P, beta=1.0)
    _, ax = plt.subplots()
    plot_activity(post, ax=ax, d=1, top_fraction=None)
    plot_activity(post, ax=ax, top_fraction=0.5, max_points=3)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), np.ones(6))
    np.testing.assert_allclose(ax.lines[1].get_xdata(), [1, 2, 6])  # log-spaced ranks, ends kept
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [4 / 7, 6 / 7, 1.0])
    np.testing.assert_allclose(ax.lines[2].get_ydata(), [1.0])  # top 3 of 6 weights hold everything
    assert [ln.get_label() for ln in ax.lines[:2]] == ["d = 1", "d = 3"]
    with pytest.raises(ValueError, match="max_points"):
        plot_activity(post, max_points=1)
    with pytest.raises(ValueError, match="top_fraction"):
        plot_activity(post, top_fraction=2.0)


# ----------------------------------------------------------------------------- displays


def test_coverage_display_holds_the_calibration_table(plt, reg_1d):
    disp = CoverageDisplay.from_estimator(reg_1d)
    table, d = reg_1d.calibration_, reg_1d.n_components_
    np.testing.assert_array_equal(disp.d, table["d"].to_numpy())
    np.testing.assert_array_equal(disp.coverage, table["coverage"].to_numpy())
    assert disp.line_ is disp.ax_.lines[0] and disp.figure_ is disp.ax_.figure
    np.testing.assert_array_equal(disp.line_.get_ydata(), table["coverage"].to_numpy())
    assert disp.target_line_.get_gid() == plotting._TARGET_GID
    np.testing.assert_allclose(disp.target_line_.get_ydata(), 0.9)
    assert disp.chosen_d == d and disp.chosen_marker_.get_xdata()[0] == d
    assert disp.chosen_marker_.get_ydata()[0] == pytest.approx(table.loc[table["d"] == d, "coverage"].iloc[0])
    # plot() draws the same numbers again, on a given Axes
    _, ax = plt.subplots()
    assert disp.plot(ax=ax, label="again") is disp and disp.ax_ is ax
    assert disp.line_.get_label() == "again"
    with pytest.raises(TypeError, match="from_result"):
        CoverageDisplay.from_estimator(reg_1d.calibration_)


def test_coverage_display_from_result_overlay_shares_the_target(plt, reg_1d, data_1d):
    res = _full_curve(reg_1d, data_1d, 0.8)
    first = CoverageDisplay.from_result(res, label="a")
    second = CoverageDisplay.from_result(res, ax=first.ax_, label="b")
    assert second.target_line_ is first.target_line_
    np.testing.assert_array_equal(second.line_.get_ydata(), res.table["coverage"].to_numpy())
    assert (first.chosen_marker_.get_label().startswith("chosen d") if res.reached
            else first.chosen_marker_.get_label().startswith("not reached"))
    with pytest.raises(TypeError, match="CalibrationResult"):
        CoverageDisplay.from_result(reg_1d)
    # a chosen d outside the curve draws no star; an empty curve is refused
    none = CoverageDisplay(d=[1, 2], coverage=[0.5, 0.7], confidence_level=0.9, chosen_d=5).plot()
    assert none.chosen_marker_ is None
    with pytest.raises(ValueError, match="empty"):
        CoverageDisplay(d=[], coverage=[], confidence_level=0.9, chosen_d=1).plot()


def test_interval_display_band_and_parity(plt, reg_1d, data_1d, reg_2d, data_2d):
    X, y = data_1d
    disp = IntervalDisplay.from_estimator(reg_1d, X, y)
    pred, pis = reg_1d.predict_interval(X)
    order = np.argsort(X[:, 0], kind="stable")
    np.testing.assert_allclose(disp.mean_line_.get_xdata(), X[order, 0])
    np.testing.assert_allclose(disp.mean_line_.get_ydata(), pred[order])
    np.testing.assert_allclose(disp.points_.get_offsets(), np.column_stack([X[:, 0], y]))
    band = disp.band_.get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(pis[:, 0, 0].min())
    assert band[:, 1].max() == pytest.approx(pis[:, 1, 0].max())
    assert disp.diagonal_ is None and disp.figure_ is disp.ax_.figure
    assert disp.coverage == pytest.approx(np.mean((y >= pis[:, 0, 0]) & (y <= pis[:, 1, 0])))
    assert f"{disp.coverage:.1%}" in disp.ax_.get_title()

    X2, y2 = data_2d
    disp = IntervalDisplay.from_estimator(reg_2d, X2, y2, confidence_level=0.5)
    pred, pis = reg_2d.predict_interval(X2, confidence_level=0.5)
    segments = np.asarray(disp.band_.get_segments())
    np.testing.assert_allclose(segments[:, 0, 0], pred)
    np.testing.assert_allclose(segments[:, 0, 1], pis[:, 0, 0])
    np.testing.assert_allclose(segments[:, 1, 1], pis[:, 1, 0])
    lims = [min(pred.min(), y2.min(), pis.min()), max(pred.max(), y2.max(), pis.max())]
    np.testing.assert_allclose(disp.diagonal_.get_xdata(), lims)
    assert disp.mean_line_ is None

    # from numbers: coverage by hand (bounds count as inside), and no d in the title when none is given
    disp = IntervalDisplay(y_true=[0.0, 1.0, 5.0, -2.0], y_pred=[0.0, 0.5, 1.0, 0.0], y_lower=[-1, 0, 0, -1],
                           y_upper=[1, 1, 2, 1], confidence_level=0.8, interval_of="y").plot()
    assert disp.coverage == 0.5
    assert disp.ax_.get_title() == "50.0% of 4 points inside the 80 % intervals"
    assert "80 % interval for y" in [t.get_text() for t in disp.ax_.get_legend().get_texts()]


def test_spectrum_display_holds_the_posterior(plt, reg_1d, clf):
    disp = SpectrumDisplay.from_estimator(reg_1d)
    post, d = reg_1d.posterior_, reg_1d.n_components_
    assert disp.d == d and disp.d_is_chosen
    np.testing.assert_allclose(disp.eigenvalue_line_.get_ydata(), reg_1d.eigenvalues_, rtol=1e-6)
    np.testing.assert_allclose(disp.variance_line_.get_ydata(), post.variances(d).double().numpy(), rtol=1e-6)
    np.testing.assert_allclose(disp.contraction_line_.get_ydata(), post.contraction(d).double().numpy(), rtol=1e-6)
    assert disp.d_line_.get_xdata()[0] == d and disp.d_line_.get_label() == f"chosen d = {d}"
    assert disp.prior_line_.get_ydata()[0] == pytest.approx(reg_1d.sigma0_**2)
    assert disp.axes_.shape == (3,) and disp.figure_ is disp.axes_[0].figure
    bare = SpectrumDisplay.from_posterior(clf.posterior_, d=2)
    assert not bare.d_is_chosen and len(bare.contraction_line_.get_ydata()) == 2
    assert bare.sigma0 == pytest.approx(clf.posterior_.fit_sigma0(2))
    with pytest.raises(TypeError, match="from_estimator"):
        SpectrumDisplay.from_posterior(reg_1d)
    with pytest.raises(TypeError, match="from_posterior"):
        SpectrumDisplay.from_estimator(clf.posterior_)
    with pytest.raises(ValueError, match="between 1 and K"):
        SpectrumDisplay.from_estimator(clf, d=0)


def test_activity_display_holds_kappa(plt):
    net = torch.nn.Linear(6, 1, bias=False).double()
    P = torch.eye(6, 3, dtype=torch.float64)
    post = ActiveSubspacePosterior(net, torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64), P, beta=1.0)
    # activity ν = (4, 2, 1, 0, 0, 0): κ = (4/7, 6/7, 1, 1, 1, 1); the top 1/3 of the weights (2) hold 6/7
    disp = ActivityDisplay.from_posterior(post, top_fraction=1 / 3)
    np.testing.assert_array_equal(disp.ranks, np.arange(1, 7))
    np.testing.assert_allclose(disp.line_.get_ydata(), [4 / 7, 6 / 7, 1, 1, 1, 1])
    assert disp.top_rank == 2 and disp.top_share == pytest.approx(6 / 7)
    assert disp.top_marker_.get_xdata()[0] == 2 and disp.top_marker_.get_ydata()[0] == pytest.approx(6 / 7)
    assert disp.line_.get_label() == "d = 3" and disp.figure_ is disp.ax_.figure
    light = ActivityDisplay.from_posterior(post, d=1, top_fraction=None, max_points=3)
    np.testing.assert_array_equal(light.line_.get_xdata(), [1, 2, 6])
    assert light.top_marker_ is None
    with pytest.raises(TypeError, match="ActivityDisplay.from_posterior"):
        ActivityDisplay.from_estimator(post)


def test_conformal_estimator_has_no_coverage_curve_over_d(plt, data_1d):
    settings = {k: v for k, v in TINY.items() if k not in ("calibration", "posterior")}
    conformal = _fit_quietly(LaplaceActiveSubspaceRegressor(**grouped(**settings)), *data_1d)
    with pytest.raises(ValueError, match="calibration='mondrian'"):
        CoverageDisplay.from_estimator(conformal)
    X, y = data_1d
    plot_intervals(conformal, X, y)  # the intervals themselves plot as for any estimator
