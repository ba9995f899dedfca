"""The learned capacity a previous instance exported is read back from a real Prometheus.

The history is written with promtool as a 60 s scrape of the service's own `/metrics` would
have stored it, each learned value with its companion report time. Two instances led the
prefill LWS one after the other (their `pod` scrape labels differ), a decode LWS was last
exported five days ago, and two series carry values that are not a capacity (NaN, 0).
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
    RestoredCapacity,
    newest_capacities,
)
from autoscaler.adapters.prometheus_source import PrometheusSource
from autoscaler.core.model import ComponentKey
from tests.harness.prometheus_server import PrometheusServer, load_openmetrics

DAY_S = 86_400
SCRAPE_S = 60
PREFILL = ComponentKey("serving", "llama-prefill")
DECODE = ComponentKey("serving", "llama-decode")
OTHER_NAMESPACE = ComponentKey("staging", "llama-prefill")


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


def openmetrics(series: list[Exported]) -> str:
    lines = [f"# TYPE {LEARNED_CAPACITY_METRIC} gauge"]
    reported = [f"# TYPE {LEARNED_CAPACITY_REPORTED_METRIC} gauge"]
    for s in series:
        labels = (
            f'component="{s.component}",deployment="llama",instance="{s.pod}:8080",'
            f'job="gang-autoscaler",lws="{s.key.lws}",namespace="{s.key.namespace}",'
            f'pod="{s.pod}"'
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
    series = [
        # the instance that led until two days ago
        Exported(PREFILL, "prefill", "ga-7c9-a", now_s - 3 * DAY_S, now_s - 2 * DAY_S, 30e3, 31e3),
        # the instance that led since, until an hour ago
        Exported(PREFILL, "prefill", "ga-7c9-b", now_s - 2 * DAY_S, now_s - 3600, 26e3, 24e3),
        Exported(DECODE, "decode", "ga-7c9-a", now_s - 6 * DAY_S, now_s - 5 * DAY_S, 300, 310),
        Exported(OTHER_NAMESPACE, "prefill", "ga-7c9-b", now_s - DAY_S, now_s - 7200, 9e3, 0),
        Exported(
            ComponentKey("serving", "bad"),
            "prefill",
            "ga-7c9-b",
            now_s - DAY_S,
            now_s - 7200,
            math.nan,
            math.nan,
        ),
    ]
    data_dir = Path(tmp_path_factory.mktemp("tsdb"))
    load_openmetrics(openmetrics(series), data_dir=data_dir)
    with PrometheusServer(data_dir=data_dir) as prometheus:
        yield History(prometheus=prometheus, series=series, now_s=now_s)


@pytest.mark.prometheus
async def test_the_newest_export_of_each_lws_comes_back(history: History) -> None:
    source = PrometheusSource(url=history.prometheus.url)
    found = await source.restore_learned_capacity(lookback_s=7 * DAY_S)
    assert set(found) == {PREFILL, DECODE}  # 0 and NaN are not capacities
    prefill = found[PREFILL]
    assert prefill.capacity_per_gang == 24e3  # the later instance's last value
    assert prefill.written_at_s == history.now_s - 3600
    assert found[DECODE].capacity_per_gang == 310
    assert not source.stats.errors


@pytest.mark.prometheus
async def test_exports_older_than_the_lookback_are_not_restored(history: History) -> None:
    source = PrometheusSource(url=history.prometheus.url)
    found = await source.restore_learned_capacity(lookback_s=4 * DAY_S)
    assert set(found) == {PREFILL}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_prometheus_raises_and_is_counted() -> None:
    source = PrometheusSource(url=f"http://127.0.0.1:{_closed_port()}", timeout_s=1.0)
    with pytest.raises(PrometheusUnavailable) as raised:
        await source.restore_learned_capacity(lookback_s=DAY_S)
    assert raised.value.kind == "connection"
    assert source.stats.errors["connection"] == 1


def _row(value: str, *, at: float = 1.7e9, **labels: str) -> dict[str, object]:
    return {"metric": labels, "value": [at, value]}


def test_series_are_joined_on_every_label_and_the_newest_wins() -> None:
    a = {"namespace": "ns", "lws": "l", "pod": "a"}
    b = {"namespace": "ns", "lws": "l", "pod": "b"}
    values = [_row("500", **a), _row("400", **b), _row("7", namespace="ns", pod="c")]
    written = [_row("1000", **a), _row("2000", **b), _row("3000", namespace="ns", pod="c")]
    assert newest_capacities(values, written) == {
        ComponentKey("ns", "l"): RestoredCapacity(capacity_per_gang=400.0, written_at_s=2000.0)
    }
    # a value whose series has no write time (a different label set) is not trusted
    assert newest_capacities(values[:1], written[1:]) == {}


def test_a_malformed_answer_raises() -> None:
    with pytest.raises(KeyError):
        newest_capacities([{"value": [0, "1"]}], [])
