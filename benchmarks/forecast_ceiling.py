"""How much of the `gang` policy's shortfall is forecast error, and how much is the policy.

Run from the repository root:

    python benchmarks/forecast_ceiling.py --trace servegen-m-small [--config FILE]

Runs `gang` twice on the same arrivals: with the product's default forecaster, and with a
clairvoyant one that returns the demand signal the simulation will actually observe one
lead time ahead (point and upper bound alike). Everything else (annotations, decision core,
cluster) is the same. The clairvoyant run is what `gang` would reach with a perfect
forecast: the gap between the two rows is forecast error; the gap between the clairvoyant
row and `oracle` is what the policy itself costs (target utilization, balloon gangs,
scale-down window, rate limits, reactive lag). Same defaults, scale and seed as `simulate`.

A third row, `hindsight max`, asks what learning from the trace's own past could reach at
best: it holds, at every moment, the most gangs any earlier moment of the trace needed (the
oracle's requirement, so each of those needs is known exactly and at once), and never scales
down. Where even that misses the SLO, the misses come from peaks larger than anything seen a
lead time before them, which no policy that decides from the past can have capacity for.

With `--model NAME` (repeatable), a row per named forecaster runs `gang` planning from it
instead of the default (`seasonal_envelope`), e.g. `--model state_space`, the plain
state-space forecast the envelope raises.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from autoscaler.sim.baselines import OracleController, PlannedController
from autoscaler.sim.config import load_settings
from autoscaler.sim.controller import Controller
from autoscaler.sim.engine import demand_series, simulate
from autoscaler.sim.metrics import measure
from autoscaler.sim.requirement import required_gangs
from autoscaler.sim.runner import build_controllers, load_workload, with_quota
from autoscaler.sim.workload import resolve_trace
from forecasting.models import MODELS, PLANNING_MODEL, make_forecaster
from forecasting.protocol import Forecaster, ForecastResult
from forecasting.series import Series
from forecasting.traces import default_traces_dir


class Clairvoyant:
    """Knows the whole demand series; answers with its value `horizon_s` after the last
    observation it was given."""

    name = "clairvoyant"

    def __init__(self, demand: np.ndarray, *, step_s: float) -> None:
        self.demand = demand
        self.step_s = step_s
        self.last_s: float | None = None

    def fit(self, history: Series) -> None:
        if history.timestamps_s.size:
            self.last_s = float(history.timestamps_s[-1])

    def update(self, timestamps_s: npt.ArrayLike, values: npt.ArrayLike) -> None:
        times = np.asarray(timestamps_s, dtype=np.float64)
        if times.size:
            self.last_s = float(times[-1])

    def forecast(self, horizon_s: float) -> ForecastResult | None:
        if self.last_s is None:
            return None
        # demand[k] is the signal observed at the end of step k, i.e. at (k + 1) * step_s
        k = math.ceil((self.last_s + horizon_s) / self.step_s) - 1
        value = float(self.demand[min(max(k, 0), self.demand.size - 1)])
        return ForecastResult(point=value, upper=value, quantile=0.9, horizon_s=horizon_s)


def hindsight_max(oracle: OracleController, requirement: Mapping[str, np.ndarray]) -> Controller:
    """Holds the most gangs the requirement reached up to now, never scaling down; starts
    where every policy starts (the oracle's first step)."""
    plan = {
        c: np.maximum(np.maximum.accumulate(r), oracle.plan[c][0]) for c, r in requirement.items()
    }
    controller = PlannedController(plan)
    controller.name = "hindsight-max"
    return controller


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="servegen-m-small")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--traces-dir", type=Path, default=None)
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        choices=sorted(MODELS),
        help="add a row with gang planning from this forecaster",
    )
    args = parser.parse_args()

    settings = load_settings(args.config)
    path = resolve_trace(args.trace, traces_dir=args.traces_dir or default_traces_dir())
    workload, _ = load_workload(path, settings, scale=None, name=args.trace)
    settings = with_quota(workload, settings)
    n_steps = max(math.ceil(workload.duration_s / settings.step_s), 1)
    demand = demand_series(workload, settings, n_steps=n_steps)

    def clairvoyant(component: str, step_s: float) -> Clairvoyant:
        return Clairvoyant(demand[component], step_s=settings.step_s)

    oracle = build_controllers(workload, settings, ["oracle"])[0]
    assert isinstance(oracle, OracleController)
    requirement = required_gangs(workload, settings, n_steps=n_steps)
    runs = [
        (
            f"gang, default forecaster ({PLANNING_MODEL})",
            build_controllers(workload, settings, ["gang"])[0],
        ),
        (
            "gang, clairvoyant forecaster",
            build_controllers(workload, settings, ["gang"], forecaster_factory=clairvoyant)[0],
        ),
        ("hindsight max", hindsight_max(oracle, requirement)),
        ("oracle", oracle),
    ]
    for name in args.model:

        def other(component: str, step_s: float, name: str = name) -> Forecaster:
            return make_forecaster(name, step_s=step_s)

        gang = build_controllers(workload, settings, ["gang"], forecaster_factory=other)[0]
        runs.insert(2, (f"gang, {name} forecaster", gang))
    metrics = {label: measure(simulate(workload, c, settings, progress=False)) for label, c in runs}
    oracle_gpu_h = metrics["oracle"].gpu_hours
    print(f"trace {args.trace}")
    print("| run | SLO attained | GPU-hours | x oracle |")
    print("|---|---|---|---|")
    for label, m in metrics.items():
        ratio = m.gpu_hours / oracle_gpu_h
        print(f"| {label} | {100 * m.slo_attainment:.2f}% | {m.gpu_hours:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
