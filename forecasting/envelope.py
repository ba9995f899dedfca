"""The default daily model, its point raised to a seasonal envelope of the last few days.

Traffic with a daily shape often steps up at roughly, not exactly, the same time each day
(the ServeGen traces: 1.5-3x steps around 09:00 that land in a different 10-minute window
from one day to the next). A point forecast smooths such steps away, and capacity ordered
from it arrives one lead time after the step. The envelope provisions for the step instead:
the highest of the demand peaks within `slack_s` of the forecast time of day on each of the
last `days` days, each scaled by today's level against that day's: the mean of the last
`level_s` against the mean of the same stretch on that day, at most 2x. Scaled day by day, a
quiet day among them (a holiday, an outage) lowers its own peak's weight instead of raising
the busiest day's, and growth already in a recent day's peak is not counted twice. An hour,
not the last window, so one dip or one missing window does not drop the envelope just before
a step; no lower bound, so a day whose traffic has stopped (a holiday, a model retired) does
not keep capacity for the peaks of the days before. The point is the larger of the model's
point and the envelope; the upper bound is at least the point.

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

DEFAULT_DAYS = 4
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
        raised = []
        for day in range(1, self.days + 1):
            target = last + steps - day * season
            then = last - day * season
            # only days whose whole window is history (a horizon near a day would reach
            # into today, already counted by the level ratio), and whose hour before is too
            # (then `recent` is a whole hour as well)
            if target - slack < 0 or target + slack > last or then - level + 1 < 0:
                continue
            window = values[target - slack : target + slack + 1]
            stretch = values[then - level + 1 : then + 1]
            both = seen & np.isfinite(stretch)
            if not np.isfinite(window).any() or not both.any():
                continue
            peak = float(np.nanmax(window))
            raised.append(
                peak * _level_ratio(float(np.mean(recent[both])), float(np.mean(stretch[both])))
            )
        return max(raised) if raised else None


def _level_ratio(now_level: float, then_level: float) -> float:
    """Today's level over one past day's, at most `MAX_LEVEL_RATIO`. Each day's peak is
    scaled by its own ratio: the busiest day's peak over the mean level of all the days
    (a quiet one among them: a holiday, an outage) raised it by up to 2x."""
    if then_level <= 0:
        # idle at this hour on that day: as idle today, its step is today's too; busier
        # today, as much busier as allowed
        return 1.0 if now_level <= 0 else MAX_LEVEL_RATIO
    return min(now_level / then_level, MAX_LEVEL_RATIO)
