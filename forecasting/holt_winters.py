"""Holt-Winters with an additive daily season, fitted by statsmodels `ExponentialSmoothing`.

statsmodels' Holt-Winters results cannot be extended with new data, so after the fit this
module keeps the fitted smoothing weights, the final level and the next day of seasonal
terms, and runs the additive Holt-Winters recursion itself: O(1) per window. A missing
window advances the season without correcting the level. Holt-Winters cannot skip missing
windows during the fit, so gaps between observed windows are linearly interpolated for the
fit only; the fit ends at the last observed window, and a gap after it advances the season.

The upper bound uses the ETS(A,N,A) forecast variance, sigma^2 * (1 + (h-1) * alpha^2) for
horizons shorter than a day, with sigma from the one-step in-sample residuals.

The fit uses `method="least_squares"`: on the ServeGen traces the default L-BFGS-B stops
without converging, while least squares converges to a lower error in about the same time.
"""

from __future__ import annotations

import collections
import math
import warnings
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd
from statsmodels.tsa.holtwinters import ExponentialSmoothing

from forecasting.errors import FitFailed, FlatSeries
from forecasting.grid import GridForecaster
from forecasting.series import FloatArray, Windows


class HoltWinters(GridForecaster):
    """Level + additive daily season; no trend term (see docs/forecasting.md)."""

    name = "holt_winters"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._z = NormalDist().inv_cdf(self.quantile)
        self._level = math.nan
        self._season: collections.deque[float] = collections.deque()
        self._alpha = math.nan
        self._gamma = math.nan
        self._sigma = math.nan

    def _fit_windows(self, values: FloatArray) -> None:
        observed = self._require_history(values, min_windows=2 * self.season_windows)
        if float(np.ptp(observed)) <= 1e-9 * float(np.max(np.abs(observed))):
            raise FlatSeries(f"all {observed.size} observed windows equal {observed[0]:g}")
        # Fitted from the first observed window to the last: a gap at either end filled
        # with a constant would be fitted as if it were traffic (a refit during a three-hour
        # Prometheus outage forecast 74 for 106). Inner gaps are interpolated; the trailing
        # gap advances the season afterwards, as missing windows do, so the forecasts stay
        # aligned with the last window.
        seen = np.flatnonzero(np.isfinite(values))
        trailing = values.size - 1 - int(seen[-1])
        values = values[int(seen[0]) : int(seen[-1]) + 1]
        filled = pd.Series(values).interpolate(limit_direction="both").to_numpy()
        model = ExponentialSmoothing(
            filled, trend=None, seasonal="add", seasonal_periods=self.season_windows
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence is checked below
            try:
                fitted = model.fit(method="least_squares")
            except (ValueError, np.linalg.LinAlgError) as err:
                raise FitFailed(f"Holt-Winters fit raised {type(err).__name__}: {err}") from err
        if not getattr(fitted.mle_retvals, "success", True):
            raise FitFailed("Holt-Winters fit did not converge")
        ahead = np.asarray(fitted.forecast(self.season_windows), dtype=np.float64)
        level = float(np.asarray(fitted.level)[-1])
        residuals = np.asarray(fitted.resid)[np.isfinite(values)]
        self._alpha = float(fitted.params["smoothing_level"])
        self._gamma = float(fitted.params["smoothing_seasonal"])
        self._sigma = float(np.sqrt(np.mean(residuals**2)))
        if not all(map(math.isfinite, [level, self._alpha, self._gamma, self._sigma])):
            raise FitFailed("Holt-Winters fit gave non-finite parameters")
        self._level = level
        self._season = collections.deque((ahead - level).tolist())
        self._season.rotate(-trailing)

    def _extend_windows(self, windows: Windows) -> None:
        for value in windows.values.tolist():
            season = self._season.popleft()
            if math.isfinite(value):
                previous = self._level
                self._level = self._alpha * (value - season) + (1 - self._alpha) * previous
                season = self._gamma * (value - previous) + (1 - self._gamma) * season
            self._season.append(season)

    def _model_forecast(self, steps: int) -> tuple[float, float]:
        point = self._level + self._season[(steps - 1) % len(self._season)]
        spread = self._sigma * math.sqrt(1 + (steps - 1) * self._alpha**2)
        return point, point + self._z * spread
