"""Cost of one control-loop tick for 10, 100 and 1,000 PD deployments, without and with
days of demand history behind every forecaster.

Run from the repository root (needs the `prometheus` binary):

    OPENBLAS_NUM_THREADS=1 python benchmarks/tick.py [--deployments 10 100 1000]
        [--history-days 0 7] [--json FILE]

Per size, a child process runs the cluster side: the fake Kubernetes API server with one
deployment per namespace (the prefill and decode LWS of `examples/pd-deployment.yaml`, one
gang of 2 pods x 8 GPUs each, on 4 GPU nodes per deployment), the vLLM exporter serving
every leader pod, and a real Prometheus scraping it. Each `--history-days` value is then
measured against that cluster side in a fresh process (`ru_maxrss` is a peak and never goes
down), which is the service: the real `Service` (watch caches, Prometheus source,
forecasters with fits in a process pool, the core, the actuator as Lease holder), whose
ticks are timed one by one with `time.monotonic()` (wall) and `time.process_time()` (CPU of
this whole process: the loop, the Prometheus query threads, the watch caches; the fit
worker is another process). Memory is this process's peak resident set (`ru_maxrss`).

Demand history. The default planning forecast (`seasonal_envelope`: the state-space model
raised to the envelope of the last days) fits on two days of history. With 0 days the
forecasters hold only the minutes of the run: until a 5-minute window closes there is no
forecast at all, after it persistence stands in (`fallback_reason` says why). With N days,
every component's forecaster gets N days before the timed ticks through the service's own
back-fill: `backfill_days` is N and `DemandForecasts.start_backfill` is called with a
`TraceDemand` where the service passes its Prometheus source (a fresh Prometheus holds
minutes, not days). The history is the last N days of the shared ServeGen trace
`servegen_m-small_600s.csv` (Alibaba Model Studio, requests/s per 10-minute window; windows
where no client sent anything are collection gaps and stay missing, as `forecasting.traces`
reads them). Its end is placed at the service's clock, each window's rate is held over the
back-fill's 60 s steps inside it, and it is scaled so that the busiest window of those days
equals one gang's demand at the policies' targets here (`PREFILL_TOKENS_PER_S` prompt
tokens/s, `DECODE_TOKENS_PER_S` generated tokens/s, what the exporter serves): one gang
always sufficed, so the forecast stays below one gang's capacity and the steady ticks still
decide "within tolerance". The service's fitter submits at most one fit per tick; the
benchmark calls `DemandForecasts.tick` back to back until every component has its first
fit, then times the ticks. The output counts, over the timed ticks, the forecasts made by
the fitted model (`fallback_reason` None) and the reasons of those that fell back.

Forecast windows close every 5 minutes, for all components in the same tick; the output
counts the timed steady ticks that closed one. With history, the first tick past the next
window boundary is then timed on its own: every fitted model takes the closed window in
(one extend of the state-space model per component). Without history that tick is not a
steady one and is not timed: the closed window brings the first persistence forecast, which
is the demand itself, one gang's learned capacity give or take noise, so the forecast floor
(`ceil(forecast / capacity)`) asks many components for a second gang.

Left out on purpose: balloon creation (buffers are 0, so steady ticks are measured, not the
one-off burst of creating a thousand balloon gangs). The load sits at the policies' targets,
so steady ticks decide "within tolerance" and write nothing; the measured work is observing,
forecasting, planning and checking every component.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import itertools
import json
import multiprocessing
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from autoscaler.adapters.prometheus_backfill import BackfillResult
    from autoscaler.core.model import Component, ComponentKey
    from autoscaler.service.app import Service
    from autoscaler.service.control_loop import TickRecord
    from autoscaler.service.forecasts import ForecastStatus
    from forecasting.traces import Trace

PD_EXAMPLE = REPO / "examples" / "pd-deployment.yaml"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
SCRAPE_INTERVAL_S = 5.0
RATE_WINDOW_S = 30.0
# What each leader pod serves; at the policies' targets, the demand of one gang.
PREFILL_TOKENS_PER_S = 3000.0
DECODE_TOKENS_PER_S = 600.0
HISTORY_TRACE = "servegen-m-small"
FIT_TIMEOUT_S = 3600.0


def _manifests(namespace: str) -> list[dict[str, Any]]:
    out = []
    for doc in yaml.safe_load_all(PD_EXAMPLE.read_text()):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = namespace
        doc["spec"]["replicas"] = 1
        annotations = doc["metadata"]["annotations"]
        annotations["gang-autoscaler.io/min-buffer"] = "0"
        annotations["gang-autoscaler.io/max-buffer"] = "0"
        # One rack per gang would need a rack per LWS; nodes carry no rack label here.
        annotations.pop("leaderworkerset.sigs.k8s.io/exclusive-topology", None)
        out.append(doc)
    return out


def populate(kube: Any, deployments: int) -> None:
    """`deployments` PD deployments, one per namespace, with 4 GPU nodes each, scheduled by
    the fake's LWS controller (`kube` is a `tests.harness.fake_kube.FakeKube`)."""
    for d in range(deployments):
        for n in range(4):
            kube.add_node(
                f"gpu-{d}-{n}",
                cpu="190",
                memory="1500Gi",
                gpus=8,
                extended={"ephemeral-storage": "3000Gi"},
                labels={"nvidia.com/gpu.product": GPU_PRODUCT},
            )
    for d in range(deployments):
        namespace = f"model-{d}"
        kube.add_namespace(namespace)
        for manifest in _manifests(namespace):
            kube.apply(manifest)
    kube.reconcile()  # LWS controller and scheduler, once for everything


