"""The end-to-end stack of the service tests: the fake Kubernetes API server, a real
Prometheus scraping the vLLM exporter, and the real `Service` started in-process.

The PD deployment is the repository's `examples/pd-deployment.yaml` (prefill and decode
LWS, 2 pods of 8 GPUs per gang, exclusive rack topology), put in a namespace of each test's
own, with the annotations a test overrides. Every rack has two GPU nodes, so one rack holds
exactly one gang (the LWS's exclusive topology).

The exporter serves a leader pod for every group a component could ever have (up to its
max-replicas), so Prometheus's targets never change during a test: the service only reads
the leaders of ready gangs, which the fake API server decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client

from autoscaler.adapters.prometheus_queries import PrometheusQueries
from autoscaler.service.app import Service
from autoscaler.service.settings import RunSettings
from tests.harness.fake_kube import FakeKube
from tests.harness.helm_chart import NAMESPACE as CHART_NAMESPACE
from tests.harness.helm_chart import service_rbac
from tests.harness.prometheus_server import free_port
from tests.harness.vllm_exporter import VllmExporter

REPO = Path(__file__).resolve().parents[2]
PD_EXAMPLE = REPO / "examples" / "pd-deployment.yaml"
RACK_LABEL = "example.com/rack"  # the example's exclusive topology key
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
LWS_API = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
PREFILL, DECODE = "llama-prefill", "llama-decode"
MAX_GANGS = {PREFILL: 4, DECODE: 6}
# Annotations for a component that holds no balloon gangs.
NO_BUFFER = {"gang-autoscaler.io/min-buffer": "0", "gang-autoscaler.io/max-buffer": "0"}

# Short rate() windows: the test Prometheus scrapes every second.
DEMAND_WINDOW = "5s"
TEST_QUERIES = PrometheusQueries.vllm(rate_window=DEMAND_WINDOW, mean_window="10s")

TICK = "500ms"


def pd_manifests(namespace: str, annotations: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """The example's two LWS in `namespace`, with `annotations[lws]` merged over theirs."""
    docs = [d for d in yaml.safe_load_all(PD_EXAMPLE.read_text()) if d]
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        name = doc["metadata"]["name"]
        doc["metadata"]["namespace"] = namespace
        doc["metadata"]["annotations"].update(
            {"gang-autoscaler.io/max-replicas": str(MAX_GANGS[name])}
        )
        doc["metadata"]["annotations"].update(annotations.get(name, {}))
        out.append(doc)
    return out


def add_gpu_zones(kube: FakeKube, *, zones: int, prefix: str = "z") -> None:
    for zone in range(zones):
        for node in range(2):
            kube.add_node(
                f"gpu-{prefix}{zone}-{node}",
                cpu="190",
                memory="1500Gi",
                gpus=8,
                extended={"ephemeral-storage": "3000Gi"},
                labels={
                    "nvidia.com/gpu.product": GPU_PRODUCT,
                    RACK_LABEL: f"{prefix}{zone}",
                },
            )


@contextlib.asynccontextmanager
async def installed_cluster(
    chart_objects: list[dict[str, Any]], **options: Any
) -> AsyncIterator[FakeKube]:
    """A fake API server with 8 racks of GPU nodes and the chart installed, that serves the
    service only what the chart grants it; leaving, checks the service was refused nothing."""
    async with FakeKube.start(bookmark_interval_s=0.5, **options) as kube:
        add_gpu_zones(kube, zones=8)
        install_chart(kube, chart_objects)
        yield kube
        assert kube.denied() == [], "the service needs a grant the chart does not give"


def install_chart(kube: FakeKube, objects: list[dict[str, Any]]) -> None:
    """What `helm install` leaves that the service relies on: its release namespace (the
    Lease's), the balloon PriorityClass, and RBAC, enforced from here on."""
    kube.add_namespace(CHART_NAMESPACE)
    for obj in objects:
        if obj["kind"] == "PriorityClass":
            kube.apply(obj)
    kube.enforce_rbac(service_rbac(objects))


def add_exporter_pods(exporter: VllmExporter, namespace: str) -> None:
    for lws, gangs in MAX_GANGS.items():
        exporter.add_lws(namespace=namespace, lws=lws, gangs=gangs, pods_per_gang=2)


def settings_for(prometheus_url: str, **overrides: Any) -> RunSettings:
    values: dict[str, Any] = {
        "prometheus_url": prometheus_url,
        "tick": TICK,
        "http_port": free_port(),
        "lease_namespace": CHART_NAMESPACE,  # the chart's, where it grants the Lease
        "lease_duration": "3s",
        "prometheus_timeout": "2s",
        "staleness_limit": "5s",
        "backfill_days": 0.01,
        "queries": TEST_QUERIES,
        "demand_window": DEMAND_WINDOW,
    }
    values.update(overrides)
    return RunSettings(**values)


class Running:
    """One in-process service and what a test needs to watch it."""

    def __init__(self, service: Service, api: client.ApiClient, executor: ThreadPoolExecutor):
        self.service = service
        self.api = api
        self.executor = executor
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service.http.port}"

    async def get(self, path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as response:
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.text()

    async def metric(self, name: str, **labels: str) -> float | None:
        """One sample of the service's own /metrics, or None when the series is absent."""
        _, text = await self.get("/metrics")
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            sample_name, _, label_text = series.partition("{")
            if sample_name != name:
                continue
            got = ",".join(sorted(p for p in label_text.rstrip("}").split(",") if p))
            if got == wanted:
                return float(value)
        return None

    async def close(self, *, release_lease: bool = True) -> None:
        self.stop.set()
        if self.task is not None:
            await self.task
        await self.service.close(release_lease=release_lease)
        await self.api.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


async def start_service(kube: FakeKube, settings: RunSettings, **options: Any) -> Running:
    api = kube.api_client()
    executor = ThreadPoolExecutor(max_workers=1)
    service = Service(
        settings,
        api_client=api,
        executor=executor,
        http_host="127.0.0.1",
        forecast_step_s=options.pop("forecast_step_s", 5.0),
        refit_interval_s=options.pop("refit_interval_s", 5.0),
        **options,
    )
    running = Running(service, api, executor)
    await service.start(sync_timeout_s=10.0)
    running.task = asyncio.create_task(service.run(running.stop))
    return running


async def wait_until(
    predicate: Callable[[], Awaitable[bool] | bool], *, timeout_s: float, what: str
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.1)


def spec_gangs(kube: FakeKube, namespace: str, lws: str) -> int:
    obj = kube.object("leaderworkersets", namespace, lws)
    assert obj is not None
    return int(obj["spec"]["replicas"])


def lws_pods(kube: FakeKube, namespace: str, lws: str) -> list[dict[str, Any]]:
    return kube.objects("pods", namespace, label_selector=f"leaderworkerset.sigs.k8s.io/name={lws}")


def balloon_pods(kube: FakeKube, namespace: str, lws: str | None = None) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/managed-by=gang-autoscaler,gang-autoscaler.io/balloon-for"
    if lws:
        selector += f"={lws}"
    return kube.objects("pods", namespace, label_selector=selector)


def writes(kube: FakeKube) -> list[tuple[str, str, str]]:
    """Every write the API server served, except leader-election Lease traffic."""
    return [
        r
        for r in kube.request_log
        if r[0] in ("POST", "PUT", "PATCH", "DELETE") and "/leases" not in r[1]
    ]
