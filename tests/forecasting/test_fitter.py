"""The off-loop fitter: the loop keeps ticking while a slow fit runs in a worker process."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest

from autoscaler.service.app import fit_executor, replace_fit_executor
from forecasting.baselines import Persistence
from forecasting.fitter import BackgroundFitter
from forecasting.models import make_forecaster
from forecasting.series import Series
from forecasting.state_space import DailyStateSpace
from tests.forecasting.traces import servegen_rates

FIVE_MIN_S = 300.0
SLOW_FIT_S = 1.5


class SlowStateSpace(DailyStateSpace):
    """The real state-space model with a deliberately slow fit."""

    def _fit_windows(self, values):  # type: ignore[no-untyped-def]
        time.sleep(SLOW_FIT_S)
        super()._fit_windows(values)


def make_slow() -> SlowStateSpace:
    return SlowStateSpace(step_s=FIVE_MIN_S)


def five_minute_m_small(days: int) -> tuple[np.ndarray, np.ndarray]:
    """servegen_m-small rows 0..days*144-1, each 600 s window split into two 300 s halves
    carrying the window's mean rate (the shared multi-day traces are 10-minute means)."""
    rates = np.repeat(servegen_rates("m-small")[: days * 144], 2)
    ends = (np.arange(rates.size) + 1) * FIVE_MIN_S
    return ends, rates


async def test_loop_keeps_ticking_while_a_slow_fit_runs_in_a_process() -> None:
    ends, rates = five_minute_m_small(days=14)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        fitter: BackgroundFitter[str] = BackgroundFitter(
            make_forecaster=make_slow, executor=pool, refit_interval_s=3600
        )
        history = 2 * 288 + 10
        fitter.observe("decode", ends[:history].tolist(), rates[:history].tolist())
        assert fitter.tick(now_s=0) == 1
        assert fitter.forecast("decode", 1800).fallback_reason == "not fitted yet"

        gaps: list[float] = []
        fed = history
        last = time.perf_counter()
        started = last
        while fitter.fits_completed("decode") == 0:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            # Ticks go on: observations arrive and the baseline answers meanwhile.
            if fed < ends.size:
                fitter.observe("decode", [float(ends[fed])], [float(rates[fed])])
                fed += 1
            assert fitter.forecast("decode", 1800) is not None
            fitter.tick(now_s=now - started)
            assert now - started < 60, "the fit never finished"

    assert now - started >= SLOW_FIT_S
    assert len(gaps) > SLOW_FIT_S / 0.05
    assert max(gaps) < 0.25, f"the loop stalled for {max(gaps):.3f} s"
    result = fitter.forecast("decode", 1800)
    assert result.fallback_reason is None
    assert fitter.last_fit_error("decode") is None
    # Observations that arrived during the fit were replayed onto the new model.
    model = fitter._series["decode"].forecaster
    assert model.last_window_end_s == ends[fed - 1]


def fitter_of(
    pool: ThreadPoolExecutor, keys: str, *, model: str, days: int, max_fits_in_flight: int
) -> BackgroundFitter[str]:
    """A fitter refitting every 600 s, each key fed the same `days` of m-small."""
    ends, rates = five_minute_m_small(days=days)
    fitter: BackgroundFitter[str] = BackgroundFitter(
        make_forecaster=functools.partial(make_forecaster, model, step_s=FIVE_MIN_S),
        executor=pool,
        refit_interval_s=600,
        max_fits_in_flight=max_fits_in_flight,
    )
    for key in keys:
        fitter.observe(key, ends.tolist(), rates.tolist())
    return fitter


def test_fits_are_staggered_one_at_a_time() -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        fitter = fitter_of(pool, "abc", model="state_space", days=3, max_fits_in_flight=1)
        assert fitter.tick(now_s=0) == 1
        assert fitter.tick(now_s=0) == 0  # one in flight already
        for now in (10, 20):
            fitter._series[_in_flight(fitter)].in_flight.result(timeout=30)
            assert fitter.tick(now_s=now) == 1
        fitter._series[_in_flight(fitter)].in_flight.result(timeout=30)
        assert fitter.tick(now_s=30) == 0  # all fitted, none due before 10 + 600
        assert [fitter.fits_completed(k) for k in "abc"] == [1, 1, 1]
        due = sorted(s.fit_due_s for s in fitter._series.values())
        assert due == [610, 620, 630]
        assert fitter.tick(now_s=615) == 1  # only the first is due again


