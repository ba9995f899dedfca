"""Cost of one control-loop tick for 10, 100 and 1,000 PD deployments.

Run from the repository root (needs the `prometheus` binary):

    OPENBLAS_NUM_THREADS=1 python benchmarks/tick.py [--deployments 10 100 1000] [--json FILE]

Per size, a child process runs the cluster side: the fake Kubernetes API server with one
deployment per namespace (the prefill and decode LWS of `examples/pd-deployment.yaml`, one
gang of 2 pods x 8 GPUs each, on 4 GPU nodes per deployment), the vLLM exporter serving
every leader pod, and a real Prometheus scraping it. This process is the service: the real
`Service` (watch caches, Prometheus source, forecasters in a process pool, the core, the
actuator as Lease holder), whose ticks are timed one by one with `time.monotonic()` (wall)
and `time.process_time()` (CPU of this whole process: the loop, the Prometheus query
threads, the watch caches). Keeping the cluster side in another process keeps its CPU out
of the figures. Memory is this process's peak resident set (`ru_maxrss`).

Left out on purpose: the demand back-fill (a start-up cost, not a tick's: `backfill_days`
is 0) and balloon creation (buffers are 0, so steady ticks are measured, not the one-off
burst of creating a thousand balloon gangs). The load sits at the policies' targets, so
steady ticks decide "within tolerance" and write nothing; the measured work is observing,
forecasting, planning and checking every component.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import multiprocessing
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PD_EXAMPLE = REPO / "examples" / "pd-deployment.yaml"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
SCRAPE_INTERVAL_S = 5.0


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
                        exporter.add_lws(
                            namespace=f"model-{d}",
                            lws=lws,
                            gangs=1,
                            pods_per_gang=1,  # workers serve no vLLM metrics: not scraped
                            values=PodValues(
                                waiting=waiting,
                                running=20,
                                kv_usage_fraction=0.5,
                                prompt_tokens_per_s=3000 if "prefill" in lws else 0,
                                generation_tokens_per_s=0 if "prefill" in lws else 600,
                            ),
                        )
                with PrometheusServer(
                    targets=exporter.targets(), scrape_interval_s=SCRAPE_INTERVAL_S
                ) as prometheus:
                    prometheus.wait_for_series(
                        "vllm:num_requests_waiting", count=2 * deployments, timeout_s=120
                    )
                    # rate() over 30 s needs a few scrapes of every counter.
                    await asyncio.sleep(4 * SCRAPE_INTERVAL_S)
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


async def measure(info: dict[str, Any], *, ticks: int, warmup: int) -> dict[str, Any]:
    from autoscaler.adapters.kube_client import new_api_client
    from autoscaler.adapters.prometheus_queries import PrometheusQueries as AdapterQueries
    from autoscaler.service.app import Service
    from autoscaler.service.settings import PrometheusQueries, RunSettings

    vllm = AdapterQueries.vllm(rate_window="30s", mean_window="30s")
    settings = RunSettings(
        prometheus_url=info["prometheus_url"],
        kubeconfig=Path(info["kubeconfig"]),
        http_port=_free_port(),
        lease_namespace="default",
        backfill_days=0,
        staleness_limit="60s",
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
        records = []
        for _ in range(warmup + ticks):
            record = await service.loop.tick()
            records.append(record)
            await asyncio.sleep(0.5)  # let watch events and fits land between ticks
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
        return {
            "components": len(last.plan.components),
            "leader": last.leader,
            "outcomes": sorted({r.outcome for r in measured}),
            "tick_wall_s_median": statistics.median(walls),
            "tick_wall_s_max": max(walls),
            "tick_cpu_s_median": statistics.median(cpus),
            "tick_cpu_s_max": max(cpus),
            "prometheus_queries_per_tick": service.prometheus.stats.last_tick_queries,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "reasons": reasons,
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


def _free_port() -> int:
    from tests.harness.prometheus_server import free_port

    return free_port()


def run_size(deployments: int, *, ticks: int, warmup: int) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tick-bench-") as tmp:
        os.environ["BENCH_TMP"] = tmp
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        started = time.monotonic()
        process = ctx.Process(target=cluster_side, args=(deployments, child), daemon=True)
        process.start()
        if not parent.poll(1800):
            process.kill()
            raise RuntimeError("the cluster side did not come up")
        info = parent.recv()
        setup_s = time.monotonic() - started
        try:
            result = asyncio.run(measure(info, ticks=ticks, warmup=warmup))
        finally:
            parent.send("stop")
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return {
        "deployments": deployments,
        "pods": info["pods"],
        "ready_pods": info["ready_pods"],
        "setup_s": round(setup_s, 1),
        **result,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployments", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--ticks", type=int, default=5, help="measured ticks per size")
    parser.add_argument("--warmup", type=int, default=3, help="ticks before measuring")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_size(args.one, ticks=args.ticks, warmup=args.warmup)))
        return 0
    results = []
    for deployments in args.deployments:
        # Each size in a fresh process: ru_maxrss is a peak and never goes down.
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                f"--one={deployments}",
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