def cluster_side(deployments: int, conn: Connection) -> None:
    """The child process: fake API server + exporter + Prometheus until told to stop."""
    from tests.harness.fake_kube import FakeKube
    from tests.harness.prometheus_server import PrometheusServer
    from tests.harness.vllm_exporter import PodValues, VllmExporter

    async def main() -> None:
        async with FakeKube.start(auto_reconcile=False, bookmark_interval_s=5.0) as kube:
            populate(kube, deployments)
            pods = kube.objects("pods")
            ready = sum(
                1
                for p in pods
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions", [])
                )
            )
            kubeconfig = kube.write_kubeconfig(Path(os.environ["BENCH_TMP"]) / "kubeconfig")
            with VllmExporter() as exporter:
                # At the policies' targets: 4 waiting on prefill, 2 on decode, per gang.
                for d in range(deployments):
                    for lws, waiting in (("llama-prefill", 4.0), ("llama-decode", 2.0)):
                        prefill = "prefill" in lws
                        exporter.add_lws(
                            namespace=f"model-{d}",
                            lws=lws,
                            gangs=1,
                            pods_per_gang=1,  # workers serve no vLLM metrics: not scraped
                            values=PodValues(
                                waiting=waiting,
                                running=20,
                                kv_usage_fraction=0.5,
                                prompt_tokens_per_s=PREFILL_TOKENS_PER_S if prefill else 0,
                                generation_tokens_per_s=0 if prefill else DECODE_TOKENS_PER_S,
                            ),
                        )
                with PrometheusServer(
                    targets=exporter.targets(), scrape_interval_s=SCRAPE_INTERVAL_S
                ) as prometheus:
                    prometheus.wait_for_series(
                        "vllm:num_requests_waiting", count=2 * deployments, timeout_s=120
                    )
                    # Until rate() has a whole window of every counter it reads the demand
                    # low, and the capacity per gang learned from it is too low to hold at.
                    await asyncio.sleep(2 * RATE_WINDOW_S)
                    conn.send(
                        {
                            "kubeconfig": str(kubeconfig),
                            "prometheus_url": prometheus.url,
                            "pods": len(pods),
                            "ready_pods": ready,
                        }
                    )
                    # Serve until the parent says stop (without blocking the fake's loop).
                    while not conn.poll():
                        await asyncio.sleep(0.2)

    asyncio.run(main())


# -- demand history ---------------------------------------------------------------------------