def test_up_to_max_fits_in_flight_are_queued_on_one_worker_per_tick() -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        fitter = fitter_of(pool, "abcde", model="seasonal_naive", days=1, max_fits_in_flight=3)
        assert fitter.tick(now_s=0) == 3
        assert fitter.fits_in_flight == 3
        for state in fitter._series.values():
            if state.in_flight is not None:
                state.in_flight.result(timeout=30)
        assert fitter.tick(now_s=15) == 2  # three collected, the last two submitted
        assert [fitter.fits_completed(k) for k in "abcde"] == [1, 1, 1, 0, 0]


def _in_flight(fitter: BackgroundFitter[str]) -> str:
    (key,) = [k for k, s in fitter._series.items() if s.in_flight is not None]
    return key


def _broken_factory() -> DailyStateSpace:
    raise RuntimeError("worker cannot build the model")


def test_a_failed_worker_keeps_the_previous_model() -> None:
    calls = {"n": 0}

    def make() -> DailyStateSpace:
        # The loop's first instance is fine; the worker's call fails.
        calls["n"] += 1
        return DailyStateSpace(step_s=FIVE_MIN_S) if calls["n"] == 1 else _broken_factory()

    ends, rates = five_minute_m_small(days=1)
    with ThreadPoolExecutor(max_workers=1) as pool:
        fitter: BackgroundFitter[str] = BackgroundFitter(
            make_forecaster=make, executor=pool, refit_interval_s=60
        )
        fitter.observe("x", ends.tolist(), rates.tolist())
        fitter.tick(now_s=0)
        with pytest.raises(RuntimeError):
            fitter._series["x"].in_flight.result(timeout=30)
        fitter.tick(now_s=1)
    assert fitter.last_fit_error("x") == "RuntimeError: worker cannot build the model"
    assert fitter.forecast("x", 600).point == rates[-1]
    assert fitter._series["x"].fit_due_s == 61


def test_a_shut_down_pool_is_reported_and_the_loop_goes_on() -> None:
    ends, rates = five_minute_m_small(days=1)
    pool = ThreadPoolExecutor(max_workers=1)
    pool.shutdown()
    fitter: BackgroundFitter[str] = BackgroundFitter(
        make_forecaster=DailyStateSpace, executor=pool, refit_interval_s=60
    )
    fitter.observe("x", ends.tolist(), rates.tolist())
    assert fitter.tick(now_s=0) == 0
    assert fitter.last_fit_error("x").startswith("cannot submit the fit: RuntimeError")
    assert fitter.tick(now_s=30) == 0  # not retried before the interval
    assert fitter.forecast("x", 300).point == rates[-1]
    assert fitter.last_window_end_s("x") == ends[-1]
    assert fitter.last_window_end_s("unknown") is None


def test_observations_going_back_in_time_are_refused() -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        fitter: BackgroundFitter[str] = BackgroundFitter(
            make_forecaster=lambda: DailyStateSpace(), executor=pool, refit_interval_s=60
        )
        fitter.observe("x", [100.0], [1.0])
        with pytest.raises(ValueError, match="back in time"):
            fitter.observe("x", [50.0], [1.0])


