"""One demand forecaster per component, back-filled from Prometheus and fitted off the loop.

The tick records each component's demand (`record`), reads a forecast one lead time ahead
(`forecast`) and lets the fitter collect finished fits and submit due ones (`tick`); none of
these wait. Fitting happens in an executor (a process pool in production, see
`forecasting.fitter` for why) on a slower cadence than the tick.

History is back-filled from Prometheus range queries when a component is first seen, in a
background task outside the tick's deadline. While a component's back-fill runs, its tick
observations are held back and appended after the back-filled history, so the series never
goes back in time. Missing demand is recorded as NaN: time moves on, the window stays
missing, never zero.

One back-fill runs at a time. Its range queries read every pod of the fleet (they have no
pod filter, so their number does not grow with the components), so components first seen
while one runs wait and are read together by the next, not one fleet-wide read per tick
that saw a new LWS.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from autoscaler.adapters.prometheus_source import PrometheusSource
from autoscaler.core.model import Component, ComponentKey, Forecast
from forecasting.fitter import BackgroundFitter
from forecasting.grid import DEFAULT_MAX_HISTORY_S
from forecasting.models import PLANNING_MODEL, make_forecaster

log = logging.getLogger(__name__)

DEFAULT_STEP_S = 300.0
DEFAULT_REFIT_INTERVAL_S = 900.0
BACKFILL_STEP_S = 60.0
# A back-fill whose every range query failed is tried again every minute. While they get no
# answer (or a 5xx, a 429, a store still coming up) and no live demand is read either,
# Prometheus is down (restarting with the cluster, replaying its WAL for a quarter of an
# hour) and it is tried until it answers. Ten tries that Prometheus refused (too many
# samples, too heavy to finish: `prometheus_backfill.refused`), or ten tries with live
# demand read meanwhile, and it gives up and forecasts from live data only. The component
# forecasts nothing meanwhile.
BACKFILL_ATTEMPTS = 10
BACKFILL_RETRY_S = 60.0
# Histories fed to their forecasters between two turns of the event loop: 2,000 components'
# week of history held it for 3 s at once.
HISTORIES_BETWEEN_YIELDS = 50
# Past this long without a demand reading, no forecast is given for a component with gangs.
STALE_DEMAND_S = 3600.0
# Fits queued on the one fit worker at a time, collected at the next tick. A fit takes about
# 0.3 s on 7 days of 5-minute windows and 1 s on 14 (docs/forecasting.md), so 8 keep the
# worker busy for 2-8 s of each 15 s tick: 2,000 components get their first fitted model about
# an hour after a start with a week of back-fill (one fit per tick took over 8 hours).
DEFAULT_FITS_IN_FLIGHT = 8
# A fit normally returns within seconds of its submission (8 queued fits of at most about a
# second each); one that has not after 5 minutes is hung, and its worker is replaced.
DEFAULT_FIT_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class ForecastStatus:
    """What `/decisions` shows about one component's forecaster."""

    model: str
    backfilled: bool
    backfill_error: str | None
    fits_completed: int
    last_fit_error: str | None
    # why no forecast is given although the model has one (demand unseen for too long)
    withheld: str | None = None


