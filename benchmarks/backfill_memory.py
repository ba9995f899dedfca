"""Memory of the demand back-fill at start-up, for a large fleet.

Run from the repository root, with `shared/` beside it:

    OPENBLAS_NUM_THREADS=1 python benchmarks/backfill_memory.py [--components 2000]
        [--days 7] [--step-s 60] [--json FILE]

Two measurements, each with its baseline in the same run:

- `arrays`: `backfill_demand` (the product's code) for `--components` components, two leader
  pods each, against a stand-in for Prometheus that answers every range query with a row
  per leader. Measured with `tracemalloc`: the peak while it runs and what the returned
  histories hold. Baseline: the floor, one float64 value array per component (what any
  history of that length must hold).
- `answer`: one range answer for every leader pod of the fleet, as JSON and parsed the way
  the client parses it (`json.loads`), for the 6-hour chunks the back-fill asks for and, as
  the baseline, the day-long chunks it asked for before.

Demand: the shared ServeGen trace `servegen_m-small_600s.csv` (Alibaba Model Studio, mean
requests/s per 10-minute window; ../shared/data/README.md), its rate times a mean prompt,
held over each window; the values do not change the memory, only make the answers real.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import platform
import time
import tracemalloc
from typing import Any

import numpy as np

from autoscaler.adapters.prometheus_backfill import CHUNK_S, DAY_S, backfill_demand
from autoscaler.adapters.prometheus_queries import PrometheusQueries
from autoscaler.core.model import Component, ComponentKey
from forecasting.traces import default_traces_dir

LEADERS_PER_COMPONENT = 2


def trace_rate() -> tuple[np.ndarray, float]:
    """Prompt tokens/s per 10-minute window of the m-small trace, and the window length."""
    with (default_traces_dir() / "servegen_m-small_600s.csv").open() as f:
        rows = list(csv.DictReader(f))
    rate = np.array([float(r["requests_per_s"]) for r in rows])
    prompt = np.array([float(r["mean_input_tokens"] or "nan") for r in rows])
    return np.nan_to_num(rate * np.nan_to_num(prompt, nan=np.nanmean(prompt))), 600.0


class TraceAnswers:
    """Answers range queries with the trace's demand for every leader of `keys`."""

    def __init__(self, keys: list[ComponentKey]) -> None:
        self.keys = keys
        self.rate, self.window_s = trace_rate()

    def matrix(self, *, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
        times = np.arange(start_s, end_s + step_s / 2, step_s)
        windows = (times // self.window_s).astype(np.int64) % self.rate.size
        values = [[float(t), f"{v:.3f}"] for t, v in zip(times, self.rate[windows], strict=True)]
        return [
            {"metric": {"namespace": key.namespace, "pod": f"{key.lws}-{g}"}, "values": values}
            for key in self.keys
            for g in range(LEADERS_PER_COMPONENT)
        ]

    def range(self, name: str, query: str, **kw: Any) -> list[dict[str, Any]]:
        return self.matrix(start_s=kw["start_s"], end_s=kw["end_s"], step_s=kw["step_s"])

    def report(self, error: Exception) -> None:
        raise error


def fleet(components: int) -> list[tuple[ComponentKey, Component]]:
    return [
        (
            ComponentKey("serving", f"llm{i // 2}-{'prefill' if i % 2 else 'decode'}"),
            Component.PREFILL if i % 2 else Component.DECODE,
        )
        for i in range(components)
    ]


def measure_arrays(components: int, *, days: float, step_s: float) -> dict[str, float]:
    wanted = fleet(components)
    answers = TraceAnswers([key for key, _ in wanted])
    tracemalloc.start()
    started = time.perf_counter()
    result = asyncio.run(
        backfill_demand(
            answers,  # type: ignore[arg-type]
            PrometheusQueries(),
            wanted,
            end_s=1_800_000_000.0,
            days=days,
            step_s=step_s,
        )
    )
    seconds = time.perf_counter() - started
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.chunks_failed == 0
    observed = np.mean([h.observed_fraction for h in result.histories.values()])
    floor = components * int(days * DAY_S // step_s) * 8
    return {
        "peak_mib": peak / 2**20,
        "held_mib": held / 2**20,
        "floor_mib": floor / 2**20,
        "seconds": seconds,
        "observed_fraction": float(observed),
    }


def measure_answer(components: int, *, chunk_s: float, step_s: float) -> dict[str, float]:
    answers = TraceAnswers([key for key, _ in fleet(components)])
    body = json.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": answers.matrix(start_s=0.0, end_s=chunk_s - step_s, step_s=step_s),
            },
        }
    )
    tracemalloc.start()
    parsed = json.loads(body)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del parsed
    return {"json_mib": len(body) / 2**20, "parsed_mib": held / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--components", type=int, default=2000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--step-s", type=float, default=60.0)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    out = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "components": args.components,
        "days": args.days,
        "step_s": args.step_s,
        "arrays": measure_arrays(args.components, days=args.days, step_s=args.step_s),
        "answer": {
            f"{chunk / 3600:g}h": measure_answer(args.components, chunk_s=chunk, step_s=args.step_s)
            for chunk in (CHUNK_S, DAY_S)
        },
    }
    arrays = out["arrays"]
    print(
        f"{args.components} components, {args.days:g} days at {args.step_s:g} s: back-fill "
        f"peak {arrays['peak_mib']:.0f} MiB, histories hold {arrays['held_mib']:.0f} MiB "
        f"(floor: one value array each, {arrays['floor_mib']:.0f} MiB), {arrays['seconds']:.1f} s"
    )
    for name, answer in out["answer"].items():
        print(
            f"one {name} range answer for {args.components * LEADERS_PER_COMPONENT} leaders: "
            f"{answer['json_mib']:.0f} MiB of JSON, {answer['parsed_mib']:.0f} MiB parsed"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
