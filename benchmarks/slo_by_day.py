"""SLO attainment, missed requests and GPU-hours of one policy, day by day.

Run from the repository root:

    python benchmarks/slo_by_day.py --trace servegen-m-small [--policy gang] [--config FILE]

On a multi-day trace the attainment over the whole run hides where the misses are: days
without history, a day whose level shifts, quiet days that miss nothing. The table says
which days spend the 1 % budget, and what each day costs against the others. Same defaults,
scale and seed as `simulate` (a 14-day trace takes about 3 minutes for `gang`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoscaler.sim.config import SimSettings, load_settings
from autoscaler.sim.engine import RunResult, simulate
from autoscaler.sim.runner import POLICIES, build_controllers, load_workload, with_quota
from autoscaler.sim.workload import Workload, resolve_trace
from forecasting.traces import default_traces_dir

DAY_S = 86_400.0


@dataclass(frozen=True)
class Day:
    day: int
    requests: float
    missed: float
    gpu_hours: float


def by_day(workload: Workload, result: RunResult, settings: SimSettings) -> list[Day]:
    """Each day of the run (from the trace's start): its requests, how many missed the SLO
    (never served counts as missed), and the GPU-hours of its steps."""
    missed = (~(result.ttft_s <= settings.slo_ttft_s)) * workload.requests
    request_day = (workload.arrival_s // DAY_S).astype(int)
    gpus = np.asarray(result.series["node_gpus"], dtype=np.float64)
    step_day = (np.arange(gpus.size) * settings.step_s // DAY_S).astype(int)
    gpu_h = gpus * settings.step_s / 3600
    return [
        Day(
            day,
            float(workload.requests[request_day == day].sum()),
            float(missed[request_day == day].sum()),
            float(np.nansum(gpu_h[step_day == day])),
        )
        for day in range(int(request_day.max()) + 1)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="servegen-m-small")
    parser.add_argument("--policy", choices=POLICIES, default="gang")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--traces-dir", type=Path, default=None)
    args = parser.parse_args()

    settings = load_settings(args.config)
    path = resolve_trace(args.trace, traces_dir=args.traces_dir or default_traces_dir())
    workload, _ = load_workload(path, settings, scale=None, name=args.trace)
    settings = with_quota(workload, settings)
    (controller,) = build_controllers(workload, settings, [args.policy])
    days = by_day(workload, simulate(workload, controller, settings, progress=False), settings)
    missed = sum(d.missed for d in days)
    print(f"{args.policy} on {args.trace}: {missed:,.0f} requests missed, "
          f"budget {0.01 * workload.total_requests:,.0f} (1 %)")  # fmt: skip
    print("| day | SLO | requests | missed | share of misses | GPU-hours |")
    print("|---|---|---|---|---|---|")
    for d in days:
        share = d.missed / missed if missed else 0.0
        print(
            f"| {d.day} | {100 * (1 - d.missed / d.requests):.2f}% | {d.requests:,.0f} | "
            f"{d.missed:,.0f} | {100 * share:.0f}% | {d.gpu_hours:,.1f} |"
        )


if __name__ == "__main__":
    main()
