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
from pathlib import Path

from autoscaler.sim.config import load_settings
from autoscaler.sim.engine import simulate
from autoscaler.sim.metrics import by_day
from autoscaler.sim.runner import POLICIES, build_controllers, load_workload, with_quota
from autoscaler.sim.workload import resolve_trace
from forecasting.traces import default_traces_dir


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
    days = by_day(simulate(workload, controller, settings, progress=False))
    missed = sum(d.missed for d in days)
    print(f"{args.policy} on {args.trace}: {missed:,.0f} requests missed, "
          f"budget {0.01 * workload.total_requests:,.0f} (1 %)")  # fmt: skip
    print("| day | SLO | requests | missed | share of misses | GPU-hours |")
    print("|---|---|---|---|---|---|")
    for d in days:
        share = d.missed / missed if missed else 0.0
        print(
            f"| {d.day} | {100 * d.slo_attainment:.2f}% | {d.requests:,.0f} | "
            f"{d.missed:,.0f} | {100 * share:.0f}% | {d.gpu_hours:,.1f} |"
        )


if __name__ == "__main__":
    main()
