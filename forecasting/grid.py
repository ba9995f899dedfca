"""The base every forecaster here builds on: windows, history, and the guards.

A subclass implements three hooks on closed window values: `_fit_windows` (may be slow and
may raise), `_extend_windows` (cheap) and `_model_forecast` (cheap). This class resamples
observations into windows, keeps a bounded history, and applies the guards: when the model
cannot be fitted (too short a history, all windows missing, a flat series, a fit that raised
or did not converge) or yields a non-finite value, persistence stands in and the result says
why. A forecast is never negative, NaN or Inf.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from forecasting.errors import FitFailed, ForecastingError, InsufficientHistory
from forecasting.history import WindowHistory, upper_quantile_of_errors
from forecasting.protocol import ForecastResult
from forecasting.series import FloatArray, Series, WindowAccumulator, Windows

DEFAULT_STEP_S = 300.0
DEFAULT_QUANTILE = 0.9
DAY_S = 86_400.0
DEFAULT_MAX_HISTORY_S = 14 * DAY_S
# The furthest a forecast reaches: a state-space forecast costs time and memory in its steps
# (10,000 hours at 5-minute windows took 2 s; 1,000,000 hours ran out of 24 GiB).
MAX_HORIZON_S = 7 * DAY_S


@dataclass(frozen=True, slots=True)
class SeenWindows:
    """Everything a forecaster has been fed, resampled: its closed windows and the sums of
    the one still open. A fit from it goes on exactly where the observations stopped, so a
    background fitter keeps no raw observations of its own."""

    history: WindowHistory
    accumulator: WindowAccumulator


class GridForecaster(abc.ABC):
    """A forecaster on a fixed grid of `step_s` windows, with a persistence fallback."""

    name: ClassVar[str]

    def __init__(
        self,
        *,
        step_s: float = DEFAULT_STEP_S,
        quantile: float = DEFAULT_QUANTILE,
        max_history_s: float = DEFAULT_MAX_HISTORY_S,
    ) -> None:
        if not 0.5 <= quantile < 1.0:
            raise ValueError(f"quantile must be in [0.5, 1), got {quantile}")
        self.step_s = float(step_s)
        self.quantile = float(quantile)
        self._accumulator = WindowAccumulator(step_s=self.step_s)
        self._history = WindowHistory(max_windows=max(2, int(max_history_s // self.step_s)))
        # Why the model cannot forecast right now; None when it can.
        self.model_unavailable_reason: str | None = "not fitted yet"
        # Forecasts by steps ahead until the next window closes or the model changes: the
        # loop asks every tick, the answer changes every `step_s` (a few minutes).
        self._forecasts: dict[int, tuple[float, float, str | None] | None] = {}

    @property
    def season_windows(self) -> int:
        """Windows in one day (the daily cycle the seasonal models follow)."""
        return max(1, round(DAY_S / self.step_s))

    @property
    def last_window_end_s(self) -> float | None:
        return self._history.last_end_s

    def seen(self) -> SeenWindows:
        """A copy of what this forecaster has been fed, for a fit elsewhere (`fit_seen`)."""
        return SeenWindows(self._history.copy(), self._accumulator.copy())

    def fit(self, history: Series) -> None:
        accumulator = WindowAccumulator(step_s=self.step_s)
        windows = WindowHistory(max_windows=self._history.max_windows)
        windows.extend(accumulator.push(history.timestamps_s, history.values))
        self.fit_seen(SeenWindows(windows, accumulator))

    def fit_seen(self, seen: SeenWindows) -> None:
        """Fit on windows resampled elsewhere (another forecaster's `seen()`); takes them over."""
        if seen.accumulator.step_s != self.step_s:
            raise ValueError(f"windows of {seen.accumulator.step_s:g} s, not {self.step_s:g} s")
        self._accumulator = seen.accumulator
        self._history = seen.history
        self._forecasts.clear()
        self.model_unavailable_reason = None
        try:
            self._fit_windows(self._history.array())
        except ForecastingError as err:
            self.model_unavailable_reason = str(err)
        except Exception as err:
            self.model_unavailable_reason = str(FitFailed(f"{type(err).__name__}: {err}"))

    def update(self, timestamps_s: npt.ArrayLike, values: npt.ArrayLike) -> None:
        windows = self._accumulator.push(timestamps_s, values)
        if windows.values.size == 0:
            return
        self._history.extend(windows)
        self._forecasts.clear()
        if self.model_unavailable_reason is not None:
            return
        try:
            self._extend_windows(windows)
        except Exception as err:
            self.model_unavailable_reason = f"update failed: {type(err).__name__}: {err}"

    def steps_ahead(self, horizon_s: float) -> int:
        if not (math.isfinite(horizon_s) and 0 <= horizon_s <= MAX_HORIZON_S):
            raise ValueError(
                f"horizon_s must be a finite number from 0 to {MAX_HORIZON_S:g} (7 days), "
                f"got {horizon_s}"
            )
        return max(1, math.ceil(horizon_s / self.step_s - 1e-9))

    def forecast(self, horizon_s: float) -> ForecastResult | None:
        steps = self.steps_ahead(horizon_s)
        if steps not in self._forecasts:
            self._forecasts[steps] = self._forecast_steps(steps)
        known = self._forecasts[steps]
        return None if known is None else self._result(*known[:2], horizon_s, known[2])

    def _forecast_steps(self, steps: int) -> tuple[float, float, str | None] | None:
        last = self._history.last_observed()
        if last is None:
            return None
        reason = self.model_unavailable_reason
        if reason is None:
            try:
                point, upper = self._model_forecast(steps)
            except ForecastingError as err:
                reason = str(err)
            else:
                if math.isfinite(point) and math.isfinite(upper):
                    return point, upper, None
                reason = "model forecast was not finite"
        point, upper = self._fallback(steps, last)
        if not math.isfinite(point):  # a fallback that overflows too (an envelope's raise)
            point, upper = self._persistence(steps, last)
            reason = f"{reason}; its fallback was not finite either: persistence"
        return point, upper, reason

    def _fallback(self, steps: int, last: float) -> tuple[float, float]:
        """What stands in while the model cannot forecast: persistence."""
        return self._persistence(steps, last)

    def _persistence(self, steps: int, last: float) -> tuple[float, float]:
        values = self._history.array()
        margin = upper_quantile_of_errors(values[steps:], values[:-steps], quantile=self.quantile)
        return last, last + margin

    def _result(
        self, point: float, upper: float, horizon_s: float, reason: str | None
    ) -> ForecastResult:
        point = max(0.0, point)
        # A baseline's point plus its error margin can overflow on absurd inputs.
        upper = max(point, upper) if math.isfinite(upper) else point
        return ForecastResult(
            point=point,
            upper=upper,
            quantile=self.quantile,
            horizon_s=float(horizon_s),
            fallback_reason=reason,
        )

    def _require_history(self, values: FloatArray, *, min_windows: int) -> FloatArray:
        """The finite values, or InsufficientHistory / FlatSeries naming the shortfall."""
        observed = values[np.isfinite(values)]
        if observed.size == 0:
            raise InsufficientHistory(f"all {values.size} windows are missing")
        if values.size < min_windows:
            raise InsufficientHistory(
                f"history is {values.size} windows of {self.step_s:g} s;"
                f" {self.name} needs at least {min_windows}"
            )
        if observed.size < min_windows:
            # Missing windows are no history: six missing days and one observed passed the
            # two-day minimum, and a daily cycle was fitted to a single day.
            raise InsufficientHistory(
                f"only {observed.size} of {values.size} windows observed;"
                f" {self.name} needs at least {min_windows}"
            )
        return observed

    @abc.abstractmethod
    def _fit_windows(self, values: FloatArray) -> None:
        """Fit on closed window values, oldest first (NaN = missing). May raise."""

    @abc.abstractmethod
    def _extend_windows(self, windows: Windows) -> None:
        """Advance the fitted model over newly closed windows."""

    @abc.abstractmethod
    def _model_forecast(self, steps: int) -> tuple[float, float]:
        """Point and upper bound `steps` windows ahead; may raise ForecastingError."""
