"""The default daily model, its point raised to a seasonal envelope of the last few days.

Traffic with a daily shape often steps up at roughly, not exactly, the same time each day
(the ServeGen traces: 1.5-3x steps around 09:00 that land in a different 10-minute window
from one day to the next). A point forecast smooths such steps away, and capacity ordered
from it arrives one lead time after the step. The envelope provisions for the step instead:
the highest demand within `slack_s` of the forecast time of day on each of the last `days`
days, scaled by today's level against theirs: the mean of the last `level_s` against the
mean of the same stretch on those days, at most 2x. An hour, not the last window, so one
dip or one missing window does not drop the envelope just before a step; no lower bound, so
a day whose traffic has stopped (a holiday, a model retired) does not keep capacity for the
peaks of the days before. The point is the larger of the model's point and the envelope;
the upper bound is at least the point.

This is a planning forecast, not an estimate of the mean: it is biased upwards on purpose,
and scores worse than `state_space` on accuracy (docs/forecasting.md). It buys SLO
attainment with capacity (docs/results.md). Below two days of history (what the state-space
model needs to fit), and whenever else the model cannot forecast (a failed fit, a flat
series), persistence stands in, as for `state_space`, and is raised to the envelope as the
model's point is; the envelope itself needs a day plus `level_s`, so below that persistence
stands in unraised.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forecasting.state_space import DailyStateSpace

DEFAULT_DAYS = 3
DEFAULT_SLACK_S = 600.0
DEFAULT_LEVEL_S = 3600.0
MAX_LEVEL_RATIO = 2.0


class SeasonalEnvelope(DailyStateSpace):
    name = "seasonal_envelope"

    def __init__(
        self,
        *,
        days: int = DEFAULT_DAYS,
        slack_s: float = DEFAULT_SLACK_S,
        level_s: float = DEFAULT_LEVEL_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if days < 1:
            raise ValueError(f"days must be >= 1, got {days}")
        if slack_s < 0 or level_s <= 0:
            raise ValueError(f"need slack_s >= 0 and level_s > 0, got {slack_s}, {level_s}")
        self.days = days
        self.slack_windows = round(slack_s / self.step_s)
        self.level_windows = max(1, round(level_s / self.step_s))

    def _model_forecast(self, steps: int) -> tuple[float, float]:
        return self._raised(*super()._model_forecast(steps), steps=steps)

    def _fallback(self, steps: int, last: float) -> tuple[float, float]:
        # Whatever keeps the model from forecasting (between one and two days of history,
        # above all), the past days' peaks are known: persistence is raised to them too.
        return self._raised(*super()._fallback(steps, last), steps=steps)

    def _raised(self, point: float, upper: float, *, steps: int) -> tuple[float, float]:
        envelope = self.envelope(steps)
        if envelope is None:
            return point, upper
        # a NaN point stays NaN (`forecast` then falls back); `_result` lifts the upper bound
        return max(point, envelope), upper

    def envelope(self, steps: int) -> float | None:
        """The seasonal envelope `steps` windows after the last one, or None without a full
        day of history (plus `level_s`) or with no observed value in the windows it reads."""
        values = self._history.array()
        last, season = values.size - 1, self.season_windows
        slack, level = self.slack_windows, self.level_windows
        recent = values[max(last - level + 1, 0) :]
        # Today's level and each day's are read at the windows both observed: a gap in
        # either compared part of an hour with all of it, a ramp's end with the whole ramp
        # (35 minutes missing today before a step raised the point by half on identical
        # days; the step's windows missing on the past days, by up to 2x).
        seen = np.isfinite(recent)
        peaks, levels, todays = [], [], []
        for day in range(1, self.days + 1):
            target = last + steps - day * season
            # only days whose whole window is history (a horizon near a day would reach
            # into today, already counted by the level ratio)
            if target - slack >= 0 and target + slack <= last:
                window = values[target - slack : target + slack + 1]
                if np.isfinite(window).any():
                    peaks.append(float(np.nanmax(window)))
            then = last - day * season
            if then - level + 1 >= 0:  # then `recent` is a whole hour too
                stretch = values[then - level + 1 : then + 1]
                both = seen & np.isfinite(stretch)
                if both.any():
                    levels.append(float(np.mean(stretch[both])))
                    todays.append(float(np.mean(recent[both])))
        if not peaks or not levels:
            return None
        now_level, then_level = float(np.mean(todays)), float(np.mean(levels))
        if then_level <= 0:
            # idle at this hour on those days: as idle today, their step is today's too;
            # busier today, as much busier as allowed
            ratio = 1.0 if now_level <= 0 else MAX_LEVEL_RATIO
        else:
            ratio = min(now_level / then_level, MAX_LEVEL_RATIO)
        return max(peaks) * ratio
