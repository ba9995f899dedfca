"""Every dashboard query runs against a real Prometheus and returns data.

Prometheus (the Debian binary, 1 s scrapes) scrapes two kinds of target, as in a cluster:
vLLM leader pods served by the harness exporter (target labels `namespace`, `pod`), and the
service's own `/metrics`, served here on aiohttp from `ServiceMetrics` while a background
thread plays the control loop (ticks, decisions, one scale-up). Each panel, annotation and
variable query is run as Grafana runs it (a range query with variables and
`$__rate_interval` substituted) and must return at least one series with a finite value;
per-component queries must return both components, which proves the pod-to-component join.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from autoscaler.service.metrics import ComponentLabels, ServiceMetrics
from tests.dashboards.conftest import DASHBOARD_FILES, RATE_INTERVAL, Query, queries, substitute
from tests.harness.prometheus_server import PrometheusFactory, ScrapeTarget, prometheus_factory
from tests.harness.vllm_exporter import PodValues, VllmExporter, vllm_exporter

pytestmark = pytest.mark.prometheus

__all__ = ["prometheus_factory", "vllm_exporter"]  # fixtures used by name below

NAMESPACE = "serving"
DEPLOYMENT = "llama"
PREFILL = ComponentLabels(NAMESPACE, DEPLOYMENT, "prefill", "llama-prefill")
DECODE = ComponentLabels(NAMESPACE, DEPLOYMENT, "decode", "llama-decode")
# Another deployment in the same namespace: the join must not leak it into "llama".
OTHER = ComponentLabels(NAMESPACE, "mistral", "unified", "mistral")
# The release's job (its ServiceMonitor scrapes it under the Service's name).
JOB = "gang-autoscaler"
VARIABLES = {
    "job": JOB,
    "namespace": NAMESPACE,
    "deployment": DEPLOYMENT,
    "component": "prefill|decode",  # what Grafana sends for "All" of two components
    "__rate_interval": RATE_INTERVAL,
}


class ServiceStandIn:
    """The service's `/metrics` on aiohttp, fed by a thread that ticks like the control loop.

    It uses the real `ServiceMetrics`; only the numbers are chosen by the test."""

    def __init__(self, *, desired_decode_gangs: int = 3) -> None:
        self.metrics = ServiceMetrics()
        self.port = 0
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._threads: list[threading.Thread] = []
        self.desired_decode_gangs = desired_decode_gangs

    async def _handle(self, _request: web.Request) -> web.Response:
        body, content_type = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def start() -> None:
            app = web.Application()
            app.router.add_get("/metrics", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = int(self._runner.addresses[0][1])

        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
        loop.close()

    def _tick_forever(self) -> None:
        m = self.metrics
        m.set_leader(True)
        m.count_policy_error(
            namespace=NAMESPACE, lws="mistral", annotation="gang-autoscaler.io/max-replicas"
        )
        m.set_policy_problems({(NAMESPACE, "mistral", "gang-autoscaler.io/max-replicas"): 1})
        while not self._stop.is_set():
            started = time.monotonic()
            desired = self.desired_decode_gangs
            m.observe_component(
                PREFILL,
                current_gangs=2,
                desired_gangs=2,
                ready_gangs=2,
                partial_gangs=0,
                unplaced_gangs=0,
                balloon_gangs=1,
                desired_balloon_gangs=1,
                demand=3800.0,
                capacity_per_gang=2500.0,
                forecast_demand=4200.0,
                forecast_demand_upper=5600.0,
                burst_factor=1.4,
            )
            m.observe_component(
                DECODE,
                current_gangs=desired,
                desired_gangs=desired,
                ready_gangs=3,
                partial_gangs=1,
                unplaced_gangs=1,
                balloon_gangs=2,
                desired_balloon_gangs=2,
                demand=900.0,
                capacity_per_gang=300.0,
                forecast_demand=1000.0,
                forecast_demand_upper=1300.0,
                burst_factor=1.1,
            )
            m.observe_component(
                OTHER,
                current_gangs=1,
                desired_gangs=1,
                ready_gangs=1,
                partial_gangs=0,
                balloon_gangs=0,
                desired_balloon_gangs=0,
                demand=None,  # no data: the series is absent, not 0
                capacity_per_gang=None,
                forecast_demand=None,
                forecast_demand_upper=None,
            )
            m.count_decision(PREFILL, reason="steady")
            m.count_decision(DECODE, reason="scale_up_waiting" if desired > 3 else "steady")
            m.count_error("prometheus")
            m.observe_watch_caches({"leaderworkersets": 0.0, "pods": 75.0, "nodes": 0.0})
            m.observe_tick(
                duration_s=0.02 + (time.monotonic() - started),
                finished_at_s=time.time(),
                queries=5,
            )
            self._stop.wait(0.5)

    def scale_up_decode(self) -> None:
        self.metrics.count_scale_write(DECODE, from_gangs=3, to_gangs=4)
        self.desired_decode_gangs = 4

    def start(self) -> None:
        ready = threading.Event()
        server = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        server.start()
        assert ready.wait(10), "service stand-in did not start"
        ticker = threading.Thread(target=self._tick_forever, daemon=True)
        ticker.start()
        self._threads = [server, ticker]

    def stop(self) -> None:
        self._stop.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        for thread in self._threads:
            thread.join(timeout=10)


@pytest.fixture
def service() -> Iterator[ServiceStandIn]:
    stand_in = ServiceStandIn()
    stand_in.start()
    yield stand_in
    stand_in.stop()


def query_range(url: str, promql: str, *, start_s: float, end_s: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode(
        {"query": promql, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": "1"}
    )
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=10) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as err:  # 400 carries Prometheus' parse error
        raise AssertionError(f"{promql}\n-> {err.read().decode(errors='replace')}") from err
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def expected_components(query: Query) -> set[str] | None:
    """Which components a per-component query must return in this scenario: both, on the
    per-deployment view (never `mistral`'s), except where only the decode scale-up shows."""
    if not query.grouped_by_component:
        return None
    if query.where.startswith("annotation") or "Scale writes" in query.where:
        return {"decode"}
    return {"prefill", "decode"} if "deployment" in query.dashboard else None


def finite(series: dict[str, Any]) -> bool:
    return any(math.isfinite(float(value)) for _, value in series["values"])


def test_every_dashboard_query_returns_data(
    prometheus_factory: PrometheusFactory,
    vllm_exporter: VllmExporter,
    service: ServiceStandIn,
) -> None:
    # Prefill on the old KV metric name (vLLM < 0.9.2), decode on the new one with 2-pod
    # gangs (workers serve no vLLM metrics), and an unrelated deployment beside them.
    vllm_exporter.add_lws(
        namespace=NAMESPACE,
        lws="llama-prefill",
        gangs=2,
        kv_metric="old",
        values=PodValues(
            waiting=6, running=4, kv_usage_fraction=0.55, prompt_tokens_per_s=1900.0,
            generation_tokens_per_s=20.0, ttft_s=0.4,
        ),
    )  # fmt: skip
    vllm_exporter.add_lws(
        namespace=NAMESPACE,
        lws="llama-decode",
        gangs=3,
        pods_per_gang=2,
        kv_metric="new",
        engines=2,
        values=PodValues(
            waiting=2, running=30, kv_usage_fraction=0.7, prompt_tokens_per_s=50.0,
            generation_tokens_per_s=300.0, ttft_s=0.9,
        ),
    )  # fmt: skip
    vllm_exporter.add_lws(namespace=NAMESPACE, lws="mistral", gangs=1, values=PodValues(waiting=9))
    targets = [
        *vllm_exporter.targets(),
        ScrapeTarget(address=f"127.0.0.1:{service.port}", labels={"job": JOB}),
    ]
    prometheus = prometheus_factory(targets=targets)
    start_s = time.time()
    prometheus.wait_for_series("gang_autoscaler_component_info", count=3)
    # leaders only: prefill 2, decode 3 with 2 engines each, mistral 1
    prometheus.wait_for_series("vllm:num_requests_waiting", count=2 + 3 * 2 + 1)
    # Let the rate windows fill, then make one scaling decision for the annotation to show.
    time.sleep(3.0)
    service.scale_up_decode()
    time.sleep(3.0)
    end_s = time.time()

    all_queries: list[Query] = [q for path in DASHBOARD_FILES for q in queries(path)]
    assert len(all_queries) >= 20
    failures = []
    for query in all_queries:
        promql = substitute(query.expr, VARIABLES)
        result = query_range(prometheus.url, promql, start_s=start_s, end_s=end_s)
        if not any(finite(series) for series in result):
            failures.append(f"{query.dashboard} {query.where}: no finite data\n{promql}")
            continue
        expected = expected_components(query)
        if expected is not None:
            components = {series["metric"].get("component") for series in result}
            if components != expected:
                failures.append(
                    f"{query.dashboard} {query.where}: components {components}\n{promql}"
                )
    assert not failures, "\n\n".join(failures)


def test_the_join_keeps_values_per_component(
    prometheus_factory: PrometheusFactory,
    vllm_exporter: VllmExporter,
    service: ServiceStandIn,
) -> None:
    """Queue depth per component is the sum over that component's leaders only."""
    vllm_exporter.add_lws(
        namespace=NAMESPACE, lws="llama-prefill", gangs=2, values=PodValues(waiting=6)
    )
    vllm_exporter.add_lws(
        namespace=NAMESPACE,
        lws="llama-decode",
        gangs=3,
        pods_per_gang=2,
        values=PodValues(waiting=2),
    )
    vllm_exporter.add_lws(namespace=NAMESPACE, lws="mistral", gangs=1, values=PodValues(waiting=9))
    prometheus = prometheus_factory(
        targets=[
            *vllm_exporter.targets(),
            ScrapeTarget(address=f"127.0.0.1:{service.port}", labels={"job": JOB}),
        ]
    )
    prometheus.wait_for_series("gang_autoscaler_component_info", count=3)
    prometheus.wait_for_series("vllm:num_requests_waiting", count=2 + 3 + 1)  # leaders only
    (queue,) = [
        q
        for q in queries(next(p for p in DASHBOARD_FILES if "deployment" in p.name))
        if "num_requests_waiting" in q.expr
    ]
    result = prometheus.query(substitute(queue.expr, VARIABLES))
    by_component = {
        series["metric"]["component"]: float(series["value"][1])  # type: ignore[index]
        for series in result
    }
    assert by_component == {"prefill": 12.0, "decode": 6.0}


def test_a_second_release_stays_out_of_the_selected_ones_panels(
    prometheus_factory: PrometheusFactory,
    vllm_exporter: VllmExporter,
    service: ServiceStandIn,
) -> None:
    """A dry-run shadow beside the real release (docs/operators.md) exports the same series:
    the panels mixed them, and the deployment's desired gangs showed the shadow's 9."""
    shadow = ServiceStandIn(desired_decode_gangs=9)
    shadow.start()
    try:
        prometheus = prometheus_factory(
            targets=[
                ScrapeTarget(address=f"127.0.0.1:{service.port}", labels={"job": JOB}),
                ScrapeTarget(
                    address=f"127.0.0.1:{shadow.port}", labels={"job": "gang-autoscaler-shadow"}
                ),
            ]
        )
        prometheus.wait_for_series("gang_autoscaler_component_info", count=6)
        board = next(p for p in DASHBOARD_FILES if "deployment" in p.name)
        variables = {q.where: q.expr for q in queries(board) if q.where.startswith("variable")}
        releases = prometheus.query(variables["variable job"])
        assert {r["metric"]["job"] for r in releases} == {JOB, "gang-autoscaler-shadow"}
        (desired,) = [
            q
            for q in queries(board)
            if "gang_autoscaler_desired_gangs" in q.expr and "panel" in q.where
        ]
        for job, gangs in ((JOB, 3.0), ("gang-autoscaler-shadow", 9.0)):
            result = prometheus.query(substitute(desired.expr, {**VARIABLES, "job": job}))
            by_component = {r["metric"]["component"]: float(r["value"][1]) for r in result}
            assert by_component == {"prefill": 2.0, "decode": gangs}
    finally:
        shadow.stop()


def test_decisions_of_a_dry_run_release_count_once_however_many_replicas_plan(
    prometheus_factory: PrometheusFactory,
    service: ServiceStandIn,
) -> None:
    """Every replica of a dry-run release plans and counts its decisions (none leads), and
    the chart keeps two replicas: the decisions panels summed both, showing twice the rate
    in the mode meant for judging the autoscaler before it writes."""
    twin = ServiceStandIn()
    twin.start()
    try:
        prometheus = prometheus_factory(
            targets=[
                ScrapeTarget(address=f"127.0.0.1:{s.port}", labels={"job": JOB, "pod": f"ga-{i}"})
                for i, s in enumerate((service, twin))
            ]
        )
        prometheus.wait_for_series("gang_autoscaler_component_info", count=6)
        time.sleep(5.0)  # the rate windows fill
        one = "rate(gang_autoscaler_decisions_total" + (
            f'{{pod="ga-0",component="prefill"}}[{RATE_INTERVAL}])'
        )
        (single,) = prometheus.query(one)
        per_replica = float(single["value"][1])  # type: ignore[index]
        assert per_replica > 0
        panels = [
            q
            for path in DASHBOARD_FILES
            for q in queries(path)
            if "gang_autoscaler_decisions_total" in q.expr
        ]
        assert len(panels) == 2  # per deployment and for the whole controller
        for panel in panels:
            result = prometheus.query(substitute(panel.expr, VARIABLES))
            steady = [
                float(r["value"][1])  # type: ignore[index]
                for r in result
                if r["metric"].get("reason") == "steady"
                and r["metric"].get("component", "prefill") == "prefill"
            ]
            assert steady, (panel.where, result)
            # the controller panel sums prefill's and decode's: twice one replica's rate
            limit = per_replica * (1.5 if "component" in panel.expr else 3.0)
            assert steady[0] < limit, (panel.where, steady, per_replica)
    finally:
        twin.stop()
