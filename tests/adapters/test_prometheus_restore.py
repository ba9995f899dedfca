"""The learned capacity a previous instance exported is read back from a real Prometheus.

The history is written with promtool as a 60 s scrape of the service's own `/metrics` would
have stored it, each learned value with its companion report time. Two instances led the
prefill LWS one after the other (their `pod` scrape labels differ) and a third measured it
with another demand query; a decode LWS was last exported five days ago, a recreated one
(another uid) a day ago; two series carry values that are not a capacity (NaN, 0).
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from autoscaler.adapters.prometheus_http import PrometheusUnavailable
from autoscaler.adapters.prometheus_restore import (
    LEARNED_CAPACITY_METRIC,
    LEARNED_CAPACITY_REPORTED_METRIC,
    CapacityIdentity,
    RestoredCapacity,
    demand_fingerprint,
    lookup_windows_s,
    newest_capacities,
)
from autoscaler.adapters.prometheus_source import PrometheusSource
from autoscaler.core.model import ComponentKey
from tests.harness.http_stub import serve
from tests.harness.prometheus_server import PrometheusServer, load_openmetrics

DAY_S = 86_400
SCRAPE_S = 60
PREFILL = ComponentKey("serving", "llama-prefill")
DECODE = ComponentKey("serving", "llama-decode")
OTHER_NAMESPACE = ComponentKey("staging", "llama-prefill")
QUERY = demand_fingerprint("sum by (namespace, pod) (rate(vllm:prompt_tokens_total[1m]))")
OTHER_QUERY = demand_fingerprint("sum by (namespace, pod) (rate(vllm:request_success_total[1m]))")
WANTED = {
    PREFILL: CapacityIdentity("uid-p", "", QUERY),
    DECODE: CapacityIdentity("uid-d", "", QUERY),
    OTHER_NAMESPACE: CapacityIdentity("uid-s", "", QUERY),
    ComponentKey("serving", "bad"): CapacityIdentity("uid-b", "", QUERY),
}


@dataclass(frozen=True)
class Exported:
    """One instance's series of one LWS: values over [start_s, end_s), the last at end_s."""

    key: ComponentKey
    component: str
    pod: str
    start_s: int
    end_s: int
    first: float
    last: float
    uid: str
    query: str = QUERY
    dry_run: str | None = None  # the label's value; None: a series of an earlier version


def openmetrics(series: list[Exported]) -> str:
    lines = [f"# TYPE {LEARNED_CAPACITY_METRIC} gauge"]
    reported = [f"# TYPE {LEARNED_CAPACITY_REPORTED_METRIC} gauge"]
    for s in series:
        labels = (
            f'component="{s.component}",deployment="llama",instance="{s.pod}:8080",'
            f'job="gang-autoscaler",lws="{s.key.lws}",lws_uid="{s.uid}",'
            f'namespace="{s.key.namespace}",pod="{s.pod}",demand_query="{s.query}"'
            + ("" if s.dry_run is None else f',dry_run="{s.dry_run}"')
        )
        count = (s.end_s - s.start_s) // SCRAPE_S
        for i in range(count + 1):
            # The learned value drifts from `first` to `last`: the newest sample must win,
            # not the largest or the mean.
            value = s.first + (s.last - s.first) * i / count
            text = "NaN" if math.isnan(value) else f"{value:g}"
            at_s = s.start_s + i * SCRAPE_S
            lines.append(f"{LEARNED_CAPACITY_METRIC}{{{labels}}} {text} {at_s}")
            reported.append(f"{LEARNED_CAPACITY_REPORTED_METRIC}{{{labels}}} {at_s} {at_s}")
    return "\n".join(lines + reported) + "\n# EOF\n"


