"""Fixtures of the service tests: one Prometheus and exporter for the session (a Prometheus
start costs seconds), a fake API server per test, each test in its own namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness.fake_kube import FakeKube
from tests.harness.helm_chart import render
from tests.harness.prometheus_server import PrometheusServer
from tests.harness.vllm_exporter import VllmExporter
from tests.service.stack import add_exporter_pods, installed_cluster

# One namespace per end-to-end test; the exporter serves all of them from the start.
NAMESPACES = (
    "up",
    "decisions",
    "dry",
    "prom-down",
    "stale-view",
    "down",
    "sigterm",
    "leader",
    "restart",
    "window",
    "badpolicy",
    "owned",
    "roles",
    "mirror",
    "flip",
    "wake",
    "scale-refused",
    "regain",
    "nonodes",
)


@dataclass
class Live:
    exporter: VllmExporter
    prometheus: PrometheusServer


@pytest.fixture(scope="session")
def live() -> Iterator[Live]:
    with VllmExporter() as exporter:
        for namespace in NAMESPACES:
            add_exporter_pods(exporter, namespace)
        with PrometheusServer(targets=exporter.targets(), scrape_interval_s=0.5) as prometheus:
            prometheus.wait_for_series(
                "vllm:num_requests_waiting", count=len(exporter.targets()) // 2, timeout_s=30
            )
            yield Live(exporter, prometheus)


@pytest.fixture(scope="session")
def chart_objects() -> list[dict[str, Any]]:
    """The chart with its default values, rendered by Helm's engine."""
    return render()


@pytest.fixture
async def kube(chart_objects: list[dict[str, Any]]) -> AsyncIterator[FakeKube]:
    async with installed_cluster(chart_objects) as server:
        yield server
