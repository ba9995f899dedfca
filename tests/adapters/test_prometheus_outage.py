"""Prometheus trouble never stops the tick: every signal becomes None, the error is counted.

A real Prometheus that is stopped and started again, plus HTTP fakes (aiohttp on the test's
own event loop, which stays free because queries run in threads) for what a real server
will not do on demand: hang, answer 503, 400 or garbage.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from autoscaler.adapters.prometheus_http import PrometheusHttp, PrometheusUnavailable
from autoscaler.adapters.prometheus_queries import PrometheusQueries
from autoscaler.adapters.prometheus_source import ComponentTarget, PrometheusSource
from autoscaler.core.model import Component, ComponentKey, Signals
from tests.harness.http_stub import serve
from tests.harness.prometheus_server import PrometheusServer
from tests.harness.vllm_exporter import PodValues, VllmExporter

KEY = ComponentKey("prod", "llama-3-70b")
TARGETS = [
    ComponentTarget(key=KEY, component=Component.UNIFIED, ready_group_indexes=frozenset({0}))
]
QUERIES = PrometheusQueries.vllm(rate_window="5s", mean_window="5s")
SIGNAL_NAMES = ("waiting_requests", "running_requests", "kv_usage_fraction", "demand")


def all_none(signals: Signals) -> bool:
    return all(getattr(signals, name) is None for name in SIGNAL_NAMES)


@pytest.mark.prometheus
async def test_stopped_prometheus_gives_none_within_timeout_then_recovers() -> None:
    with VllmExporter() as exporter:
        exporter.add_lws(namespace="prod", lws="llama-3-70b", gangs=1, pods_per_gang=2,
                         values=PodValues(waiting=2.0, running=9.0))  # fmt: skip
        with PrometheusServer(targets=exporter.targets()) as prometheus:
            prometheus.wait_for_series("vllm:num_requests_running", count=1)
            errors: list[PrometheusUnavailable] = []
            source = PrometheusSource(
                url=prometheus.url, queries=QUERIES, timeout_s=2.0, on_error=errors.append
            )
            assert (await source.observe(TARGETS))[KEY].running_requests == 9.0

            prometheus.stop()
            started = time.monotonic()
            signals = (await source.observe(TARGETS))[KEY]
            took_s = time.monotonic() - started
            assert all_none(signals), signals
            assert set(signals.missing_reasons) == set(SIGNAL_NAMES)
            assert signals.missing_reasons["waiting_requests"].startswith("prometheus connection")
            # the cause, not the URL: cut at 300 characters, the percent-encoded query left
            # no room for it
            assert "Connection refused" in signals.missing_reasons["waiting_requests"]
            assert "/api/v1/query" not in signals.missing_reasons["waiting_requests"]
            assert took_s < 2.0
            assert source.stats.errors["connection"] == 6  # one per query, after one retry
            assert source.stats.last_tick_queries == 12  # the retry is the only one
            assert len(errors) == 6 and {e.kind for e in errors} == {"connection"}

            prometheus.start()
            deadline = time.monotonic() + 20.0
            # Gauges come back from the WAL at once; rate() needs fresh scrapes (after the
            # 5 s service-discovery delay of a starting Prometheus).
            while signals.missing_reasons and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                signals = (await source.observe(TARGETS))[KEY]
            assert signals.running_requests == 9.0
            assert signals.waiting_requests == 2.0
            assert signals.missing_reasons == {}


async def test_hanging_prometheus_gives_none_within_the_timeout() -> None:
    async def hang(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.json_response({})

    async with serve(hang) as (url, seen):
        source = PrometheusSource(url=url, queries=QUERIES, timeout_s=1.0)
        started = time.monotonic()
        signals = (await source.observe(TARGETS))[KEY]
        took_s = time.monotonic() - started
        assert all_none(signals)
        assert signals.missing_reasons["demand"].startswith("prometheus timeout")
        assert 0.9 < took_s < 1.7
        assert source.stats.errors["timeout"] == 6
        assert len(seen) == 6  # a timeout is not retried: the deadline is spent
        # The server-side evaluation deadline travels with the query.
        assert {r.query["timeout"] for r in seen} <= {f"{ms}ms" for ms in range(900, 1001)}


async def test_a_caller_deadline_cancels_the_tick_cleanly() -> None:
    async def hang(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.json_response({})

    async with serve(hang) as (url, _seen):
        source = PrometheusSource(url=url, queries=QUERIES, timeout_s=5.0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(source.observe(TARGETS), timeout=0.3)
        # Cancelled, not failed: nothing was counted as a Prometheus error.
        assert source.stats.errors == {}


@pytest.mark.parametrize(
    ("status", "kind", "requests_per_query"),
    [
        pytest.param(503, "http_5xx", 2, id="503-retried-once"),
        pytest.param(500, "http_5xx", 1, id="500-not-retried"),
        pytest.param(400, "http_4xx", 1, id="400-not-retried"),
        pytest.param(200, "bad_response", 1, id="200-not-json"),
    ],
)
async def test_http_errors_give_none_and_are_counted(
    status: int, kind: str, requests_per_query: int
) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, text="<html>proxy error</html>")

    async with serve(answer) as (url, seen):
        source = PrometheusSource(url=url, queries=QUERIES, timeout_s=3.0)
        signals = (await source.observe(TARGETS))[KEY]
        assert all_none(signals)
        assert signals.missing_reasons["kv_usage_fraction"].startswith(f"prometheus {kind}")
        assert source.stats.errors == {kind: 6}
        assert len(seen) == 6 * requests_per_query
        # The next tick works again as soon as Prometheus does.
        assert source.stats.last_error is not None


async def test_malformed_rows_are_a_bad_response() -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        row = {"metric": {"namespace": "prod", "pod": "llama-3-70b-0"}, "val": [1, "2"]}
        return web.json_response({"status": "success", "data": {"result": [row]}})

    errors: list[PrometheusUnavailable] = []
    async with serve(answer) as (url, _seen):
        source = PrometheusSource(url=url, queries=QUERIES, on_error=errors.append)
        signals = (await source.observe(TARGETS))[KEY]
    assert all_none(signals)
    assert signals.missing_reasons["waiting_requests"].startswith("prometheus bad_response")
    assert [e.kind for e in errors] == ["bad_response"] * 6


async def test_one_failing_query_leaves_the_others() -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        query = request.query["query"]
        if "kv_cache_usage_perc" in query:
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400
            )
        now = time.time()
        value = str(now - 1) if "timestamp(" in query else "3"
        row = {"metric": {"namespace": "prod", "pod": "llama-3-70b-0"}, "value": [now, value]}
        return web.json_response({"status": "success", "data": {"resultType": "vector",
                                                                "result": [row]}})  # fmt: skip

    async with serve(answer) as (url, _seen):
        source = PrometheusSource(url=url, queries=QUERIES, timeout_s=3.0)
        signals = (await source.observe(TARGETS))[KEY]
    assert signals.kv_usage_fraction is None
    assert signals.missing_reasons.keys() == {"kv_usage_fraction"}
    assert (signals.waiting_requests, signals.running_requests, signals.demand) == (3.0,) * 3


async def test_an_answer_trickled_byte_by_byte_is_cut_off_at_the_deadline() -> None:
    """requests' timeout bounds each read, not the answer: a server sending a byte every
    50 ms (a proxy or query frontend streaming under load) held the query's thread for
    the whole answer, ten seconds here, long after its tick had given up on it; threads
    piled up tick after tick."""
    body = b'{"status": "success", "data": {"resultType": "vector", "result": []}}' + b" " * 130

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        await response.prepare(request)
        for byte in body:
            await response.write(bytes([byte]))
            await asyncio.sleep(0.05)
        return response

    async with serve(trickle) as (url, _seen):
        http = PrometheusHttp(url=url, timeout_s=1.0, retries=0)
        started = time.monotonic()
        with pytest.raises(PrometheusUnavailable) as caught:
            await asyncio.to_thread(http.instant, "waiting", "up", deadline=time.monotonic() + 1.0)
        took_s = time.monotonic() - started
        assert caught.value.kind == "timeout"
        assert took_s < 1.6, took_s
        assert "the whole answer" in caught.value.detail
        http.close()


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        pytest.param({"Content-Length": "500"}, b'{"status": "success"', id="cut-short"),
        pytest.param({"Content-Encoding": "gzip"}, b"not gzip at all", id="bad-gzip"),
    ],
)
async def test_a_broken_body_is_a_bad_response_not_retried(
    headers: dict[str, str], body: bytes
) -> None:
    """Read by the answer deadline, a cut or undecodable body became a connection error and
    was sent again, though it could never succeed; requests itself calls it a bad answer."""

    async def broken(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json", **headers})
        await response.prepare(request)
        await response.write(body)
        request.transport.close()  # type: ignore[union-attr]
        return response

    async with serve(broken) as (url, seen):
        http = PrometheusHttp(url=url, timeout_s=5.0, retries=1)
        with pytest.raises(PrometheusUnavailable) as caught:
            await asyncio.to_thread(http.instant, "waiting", "up", deadline=time.monotonic() + 5.0)
        assert caught.value.kind == "bad_response", caught.value
        assert len(seen) == 1
        http.close()
