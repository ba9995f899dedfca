"""The Prometheus source against a real Prometheus scraping the vLLM exporter.

One Prometheus and one exporter serve the whole module (a Prometheus start costs about 6 s:
its service discovery hands targets over every 5 s). Each test owns its LWS names, so the
tests do not disturb each other. Short `rate()` windows (5 s) and a short staleness limit
keep the wall time low with the 1 s scrape interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from autoscaler.adapters.prometheus_queries import PrometheusQueries, sglang_queries
from autoscaler.adapters.prometheus_source import ComponentTarget, PrometheusSource
from autoscaler.core.model import Component, ComponentKey, Signals
from tests.harness.prometheus_server import PrometheusServer
from tests.harness.vllm_exporter import VllmExporter

pytestmark = pytest.mark.prometheus

RATE_WINDOW = "5s"
STALENESS_LIMIT_S = 3.0
QUERIES = PrometheusQueries.vllm(rate_window=RATE_WINDOW, mean_window=RATE_WINDOW)
# what an operator might point unified components at: the prompt tokens served alone
UNIFIED_DEMAND = f"sum by (namespace, pod) (rate(vllm:prompt_tokens_total[{RATE_WINDOW}]))"

# Deployments of the module: (namespace, lws, gangs, pods per gang, kv name, engines).
PREFILL = ComponentKey("team-a", "llama-3-70b-prefill")
DECODE = ComponentKey("team-a", "llama-3-70b-decode")
OLD_KV = ComponentKey("team-b", "qwen-2")  # vLLM V0: old KV name, no engine label
BOTH_KV = ComponentKey("team-b", "qwen-2-5")  # vLLM 0.10: both names; LWS name ends in -2-5
SATURATED = ComponentKey("team-c", "mixtral")
NAN_KV = ComponentKey("team-c", "nan-kv")
FROZEN = ComponentKey("team-d", "frozen")
DOWN = ComponentKey("team-d", "down")


@dataclass
class Live:
    exporter: VllmExporter
    prometheus: PrometheusServer

    def source(self, **kwargs: float) -> PrometheusSource:
        return PrometheusSource(
            url=self.prometheus.url,
            queries=QUERIES,
            timeout_s=kwargs.pop("timeout_s", 5.0),
            staleness_limit_s=STALENESS_LIMIT_S,
        )


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with VllmExporter() as exporter:
        add = exporter.add_lws
        add(namespace="team-a", lws=PREFILL.lws, gangs=2, pods_per_gang=2, engines=2,
            workers_expose_vllm=True)  # fmt: skip
        add(namespace="team-a", lws=DECODE.lws, gangs=3, pods_per_gang=2)
        add(namespace="team-b", lws=OLD_KV.lws, gangs=1, kv_metric="old", engines=0)
        add(namespace="team-b", lws=BOTH_KV.lws, gangs=1, kv_metric="both")
        add(namespace="team-c", lws=SATURATED.lws, gangs=1)
        add(namespace="team-c", lws=NAN_KV.lws, gangs=1)
        add(namespace="team-d", lws=FROZEN.lws, gangs=1, explicit_timestamps=True)
        add(namespace="team-d", lws=DOWN.lws, gangs=1)
        with PrometheusServer(targets=exporter.targets()) as prometheus:
            prometheus.wait_for_series("vllm:num_requests_running", count=12)
            yield Live(exporter=exporter, prometheus=prometheus)


def target(key: ComponentKey, component: Component, groups: set[int]) -> ComponentTarget:
    return ComponentTarget(key=key, component=component, ready_group_indexes=frozenset(groups))


async def observe_until(
    source: PrometheusSource,
    targets: list[ComponentTarget],
    done: Callable[[dict[ComponentKey, Signals]], bool],
    *,
    timeout_s: float = 20.0,
) -> dict[ComponentKey, Signals]:
    """Observe every 0.5 s until `done(signals)` holds; return the last observation."""
    deadline = time.monotonic() + timeout_s
    while True:
        signals = await source.observe(targets)
        if done(signals) or time.monotonic() > deadline:
            return signals
        await asyncio.sleep(0.5)


async def test_signals_match_exporter_with_leader_only_aggregation(live: Live) -> None:
    set_pod = live.exporter.set_pod
    # Distinct values per leader, so a sum, a mean, a worker or a not-ready gang all show.
    set_pod(namespace="team-a", pod="llama-3-70b-prefill-0", waiting=3, running=10,
            kv_usage_fraction=0.5, prompt_tokens_per_s=4000.0)  # fmt: skip
    set_pod(namespace="team-a", pod="llama-3-70b-prefill-1", waiting=5, running=6,
            kv_usage_fraction=0.7, prompt_tokens_per_s=2000.0)  # fmt: skip
    set_pod(namespace="team-a", pod="llama-3-70b-decode-0", waiting=1, running=40,
            kv_usage_fraction=0.9, generation_tokens_per_s=800.0)  # fmt: skip
    set_pod(
        namespace="team-a",
        pod="llama-3-70b-decode-1",
        waiting=50,
        running=50,
        kv_usage_fraction=0.1,
        generation_tokens_per_s=9999.0,
    )  # not ready
    set_pod(namespace="team-a", pod="llama-3-70b-decode-2", waiting=2, running=30,
            kv_usage_fraction=0.6, generation_tokens_per_s=600.0)  # fmt: skip
    # Workers of the prefill LWS expose vLLM series too; they must not be counted.
    set_pod(namespace="team-a", pod="llama-3-70b-prefill-0-1", waiting=100, running=100)
    targets = [
        target(PREFILL, Component.PREFILL, {0, 1}),
        target(DECODE, Component.DECODE, {0, 2}),
    ]
    source = live.source()

    def settled(s: dict[ComponentKey, Signals]) -> bool:
        demand = s[PREFILL].demand, s[DECODE].demand
        return None not in demand and abs(demand[0] - 6000) < 60 and abs(demand[1] - 1400) < 14  # type: ignore[operator]

    signals = await observe_until(source, targets, settled)
    prefill, decode = signals[PREFILL], signals[DECODE]
    assert prefill.missing_reasons == {} and decode.missing_reasons == {}
    assert (prefill.waiting_requests, prefill.running_requests) == (8.0, 16.0)
    assert prefill.kv_usage_fraction == pytest.approx(0.6)
    assert prefill.demand == pytest.approx(6000.0, rel=0.01)  # prompt tokens/s, 2 engines
    assert (decode.waiting_requests, decode.running_requests) == (3.0, 70.0)
    assert decode.kv_usage_fraction == pytest.approx(0.75)
    assert decode.demand == pytest.approx(1400.0, rel=0.01)  # generated tokens/s
    assert source.stats.last_tick_queries == len(QUERIES.instant_queries())


async def test_old_only_and_new_and_old_kv_names_both_work(live: Live) -> None:
    live.exporter.set_pod(namespace="team-b", pod="qwen-2-0", kv_usage_fraction=0.25, waiting=7)
    live.exporter.set_pod(namespace="team-b", pod="qwen-2-5-0", kv_usage_fraction=0.45, waiting=2)
    targets = [
        target(OLD_KV, Component.UNIFIED, {0}),
        target(BOTH_KV, Component.UNIFIED, {0}),
    ]

    def settled(s: dict[ComponentKey, Signals]) -> bool:
        return s[OLD_KV].kv_usage_fraction == 0.25 and s[BOTH_KV].kv_usage_fraction == 0.45

    signals = await observe_until(live.source(), targets, settled)
    assert signals[OLD_KV].kv_usage_fraction == 0.25  # only vllm:gpu_cache_usage_perc
    assert signals[BOTH_KV].kv_usage_fraction == 0.45  # both names, counted once
    # `qwen-2-5-0` is the leader of qwen-2-5, not a worker of qwen-2 group 5.
    assert (signals[OLD_KV].waiting_requests, signals[BOTH_KV].waiting_requests) == (7.0, 2.0)


async def test_saturated_demand_adds_the_queue_growth(live: Live) -> None:
    # Served 3000 prompt tokens/s with 500-token prompts while the queue grows by 2 req/s:
    # 1000 more tokens/s arrive than are served.
    live.exporter.set_pod(namespace="team-c", pod="mixtral-0", prompt_tokens_per_s=3000.0,
                          mean_prompt_tokens=500.0, waiting_growth_per_s=2.0)  # fmt: skip
    targets = [target(SATURATED, Component.PREFILL, {0})]

    def settled(s: dict[ComponentKey, Signals]) -> bool:
        return s[SATURATED].demand is not None and abs(s[SATURATED].demand - 4000) < 40

    signals = await observe_until(live.source(), targets, settled)
    assert signals[SATURATED].demand == pytest.approx(4000.0, rel=0.01)
    live.exporter.set_pod(namespace="team-c", pod="mixtral-0", waiting_growth_per_s=0.0)


async def test_nan_and_missing_leader_are_none_with_reason(live: Live) -> None:
    live.exporter.set_pod(namespace="team-c", pod="nan-kv-0", kv_usage_fraction=float("nan"))
    targets = [
        target(NAN_KV, Component.DECODE, {0}),
        target(ComponentKey("team-c", "mixtral"), Component.PREFILL, {0, 7}),  # no pod 7
    ]

    def settled(s: dict[ComponentKey, Signals]) -> bool:
        return s[NAN_KV].kv_usage_fraction is None

    signals = await observe_until(live.source(), targets, settled)
    nan_kv = signals[NAN_KV]
    assert nan_kv.kv_usage_fraction is None
    assert nan_kv.missing_reasons["kv_usage_fraction"] == "NaN for team-c/nan-kv-0"
    assert nan_kv.waiting_requests == 0.0  # measured zero stays zero
    partial = signals[ComponentKey("team-c", "mixtral")]
    assert partial.waiting_requests is None
    # Pod 7 is in no query's results; the freshness query is read first.
    assert partial.missing_reasons["waiting_requests"] == (
        "freshness query (sample_time) returned no sample for ready leader team-c/mixtral-7"
    )


async def test_series_no_longer_scraped_becomes_none_after_staleness_limit(live: Live) -> None:
    live.exporter.set_pod(namespace="team-d", pod="frozen-0", waiting=4)
    targets = [target(FROZEN, Component.UNIFIED, {0})]
    source = live.source()
    signals = await observe_until(source, targets, lambda s: s[FROZEN].waiting_requests == 4.0)
    assert signals[FROZEN].waiting_requests == 4.0
    # From now on the exporter repeats a sample with a fixed timestamp: Prometheus keeps it
    # visible for its 5 min lookback delta, but the sample ages.
    live.exporter.freeze(namespace="team-d", pod="frozen-0")
    frozen_at = time.monotonic()
    signals = await observe_until(
        source, targets, lambda s: s[FROZEN].waiting_requests is None, timeout_s=15
    )
    took_s = time.monotonic() - frozen_at
    assert signals[FROZEN].waiting_requests is None
    assert (
        "stale: newest sample of team-d/frozen-0"
        in signals[FROZEN].missing_reasons["waiting_requests"]
    )
    assert STALENESS_LIMIT_S - 1.0 < took_s < STALENESS_LIMIT_S + 3.0
    # The sample itself is still there: Prometheus alone would have served it for minutes.
    assert live.prometheus.query('vllm:num_requests_waiting{pod="frozen-0"}')


async def test_pod_that_stops_answering_scrapes_becomes_none(live: Live) -> None:
    targets = [target(DOWN, Component.UNIFIED, {0})]
    source = live.source()
    await observe_until(source, targets, lambda s: s[DOWN].running_requests is not None)
    live.exporter.set_serving(namespace="team-d", pod="down-0", serving=False)
    signals = await observe_until(
        source, targets, lambda s: s[DOWN].running_requests is None, timeout_s=10
    )
    # A failed scrape writes staleness markers: the series disappears at once.
    assert signals[DOWN].missing_reasons["running_requests"] == (
        "freshness query (sample_time) returned no sample for ready leader team-d/down-0"
    )
    live.exporter.set_serving(namespace="team-d", pod="down-0", serving=True)


@pytest.mark.parametrize(
    ("queries", "per_tick"),
    [
        pytest.param(QUERIES, 6, id="defaults"),
        pytest.param(
            QUERIES.model_copy(update={"unified_demand": UNIFIED_DEMAND}),
            7,
            id="unified-demand-set",
        ),
    ],
)
async def test_queries_per_tick_do_not_grow_with_deployments(
    live: Live, queries: PrometheusQueries, per_tick: int
) -> None:
    source = PrometheusSource(
        url=live.prometheus.url,
        queries=queries,
        timeout_s=5.0,
        staleness_limit_s=STALENESS_LIMIT_S,
    )

    def deployments(n: int) -> list[ComponentTarget]:
        return [
            target(ComponentKey(f"ns-{i % 7}", f"model-{i}-{part}"), component, {0, 1})
            for i in range(n)
            for part, component in (("prefill", Component.PREFILL), ("decode", Component.DECODE))
        ]

    counted = {}
    for n in (1, 200):
        server_before = live.prometheus.http_requests("/api/v1/query")
        signals = await source.observe(deployments(n))
        await asyncio.sleep(0.2)  # Prometheus counts a request after answering it
        server_count = live.prometheus.http_requests("/api/v1/query") - server_before
        counted[n] = (source.stats.last_tick_queries, server_count)
        assert len(signals) == 2 * n
    # docs/prometheus.md states these counts
    assert counted[1] == counted[200] == (per_tick, per_tick)


@pytest.mark.parametrize(
    "queries",
    [
        pytest.param(PrometheusQueries(), id="vllm-defaults"),
        pytest.param(sglang_queries(), id="sglang"),
    ],
)
async def test_shipped_query_sets_are_valid_promql(live: Live, queries: PrometheusQueries) -> None:
    source = PrometheusSource(url=live.prometheus.url, queries=queries, timeout_s=5.0)
    outcomes = await source.query_all()
    assert {name: o.error for name, o in outcomes.items() if o.error} == {}
    assert source.stats.errors == {}