def trace_history(
    trace: Trace, *, end_s: float, days: float, step_s: float, peak: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The last `days` of `trace` on the back-fill's grid of `step_s` ending at `end_s`.

    The trace's end is placed at the grid's end; each grid point takes the rate of the trace
    window it falls in (NaN where the trace has a gap); the values are scaled so that the
    busiest window of those days equals `peak`.
    """
    from autoscaler.adapters.prometheus_backfill import DAY_S, history_grid

    ends = trace.series.timestamps_s  # each window labelled by its end
    span_s = float(ends[-1] - ends[0]) + trace.native_step_s
    if days * DAY_S > span_s:
        raise ValueError(f"{trace.name} covers {span_s / DAY_S:g} days, not {days:g}")
    grid = history_grid(end_s=end_s, days=days, step_s=step_s)
    windows = np.searchsorted(ends, grid - grid[-1] + ends[-1], side="left")
    rates = trace.series.values[windows]
    return grid, rates * (peak / np.nanmax(rates))


class TraceDemand:
    """Demand history from a trace, answering the back-fill as `PrometheusSource` does."""

    def __init__(self, trace: Trace, *, peak_by_component: Mapping[Component, float]) -> None:
        self.trace = trace
        self.peak_by_component = peak_by_component

    async def backfill_demand(
        self,
        components: Iterable[tuple[ComponentKey, Component]],
        *,
        end_s: float,
        days: float,
        step_s: float,
    ) -> BackfillResult:
        from autoscaler.adapters.prometheus_backfill import BackfillResult, DemandHistory

        by_kind: dict[Component, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = {}
        histories = {}
        for key, component in components:
            if component not in by_kind:
                by_kind[component] = trace_history(
                    self.trace,
                    end_s=end_s,
                    days=days,
                    step_s=step_s,
                    peak=self.peak_by_component[component],
                )
            grid, values = by_kind[component]
            histories[key] = DemandHistory(key=key, step_s=step_s, timestamps_s=grid, values=values)
        return BackfillResult(histories=histories, chunks_total=0, chunks_failed=0, errors=())


def history_source() -> TraceDemand:
    from autoscaler.core.model import Component
    from forecasting.traces import load_trace

    return TraceDemand(
        load_trace(HISTORY_TRACE),
        peak_by_component={
            Component.PREFILL: PREFILL_TOKENS_PER_S,
            Component.DECODE: DECODE_TOKENS_PER_S,
        },
    )


def _fitted(status: ForecastStatus) -> bool:
    # A fit that failed counts as done: its error is in the output.
    return status.fits_completed > 0 or status.last_fit_error is not None


async def seed_history(service: Service) -> dict[str, Any]:
    """Back-fill every component's demand from the trace, then fit every forecaster once."""
    now_s = time.time()
    policies = service.kube.snapshot(now_s=now_s).policies
    components = [(key, policy.component) for key, policy in policies.items()]
    keys = [key for key, _ in components]
    source = history_source()
    forecasts = service.forecasts
    started = time.monotonic()
    # The back-fill only calls the source's `backfill_demand`. Every component is now known
    # to the service, so its first tick starts no back-fill of its own.
    forecasts.start_backfill(source, components, now_s=now_s)  # type: ignore[arg-type]
    while not all(forecasts.status(key).backfilled for key in keys):
        await asyncio.sleep(0.1)
    backfilled = time.monotonic()
    unfitted = keys
    while unfitted:
        if time.monotonic() - backfilled > FIT_TIMEOUT_S:
            raise RuntimeError(f"{len(unfitted)} forecasters not fitted in {FIT_TIMEOUT_S:g}s")
        for _ in range(50):  # collect the finished fit, submit the next
            forecasts.tick(now_s=time.time())
            await asyncio.sleep(0.02)
        unfitted = [key for key in unfitted if not _fitted(forecasts.status(key))]
    errors = {forecasts.status(key).last_fit_error for key in keys} - {None}
    return {
        "history_trace": source.trace.source.name,
        "history_components": len(keys),
        "backfill_s": round(backfilled - started, 1),
        "first_fits_s": round(time.monotonic() - backfilled, 1),
        "fit_errors": sorted(str(e) for e in errors)[:3],
    }


# -- the service side -------------------------------------------------------------------------


async def measure(
    info: dict[str, Any], *, history_days: float, ticks: int, warmup: int
) -> dict[str, Any]:
    from autoscaler.adapters.kube_client import new_api_client
    from autoscaler.adapters.prometheus_queries import PrometheusQueries
    from autoscaler.service.app import Service
    from autoscaler.service.settings import RunSettings

    window = f"{RATE_WINDOW_S:g}s"
    vllm = PrometheusQueries.vllm(rate_window=window, mean_window=window)
    settings = RunSettings(
        prometheus_url=info["prometheus_url"],
        kubeconfig=Path(info["kubeconfig"]),
        http_port=_free_port(),
        lease_namespace="default",
        backfill_days=history_days,
        staleness_limit=timedelta(seconds=60),
        queries=PrometheusQueries(
            waiting=vllm.waiting,
            running=vllm.running,
            kv_cache=vllm.kv_cache,
            prefill_demand=vllm.prefill_demand,
            decode_demand=vllm.decode_demand,
        ),
    )
    api = await new_api_client(kubeconfig=settings.kubeconfig)
    service = Service(settings, api_client=api, http_host="127.0.0.1")
    try:
        await service.start(sync_timeout_s=300)
        deadline = time.monotonic() + 30
        while not service.is_leader() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        history = await seed_history(service) if history_days > 0 else {}
        records = []
        steady_stalls: list[float] = []
        for _ in range(warmup + ticks):
            async with loop_stall_probe() as stalls:
                record = await service.loop.tick()
            records.append(record)
            steady_stalls.append(max(stalls))
            await asyncio.sleep(0.5)  # let watch events and fits land between ticks
        step_s = service.forecasts.step_s
        window_tick = None
        window_stall_s = None
        if history_days > 0:  # the first tick after the next forecast window closes
            await asyncio.sleep(step_s - time.time() % step_s + 1.0)
            async with loop_stall_probe() as stalls:
                window_tick = await service.loop.tick()
            window_stall_s = max(stalls)
        if os.environ.get("BENCH_PROFILE"):
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            await service.loop.tick()
            profiler.disable()
            stats = pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative")
            stats.print_stats(45)
        measured = records[warmup:]
        last = measured[-1]
        assert last.plan is not None, last.outcome
        reasons: dict[str, int] = {}
        for plan in last.plan.components.values():
            reasons[plan.reason.value] = reasons.get(plan.reason.value, 0) + 1
        walls = [r.duration_s for r in measured]
        cpus = [r.cpu_s for r in measured]
        starts = [r.started_at_s for r in records[max(warmup - 1, 0) :]]
        from_model = [
            sum(1 for f in r.forecasts.values() if f.fallback_reason is None) for r in measured
        ]
        fallbacks = collections.Counter(
            f.fallback_reason for r in measured for f in r.forecasts.values() if f.fallback_reason
        )
        return {
            "history_days": history_days,
            **history,
            "components": len(last.plan.components),
            "leader": last.leader,
            "outcomes": sorted({r.outcome for r in measured}),
            "tick_wall_s_median": statistics.median(walls),
            "tick_wall_s_max": max(walls),
            "tick_cpu_s_median": statistics.median(cpus),
            "tick_cpu_s_max": max(cpus),
            "measured_ticks_closing_a_window": sum(
                1 for a, b in itertools.pairwise(starts) if b // step_s > a // step_s
            ),
            "window_closing_tick": None
            if window_tick is None
            else {
                "outcome": window_tick.outcome,
                "wall_s": window_tick.duration_s,
                "cpu_s": window_tick.cpu_s,
                "scale_writes": _scale_writes([window_tick]),
                "longest_loop_stall_s": window_stall_s,
            },
            # How long the event loop ran without letting another task in (a Lease renewal,
            # a probe), at most, over each timed steady tick: the largest.
            "longest_loop_stall_s": max(steady_stalls[warmup:]),
            # Steady ticks write nothing; a write would be in the figures.
            "scale_writes": {
                "warmup": _scale_writes(records[:warmup]),
                "timed": _scale_writes(measured),
            },
            "prometheus_queries_per_tick": service.prometheus.stats.last_tick_queries,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "reasons": reasons,
            # Per timed tick: forecasts made, and the fewest made by the fitted model.
            "forecasts_per_tick": len(last.forecasts),
            "forecasts_from_the_model_min": min(from_model),
            "forecast_fallbacks": dict(fallbacks.most_common(3)),
            "components_with_a_missing_signal": sum(
                1 for s in last.signals.values() if s.missing_reasons
            ),
            "missing_reasons": sorted(
                {f"{k}: {v}" for s in last.signals.values() for k, v in s.missing_reasons.items()}
            )[:3],
        }
    finally:
        await service.close()
        await api.close()


@contextlib.asynccontextmanager
async def loop_stall_probe(period_s: float = 0.005) -> AsyncIterator[list[float]]:
    """While inside, a task that asks to run every `period_s` records how late each wake-up
    came: the time the event loop spent without giving any other task a turn."""
    stalls: list[float] = [0.0]
    asked = [time.monotonic()]

    async def probe() -> None:
        while True:
            asked[0] = time.monotonic()
            await asyncio.sleep(period_s)
            stalls.append(max(time.monotonic() - asked[0] - period_s, 0.0))

    task = asyncio.create_task(probe())
    try:
        yield stalls
    finally:
        # a stretch after the last await inside is over by now, its wake-up still pending
        stalls.append(max(time.monotonic() - asked[0] - period_s, 0.0))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _scale_writes(records: list[TickRecord]) -> int:
    return sum(
        1
        for r in records
        if r.applied is not None
        for c in r.applied.components.values()
        if c.scale is not None and c.scale.result.value == "scaled"
    )


def _free_port() -> int:
    from tests.harness.prometheus_server import free_port

    return free_port()


@contextlib.contextmanager
def cluster(deployments: int) -> Iterator[dict[str, Any]]:
    """The cluster side in a child process, for as long as the block runs."""
    with tempfile.TemporaryDirectory(prefix="tick-bench-") as tmp:
        os.environ["BENCH_TMP"] = tmp
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        started = time.monotonic()
        process = ctx.Process(target=cluster_side, args=(deployments, child), daemon=True)
        process.start()
        try:
            deadline = time.monotonic() + 1800
            while not parent.poll(1.0):
                if not process.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the cluster side did not come up")
            info = parent.recv()
            info["setup_s"] = round(time.monotonic() - started, 1)
            yield info
        finally:
            with contextlib.suppress(OSError):  # a child that died has closed its end
                parent.send("stop")
            process.join(timeout=60)
            if process.is_alive():
                process.kill()


def run_one(
    deployments: int, info: dict[str, Any], *, history_days: float, ticks: int, warmup: int
) -> dict[str, Any]:
    result = asyncio.run(measure(info, history_days=history_days, ticks=ticks, warmup=warmup))
    return {
        "deployments": deployments,
        "pods": info["pods"],
        "ready_pods": info["ready_pods"],
        "setup_s": info["setup_s"],
        **result,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployments", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument(
        "--history-days",
        type=float,
        nargs="+",
        default=[0.0, 7.0],
        help="days of demand history behind every forecaster, one measurement per value "
        "(0: none, every forecast falls back; 7: the service's default back-fill)",
    )
    parser.add_argument("--ticks", type=int, default=5, help="measured ticks per size")
    parser.add_argument("--warmup", type=int, default=3, help="ticks before measuring")
    parser.add_argument("--json", type=Path, help="write the results here")
    # One size with the first --history-days value in this process (BENCH_PROFILE=1 to
    # profile a tick); --cluster: the info of a cluster side already running.
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cluster", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        options = {"history_days": args.history_days[0], "ticks": args.ticks, "warmup": args.warmup}
        if args.cluster is not None:
            result = run_one(args.one, args.cluster, **options)
        else:
            with cluster(args.one) as info:
                result = run_one(args.one, info, **options)
        print(json.dumps(result))
        return 0
    results = []
    for deployments in args.deployments:
        with cluster(deployments) as info:
            for days in args.history_days:
                # Each measurement in a fresh process: ru_maxrss is a peak.
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        f"--one={deployments}",
                        f"--history-days={days:g}",
                        f"--cluster={json.dumps(info)}",
                        f"--ticks={args.ticks}",
                        f"--warmup={args.warmup}",
                    ],
                    check=True,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results.append(result)
                print(json.dumps(result), flush=True)
    report = {"python": platform.python_version(), "cpus": os.cpu_count(), "results": results}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
