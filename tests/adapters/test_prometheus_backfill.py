"""Demand back-fill: 7 days of history loaded with promtool are rebuilt per component.

The history is the real ServeGen m-small trace (`../shared/data/traces/
servegen_m-small_600s.csv`, Alibaba Bailian, rows for days 7 to 14: 1,008 ten-minute windows),
turned into the vLLM counters a 30 s scrape of two LWS deployments would have stored:
prompt tokens for a prefill LWS whose two leaders split the load 60/40, generated tokens for
a decode LWS. Windows where the trace has no requests at all are collection gaps (the
trace README says to treat them as missing), so no sample is written for them, and they
must come back as NaN, never as zero.
"""

from __future__ import annotations

import csv
import math
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from autoscaler.adapters.prometheus_backfill import backfill_demand, refused
from autoscaler.adapters.prometheus_http import PrometheusUnavailable
from autoscaler.adapters.prometheus_queries import PrometheusQueries
from autoscaler.adapters.prometheus_source import PrometheusSource
from autoscaler.core.model import Component, ComponentKey
from tests.harness.http_stub import serve
from tests.harness.prometheus_server import PrometheusServer, load_openmetrics
from tests.harness.shared_data import shared_data_path

WINDOW_S = 600
SCRAPE_S = 30
FIRST_ROW_DAY = 7
PREFILL = ComponentKey("serving", "m-small-prefill")
DECODE = ComponentKey("serving", "m-small-decode")
LEADER_SHARES = {"m-small-prefill-0": 0.6, "m-small-prefill-1": 0.4}


@dataclass(frozen=True)
class TraceWindow:
    start_s: float
    prompt_tokens_per_s: float | None  # None: a collection gap
    generated_tokens_per_s: float | None


def read_windows(*, end_s: int) -> list[TraceWindow]:
    path = shared_data_path("traces", "servegen_m-small_600s.csv")
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if float(r["t_seconds"]) >= FIRST_ROW_DAY * 86400]
    assert len(rows) == 1008
    start = end_s - len(rows) * WINDOW_S
    windows = []
    for i, row in enumerate(rows):
        rate = float(row["requests_per_s"])
        tokens_in = float(row["mean_input_tokens"] or "nan")
        tokens_out = float(row["mean_output_tokens"] or "nan")
        gap = rate == 0 or math.isnan(tokens_in) or math.isnan(tokens_out)
        windows.append(
            TraceWindow(
                start_s=start + i * WINDOW_S,
                prompt_tokens_per_s=None if gap else rate * tokens_in,
                generated_tokens_per_s=None if gap else rate * tokens_out,
            )
        )
    return windows


