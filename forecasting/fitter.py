"""Fitting forecasters off the event loop, staggered across many series.

The control loop calls `observe` with each tick's values (a cheap `update` of the current
model), `forecast` to read the latest model, and `tick(now_s)` once per tick. `tick` never
waits: it collects fits that have finished (swapping the new model in and replaying the
observations that arrived while it was fitting) and submits fits that are due to the
executor. At most `max_fits_in_flight` run at once; a series is refitted `refit_interval_s`
after its previous fit finished, so the fits of many series spread out over the interval
instead of all landing on one tick.

The fitter keeps no observations of its own. A fit starts from a copy of what the current
forecaster has already resampled (its closed windows and the open one, `GridForecaster.seen`),
and only the observations that arrive while a fit runs are held, to be replayed onto the new
model. Memory per series is the forecaster's window history (two weeks of 5-minute windows:
about 40 KiB) and its model, whatever the tick.

Use a process pool (`ProcessPoolExecutor(max_workers=1, mp_context=spawn)`): statsmodels'
optimizer and Kalman filter hold the GIL for long stretches, so a fit in a thread stalls the
loop (docs/forecasting.md has the measurement); a process runs on the other core and ships
back a fitted model of a few tens of kilobytes. A thread pool works too and suits tests.

A fit that has not returned `fit_timeout_s` after it was submitted is abandoned: its series
keeps the model it has and is refitted one refit interval later. One hung fit would
otherwise hold the only worker, and every later fit queued behind it, for good. With
`replace_executor` the fitter abandons the oldest overdue fit only (one worker runs fits in
the order submitted, so the others merely wait behind it), swaps the pool for a new one
(the function stops the old pool's worker, which ends the hung fit) and submits the other
fits that were in flight again at once. Without it (a thread cannot be stopped) every
overdue fit is abandoned.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable
from concurrent.futures import BrokenExecutor, Executor, Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from forecasting.grid import GridForecaster, SeenWindows
from forecasting.protocol import ForecastResult

log = logging.getLogger(__name__)

Key = TypeVar("Key", bound=Hashable)


def fit_forecaster(make: Callable[[], GridForecaster], seen: SeenWindows) -> GridForecaster:
    """Build and fit one forecaster; runs in the worker, so it must stay picklable."""
    forecaster = make()
    forecaster.fit_seen(seen)
    return forecaster


@dataclass
class _SeriesState:
    forecaster: GridForecaster
    last_timestamp_s: float | None = None
    fit_due_s: float = -math.inf
    in_flight: Future[GridForecaster] | None = None
    submitted_s: float = -math.inf
    submission: int = 0  # order of submission: one worker runs fits in this order
    # observations since the in-flight fit's snapshot, replayed onto the new model
    replay_timestamps_s: list[float] = field(default_factory=list)
    replay_values: list[float] = field(default_factory=list)
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
        fit_timeout_s: float = math.inf,
        replace_executor: Callable[[Executor], Executor] | None = None,
    ) -> None:
        if refit_interval_s <= 0 or max_fits_in_flight < 1 or not fit_timeout_s > 0:
            raise ValueError(
                "refit_interval_s and fit_timeout_s must be > 0, max_fits_in_flight >= 1"
            )
        self._make = make_forecaster
        self._executor = executor
        self.refit_interval_s = refit_interval_s
        self.max_fits_in_flight = max_fits_in_flight
        self.fit_timeout_s = fit_timeout_s
        self._replace_executor = replace_executor
        self._series: dict[Key, _SeriesState] = {}
        self.fits_abandoned = 0  # fits given up on after `fit_timeout_s`, since the start
        self.pools_replaced = 0  # worker pools replaced (a hung fit, or a dead worker)
        self._submissions = 0

    def observe(self, key: Key, timestamps_s: list[float], values: list[float]) -> None:
        """Record new observations of `key` and update its current model (cheap)."""
        state = self._series.get(key)
        if state is None:
            state = self._series[key] = _SeriesState(forecaster=self._make())
        if not len(timestamps_s):
            return
        last = state.last_timestamp_s
        if last is not None and timestamps_s[0] < last:
            raise ValueError(
                f"observations of {key!r} went back in time: {timestamps_s[0]} < {last}"
            )
        state.forecaster.update(timestamps_s, values)
        state.last_timestamp_s = float(timestamps_s[-1])
        if state.in_flight is not None:
            state.replay_timestamps_s.extend(float(t) for t in timestamps_s)
            state.replay_values.extend(float(v) for v in values)

    def forget(self, key: Key) -> None:
        """Drop `key`'s series and model: a fit still queued is cancelled, one running is
        left to finish and never collected."""
        state = self._series.pop(key, None)
        if state is not None and state.in_flight is not None:
            state.in_flight.cancel()

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
        """Collect finished fits, abandon overdue ones, then submit due ones; returns how
        many were submitted."""
        for key, state in self._series.items():
            if state.in_flight is not None and state.in_flight.done():
                self._collect(key, state, now_s=now_s)
        self._abandon_overdue(now_s=now_s)
        free = self.max_fits_in_flight - self.fits_in_flight
        due = sorted(
            (s.fit_due_s, i)
            for i, s in enumerate(self._series.values())
            if s.in_flight is None and s.fit_due_s <= now_s and s.last_timestamp_s is not None
        )
        states = list(self._series.values())
        submitted = 0
        for _, index in due[: max(0, free)]:
            state = states[index]
            try:
                state.in_flight = self._executor.submit(
                    fit_forecaster, self._make, state.forecaster.seen()
                )
                state.submitted_s = now_s
                self._submissions += 1
                state.submission = self._submissions
            except Exception as err:  # a shut-down or broken pool: keep serving, retry later
                state.last_fit_error = f"cannot submit the fit: {type(err).__name__}: {err}"
                state.fit_due_s = now_s + self.refit_interval_s
                log.warning("cannot submit a fit: %s", err)
                if isinstance(err, BrokenExecutor):
                    self._replace_broken(now_s=now_s)
                    state.fit_due_s = now_s  # on the new pool, at the next tick
                continue
            submitted += 1
        return submitted

    def _abandon_overdue(self, *, now_s: float) -> None:
        overdue = sorted(
            (s.submission, k)
            for k, s in self._series.items()
            if s.in_flight is not None and now_s - s.submitted_s > self.fit_timeout_s
        )
        if not overdue:
            return
        if self._replace_executor is not None:
            # One worker runs the fits in the order submitted: the hung one is the first;
            # the others only wait behind it, and go to the new pool.
            overdue = overdue[:1]
        for _, key in overdue:
            state = self._series[key]
            self._drop_fit(state, due_s=now_s + self.refit_interval_s)
            state.last_fit_error = (
                f"fit did not finish within {self.fit_timeout_s:g} s; keeping the previous model"
            )
            self.fits_abandoned += 1
            log.warning("fit of %r did not finish within %gs; abandoned", key, self.fit_timeout_s)
        self._replace_pool(now_s=now_s, why="to end a hung fit")

    def _replace_broken(self, *, now_s: float) -> None:
        """A pool whose worker died (an OOM kill) refuses every later fit: replace it, as a
        hung one is, or no model would be fitted again until a restart."""
        self._replace_pool(now_s=now_s, why="its worker died")

    def _replace_pool(self, *, now_s: float, why: str) -> None:
        """A new pool (when the owner gave a way to make one); the fits queued on the old
        one go to it at the next tick."""
        if self._replace_executor is None:
            return
        for state in self._series.values():
            if state.in_flight is not None:
                self._drop_fit(state, due_s=now_s)
        self._executor = self._replace_executor(self._executor)
        self.pools_replaced += 1
        log.warning("replaced the fit worker pool: %s", why)

    @staticmethod
    def _drop_fit(state: _SeriesState, *, due_s: float) -> None:
        assert state.in_flight is not None
        state.in_flight.cancel()
        state.in_flight = None
        state.fit_due_s = due_s
        # The current model has had these observations; they were kept for the new one.
        state.replay_timestamps_s, state.replay_values = [], []

    def _collect(self, key: Key, state: _SeriesState, *, now_s: float) -> None:
        future, state.in_flight = state.in_flight, None
        state.fit_due_s = now_s + self.refit_interval_s
        replay = state.replay_timestamps_s, state.replay_values
        state.replay_timestamps_s, state.replay_values = [], []
        assert future is not None
        try:
            fitted = future.result()
        except Exception as err:  # a broken worker must not stop the loop: keep the old model
            state.last_fit_error = f"{type(err).__name__}: {err}"
            log.warning("fit of %r failed; keeping the previous model: %s", key, err)
            if isinstance(err, BrokenExecutor):
                self._replace_broken(now_s=now_s)
                state.fit_due_s = now_s  # on the new pool, at the next tick
            return
        # Observations that arrived while the fit ran: replay them on the new model.
        if replay[0]:
            fitted.update(*replay)
        state.fits_completed += 1
        failed = fitted.model_unavailable_reason
        if failed is not None and state.forecaster.model_unavailable_reason is None:
            # A refit that did not converge would leave the series on its fallback
            # (persistence, without the seasonal envelope) until the next refit: keep the
            # model that worked, which has had every observation since.
            state.last_fit_error = f"{failed}; keeping the previous model"
            log.warning("refit of %r failed; keeping the previous model: %s", key, failed)
            return
        state.forecaster = fitted
        state.last_fit_error = failed
