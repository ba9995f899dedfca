"""Cost of the Kubernetes snapshot (`build_state`) per tick, with and without the parse cache.

Run from the repository root:

    OPENBLAS_NUM_THREADS=1 python benchmarks/snapshot.py [--deployments 100 1000] [--json FILE]

The objects are those of `benchmarks/tick.py`: one PD deployment per namespace (the prefill
and decode LWS of `examples/pd-deployment.yaml`, one gang of 2 pods x 8 GPUs each, 4 GPU
nodes per deployment), created in the fake API server and scheduled by its LWS controller,
then read back as the watch caches hold them. Each variant builds the snapshot `--repeat`
times in this process and reports the median and the fastest (CPU, `time.process_time`);
the cached variant is measured after one warm-up call, as every tick after the first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.tick import populate  # noqa: E402


async def cluster_objects(deployments: int) -> dict[str, list[dict[str, Any]]]:
    from tests.harness.fake_kube import FakeKube

    async with FakeKube.start(auto_reconcile=False) as kube:
        populate(kube, deployments)
        return {
            "lws": kube.objects("leaderworkersets"),
            "pods": kube.objects("pods"),
            "nodes": kube.objects("nodes"),
        }


def time_snapshots(
    objects: dict[str, list[dict[str, Any]]], *, cached: bool, repeat: int
) -> list[float]:
    from autoscaler.adapters.kube_discovery import ParseCache
    from autoscaler.adapters.kube_state import build_state

    cache = ParseCache() if cached else None

    def snapshot() -> None:
        build_state(
            lws_objects=objects["lws"],
            pods=objects["pods"],
            nodes=objects["nodes"],
            now_s=0.0,
            parse_cache=cache,
        )

    if cached:
        snapshot()
    times = []
    for _ in range(repeat):
        started = time.process_time()
        snapshot()
        times.append(time.process_time() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployments", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for deployments in args.deployments:
        objects = asyncio.run(cluster_objects(deployments))
        row: dict[str, Any] = {"deployments": deployments, "lws": len(objects["lws"])}
        for name, cached in (("no_cache", False), ("parse_cache", True)):
            times = time_snapshots(objects, cached=cached, repeat=args.repeat)
            row[f"{name}_cpu_s_median"] = statistics.median(times)
            row[f"{name}_cpu_s_min"] = min(times)
        row["speedup"] = row["no_cache_cpu_s_median"] / row["parse_cache_cpu_s_median"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": platform.platform(),
                    "python": platform.python_version(),
                    "results": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
