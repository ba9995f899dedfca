"""A test exporter that serves vLLM-format `/metrics` for the pods of several LWS deployments.

How pods appear to Prometheus: each pod is its own scrape target, served by one aiohttp
server under `/pods/<namespace>/<pod>/metrics`, with target labels `namespace` and `pod`
(and `__metrics_path__` selecting the path). That is what a real Kubernetes pod scrape
produces: a PodMonitor or `kubernetes_sd_configs` job relabels
`__meta_kubernetes_namespace` / `__meta_kubernetes_pod_name` into `namespace` / `pod` target
labels, and vLLM's own exposition carries only `model_name` (and `engine` in V1), never pod
identity. So the exposition here carries no `namespace`/`pod` labels and `honor_labels` is
not needed. Use `targets()` for the scrape config (`PrometheusServer(targets=...)`).

Pods follow LeaderWorkerSet naming: leader `<lws>-<group>`, workers
`<lws>-<group>-<worker>` (worker index from 1). In a multi-node gang only the leader runs
the vLLM API server, so worker targets expose no `vllm:` series (unless a test asks for
them, to prove they are ignored).

Values are controlled by the test (`set_pod`, `set_lws`) and evaluated at scrape time:
gauges as set (a waiting queue may grow at a set rate), counters growing at a set rate
from the moment the rate was set, so `rate(...)` in Prometheus returns the set rate.
The server runs on its own thread and event loop, so it keeps serving while a test blocks.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

import pytest
from aiohttp import web

from tests.harness.prometheus_server import ScrapeTarget

KvMetricName = Literal["new", "old", "both"]

# vLLM V1 bucket bounds for vllm:time_to_first_token_seconds (see shared vllm-metrics.md).
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
# vLLM's 1-2-5 buckets for request_prompt_tokens / request_generation_tokens (to 8192 here).
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 8192)


@dataclass(frozen=True, slots=True)
class PodValues:
    """What one leader pod reports. Rates are per second, applied from `since_s`."""

    waiting: float = 0.0  # vllm:num_requests_waiting at `since_s`
    waiting_growth_per_s: float = 0.0  # queue growth while saturated
    running: float = 0.0
    kv_usage_fraction: float = 0.0  # may be NaN, to test NaN handling
    prompt_tokens_per_s: float = 0.0
    generation_tokens_per_s: float = 0.0
    mean_prompt_tokens: float = 1000.0  # per finished request
    mean_generation_tokens: float = 200.0
    ttft_s: float = 0.2  # every finished request's time to first token


@dataclass(slots=True)
class _PodState:
    namespace: str
    pod: str
    lws: str
    group_index: int
    worker_index: int
    model_name: str
    engines: int  # 0: V0 (no engine label); n >= 1: V1 with engine="0".."n-1"
    kv_metric: KvMetricName
    values: PodValues = field(default_factory=PodValues)
    since_s: float = field(default_factory=time.time)
    # Counter levels reached at `since_s` (prompt, generation, prompt requests, gen requests)
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: float = 0.0
    serving: bool = True
    explicit_timestamps: bool = False  # write each sample's timestamp in the exposition
    frozen_at_s: float | None = None  # expose fixed values with this explicit timestamp
    expose_vllm: bool = True

    def counters_at(self, now_s: float) -> tuple[float, float, float]:
        elapsed = max(0.0, now_s - self.since_s)
        v = self.values
        prompt = self.prompt_tokens + v.prompt_tokens_per_s * elapsed
        generation = self.generation_tokens + v.generation_tokens_per_s * elapsed
        # Finished requests per second, from whichever token rate the pod serves (a decode
        # pod of a PD pair processes no prompt tokens).
        if v.prompt_tokens_per_s > 0:
            req_rate = v.prompt_tokens_per_s / v.mean_prompt_tokens
        else:
            req_rate = v.generation_tokens_per_s / v.mean_generation_tokens
        return prompt, generation, self.requests + req_rate * elapsed

    def waiting_at(self, now_s: float) -> float:
        elapsed = max(0.0, now_s - self.since_s)
        return self.values.waiting + self.values.waiting_growth_per_s * elapsed


def leader_name(lws: str, group_index: int) -> str:
    return f"{lws}-{group_index}"


def worker_name(lws: str, group_index: int, worker_index: int) -> str:
    return f"{lws}-{group_index}-{worker_index}"


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in pairs)
    return "{" + body + "}" if body else ""


def render_pod(state: _PodState, now_s: float) -> str:
    """The pod's exposition text in vLLM's format (prometheus_client text format 0.0.4)."""
    if not state.expose_vllm:
        return ""
    if state.frozen_at_s is not None:
        now_s = state.frozen_at_s
    suffix = f" {int(now_s * 1000)}" if state.explicit_timestamps else ""
    v = state.values
    engines = [str(i) for i in range(state.engines)] if state.engines else [None]
    share = 1.0 / len(engines)  # sums split over data-parallel engines, as vLLM V1 reports
    prompt, generation, requests = state.counters_at(now_s)
    waiting = state.waiting_at(now_s)
    gen_requests = requests  # one generation-length observation per finished request
    lines: list[str] = []

    def base(engine: str | None) -> list[tuple[str, str]]:
        pairs = [("engine", engine)] if engine is not None else []
        return [*pairs, ("model_name", state.model_name)]

    def sample(
        name: str, value: float, engine: str | None, extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        lines.append(f"{name}{_labels([*base(engine), *extra])} {_fmt(value)}{suffix}")

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
    for e in engines:
        sample("vllm:num_requests_running", v.running * share, e)
    family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
    for e in engines:
        sample("vllm:num_requests_waiting", waiting * share, e)
    if state.kv_metric in ("old", "both"):
        family("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent.")
        for e in engines:
            sample("vllm:gpu_cache_usage_perc", v.kv_usage_fraction, e)
    if state.kv_metric in ("new", "both"):
        family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
        for e in engines:
            sample("vllm:kv_cache_usage_perc", v.kv_usage_fraction, e)
    family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
    for e in engines:
        sample("vllm:prompt_tokens_total", prompt * share, e)
    family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.")
    for e in engines:
        sample("vllm:generation_tokens_total", generation * share, e)
    family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    for e in engines:
        sample("vllm:request_success_total", requests * share, e, (("finished_reason", "stop"),))

    def histogram(name: str, help_text: str, bounds: Iterable[float], observed: float,
                  count: float) -> None:  # fmt: skip
        family(name, "histogram", help_text)
        for e in engines:
            n = count * share
            for bound in bounds:
                le = ("le", repr(float(bound)))
                sample(f"{name}_bucket", n if observed <= bound else 0.0, e, (le,))
            sample(f"{name}_bucket", n, e, (("le", "+Inf"),))
            sample(f"{name}_count", n, e)
            sample(f"{name}_sum", n * observed, e)

    histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        TTFT_BUCKETS_S,
        v.ttft_s,
        requests,
    )
    histogram(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        TOKEN_BUCKETS,
        v.mean_prompt_tokens,
        requests,
    )
    histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        TOKEN_BUCKETS,
        v.mean_generation_tokens,
        gen_requests,
    )
    return "\n".join(lines) + "\n"


class VllmExporter:
    """Serves vLLM metrics for LWS pods; the test sets the values."""

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self._host = host
        self._pods: dict[tuple[str, str], _PodState] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.scrapes = 0

    # ---- deployments and pods

    def add_lws(
        self,
        *,
        namespace: str,
        lws: str,
        gangs: int,
        pods_per_gang: int = 1,
        kv_metric: KvMetricName = "new",
        engines: int = 1,
        model_name: str = "meta-llama/Llama-3.1-70B-Instruct",
        values: PodValues | None = None,
        workers_expose_vllm: bool = False,
        explicit_timestamps: bool = False,
    ) -> list[str]:
        """Add one LWS with `gangs` groups; return its leader pod names.

        `explicit_timestamps` writes sample timestamps into the exposition (as some exporters
        and federation do); only such pods can be `freeze`-d.
        """
        leaders = []
        with self._lock:
            for group in range(gangs):
                for worker in range(pods_per_gang):
                    pod = (
                        leader_name(lws, group) if worker == 0 else worker_name(lws, group, worker)
                    )
                    self._pods[(namespace, pod)] = _PodState(
                        namespace=namespace,
                        pod=pod,
                        lws=lws,
                        group_index=group,
                        worker_index=worker,
                        model_name=model_name,
                        engines=engines,
                        kv_metric=kv_metric,
                        values=values or PodValues(),
                        expose_vllm=worker == 0 or workers_expose_vllm,
                        explicit_timestamps=explicit_timestamps,
                    )
                leaders.append(leader_name(lws, group))
        return leaders

    def remove_pod(self, *, namespace: str, pod: str) -> None:
        with self._lock:
            del self._pods[(namespace, pod)]

    def _leaders(self, namespace: str, lws: str) -> Iterator[_PodState]:
        return (
            s
            for s in self._pods.values()
            if s.namespace == namespace and s.lws == lws and s.worker_index == 0
        )

    def set_pod(self, *, namespace: str, pod: str, **changes: float) -> None:
        """Change a pod's values from now on; counters keep the level they reached."""
        with self._lock:
            state = self._pods[(namespace, pod)]
            now_s = time.time()
            state.prompt_tokens, state.generation_tokens, state.requests = state.counters_at(now_s)
            waiting = state.waiting_at(now_s)
            state.values = replace(state.values, **{"waiting": waiting, **changes})
            state.since_s = now_s

    def set_lws(self, *, namespace: str, lws: str, **changes: float) -> None:
        """`set_pod` on every leader of `lws`."""
        with self._lock:
            pods = [s.pod for s in self._leaders(namespace, lws)]
        for pod in pods:
            self.set_pod(namespace=namespace, pod=pod, **changes)

    def set_serving(self, *, namespace: str, pod: str, serving: bool) -> None:
        """A pod that does not serve answers 503: its scrape fails and its series go stale."""
        with self._lock:
            self._pods[(namespace, pod)].serving = serving

    def freeze(self, *, namespace: str, pod: str) -> None:
        """Keep exposing the current values with their timestamp no longer advancing.

        Prometheus keeps the last sample visible for its lookback delta (5 min by default)
        because explicitly timestamped series get no staleness markers: the sample just ages,
        as it does behind a stuck exporter or a federation hop.
        """
        with self._lock:
            state = self._pods[(namespace, pod)]
            if not state.explicit_timestamps:
                # Switching a series to explicit timestamps makes Prometheus write a
                # staleness marker at once, which is a different scenario.
                raise ValueError(f"{namespace}/{pod} was not added with explicit_timestamps")
            state.frozen_at_s = time.time()

    def targets(self) -> list[ScrapeTarget]:
        """One scrape target per pod (leaders and workers), labelled `namespace` and `pod`."""
        with self._lock:
            pods = sorted(self._pods)
        return [
            ScrapeTarget(
                address=f"{self._host}:{self.port}",
                labels={
                    "namespace": namespace,
                    "pod": pod,
                    "__metrics_path__": f"/pods/{namespace}/{pod}/metrics",
                },
            )
            for namespace, pod in pods
        ]

    # ---- HTTP

    async def _metrics(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["pod"])
        with self._lock:
            self.scrapes += 1
            state = self._pods.get(key)
            if state is None:
                raise web.HTTPNotFound(text=f"no pod {key[0]}/{key[1]}")
            if not state.serving:
                raise web.HTTPServiceUnavailable(text="pod not serving")
            body = render_pod(state, time.time())
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    def start(self) -> str:
        """Serve on a free port on a background thread; return the base URL."""
        ready = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            app = web.Application()
            app.router.add_get("/pods/{namespace}/{pod}/metrics", self._metrics)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self._host, 0)
            await site.start()
            self.port = int(self._runner.addresses[0][1])

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(serve())
            except BaseException as err:
                failure.append(err)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="vllm-exporter", daemon=True)
        self._thread.start()
        ready.wait(timeout=10)
        if failure:
            raise failure[0]
        return f"http://{self._host}:{self.port}"

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> VllmExporter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def vllm_exporter() -> Iterator[VllmExporter]:
    """A started `VllmExporter` with no pods yet; stopped at teardown."""
    with VllmExporter() as exporter:
        yield exporter