def test_a_fit_starts_from_the_resampled_windows_and_replays_what_it_missed() -> None:
    ends, rates = five_minute_m_small(days=3)
    make = functools.partial(
        make_forecaster, "seasonal_naive", step_s=FIVE_MIN_S, max_history_s=86_400
    )
    # Ticks every 15 s around their window's rate, as the service records them.
    ticks = np.concatenate([np.arange(end - 285.0, end + 1, 15.0) for end in ends])
    values = np.repeat(rates, 20) * (1 + 0.01 * np.tile(np.arange(20), rates.size))
    with ThreadPoolExecutor(max_workers=1) as pool:
        fitter: BackgroundFitter[str] = BackgroundFitter(
            make_forecaster=make, executor=pool, refit_interval_s=60
        )
        first = (ends.size - 100) * 20 + 7  # into a window of the last day, which stays open
        fitter.observe("x", ticks[:first].tolist(), values[:first].tolist())
        fitter.tick(now_s=0)
        state = fitter._series["x"]
        state.in_flight.result(timeout=30)  # finished, but not collected until the next tick
        for i in range(first, ticks.size - 1):
            fitter.observe("x", [float(ticks[i])], [float(values[i])])
        assert len(state.replay_timestamps_s) == ticks.size - 1 - first
        fitter.tick(now_s=1)
        assert fitter.fits_completed("x") == 1
        assert state.replay_timestamps_s == []
        fitter.observe("x", [float(ticks[-1])], [float(values[-1])])

    # The new model has seen exactly what one fed every observation directly has: the open
    # window's sums went with the snapshot, the rest was replayed.
    direct = make()
    direct.fit(Series(ticks, values))
    model = state.forecaster
    assert model.last_window_end_s == direct.last_window_end_s == ends[-1]
    np.testing.assert_array_equal(model._history.array(), direct._history.array())
    assert len(model._history) == 288  # bounded by the forecaster's day of history
    assert model.forecast(3600) == direct.forecast(3600)
    assert model.forecast(3600).fallback_reason is None


HANG_MARK = 666.0


class HangingPersistence(Persistence):
    """Persistence whose fit never returns on a series that contains `HANG_MARK`."""

    def _fit_windows(self, values):  # type: ignore[no-untyped-def]
        if np.any(values == HANG_MARK):
            time.sleep(600)
        super()._fit_windows(values)


def make_hanging() -> HangingPersistence:
    return HangingPersistence(step_s=FIVE_MIN_S)


def _feed(fitter: BackgroundFitter[str], key: str, value: float) -> None:
    ends = [FIVE_MIN_S * (i + 1) for i in range(3)]
    fitter.observe(key, ends, [value] * 3)


def test_a_hung_fit_is_abandoned_after_the_timeout_and_keeps_its_model() -> None:
    release = threading.Event()

    def make() -> HangingPersistence:
        class Blocking(HangingPersistence):
            def _fit_windows(self, values):  # type: ignore[no-untyped-def]
                if np.any(values == HANG_MARK):
                    release.wait(30)
                Persistence._fit_windows(self, values)

        return Blocking(step_s=FIVE_MIN_S)

    with ThreadPoolExecutor(max_workers=1) as pool:
        fitter: BackgroundFitter[str] = BackgroundFitter(
            make_forecaster=make, executor=pool, refit_interval_s=600, fit_timeout_s=60
        )
        _feed(fitter, "stuck", HANG_MARK)
        assert fitter.tick(now_s=0) == 1
        _feed(fitter, "ok", 10.0)
        assert fitter.tick(now_s=30) == 0  # one in flight at a time, not overdue yet
        assert fitter.last_fit_error("stuck") is None and fitter.fits_abandoned == 0
        assert fitter.tick(now_s=61) == 1  # abandoned, so "ok" goes in
        assert fitter.fits_abandoned == 1
        assert "did not finish within 60 s" in fitter.last_fit_error("stuck")
        # the series keeps forecasting (from its own windows) and is refitted a refit later
        assert fitter.forecast("stuck", 300).point == HANG_MARK
        assert fitter._series["stuck"].fit_due_s == 661
        release.set()


