"""Fitting forecasters off the event loop, staggered across many series.

The control loop calls `observe` with each tick's values (a cheap `update` of the current
model), `forecast` to read the latest model, and `tick(now_s)` once per tick. `tick` never
waits: it collects fits that have finished (swapping the new model in and replaying the
observations that arrived while it was fitting) and submits fits that are due to the
executor. At most `max_fits_in_flight` run at once; a series is refitted `refit_interval_s`
after its previous fit finished, so the fits of many series spread out over the interval
instead of all landing on one tick.

Use a process pool (`ProcessPoolExecutor(max_workers=1, mp_context=spawn)`): statsmodels'
optimizer and Kalman filter hold the GIL for long stretches, so a fit in a thread stalls the
loop (docs/forecasting.md has the measurement); a process runs on the other core and ships
back a fitted model of a few tens of kilobytes. A thread pool works too and suits tests.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from forecasting.grid import DEFAULT_MAX_HISTORY_S, GridForecaster
from forecasting.protocol import ForecastResult
from forecasting.series import Series

log = logging.getLogger(__name__)

Key = TypeVar("Key", bound=Hashable)


def fit_forecaster(make: Callable[[], GridForecaster], history: Series) -> GridForecaster:
    """Build and fit one forecaster; runs in the worker, so it must stay picklable."""
    forecaster = make()
    forecaster.fit(history)
    return forecaster


@dataclass
class _SeriesState:
    forecaster: GridForecaster
    timestamps_s: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    dropped: int = 0  # observations trimmed from the front, so positions stay comparable
    fit_due_s: float = -math.inf
    in_flight: Future[GridForecaster] | None = None
    snapshot_end: int = 0  # absolute position of the end of the in-flight fit's history
    fits_completed: int = 0
    last_fit_error: str | None = None


class BackgroundFitter(Generic[Key]):
    """One forecaster per series key, refitted in `executor`, read without waiting."""

    def __init__(
        self,
        *,
        make_forecaster: Callable[[], GridForecaster],
        executor: Executor,
        refit_interval_s: float,
        max_fits_in_flight: int = 1,
        max_history_s: float = DEFAULT_MAX_HISTORY_S,
    ) -> None:
        if refit_interval_s <= 0 or max_fits_in_flight < 1:
            raise ValueError("refit_interval_s must be > 0 and max_fits_in_flight >= 1")
        self._make = make_forecaster
        self._executor = executor
        self.refit_interval_s = refit_interval_s
        self.max_fits_in_flight = max_fits_in_flight
        self.max_history_s = max_history_s
        self._series: dict[Key, _SeriesState] = {}

    def observe(self, key: Key, timestamps_s: list[float], values: list[float]) -> None:
        """Record new observations of `key` and update its current model (cheap)."""
        state = self._series.get(key)
        if state is None:
            state = self._series[key] = _SeriesState(forecaster=self._make())
        if state.timestamps_s and len(timestamps_s) and timestamps_s[0] < state.timestamps_s[-1]:
            raise ValueError(
                f"observations of {key!r} went back in time:"
                f" {timestamps_s[0]} < {state.timestamps_s[-1]}"
            )
        state.timestamps_s.extend(float(t) for t in timestamps_s)
        state.values.extend(float(v) for v in values)
        state.forecaster.update(timestamps_s, values)
        self._trim(state)

    def forecast(self, key: Key, horizon_s: float) -> ForecastResult | None:
        """The latest model's forecast; None for an unknown key or one with no data."""
        state = self._series.get(key)
        return None if state is None else state.forecaster.forecast(horizon_s)

    def last_window_end_s(self, key: Key) -> float | None:
        """End of the last closed window of `key`: where `forecast`'s horizon starts."""
        state = self._series.get(key)
        return None if state is None else state.forecaster.last_window_end_s

    def fits_completed(self, key: Key) -> int:
        state = self._series.get(key)
        return 0 if state is None else state.fits_completed

    def last_fit_error(self, key: Key) -> str | None:
        state = self._series.get(key)
        return None if state is None else state.last_fit_error

    @property
    def fits_in_flight(self) -> int:
        return sum(1 for s in self._series.values() if s.in_flight is not None)

    def tick(self, *, now_s: float) -> int:
        """Collect finished fits, then submit due ones; returns how many were submitted."""
        for key, state in self._series.items():
            if state.in_flight is not None and state.in_flight.done():
                self._collect(key, state, now_s=now_s)
        free = self.max_fits_in_flight - self.fits_in_flight
        due = sorted(
            (s.fit_due_s, i)
            for i, s in enumerate(self._series.values())
            if s.in_flight is None and s.fit_due_s <= now_s and s.timestamps_s
        )
        states = list(self._series.values())
        submitted = 0
        for _, index in due[: max(0, free)]:
            state = states[index]
            history = Series(np.array(state.timestamps_s), np.array(state.values))
            state.snapshot_end = state.dropped + len(state.timestamps_s)
            try:
                state.in_flight = self._executor.submit(fit_forecaster, self._make, history)
            except Exception as err:  # a shut-down or broken pool: keep serving, retry later
                state.last_fit_error = f"cannot submit the fit: {type(err).__name__}: {err}"
                state.fit_due_s = now_s + self.refit_interval_s
                log.warning("cannot submit a fit: %s", err)
                continue
            submitted += 1
        return submitted

    def _collect(self, key: Key, state: _SeriesState, *, now_s: float) -> None:
        future, state.in_flight = state.in_flight, None
        state.fit_due_s = now_s + self.refit_interval_s
        assert future is not None
        try:
            fitted = future.result()
        except Exception as err:  # a broken worker must not stop the loop: keep the old model
            state.last_fit_error = f"{type(err).__name__}: {err}"
            log.warning("fit of %r failed; keeping the previous model: %s", key, err)
            return
        # Observations that arrived while the fit ran: replay them on the new model.
        start = max(0, state.snapshot_end - state.dropped)
        if start < len(state.timestamps_s):
            fitted.update(state.timestamps_s[start:], state.values[start:])
        state.forecaster = fitted
        state.fits_completed += 1
        state.last_fit_error = fitted.model_unavailable_reason

    def _trim(self, state: _SeriesState) -> None:
        # Trim in chunks (10% slack) so trimming stays amortised O(1) per observation.
        if not state.timestamps_s:
            return
        oldest_kept = state.timestamps_s[-1] - self.max_history_s
        if state.timestamps_s[0] >= oldest_kept - 0.1 * self.max_history_s:
            return
        cut = bisect.bisect_left(state.timestamps_s, oldest_kept)
        if state.in_flight is not None:
            # Keep what the in-flight fit has not seen, so it can be replayed.
            cut = min(cut, max(0, state.snapshot_end - state.dropped))
        del state.timestamps_s[:cut]
        del state.values[:cut]
        state.dropped += cut
