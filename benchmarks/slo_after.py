"""SLO attainment per policy over the whole trace and over the requests after a given time.

Run from the repository root:

    python benchmarks/slo_after.py --trace azure-code --after 15m [--config FILE]

Every policy starts in the same steady state, sized for the trace's first lead time. On a
short, bursty trace the first bursts decide most of the misses: a gang asked for after the
first burst serves one lead time later. Comparing attainment over the whole trace with
attainment after the first bursts separates what the start-up state costs from what the
policy does once it has seen the traffic. Same defaults, scale and seed as `simulate`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoscaler.commands.arg_types import positive_duration_s
from autoscaler.sim.config import load_settings
from autoscaler.sim.engine import simulate
from autoscaler.sim.metrics import measure
from autoscaler.sim.runner import POLICIES, build_controllers, load_workload, with_quota
from autoscaler.sim.workload import resolve_trace
from forecasting.traces import default_traces_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="azure-code")
    parser.add_argument("--after", type=positive_duration_s, default=900.0, help="e.g. 15m")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--traces-dir", type=Path, default=None)
    args = parser.parse_args()

    traces_dir = args.traces_dir or default_traces_dir()
    settings = load_settings(args.config)
    path = resolve_trace(args.trace, traces_dir=traces_dir)
    workload, _ = load_workload(path, settings, scale=None, name=args.trace)
    settings = with_quota(workload, settings)
    late = workload.arrival_s >= args.after
    print(f"| policy | SLO, whole trace | SLO, requests after {args.after:g} s |")
    print("|---|---|---|")
    for controller in build_controllers(workload, settings, POLICIES):
        result = simulate(workload, controller, settings, progress=False)
        whole = measure(result).slo_attainment
        met = (result.ttft_s <= settings.slo_ttft_s) * workload.requests
        after = met[late].sum() / workload.requests[late].sum()
        print(f"| {controller.name} | {100 * whole:.2f}% | {100 * after:.2f}% |")


if __name__ == "__main__":
    main()