@dataclass
class History:
    prometheus: PrometheusServer
    series: list[Exported]
    now_s: int


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    now_s = int(time.time()) // SCRAPE_S * SCRAPE_S
    day, hour = DAY_S, 3600
    series = [
        # the instance that led until two days ago
        Exported(PREFILL, "prefill", "ga-a", now_s - 3 * day, now_s - 2 * day, 30e3, 31e3, "uid-p"),
        # the instance that led since, until half an hour ago
        Exported(
            PREFILL,
            "prefill",
            "ga-b",
            now_s - 2 * day,
            now_s - 1800,
            26e3,
            24e3,
            "uid-p",
            dry_run="false",
        ),
        # a dry-run shadow release's, newer (docs/operators.md: a trial beside the real one)
        Exported(
            PREFILL,
            "prefill",
            "shadow",
            now_s - hour,
            now_s - 60,
            900,
            900,
            "uid-p",
            dry_run="true",
        ),
        # the newest, but measured with another demand query
        Exported(PREFILL, "prefill", "ga-c", now_s - hour, now_s - 60, 5, 6, "uid-p", OTHER_QUERY),
        Exported(DECODE, "decode", "ga-a", now_s - 6 * day, now_s - 5 * day, 300, 310, "uid-d"),
        # the decode LWS before it was deleted and created again
        Exported(DECODE, "decode", "ga-b", now_s - 2 * day, now_s - day, 900, 900, "uid-old"),
        Exported(
            OTHER_NAMESPACE, "prefill", "ga-b", now_s - day, now_s - 2 * hour, 9e3, 0, "uid-s"
        ),
        Exported(
            ComponentKey("serving", "bad"),
            "prefill",
            "ga-b",
            now_s - day,
            now_s - 2 * hour,
            math.nan,
            math.nan,
            "uid-b",
        ),
    ]
    data_dir = Path(tmp_path_factory.mktemp("tsdb"))
    load_openmetrics(openmetrics(series), data_dir=data_dir)
    with PrometheusServer(data_dir=data_dir) as prometheus:
        yield History(prometheus=prometheus, series=series, now_s=now_s)


@pytest.mark.prometheus
async def test_the_newest_export_of_each_lws_comes_back(history: History) -> None:
    source = PrometheusSource(url=history.prometheus.url)
    found = await source.restore_learned_capacity(wanted=WANTED, lookback_s=7 * DAY_S)
    assert set(found) == {PREFILL, DECODE}  # 0 and NaN are not capacities
    prefill = found[PREFILL]
    assert prefill.capacity_per_gang == 24e3  # the later instance's last value, same query
    assert prefill.written_at_s == history.now_s - 1800
    assert found[DECODE].capacity_per_gang == 310  # not the recreated LWS's 900
    assert not source.stats.errors


@pytest.mark.prometheus
async def test_a_dry_run_shadow_s_export_comes_back_to_dry_run_instances_only(
    history: History,
) -> None:
    """A shadow release in dry-run learns from the same pods with its own settings and
    code: a restarted writing instance took its value, the newest, as its own."""
    source = PrometheusSource(url=history.prometheus.url)
    wanted = {PREFILL: WANTED[PREFILL]}
    writing = await source.restore_learned_capacity(wanted=wanted, lookback_s=7 * DAY_S)
    assert writing[PREFILL].capacity_per_gang == 24e3
    shadow = await source.restore_learned_capacity(
        wanted=wanted, lookback_s=7 * DAY_S, include_dry_run=True
    )
    assert shadow[PREFILL].capacity_per_gang == 900
    assert shadow[PREFILL].written_at_s == history.now_s - 60


@pytest.mark.prometheus
async def test_each_wider_lookup_asks_only_for_what_is_missing(history: History) -> None:
    wanted = {PREFILL: WANTED[PREFILL], DECODE: WANTED[DECODE]}
    source = PrometheusSource(url=history.prometheus.url)
    found = await source.restore_learned_capacity(wanted=wanted, lookback_s=7 * DAY_S)
    # prefill is in the last hour; decode needs the day and then the week: 3 lookups
    assert set(found) == {PREFILL, DECODE}
    assert source.stats.queries_sent == 6


@pytest.mark.prometheus
async def test_the_lookups_stop_once_everything_is_found(history: History) -> None:
    source = PrometheusSource(url=history.prometheus.url)
    wanted = {PREFILL: CapacityIdentity("uid-p", "", OTHER_QUERY)}
    found = await source.restore_learned_capacity(wanted=wanted, lookback_s=7 * DAY_S)
    assert found[PREFILL].capacity_per_gang == 6
    assert source.stats.queries_sent == 2


@pytest.mark.prometheus
async def test_exports_older_than_the_lookback_are_not_restored(history: History) -> None:
    source = PrometheusSource(url=history.prometheus.url)
    found = await source.restore_learned_capacity(wanted=WANTED, lookback_s=4 * DAY_S)
    assert set(found) == {PREFILL}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_prometheus_raises_and_is_counted() -> None:
    source = PrometheusSource(url=f"http://127.0.0.1:{_closed_port()}", timeout_s=1.0)
    with pytest.raises(PrometheusUnavailable) as raised:
        await source.restore_learned_capacity(wanted=WANTED, lookback_s=DAY_S)
    assert raised.value.kind == "connection"
    assert source.stats.errors["connection"] == 1


