"""A state-space model with a daily cycle: local level plus trigonometric seasonality.

statsmodels `UnobservedComponents(level="llevel", freq_seasonal=[daily, k harmonics])`.
The Kalman filter skips missing windows natively, so gaps stay gaps. With k harmonics the
state has 1 + 2k elements whatever the step, so one update (`results.extend`, which runs the
filter over the new windows only, starting from the last predicted state) costs O(1) per
observation, and a fit on 14 days of 5-minute windows takes well under a second.

The fit is kept small on purpose: fitted results over the whole history pickle to about
60 MB (smoother output), which is too much to ship back from a worker process, so the model
is fitted on all but the last window and then extended by that window. Only the extension,
a few tens of kilobytes, is kept.
"""

from __future__ import annotations

import math
import warnings
from statistics import NormalDist
from typing import Any

import numpy as np
from statsmodels.tsa.statespace.structural import UnobservedComponents

from forecasting.errors import FitFailed, FlatSeries
from forecasting.grid import GridForecaster
from forecasting.series import FloatArray, Windows

DEFAULT_HARMONICS = 4
DEFAULT_MAX_ITERATIONS = 50  # statsmodels' own default for its L-BFGS fit


class DailyStateSpace(GridForecaster):
    """Local level + daily trigonometric cycle, updated in O(1) per window."""

    name = "state_space"

    def __init__(
        self,
        *,
        harmonics: int = DEFAULT_HARMONICS,
        max_iterations: int = DEFAULT_MAX_ITERATIONS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if harmonics < 1 or max_iterations < 1:
            raise ValueError(
                f"harmonics and max_iterations must be >= 1, got {harmonics}, {max_iterations}"
            )
        self.harmonics = harmonics
        self.max_iterations = max_iterations
        self._results: Any = None
        self._scale = 1.0  # the series' spread at the last fit: the model's unit
        self._z = NormalDist().inv_cdf(self.quantile)

    def _fit_windows(self, values: FloatArray) -> None:
        self._results = None
        # Two days so the daily cycle is seen twice, not just once.
        observed = self._require_history(values, min_windows=2 * self.season_windows)
        if float(np.ptp(observed)) <= 1e-9 * float(np.max(np.abs(observed))):
            raise FlatSeries(f"all {observed.size} observed windows equal {observed[0]:g}")
        harmonics = min(self.harmonics, self.season_windows // 2)
        # The optimizer's stopping test is not scale-free: on prompt tokens/s (around 1e5)
        # it stopped after 0-1 iterations at the starting parameters and still reported
        # convergence, with an upper bound twice as wide. The model is fitted in units of
        # the series' spread and its forecasts are scaled back.
        largest = float(np.max(np.abs(observed)))  # > 0: a flat series was refused above
        self._scale = largest * float(np.std(observed / largest))  # no overflow near 1e308
        model = UnobservedComponents(
            values[:-1] / self._scale,
            level="llevel",
            freq_seasonal=[{"period": self.season_windows, "harmonics": harmonics}],
        )
        with warnings.catch_warnings():
            # Non-convergence is checked below and reported as the fallback reason.
            warnings.simplefilter("ignore")
            try:
                # no parameter covariance: nothing reads it, and every `extend` added ~110
                # bytes of text about it to the results (unbounded between refits)
                fitted = model.fit(disp=False, maxiter=self.max_iterations, cov_type="none")
            except (ValueError, np.linalg.LinAlgError) as err:
                raise FitFailed(f"state-space fit raised {type(err).__name__}: {err}") from err
        retvals = fitted.mle_retvals
        if not retvals.get("converged", False) or retvals.get("iterations", 1) == 0:
            raise FitFailed("state-space fit did not converge")
        if not np.all(np.isfinite(fitted.params)):
            raise FitFailed("state-space fit gave non-finite parameters")
        self._results = fitted.extend(values[-1:] / self._scale)

    def _extend_windows(self, windows: Windows) -> None:
        self._results = self._results.extend(np.asarray(windows.values) / self._scale)

    def _model_forecast(self, steps: int) -> tuple[float, float]:
        prediction = self._results.get_forecast(steps)
        mean = float(np.asarray(prediction.predicted_mean)[-1]) * self._scale
        variance = float(np.asarray(prediction.var_pred_mean)[-1])
        if not (math.isfinite(variance) and variance >= 0):
            return mean, math.nan
        return mean, mean + self._z * math.sqrt(variance) * self._scale
