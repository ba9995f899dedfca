"""The default daily model, its point raised to a seasonal envelope of the last few days.

Traffic with a daily shape often steps up at roughly, not exactly, the same time each day
(the ServeGen traces: 1.5-3x steps around 09:00 that land in a different 10-minute window
from one day to the next). A point forecast smooths such steps away, and capacity ordered
from it arrives one lead time after the step. The envelope provisions for the step instead:
the highest demand within `slack_s` of the forecast time of day on each of the last `days`
days, scaled by how the latest window compares with those days at the same time (clamped to
`0.5-2x`, so one odd window cannot swing it far). The point is the larger of the model's
point and the envelope; the upper bound is at least the point.

This is a planning forecast, not an estimate of the mean: it is biased upwards on purpose,
and scores worse than `state_space` on accuracy (docs/forecasting.md). It buys SLO
attainment with capacity (docs/results.md). With less than one day of history it is the
state-space model unchanged; without a fitted model, persistence stands in unraised.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from forecasting.state_space import DailyStateSpace

DEFAULT_DAYS = 3
DEFAULT_SLACK_S = 600.0
LEVEL_RATIO_BOUNDS = (0.5, 2.0)


class SeasonalEnvelope(DailyStateSpace):
    name = "seasonal_envelope"

    def __init__(
        self, *, days: int = DEFAULT_DAYS, slack_s: float = DEFAULT_SLACK_S, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if days < 1:
            raise ValueError(f"days must be >= 1, got {days}")
        if slack_s < 0:
            raise ValueError(f"slack_s must be >= 0, got {slack_s}")
        self.days = days
        self.slack_windows = round(slack_s / self.step_s)

    def _model_forecast(self, steps: int) -> tuple[float, float]:
        point, upper = super()._model_forecast(steps)
        envelope = self.envelope(steps)
        if envelope is None or not math.isfinite(point):
            return point, upper
        point = max(point, envelope)
        return point, max(point, upper) if math.isfinite(upper) else upper

    def envelope(self, steps: int) -> float | None:
        """The seasonal envelope `steps` windows after the last one, or None without a full
        day of history."""
        values = self._history.array()
        last, season, slack = values.size - 1, self.season_windows, self.slack_windows
        peaks, levels = [], []
        for day in range(1, self.days + 1):
            target = last + steps - day * season
            window = values[max(target - slack, 0) : min(target + slack + 1, values.size)]
            if target - slack >= 0 and np.isfinite(window).any():
                peaks.append(float(np.nanmax(window)))
            then = last - day * season
            if then >= 0 and math.isfinite(values[then]):
                levels.append(float(values[then]))
        latest = self._history.last_observed()
        if not peaks or not levels or latest is None or float(np.mean(levels)) <= 0:
            return None
        low, high = LEVEL_RATIO_BOUNDS
        ratio = min(max(float(latest) / float(np.mean(levels)), low), high)
        return max(peaks) * ratio