def _row(value: str, *, at: float = 1.7e9, **labels: str) -> dict[str, object]:
    return {"metric": labels, "value": [at, value]}


def test_series_are_joined_on_every_label_and_the_newest_wins() -> None:
    same = {"namespace": "ns", "lws": "l", "lws_uid": "u", "demand_query": "q"}
    a, b = {**same, "pod": "a"}, {**same, "pod": "b"}
    values = [_row("500", **a), _row("400", **b), _row("7", namespace="ns", pod="c")]
    written = [_row("1000", **a), _row("2000", **b), _row("3000", namespace="ns", pod="c")]
    wanted = {ComponentKey("ns", "l"): CapacityIdentity("u", "", "q")}
    assert newest_capacities(values, written, wanted=wanted) == {
        ComponentKey("ns", "l"): RestoredCapacity(capacity_per_gang=400.0, written_at_s=2000.0)
    }
    # a value whose series has no write time (a different label set) is not trusted
    assert newest_capacities(values[:1], written[1:], wanted=wanted) == {}
    # nor one for another object, query or gang template
    for other in (CapacityIdentity("u2", "", "q"), CapacityIdentity("u", "t2", "q")):
        assert newest_capacities(values, written, wanted={ComponentKey("ns", "l"): other}) == {}
    templated = [{**row, "metric": {**row["metric"], "template": "t2"}} for row in values]
    stamped = [{**row, "metric": {**row["metric"], "template": "t2"}} for row in written]
    assert newest_capacities(templated, stamped, wanted={ComponentKey("ns", "l"): other}) == {
        ComponentKey("ns", "l"): RestoredCapacity(capacity_per_gang=400.0, written_at_s=2000.0)
    }


def test_a_malformed_answer_raises() -> None:
    with pytest.raises(KeyError):
        newest_capacities([{"value": [0, "1"]}], [], wanted={})


def test_lookups_widen_up_to_the_lookback() -> None:
    assert lookup_windows_s(7 * DAY_S) == (3600, DAY_S, 7 * DAY_S)
    assert lookup_windows_s(0.01 * DAY_S) == (864,)
    assert lookup_windows_s(DAY_S) == (3600, DAY_S)
    assert lookup_windows_s(0) == ()


def test_the_fingerprint_ignores_whitespace_only() -> None:
    assert demand_fingerprint("sum(rate(x[1m]))") == demand_fingerprint(" sum(rate(x[1m]))\n")
    assert demand_fingerprint("sum(rate(x[1m]))") != demand_fingerprint("sum(rate(x[5m]))")


async def test_a_wider_lookup_too_heavy_for_prometheus_returns_what_was_found() -> None:
    """The week-long lookup of a large fleet passes `--query.max-samples` (422). Raising
    after the narrower lookups had answered made the caller ask again every minute, for
    good; it now stops there with what was found (here nothing)."""
    from aiohttp import web

    answered: list[str] = []

    async def prometheus(request: web.Request) -> web.Response:
        query = (await request.post()).get("query") or request.query.get("query", "")
        answered.append(str(query))
        if "[604800s]" in str(query):
            return web.json_response(
                {"status": "error", "errorType": "execution",
                 "error": "query processing would load too many samples into memory"},
                status=422,
            )  # fmt: skip
        return web.json_response({"status": "success", "data": {"resultType": "vector",
                                                                 "result": []}})  # fmt: skip

    async with serve(prometheus) as (url, _):
        source = PrometheusSource(url=url, timeout_s=2.0)
        found = await source.restore_learned_capacity(wanted=WANTED, lookback_s=7 * DAY_S)
        assert found == {}
        # the hour and the day (two queries each), then the week's first, which failed
        assert len(answered) == 5 and answered[-1].endswith("[604800s])")
        source.close()


async def test_a_wider_lookup_that_meets_an_outage_is_asked_again() -> None:
    """Prometheus restarting between the day's lookup and the week's: raised, so the caller
    asks again a minute later, where a heavy-query refusal ends the lookup."""
    from aiohttp import web

    async def prometheus(request: web.Request) -> web.Response:
        query = (await request.post()).get("query") or request.query.get("query", "")
        if "[86400s]" in str(query):
            return web.Response(status=503, text="Service Unavailable")
        return web.json_response({"status": "success", "data": {"resultType": "vector",
                                                                 "result": []}})  # fmt: skip

    async with serve(prometheus) as (url, _):
        source = PrometheusSource(url=url, timeout_s=2.0)
        with pytest.raises(PrometheusUnavailable):
            await source.restore_learned_capacity(wanted=WANTED, lookback_s=7 * DAY_S)
        source.close()
