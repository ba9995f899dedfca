"""The demand back-fill of `DemandForecasts` against a Prometheus that refuses, stalls or
answers: retries while Prometheus is down, one fleet-wide read at a time, and the loop kept
turning while a week of history is fed to the forecasters."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from autoscaler.adapters.prometheus_backfill import BackfillResult, DemandHistory, history_grid
from autoscaler.adapters.prometheus_source import PrometheusSource
from autoscaler.core.model import Component, ComponentKey
from autoscaler.service.forecasts import DemandForecasts
from tests.harness.http_stub import serve
from tests.service.stack import wait_until

KEY = ComponentKey("serving", "llm")
# one 6-hour range query per back-fill, retried at once
QUICK = {"backfill_days": 0.25, "backfill_retry_s": 0.05}
EMPTY_MATRIX = {"status": "success", "data": {"resultType": "matrix", "result": []}}


def _is_range(request: web.Request) -> bool:
    return request.path.endswith("/query_range")


@pytest.fixture
async def pool() -> AsyncIterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=1)
    yield executor
    executor.shutdown()


@contextlib.asynccontextmanager
async def backfilling(
    handler: Callable[[web.Request], Awaitable[web.Response]],
    pool: ThreadPoolExecutor,
    *,
    timeout_s: float,
    **settings: Any,
) -> AsyncIterator[tuple[DemandForecasts, PrometheusSource, list[web.Request]]]:
    """Forecasts back-filling from `handler` as Prometheus: them, the source, the requests."""
    async with serve(handler) as (url, seen):
        source = PrometheusSource(url=url, timeout_s=timeout_s)
        forecasts = DemandForecasts(executor=pool, **settings)
        try:
            yield forecasts, source, seen
        finally:
            await forecasts.close()
            source.close()


async def test_a_backfill_that_prometheus_refused_is_tried_again(
    pool: ThreadPoolExecutor,
) -> None:
    """Prometheus restarting with the service answers 503 until it is ready: every range
    query of the back-fill failed, and the week of history was never asked for again."""
    ready = asyncio.Event()

    async def prometheus(request: web.Request) -> web.Response:
        if _is_range(request) and not ready.is_set():
            return web.Response(status=503, text="Service Unavailable")
        return web.json_response(EMPTY_MATRIX)

    async with backfilling(
        prometheus, pool, timeout_s=2, backfill_days=2, backfill_retry_s=0.2
    ) as (forecasts, source, seen):
        forecasts.start_backfill(source, [(KEY, Component.PREFILL)], now_s=time.time())
        forecasts.record(KEY, now_s=time.time(), demand=1000.0)  # a live tick waits
        await wait_until(
            lambda: "retrying" in (forecasts.status(KEY).backfill_error or ""),
            timeout_s=10,
            what="a failed first back-fill",
        )
        assert not forecasts.status(KEY).backfilled
        failed_queries = len(seen)
        ready.set()  # Prometheus is back
        await wait_until(
            lambda: forecasts.status(KEY).backfilled, timeout_s=10, what="the back-fill"
        )
        assert len(seen) > failed_queries
        assert forecasts.status(KEY).backfill_error is None


async def test_a_prometheus_down_longer_than_the_tries_is_waited_for(
    pool: ThreadPoolExecutor,
) -> None:
    """A Prometheus replaying its WAL after a cluster restart answers 503 for a quarter of
    an hour. The back-fill gave up after ten tries a minute apart and forecast from live
    data for the next days; while no live demand is read either, it keeps trying."""
    failures_left = 5

    async def prometheus(request: web.Request) -> web.Response:
        nonlocal failures_left
        if _is_range(request) and failures_left > 0:
            failures_left -= 1
            return web.Response(status=503, text="Service Unavailable")
        return web.json_response(EMPTY_MATRIX)

    async with backfilling(
        prometheus,
        pool,
        timeout_s=2,
        **QUICK,
        backfill_attempts=2,
    ) as (forecasts, source, _):
        forecasts.start_backfill(source, [(KEY, Component.PREFILL)], now_s=time.time())
        forecasts.record(KEY, now_s=time.time(), demand=None)  # the ticks read nothing
        await wait_until(
            lambda: forecasts.status(KEY).backfilled, timeout_s=10, what="the back-fill"
        )
        assert failures_left == 0
        assert forecasts.status(KEY).backfill_error is None


async def test_range_queries_refused_while_live_demand_is_read_give_up_and_say_so(
    pool: ThreadPoolExecutor,
) -> None:
    """Prometheus answers the ticks but refuses every range query (a query frontend's
    limit, say): after the tries the component forecasts from live data, and its status
    says no history was read instead of `backfilled`."""

    async def prometheus(request: web.Request) -> web.Response:
        if _is_range(request):
            return web.Response(status=422, text="query processing would load too many samples")
        return web.json_response(EMPTY_MATRIX)

    async with backfilling(
        prometheus,
        pool,
        timeout_s=2,
        **QUICK,
        backfill_attempts=3,
    ) as (forecasts, source, seen):
        forecasts.start_backfill(source, [(KEY, Component.PREFILL)], now_s=time.time())
        forecasts.record(KEY, now_s=time.time(), demand=1000.0)
        await wait_until(
            lambda: "live data only" in (forecasts.status(KEY).backfill_error or ""),
            timeout_s=10,
            what="the back-fill to give up",
        )
        assert len([r for r in seen if _is_range(r)]) == 3  # one chunk, three tries
        assert not forecasts.status(KEY).backfilled
        assert not forecasts._pending  # the live reading went to the forecaster


async def test_refused_range_queries_give_up_without_live_demand_and_free_the_queue(
    pool: ThreadPoolExecutor,
) -> None:
    """A component at zero gangs reads no demand. With its range queries refused (a 422 of
    a query frontend's limit) its back-fill was tried for good, and every component seen
    after it waited behind it, forecasting nothing, its ticks piling up."""

    async def prometheus(request: web.Request) -> web.Response:
        if _is_range(request):
            return web.Response(status=422, text="query processing would load too many samples")
        return web.json_response(EMPTY_MATRIX)

    parked, busy = ComponentKey("serving", "parked"), ComponentKey("serving", "busy")
    async with backfilling(
        prometheus,
        pool,
        timeout_s=2,
        **QUICK,
        backfill_attempts=3,
    ) as (forecasts, source, seen):
        forecasts.start_backfill(source, [(parked, Component.PREFILL)], now_s=time.time())
        forecasts.record(parked, now_s=time.time(), demand=None)  # at zero gangs
        forecasts.start_backfill(source, [(busy, Component.DECODE)], now_s=time.time())
        await wait_until(
            lambda: "live data only" in (forecasts.status(busy).backfill_error or ""),
            timeout_s=10,
            what="the queued back-fill to run and give up",
        )
        assert "live data only" in (forecasts.status(parked).backfill_error or "")
        assert "422" in (forecasts.status(parked).backfill_error or "")
        assert len([r for r in seen if _is_range(r)]) == 6  # three tries each
        assert not forecasts._pending


async def test_tries_while_prometheus_was_down_do_not_count_as_refusals(
    pool: ThreadPoolExecutor,
) -> None:
    """Four tries met a Prometheus that was down, then one refused a query while it came up,
    then it answered: one budget for both gave up at the first refusal, a call before the
    history was there."""
    answers = [503] * 4 + [422]

    async def prometheus(request: web.Request) -> web.Response:
        if _is_range(request) and answers:
            return web.Response(status=answers.pop(0), text="not now")
        return web.json_response(EMPTY_MATRIX)

    async with backfilling(
        prometheus, pool, timeout_s=2, backfill_attempts=3, **QUICK,
    ) as (forecasts, source, _):  # fmt: skip
        forecasts.start_backfill(source, [(KEY, Component.PREFILL)], now_s=time.time())
        await wait_until(
            lambda: forecasts.status(KEY).backfilled, timeout_s=10, what="the back-fill"
        )
        assert not answers and forecasts.status(KEY).backfill_error is None


async def test_components_seen_while_a_backfill_runs_are_read_together_next(
    pool: ThreadPoolExecutor,
) -> None:
    """The range queries read the whole fleet. A GitOps rollout adding one LWS a tick
    started one fleet-wide back-fill per tick; those seen meanwhile now wait for the one
    running and are read by one more, whose history ends when the first of them was seen
    (their held ticks follow it)."""
    release = asyncio.Event()

    async def prometheus(request: web.Request) -> web.Response:
        if _is_range(request):
            await release.wait()
        return web.json_response(EMPTY_MATRIX)

    keys = [ComponentKey("serving", f"llm-{i}") for i in range(4)]
    async with backfilling(prometheus, pool, timeout_s=10, backfill_days=0.25) as (
        forecasts,
        source,
        seen,
    ):  # one 6-hour chunk
        start_s = 1_800_000_000.0
        for tick, key in enumerate(keys):
            now_s = start_s + 15 * tick
            assert forecasts.start_backfill(source, [(key, Component.PREFILL)], now_s=now_s)
            forecasts.record(key, now_s=now_s, demand=100.0)
            await asyncio.sleep(0.1)
        release.set()
        await wait_until(
            lambda: all(forecasts.status(k).backfilled for k in keys),
            timeout_s=10,
            what="every back-fill",
        )
        ends = [float(r.query["end"]) for r in seen if _is_range(r)]
        assert ends == [pytest.approx(start_s, abs=60), pytest.approx(start_s + 15, abs=60)]
        assert not forecasts._pending


class _WeekOfHistory:
    """A source whose back-fill returns at once with a week of history per component."""

    def __init__(self, keys: Iterable[ComponentKey], *, end_s: float) -> None:
        grid = history_grid(end_s=end_s, days=7, step_s=60)
        values = np.full(grid.size, 500.0)
        self.histories = {k: DemandHistory(k, 60.0, grid, values) for k in keys}

    async def backfill_demand(self, *_: object, **__: object) -> BackfillResult:
        return BackfillResult(histories=self.histories, chunks_total=28, chunks_failed=0, errors=())


async def test_feeding_a_fleets_history_leaves_the_loop_its_turns(
    pool: ThreadPoolExecutor,
) -> None:
    """2,000 components' week of history fed at once held the event loop for 3 s: Lease
    renewals, probes and the tick waited. The loop now turns every few components."""
    now_s = time.time()
    keys = [ComponentKey("serving", f"llm-{i}") for i in range(200)]
    forecasts = DemandForecasts(executor=pool)
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    counter = asyncio.create_task(count_turns())
    try:
        forecasts.start_backfill(
            _WeekOfHistory(keys, end_s=now_s),  # type: ignore[arg-type]
            [(k, Component.PREFILL) for k in keys],
            now_s=now_s,
        )
        await asyncio.sleep(0)  # the back-fill task starts
        before = turns
        await asyncio.gather(*forecasts._tasks)
        assert turns - before >= 3  # 200 components, a turn every 50
        assert all(forecasts.status(k).backfilled for k in keys)
    finally:
        counter.cancel()
        await forecasts.close()


def test_missing_readings_held_during_a_backfill_keep_one_per_window(
    pool: ThreadPoolExecutor,
) -> None:
    """While Prometheus is down the ticks wait behind the back-fill; a day of them was
    5,760 readings per component, all missing. One per forecast window says as much."""
    forecasts = DemandForecasts(executor=pool, step_s=300.0)
    forecasts._known.add(KEY)
    forecasts._pending[KEY] = []
    for tick in range(40):  # 10 minutes of missing readings, two windows
        forecasts.record(KEY, now_s=1_800_000_000.0 + 15 * tick, demand=None)
    forecasts.record(KEY, now_s=1_800_000_600.0, demand=250.0)
    forecasts.record(KEY, now_s=1_800_000_615.0, demand=260.0)
    held = forecasts._pending[KEY]
    assert [math.isnan(v) for _, v in held] == [True, True, False, False]
