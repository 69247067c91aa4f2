"""Diagnostic plots of a fitted GLAS model: calibration curve, intervals, spectrum, activity.

The plots follow scikit-learn's Display pattern: a ``*Display`` object holds the numbers of one plot, is
built with ``from_estimator`` (a fitted regressor or classifier) or ``from_result`` / ``from_posterior``,
and draws them with ``plot(ax=None)``, keeping the matplotlib artists it made as attributes ending in
``_`` (``ax_``, ``figure_``, ``line_``, ...) for restyling. The ``plot_*`` functions are shortcuts that build
the display and return its Axes, so plots can be combined with ordinary matplotlib calls.

- :class:`CoverageDisplay`, :func:`plot_calibration`: coverage of the calibration data against the
  subspace dimension d (paper Fig. 6).
- :class:`IntervalDisplay`, :func:`plot_intervals`: intervals over sorted x for 1-D inputs, else a parity
  plot (paper Fig. 3, 7).
- :class:`SpectrumDisplay`, :func:`plot_spectrum`: eigenvalues λ_j, posterior variances σ_j² and
  contraction ratios c_j (paper Fig. 13).
- :class:`ActivityDisplay`, :func:`plot_activity`: sorted cumulative activity share κ_i of the weights,
  log-log (paper Fig. 8).
- :class:`RegionalCoverageDisplay`: coverage and mean width of intervals per quantile bin of the predictive std
  σ̂(x) or of a column, with the worst-slab coverage (:mod:`glas_sklearn.regional_coverage`).

matplotlib is optional: it is imported only when something is drawn (``pip install glas-sklearn[plot]``).
"""

from ._axes import TARGET_GID as _TARGET_GID  # noqa: F401  (the gid of CoverageDisplay's target line)
from .activity import ActivityDisplay, plot_activity
from .coverage import CoverageDisplay, plot_calibration
from .intervals import IntervalDisplay, plot_intervals
from .regional import RegionalCoverageDisplay
from .spectrum import SpectrumDisplay, plot_spectrum

__all__ = [
    "ActivityDisplay",
    "CoverageDisplay",
    "IntervalDisplay",
    "RegionalCoverageDisplay",
    "SpectrumDisplay",
    "plot_activity",
    "plot_calibration",
    "plot_intervals",
    "plot_spectrum",
]