def test_a_hung_fit_in_a_process_is_ended_and_the_pool_replaced() -> None:
    pool = fit_executor()
    replaced: list[object] = []

    def replace(old):  # type: ignore[no-untyped-def]
        replaced.append(old)
        return replace_fit_executor(old)

    fitter: BackgroundFitter[str] = BackgroundFitter(
        make_forecaster=make_hanging,
        executor=pool,
        refit_interval_s=600,
        max_fits_in_flight=2,
        fit_timeout_s=60,
        replace_executor=replace,
    )
    try:
        _feed(fitter, "stuck", HANG_MARK)
        _feed(fitter, "ok", 10.0)
        assert fitter.tick(now_s=0) == 2  # "ok" queued behind the hung fit on one worker
        while not pool._processes:
            time.sleep(0.05)
        workers = list(pool._processes.values())
        assert fitter.tick(now_s=61) == 1  # "ok" submitted again, to the new pool
        assert replaced == [pool] and fitter._executor is not pool
        for worker in workers:  # the hung fit's process is ended
            # under load a single join(timeout=10) has come back within seconds with the
            # process still alive (the pool's shutdown reaps it too), so poll until it ends
            ended_by = time.monotonic() + 30
            while worker.is_alive() and time.monotonic() < ended_by:
                worker.join(timeout=0.5)
            assert not worker.is_alive()
        # A fresh worker process imports statsmodels before it fits: on a loaded machine
        # that alone can take a minute, so the wait is on the wall clock, and generous.
        now = 61
        deadline = time.monotonic() + 240
        while fitter.fits_completed("ok") == 0:
            assert time.monotonic() < deadline, fitter.last_fit_error("ok")
            time.sleep(0.5)
            now += 1
            fitter.tick(now_s=now)
        assert fitter.fits_completed("stuck") == 0 and fitter.fits_abandoned == 1
        assert fitter._series["ok"].fit_due_s > 61  # fitted, not resubmitted again
    finally:
        fitter._executor.shutdown(wait=False, cancel_futures=True)
        for process in (getattr(fitter._executor, "_processes", None) or {}).values():
            process.terminate()


def test_a_pool_whose_worker_died_is_replaced_and_fitting_goes_on() -> None:
    """An OOM kill of the fit worker breaks a ProcessPoolExecutor for good: every later
    submit raised BrokenProcessPool, and no model was fitted again until a restart."""
    pool = fit_executor()
    fitter: BackgroundFitter[str] = BackgroundFitter(
        make_forecaster=functools.partial(make_forecaster, "persistence", step_s=FIVE_MIN_S),
        executor=pool,
        refit_interval_s=1,
        max_fits_in_flight=1,
        fit_timeout_s=300,
        replace_executor=replace_fit_executor,
    )
    try:
        _feed(fitter, "a", 10.0)
        now = 0
        while fitter.fits_completed("a") == 0:
            assert now < 120
            fitter.tick(now_s=now)
            time.sleep(0.2)
            now += 1
        for worker in list(pool._processes.values()):
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(timeout=10)
        _feed(fitter, "b", 20.0)  # a component seen after the kill
        deadline = now + 240
        while fitter.fits_completed("b") == 0 or fitter.fits_completed("a") < 2:
            assert now < deadline, (fitter.last_fit_error("a"), fitter.last_fit_error("b"))
            fitter.tick(now_s=now)
            time.sleep(0.2)
            now += 1
        assert fitter.pools_replaced == 1 and fitter._executor is not pool
    finally:
        fitter._executor.shutdown(wait=False, cancel_futures=True)
        for process in (getattr(fitter._executor, "_processes", None) or {}).values():
            process.terminate()


FAIL_MARK = 777.0


class FailingPersistence(Persistence):
    """Persistence whose fit fails on a series that contains `FAIL_MARK`."""

    def _fit_windows(self, values):  # type: ignore[no-untyped-def]
        if np.any(values == FAIL_MARK):
            raise RuntimeError("did not converge")
        super()._fit_windows(values)


def test_a_refit_that_fails_keeps_the_model_that_worked() -> None:
    """A refit that failed was swapped in, and the series forecast from its fallback until
    the next refit."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        fitter: BackgroundFitter[str] = BackgroundFitter(
            make_forecaster=lambda: FailingPersistence(step_s=FIVE_MIN_S),
            executor=pool,
            refit_interval_s=60,
        )
        _feed(fitter, "x", 10.0)
        fitter.tick(now_s=0)
        fitter._series["x"].in_flight.result(timeout=30)  # type: ignore[union-attr]
        fitter.tick(now_s=1)
        good = fitter._series["x"].forecaster
        assert good.model_unavailable_reason is None
        fitter.observe("x", [FIVE_MIN_S * 4 + 1, FIVE_MIN_S * 5], [FAIL_MARK, FAIL_MARK])
        fitter.tick(now_s=61)
        fitter._series["x"].in_flight.result(timeout=30)  # type: ignore[union-attr]
        fitter.tick(now_s=62)
        assert fitter.fits_completed("x") == 2
        assert fitter._series["x"].forecaster is good
        assert fitter.last_fit_error("x") == (
            "RuntimeError: did not converge; keeping the previous model"
        )
        result = fitter.forecast("x", 300)
        assert result is not None and result.fallback_reason is None