class DemandForecasts:
    """Forecasters by component; every method is cheap enough for the tick except `backfill`."""

    def __init__(
        self,
        *,
        executor: Executor,
        model: str = PLANNING_MODEL,
        step_s: float = DEFAULT_STEP_S,
        refit_interval_s: float = DEFAULT_REFIT_INTERVAL_S,
        backfill_days: float = 7.0,
        backfill_step_s: float = BACKFILL_STEP_S,
        backfill_attempts: int = BACKFILL_ATTEMPTS,
        backfill_retry_s: float = BACKFILL_RETRY_S,
        stale_demand_s: float = STALE_DEMAND_S,
        max_fits_in_flight: int = DEFAULT_FITS_IN_FLIGHT,
        fit_timeout_s: float = DEFAULT_FIT_TIMEOUT_S,
        replace_executor: Callable[[Executor], Executor] | None = None,
    ) -> None:
        self.model = model
        self.step_s = step_s
        self.backfill_days = backfill_days
        # the demand history a forecaster keeps: reading more (`--backfill-days` goes to 90
        # for the learned-capacity lookup) would only be dropped, after costing its memory
        self._demand_days = min(backfill_days, DEFAULT_MAX_HISTORY_S / 86_400.0)
        self.backfill_step_s = backfill_step_s
        self.backfill_attempts = max(1, backfill_attempts)
        self.backfill_retry_s = backfill_retry_s
        self.stale_demand_s = stale_demand_s
        # A partial of a module-level function: it must pickle into a process pool.
        self._fitter: BackgroundFitter[ComponentKey] = BackgroundFitter(
            make_forecaster=functools.partial(make_forecaster, model, step_s=step_s),
            executor=executor,
            refit_interval_s=refit_interval_s,
            max_fits_in_flight=max_fits_in_flight,
            fit_timeout_s=fit_timeout_s,
            replace_executor=replace_executor,
        )
        self._known: set[ComponentKey] = set()
        # when each component's demand was last read (a finite value), live or back-filled
        self._last_demand_s: dict[ComponentKey, float] = {}
        # components whose observations the model refuses now (a clock step back): said once
        self._refused: set[ComponentKey] = set()
        self._withheld: dict[ComponentKey, str] = {}
        # what each component's demand series measures (`keep_only`)
        self._identity: dict[ComponentKey, Hashable] = {}
        self._pending: dict[ComponentKey, list[tuple[float, float]]] = {}
        self._backfill_errors: dict[ComponentKey, str] = {}
        # components whose back-fill read nothing: every range query failed for good
        self._no_history: set[ComponentKey] = set()
        # components first seen while a back-fill ran, for the next one, and when the first
        # of them was seen (the next back-fill's history ends there, before any held tick)
        self._queued: dict[ComponentKey, Component] = {}
        self._queued_end_s: float | None = None
        self._running: asyncio.Task[None] | None = None
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()

    def keep_only(self, identities: Mapping[ComponentKey, Hashable]) -> list[ComponentKey]:
        """Forget the components not in `identities` (deleted, opted out, held without a
        policy) and those whose identity changed (its demand query another one: a new
        `component` kind measures another unit). A forgotten component is back-filled
        afresh when it is seen again. Returns the forgotten keys.

        Before, a deleted component's history stayed in memory and was refitted every
        refit interval, taking fit slots from live components."""
        forgotten = [
            key
            for key in self._known | set(self._identity)
            if key not in identities
            or (key in self._identity and self._identity[key] != identities[key])
        ]
        for key in forgotten:
            self._identity.pop(key, None)
            self._forget(key)
        self._identity.update(identities)
        return forgotten

    def _forget(self, key: ComponentKey) -> None:
        """Drop a component's history and model; `start_backfill` reads it afresh."""
        self._last_demand_s.pop(key, None)
        self._refused.discard(key)
        self._withheld.pop(key, None)
        self._known.discard(key)
        self._pending.pop(key, None)
        self._backfill_errors.pop(key, None)
        self._no_history.discard(key)
        self._queued.pop(key, None)
        self._fitter.forget(key)

    # -- back-fill ------------------------------------------------------------------------

    def start_backfill(
        self,
        source: PrometheusSource,
        components: Iterable[tuple[ComponentKey, Component]],
        *,
        now_s: float,
    ) -> int:
        """Back-fill every component not seen before, in the background; returns how many.
        While a back-fill runs, they wait for the next one."""
        new = [(key, kind) for key, kind in components if key not in self._known]
        if not new:
            return 0
        for key, kind in new:
            self._known.add(key)
            self._pending[key] = []
            self._queued[key] = kind
        if self._queued_end_s is None:
            self._queued_end_s = now_s
        if self._running is None:
            self._start_next(source)
        return len(new)

    def _start_next(self, source: PrometheusSource) -> None:
        """Start a back-fill of the queued components (those still waiting for one)."""
        self._running = None
        batch = [(key, kind) for key, kind in self._queued.items() if key in self._pending]
        end_s = self._queued_end_s
        self._queued = {}
        self._queued_end_s = None
        if not batch or end_s is None or self._closing:
            return
        task = asyncio.create_task(self._backfill(source, batch, end_s=end_s), name="backfill")
        self._running = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._start_next(source))

    def _live_demand_read(self, keys: Iterable[ComponentKey]) -> bool:
        """Whether a tick has read a demand of any of `keys` since its back-fill began."""
        return any(math.isfinite(v) for key in keys for _, v in self._pending.get(key, ()))

    async def _backfill(
        self,
        source: PrometheusSource,
        components: list[tuple[ComponentKey, Component]],
        *,
        end_s: float,
    ) -> None:
        keys = [key for key, _ in components]
        # A key forgotten (and perhaps seen again) while this ran is no longer this
        # back-fill's: its held list is another one, or none.
        held_lists = {key: self._pending[key] for key in keys}

        def still_ours(key: ComponentKey) -> bool:
            return self._pending.get(key) is held_lists[key]

        try:
            if self.backfill_days > 0:
                result = await source.backfill_demand(
                    components, end_s=end_s, days=self._demand_days, step_s=self.backfill_step_s
                )
                attempt = 1
                refusals = int(result.chunks_refused > 0)
                while result.chunks_total and result.chunks_failed == result.chunks_total:
                    ours = list(filter(still_ours, keys))
                    if not ours:
                        return
                    if refusals >= self.backfill_attempts or (
                        attempt >= self.backfill_attempts and self._live_demand_read(ours)
                    ):
                        break  # Prometheus answers; it will not run the range queries
                    # Prometheus down (restarted with the service, say): try again while the
                    # live ticks wait in `_pending`, since history cannot be added behind them
                    for key in ours:
                        self._backfill_errors[key] = (
                            f"all {result.chunks_total} range queries failed; "
                            f"retrying in {self.backfill_retry_s:g}s (attempt {attempt + 1}; "
                            f"until Prometheus answers; {self.backfill_attempts} refused, or "
                            "with live demand read, and it stops)"
                        )
                    log.warning(
                        "demand back-fill of %d components failed (attempt %d): %s; retrying "
                        "in %gs",
                        len(ours),
                        attempt,
                        result.errors[0] if result.errors else "no answer",
                        self.backfill_retry_s,
                    )
                    await asyncio.sleep(self.backfill_retry_s)
                    attempt += 1
                    result = await source.backfill_demand(
                        components,
                        end_s=end_s,
                        days=self._demand_days,
                        step_s=self.backfill_step_s,
                    )
                    refusals += result.chunks_refused > 0
                read_nothing = (
                    result.chunks_total > 0 and result.chunks_failed == result.chunks_total
                )
                for key in filter(still_ours, keys):
                    self._backfill_errors.pop(key, None)
                for count, (key, history) in enumerate(result.histories.items(), start=1):
                    if count % HISTORIES_BETWEEN_YIELDS == 0:
                        await asyncio.sleep(0)  # the ticks, probes and Lease go on meanwhile
                    if not still_ours(key):
                        continue
                    if read_nothing:
                        self._no_history.add(key)
                        self._backfill_errors[key] = (
                            f"all {result.chunks_total} range queries failed {attempt} times "
                            f"({result.errors[0] if result.errors else 'no answer'}); "
                            "forecasting from live data only"
                        )
                        continue
                    self._observe(key, history.timestamps_s.tolist(), history.values.tolist())
                    seen = history.timestamps_s[np.isfinite(history.values)]
                    if seen.size:
                        self._last_demand_s.setdefault(key, float(seen[-1]))
                    if result.chunks_failed:
                        self._backfill_errors[key] = (
                            f"{result.chunks_failed} of {result.chunks_total} range queries "
                            "failed; those days are missing"
                        )
                log.info(
                    "back-filled demand history of %d components (%d range queries, %d failed)",
                    len(keys),
                    result.chunks_total,
                    result.chunks_failed,
                )
        except Exception as err:  # a failed back-fill costs history, never the service
            log.warning("demand back-fill failed: %r; forecasting from live data only", err)
            for key in filter(still_ours, keys):
                self._backfill_errors[key] = repr(err)
        finally:
            for key in keys:
                if not still_ours(key):
                    continue
                held = self._pending.pop(key)
                for t, v in held:
                    self._observe(key, [t], [v])

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- per tick -------------------------------------------------------------------------

    def record(self, key: ComponentKey, *, now_s: float, demand: float | None) -> None:
        """This tick's demand (None: missing, recorded as NaN so the window stays missing).

        A wall clock stepped back (after a step forward: an NTP correction) leaves the
        model's windows ahead of every new reading, which is dropped until the clock has
        caught up. Behind by more than `stale_demand_s`, that lost live demand for hours
        while the model forecast for the wrong time of day, and nothing said so: the
        component's history is dropped instead, and back-filled afresh at the next tick. A
        step of minutes only drops readings: dropping the history of every component at
        once would leave the fleet without forecasts until its back-fills and fits end."""
        value = math.nan if demand is None else float(demand)
        pending = self._pending.get(key)
        if pending is not None:
            if (
                math.isnan(value)
                and pending
                and math.isnan(pending[-1][1])
                and pending[-1][0] // self.step_s == now_s // self.step_s
            ):
                # one missing reading marks a window missing: a Prometheus down for a day
                # holds 288 of them per component, not 5,760
                return
            pending.append((now_s, value))
            if math.isfinite(value):
                self._last_demand_s[key] = now_s
            return
        last_end_s = self._fitter.last_window_end_s(key)
        if last_end_s is not None and now_s < last_end_s - self.stale_demand_s:
            log.warning(
                "the clock went back %.0fs behind %s's demand history: dropping it to "
                "back-fill it again",
                last_end_s - now_s,
                key,
            )
            self._forget(key)
            return
        self._known.add(key)
        if self._observe(key, [now_s], [value]) and math.isfinite(value):
            self._last_demand_s[key] = now_s

    def _observe(self, key: ComponentKey, timestamps_s: list[float], values: list[float]) -> bool:
        """Feed observations to the key's model; False when they were dropped."""
        try:
            self._fitter.observe(key, timestamps_s, values)
        except ValueError as err:
            # A wall clock stepping back within a window: drop the observation, not the model.
            # Said once until one is taken again: a step of minutes drops one a tick, and at
            # hundreds of components that was thousands of lines.
            if key not in self._refused:
                self._refused.add(key)
                log.warning(
                    "dropped demand observation of %s: %s (and any more until the clock "
                    "passes the history's end)",
                    key,
                    err,
                )
            return False
        self._refused.discard(key)
        return True

    def tick(self, *, now_s: float) -> int:
        """Collect finished fits and submit due ones (never waits); returns how many fits
        were abandoned as hung in this call."""
        before = self._fitter.fits_abandoned
        self._fitter.tick(now_s=now_s)
        return self._fitter.fits_abandoned - before

    def model_horizon_s(self, key: ComponentKey, *, horizon_s: float, now_s: float) -> float:
        """The horizon to ask the model for so that it looks `horizon_s` past `now_s`.

        The model's horizon starts at the end of its last closed window, which trails `now_s`
        by up to one step; without the gap a lead time of 5 minutes would look up to a step
        short.
        """
        last_end_s = self._fitter.last_window_end_s(key)
        behind_s = 0.0 if last_end_s is None else min(max(now_s - last_end_s, 0.0), self.step_s)
        return horizon_s + behind_s

    def forecast(
        self, key: ComponentKey, *, horizon_s: float, now_s: float, at_zero: bool = False
    ) -> Forecast | None:
        """Demand `horizon_s` after `now_s`; None when demand has not been read for longer
        than `stale_demand_s`, unless the component is `at_zero`.

        Missing demand still closes windows (as gaps), so a model keeps forecasting from
        days-old data with nothing to say so: a demand query broken by a server upgrade
        would have the floor and the balloons follow the last week for good. At zero gangs
        no demand can be read at all, and the forecast is what brings the component back.
        """
        self._withheld.pop(key, None)
        last_s = self._last_demand_s.get(key)
        if not at_zero and last_s is not None and now_s - last_s > self.stale_demand_s:
            self._withheld[key] = (
                f"no demand read for {now_s - last_s:.0f}s (limit {self.stale_demand_s:g}s): "
                "no forecast until it is read again"
            )
            return None
        result = self._fitter.forecast(
            key, self.model_horizon_s(key, horizon_s=horizon_s, now_s=now_s)
        )
        if result is None:
            return None
        return Forecast(
            point=result.point,
            upper=result.upper,
            horizon_s=horizon_s,  # from now, which is what the plan reasons with
            fallback_reason=result.fallback_reason,
        )

    def status(self, key: ComponentKey) -> ForecastStatus:
        return ForecastStatus(
            model=self.model,
            backfilled=key in self._known
            and key not in self._pending
            and key not in self._no_history,
            backfill_error=self._backfill_errors.get(key),
            fits_completed=self._fitter.fits_completed(key),
            last_fit_error=self._fitter.last_fit_error(key),
            withheld=self._withheld.get(key),
        )