def openmetrics(windows: list[TraceWindow]) -> str:
    """Counters as a 30 s scrape stored them; gaps have no samples, counters carry on."""
    series: dict[str, list[str]] = {}

    def add(name: str, pod: str, value: float, at_s: float) -> None:
        labels = (
            f'engine="0",instance="10.0.0.1:8000",job="vllm",model_name="m-small",'
            f'namespace="serving",pod="{pod}"'
        )
        series.setdefault(f"{name}{pod}", []).append(f"{name}{{{labels}}} {value:.3f} {at_s:.0f}")

    prompt = {pod: 0.0 for pod in LEADER_SHARES}
    generated = 0.0
    for w in windows:
        for k in range(WINDOW_S // SCRAPE_S):
            at_s = w.start_s + k * SCRAPE_S
            if w.prompt_tokens_per_s is None or w.generated_tokens_per_s is None:
                continue
            if k:  # the sample at the window start closes the previous window's growth
                for pod, share in LEADER_SHARES.items():
                    prompt[pod] += share * w.prompt_tokens_per_s * SCRAPE_S
                generated += w.generated_tokens_per_s * SCRAPE_S
            for pod in LEADER_SHARES:
                add("vllm:prompt_tokens_total", pod, prompt[pod], at_s)
            add("vllm:generation_tokens_total", "m-small-decode-0", generated, at_s)
            # A worker pod that (wrongly) exposes a counter must not be counted.
            add("vllm:prompt_tokens_total", "m-small-prefill-0-1", 1e9 + at_s * 1e3, at_s)
        for pod, share in LEADER_SHARES.items():
            prompt[pod] += share * (w.prompt_tokens_per_s or 0.0) * SCRAPE_S
        generated += (w.generated_tokens_per_s or 0.0) * SCRAPE_S
    lines = ["# TYPE vllm:prompt_tokens counter", "# TYPE vllm:generation_tokens counter"]
    for samples in series.values():
        lines.extend(samples)
    return "\n".join(lines) + "\n# EOF\n"


@dataclass
class History:
    prometheus: PrometheusServer
    windows: list[TraceWindow]
    end_s: int


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    end_s = int(time.time()) // WINDOW_S * WINDOW_S - WINDOW_S
    windows = read_windows(end_s=end_s)
    data_dir = Path(tmp_path_factory.mktemp("tsdb"))
    load_openmetrics(openmetrics(windows), data_dir=data_dir)
    with PrometheusServer(data_dir=data_dir) as prometheus:
        yield History(prometheus=prometheus, windows=windows, end_s=end_s)


@pytest.mark.prometheus
async def test_seven_days_are_rebuilt_per_component_with_gaps_kept(history: History) -> None:
    source = PrometheusSource(url=history.prometheus.url, queries=PrometheusQueries())
    result = await source.backfill_demand(
        [(PREFILL, Component.PREFILL), (DECODE, Component.DECODE)],
        end_s=history.end_s,
        days=7,
        step_s=60,
    )
    assert (result.chunks_total, result.chunks_failed) == (56, 0)  # 6 hours per range query
    prefill, decode = result.histories[PREFILL], result.histories[DECODE]
    assert prefill.timestamps_s.size == 7 * 1440
    assert prefill.timestamps_s[-1] == history.end_s
    assert np.all(np.diff(prefill.timestamps_s) == 60)

    at = {float(t): i for i, t in enumerate(prefill.timestamps_s)}
    gaps = compared = 0
    for w in history.windows:
        # Mid-window, the 1 m rate sees only this window's samples.
        mid = at[w.start_s + WINDOW_S / 2]
        inside = [at[w.start_s + s] for s in range(120, WINDOW_S, 60)]
        if w.prompt_tokens_per_s is None:
            gaps += 1
            assert np.all(np.isnan(prefill.values[inside])), w
            assert np.all(np.isnan(decode.values[inside])), w
            continue
        compared += 1
        assert prefill.values[mid] == pytest.approx(w.prompt_tokens_per_s, rel=1e-3), w
        assert decode.values[mid] == pytest.approx(w.generated_tokens_per_s, rel=1e-3), w
    assert (gaps, compared) == (37, 971)  # the trace README: 37 all-zero windows, days 7-13
    assert not np.any(prefill.values[np.isfinite(prefill.values)] == 0.0)
    assert 0.90 < prefill.observed_fraction < 0.97


@pytest.mark.prometheus
async def test_unknown_components_get_an_all_missing_history(history: History) -> None:
    source = PrometheusSource(url=history.prometheus.url)
    other = ComponentKey("serving", "m-small")  # a prefix of the real LWS names
    result = await source.backfill_demand(
        [(other, Component.UNIFIED)], end_s=history.end_s, days=1, step_s=300
    )
    assert result.chunks_total == 4  # 6 hours each
    assert np.all(np.isnan(result.histories[other].values))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_prometheus_leaves_history_missing() -> None:
    source = PrometheusSource(url=f"http://127.0.0.1:{_closed_port()}", timeout_s=1.0)
    result = await source.backfill_demand(
        [(PREFILL, Component.PREFILL), (DECODE, Component.DECODE)],
        end_s=1_800_000_000,
        days=2,
    )
    assert (result.chunks_total, result.chunks_failed) == (16, 16)  # 2 queries x 8 chunks
    assert all(np.all(np.isnan(h.values)) for h in result.histories.values())
    assert source.stats.errors["connection"] == 16


async def test_a_range_query_slower_than_a_tick_query_still_fills_the_history() -> None:
    """Back-fill range queries had the tick's timeout (capped at half the tick, 7.5 s by
    default), while a day of a large fleet takes longer (about 9 s at 800 leaders): every
    chunk failed and the history stayed empty after each restart. They run off the tick,
    with a limit of their own."""
    import asyncio

    from aiohttp import web

    end_s = 1_800_000_000.0

    async def slow_prometheus(request: web.Request) -> web.Response:
        form = await request.post()
        await asyncio.sleep(2.5)  # a tick query would have given up after 1 s
        start = float(str(form.get("start") or request.query["start"]))
        row = {"metric": {"namespace": PREFILL.namespace, "pod": "m-small-prefill-0"},
               "values": [[start + 600, "1000"]]}  # fmt: skip
        return web.json_response(
            {"status": "success", "data": {"resultType": "matrix", "result": [row]}}
        )

    async with serve(slow_prometheus) as (url, _):
        source = PrometheusSource(url=url, timeout_s=1.0)
        result = await source.backfill_demand(
            [(PREFILL, Component.PREFILL)], end_s=end_s, days=0.25, step_s=300
        )
        source.close()
    assert (result.chunks_total, result.chunks_failed) == (1, 0)  # one 6-hour chunk
    assert np.nansum(result.histories[PREFILL].values) == 1000


async def test_a_partial_answer_of_a_thanos_querier_fails_its_chunk() -> None:
    """Thanos answers a query some of its stores failed with the rest of the series and a
    warning, which the client drops: a history of one leader of two, taken as the whole.
    Asked not to, it refuses the query, and the chunk is missing and counted as failed."""
    from aiohttp import web

    async def thanos(request: web.Request) -> web.Response:
        form = await request.post()
        if (form.get("partial_response") or request.query.get("partial_response")) == "false":
            return web.json_response(
                {"status": "error", "errorType": "execution", "error": "store unavailable"},
                status=422,
            )
        start = float(str(form.get("start") or request.query["start"]))
        row = {"metric": {"namespace": PREFILL.namespace, "pod": "m-small-prefill-0"},
               "values": [[start + 600, "500"]]}  # fmt: skip
        return web.json_response(
            {
                "status": "success",
                "warnings": ["store 10.0.0.7:10901 unavailable"],
                "data": {"resultType": "matrix", "result": [row]},
            }
        )

    async with serve(thanos) as (url, _):
        source = PrometheusSource(url=url, timeout_s=1.0)
        result = await source.backfill_demand(
            [(PREFILL, Component.PREFILL)], end_s=1.8e9, days=0.25, step_s=300
        )
        source.close()
    assert (result.chunks_total, result.chunks_failed) == (1, 1)
    assert np.isnan(result.histories[PREFILL].values).all()


async def test_a_tick_during_a_back_fill_counts_only_its_own_queries() -> None:
    """The per-tick query count was the difference of a counter the back-fill's thread also
    raises: a tick during a back-fill counted 7 of a fixed 6."""
    import asyncio

    from aiohttp import web

    async def prometheus(request: web.Request) -> web.Response:
        if request.path.endswith("/query_range"):
            await asyncio.sleep(0.3)
            return web.json_response({"status": "success",
                                      "data": {"resultType": "matrix", "result": []}})  # fmt: skip
        await asyncio.sleep(0.05)
        return web.json_response({"status": "success",
                                  "data": {"resultType": "vector", "result": []}})  # fmt: skip

    async with serve(prometheus) as (url, _):
        source = PrometheusSource(url=url, timeout_s=5.0)
        backfill = asyncio.create_task(
            source.backfill_demand([(PREFILL, Component.PREFILL)], end_s=1.8e9, days=7)
        )
        for _ in range(5):  # ticks while the week's range queries go out one after another
            await source.observe([])
            assert source.stats.last_tick_queries == len(source.queries.instant_queries())
        await backfill
        source.close()
    assert source.stats.queries_sent > 5 * len(source.queries.instant_queries())


@pytest.mark.prometheus
async def test_a_step_one_leader_skipped_is_missing_not_the_others_sum(tmp_path: Path) -> None:
    """Two leaders at 500 prompt tokens/s each. One is not scraped for 2 minutes (its node's
    network, say) while the other is: those steps summed to 500, half the load, a dip the
    live tick refuses to read (a partial sum understates the load). Later its gang is
    scaled away for 30 minutes and comes back under the same pod name: then the other's
    500 is the whole load, and stays."""
    end_s = int(time.time()) // WINDOW_S * WINDOW_S - WINDOW_S
    start_s = end_s - 7200
    outage = range(start_s + 1800, start_s + 1920)
    gone = range(start_s + 3600, start_s + 5400)
    labels = 'job="vllm",namespace="serving",pod="{}"'
    lines = ["# TYPE vllm:prompt_tokens counter"]
    for pod in ("m-small-prefill-0", "m-small-prefill-1"):
        total = 0.0
        for at_s in range(start_s, end_s + 1, SCRAPE_S):
            total += 0.0 if at_s == start_s else 500.0 * SCRAPE_S
            if pod.endswith("-1") and (at_s in outage or at_s in gone):
                if at_s in gone:
                    total = 0.0  # a new pod's counter starts again
                continue
            lines.append(f"vllm:prompt_tokens_total{{{labels.format(pod)}}} {total:.0f} {at_s}")
    data_dir = tmp_path / "tsdb"
    load_openmetrics("\n".join(lines) + "\n# EOF\n", data_dir=data_dir)
    with PrometheusServer(data_dir=data_dir) as prometheus:
        source = PrometheusSource(url=prometheus.url, queries=PrometheusQueries())
        result = await source.backfill_demand(
            [(PREFILL, Component.PREFILL)], end_s=end_s, days=7200 / 86400, step_s=60
        )
    history = result.histories[PREFILL]
    at = {float(t): i for i, t in enumerate(history.timestamps_s)}

    def steps(first: int, last: int) -> list[int]:
        return [at[float(t)] for t in range(first, last, 60)]

    skipped = history.values[steps(outage.start + 60, outage.stop)]
    assert np.isnan(skipped).any() and not (skipped < 900).any()  # missing, never half
    assert history.values[steps(start_s + 600, outage.start - 60)] == pytest.approx(1000, rel=1e-3)
    alone = history.values[steps(gone.start + 300, gone.stop - 60)]
    assert alone == pytest.approx(500.0, rel=1e-3)  # the gang was gone: the sum is right
    assert not history.timestamps_s.flags.writeable  # one grid, shared by every history


@pytest.mark.prometheus
async def test_a_leader_skipped_across_two_chunks_edge_is_missing_too(tmp_path: Path) -> None:
    """The same 2-minute miss of one leader, at the edge between two range queries (the
    back-fill reads 6 hours a query; here 30 minutes): each query saw only its own side of
    the gap, and the steps read 500, half the load."""
    end_s = int(time.time()) // WINDOW_S * WINDOW_S - WINDOW_S
    grid0 = end_s - 119 * 60  # 2 hours of 60 s steps; the chunks' edge after step 29
    outage = range(grid0 + 29 * 60 - 30, grid0 + 31 * 60 - 30)
    labels = 'job="vllm",namespace="serving",pod="{}"'
    lines = ["# TYPE vllm:prompt_tokens counter"]
    for pod in ("m-small-prefill-0", "m-small-prefill-1"):
        for at_s in range(grid0 - 600, end_s + 1, SCRAPE_S):
            if pod.endswith("-1") and at_s in outage:
                continue
            total = 500.0 * (at_s - grid0 + 600)
            lines.append(f"vllm:prompt_tokens_total{{{labels.format(pod)}}} {total:.0f} {at_s}")
    data_dir = tmp_path / "tsdb"
    load_openmetrics("\n".join(lines) + "\n# EOF\n", data_dir=data_dir)
    with PrometheusServer(data_dir=data_dir) as prometheus:
        source = PrometheusSource(url=prometheus.url, queries=PrometheusQueries())
        result = await backfill_demand(
            source.http,
            source.queries,
            [(PREFILL, Component.PREFILL)],
            end_s=end_s,
            days=7200 / 86400,
            step_s=60,
            chunk_s=1800,
        )
        source.close()
    assert result.chunks_total == 4
    values = result.histories[PREFILL].values
    assert np.isnan(values[29:31]).all()  # missing, never the other leader's half
    assert values[:28] == pytest.approx(1000, rel=1e-3)
    assert values[32:] == pytest.approx(1000, rel=1e-3)


@pytest.mark.parametrize(
    ("kind", "status", "detail", "is_refusal"),
    [
        pytest.param("http_4xx", 422, "query processing would load too many samples", True,
                     id="too-many-samples"),
        pytest.param("http_4xx", 400, "bad_data: parse error", True, id="bad-query"),
        pytest.param("bad_response", None, "expected a result list", True, id="malformed"),
        pytest.param("timeout", None, "deadline passed", True, id="too-heavy-to-finish"),
        pytest.param("http_4xx", 429, "too many outstanding requests", False, id="429-later"),
        pytest.param("http_4xx", 408, "request timeout", False, id="408-later"),
        pytest.param("http_4xx", 422, "partial response disabled; rpc error: code = Unavailable",
                     False, id="thanos-store-coming-up"),
        pytest.param("http_5xx", 503, "Service Unavailable", False, id="503-down"),
        pytest.param("connection", None, "connection refused", False, id="down"),
    ],
)  # fmt: skip
def test_which_failures_are_refusals(kind, status, detail, is_refusal) -> None:
    """A refusal stops the back-fill after its tries; anything that passes with time (a
    Prometheus or Thanos store still coming up, a rate limit) is waited for."""
    error = PrometheusUnavailable("prefill_demand", kind=kind, detail=detail, status=status)
    assert refused(error) is is_refusal
