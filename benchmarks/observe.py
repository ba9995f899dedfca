"""Observe benchmark: one tick's Prometheus observe time for 200 PD deployments.

Run from the repository root (needs Debian's `prometheus` on PATH):

    OPENBLAS_NUM_THREADS=1 python benchmarks/observe.py [--deployments 200] [--json FILE]

Starts the test vLLM exporter with `--deployments` prefill/decode deployments (each
component one LWS of `--gangs` gangs of `--pods-per-gang` pods: leaders serve vLLM metrics,
workers are scraped too and serve none), a real Prometheus scraping every pod every
`--scrape-interval-s`, waits until every component has every signal, then times
`PrometheusSource.observe` over `--ticks` ticks with the default queries. It also records
the largest gap between 10 ms event-loop ticks while observing (the queries run in threads,
so the loop must stay free), the queries per tick, and the time of the Python mapping alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.adapters.prometheus_source import ComponentTarget, PrometheusSource
from autoscaler.core.model import Component, ComponentKey
from tests.harness.prometheus_server import PrometheusServer, ScrapeTarget
from tests.harness.vllm_exporter import PodValues, VllmExporter


def build(
    exporter: VllmExporter, *, deployments: int, gangs: int, pods: int
) -> list[ComponentTarget]:
    targets = []
    for i in range(deployments):
        namespace = f"team-{i % 10}"
        for part, component in (("prefill", Component.PREFILL), ("decode", Component.DECODE)):
            lws = f"model-{i}-{part}"
            exporter.add_lws(
                namespace=namespace,
                lws=lws,
                gangs=gangs,
                pods_per_gang=pods,
                kv_metric="new" if i % 2 else "both",
                values=PodValues(
                    waiting=i % 5,
                    running=10 + i % 7,
                    kv_usage_fraction=0.5,
                    prompt_tokens_per_s=1000.0 + i,
                    generation_tokens_per_s=200.0 + i,
                ),
            )
            targets.append(
                ComponentTarget(
                    key=ComponentKey(namespace, lws),
                    component=component,
                    ready_group_indexes=frozenset(range(gangs)),
                )
            )
    return targets


T = TypeVar("T")


async def loop_stall_s(
    awaitable_factory: Callable[[], Awaitable[T]], *, period_s: float = 0.01
) -> tuple[T, float]:
    """Run the coroutine while a 10 ms ticker measures the largest gap between its ticks."""
    worst = 0.0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(period_s)
            now = time.perf_counter()
            worst = max(worst, now - last - period_s)
            last = now

    task = asyncio.create_task(ticker())
    result = await awaitable_factory()
    stop.set()
    await task
    return result, worst


async def curl_queries(url: str, source: PrometheusSource) -> None:
    processes = [
        await asyncio.create_subprocess_exec(
            "curl",
            "-sf",
            "-o",
            "/dev/null",
            f"{url}/api/v1/query",
            "--data-urlencode",
            f"query={query}",
        )
        for query in source.queries.instant_queries().values()
    ]
    for process in processes:
        await process.wait()


def serve_exporter(args: argparse.Namespace, conn: Connection) -> None:
    """Child process: the exporter, so its rendering does not compete with the measured
    process for the GIL (real vLLM pods are other processes too)."""
    with VllmExporter() as exporter:
        targets = build(
            exporter, deployments=args.deployments, gangs=args.gangs, pods=args.pods_per_gang
        )
        conn.send((targets, exporter.targets()))
        conn.recv()  # wait until the parent is done


async def run(args: argparse.Namespace) -> dict[str, object]:
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.Process(target=serve_exporter, args=(args, child), daemon=True)
    process.start()
    try:
        targets, scrape_targets = parent.recv()
        return await measure(args, targets, scrape_targets)
    finally:
        parent.send("stop")
        process.join(timeout=10)


async def measure(
    args: argparse.Namespace, targets: list[ComponentTarget], scrape_targets: list[ScrapeTarget]
) -> dict[str, object]:
    pods = len(scrape_targets)
    leaders = len(targets) * args.gangs
    with PrometheusServer(
        targets=scrape_targets, scrape_interval_s=args.scrape_interval_s
    ) as prometheus:
        started = time.monotonic()
        prometheus.wait_for_series("vllm:num_requests_running", count=leaders, timeout_s=120)
        source = PrometheusSource(
            url=prometheus.url, timeout_s=10.0, max_parallel_queries=args.parallel
        )
        while True:
            signals = await source.observe(targets)
            missing = sum(1 for s in signals.values() if s.missing_reasons)
            if not missing or time.monotonic() - started > 180:
                break
            await asyncio.sleep(args.scrape_interval_s)
        if missing:
            raise SystemExit(f"{missing} components still miss signals after 180 s")

        load_before = os.getloadavg()[0]
        durations, stalls = [], []
        for _ in range(args.ticks):
            t0 = time.perf_counter()
            signals, stall = await loop_stall_s(lambda: source.observe(targets))
            durations.append(time.perf_counter() - t0)
            stalls.append(stall)
            await asyncio.sleep(0.2)
        # The same ticker with nothing else running on the loop: on a busy machine the OS
        # alone delays a 10 ms sleep; the difference is what observe() adds.
        idle_stalls = []
        for _ in range(args.ticks):
            _, stall = await loop_stall_s(lambda: asyncio.sleep(statistics.median(durations)))
            idle_stalls.append(stall)
        # Control: the same six queries sent by curl processes, so Prometheus works as hard
        # but nothing runs in this process. On a 2-core machine with Prometheus local, any
        # stall seen here is CPU contention, not the event loop being blocked.
        external_stalls = []
        for _ in range(args.ticks):
            _, stall = await loop_stall_s(lambda: curl_queries(prometheus.url, source))
            external_stalls.append(stall)
        outcomes = await source.query_all()
        t0 = time.perf_counter()
        for target in targets:
            source.signals_for(target, outcomes)
        mapping_s = time.perf_counter() - t0
        queries = source.stats.last_tick_queries
        errors = dict(source.stats.errors)
    durations.sort()
    return {
        "deployments": args.deployments,
        "components": len(targets),
        "scrape_targets": pods,
        "leader_pods": leaders,
        "scrape_interval_s": args.scrape_interval_s,
        "ticks": args.ticks,
        "queries_per_tick": queries,
        "max_parallel_queries": args.parallel,
        "observe_s_median": statistics.median(durations),
        "observe_s_p90": durations[int(0.9 * (len(durations) - 1))],
        "observe_s_max": durations[-1],
        "mapping_s": mapping_s,
        "loop_stall_s_max": max(stalls),
        "loop_stall_s_median": statistics.median(stalls),
        "idle_loop_stall_s_max": max(idle_stalls),
        "curl_loop_stall_s_max": max(external_stalls),
        "curl_loop_stall_s_median": statistics.median(external_stalls),
        "idle_loop_stall_s_median": statistics.median(idle_stalls),
        "errors": errors,
        "load_average_1m_before": load_before,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "prometheus": subprocess.run(
                ["prometheus", "--version"], capture_output=True, text=True, check=False
            ).stdout.splitlines()[0],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=200)
    parser.add_argument("--gangs", type=int, default=2)
    parser.add_argument("--pods-per-gang", type=int, default=2)
    parser.add_argument("--scrape-interval-s", type=float, default=10.0)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=6, help="max_parallel_queries")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = asyncio.run(run(args))
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
