"""The two baselines every model must beat: persistence and seasonal-naive.

Their upper bounds are empirical: the forecast plus the `quantile` of the baseline's own
past errors at the same horizon over the kept history.
"""

from __future__ import annotations

from forecasting.errors import InsufficientHistory
from forecasting.grid import GridForecaster
from forecasting.history import upper_quantile_of_errors
from forecasting.series import FloatArray, Windows


class Persistence(GridForecaster):
    """The last observed window value, whatever the horizon."""

    name = "persistence"

    def _fit_windows(self, values: FloatArray) -> None:
        self._require_history(values, min_windows=1)

    def _extend_windows(self, windows: Windows) -> None:
        pass

    def _model_forecast(self, steps: int) -> tuple[float, float]:
        last = self._history.last_observed()
        if last is None:
            raise InsufficientHistory("every kept window is missing")
        return self._persistence(steps, last)


class SeasonalNaive(GridForecaster):
    """The value of the same window one day earlier (the most recent such day)."""

    name = "seasonal_naive"

    def _fit_windows(self, values: FloatArray) -> None:
        self._require_history(values, min_windows=self.season_windows)

    def _extend_windows(self, windows: Windows) -> None:
        pass

    def _model_forecast(self, steps: int) -> tuple[float, float]:
        values = self._history.array()
        season = self.season_windows
        # Target is index len+steps-1; go back whole seasons until it lands in the history.
        back = season * -(-steps // season)
        source = values.size - 1 + steps - back
        if source < 0:
            raise InsufficientHistory("history is shorter than one day")
        point = float(values[source])
        if point != point:  # NaN: that window a day ago was missing
            raise InsufficientHistory("the window one day before the target is missing")
        margin = upper_quantile_of_errors(values[back:], values[:-back], quantile=self.quantile)
        return point, point + margin
