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

With `--envelope`, a fourth row runs `gang` with the default forecaster's point raised to a
causal seasonal envelope: the highest demand within +-2 windows of the same time of day on
each of the last 3 days, scaled by how the latest window compares with those days at the
same time (clamped to 0.5-2x). It shows what buying SLO with capacity costs on traces whose
daily steps jitter by tens of minutes.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from autoscaler.commands.simulate import default_traces_dir
from autoscaler.sim.baselines import OracleController, PlannedController
from autoscaler.sim.config import load_settings
from autoscaler.sim.controller import Controller
from autoscaler.sim.engine import demand_series, simulate
from autoscaler.sim.metrics import measure
from autoscaler.sim.requirement import required_gangs
from autoscaler.sim.runner import build_controllers, load_workload, with_quota
from autoscaler.sim.workload import resolve_trace
from forecasting.protocol import ForecastResult
from forecasting.series import Series
from forecasting.state_space import DailyStateSpace

ENVELOPE_DAYS = 3
ENVELOPE_SLACK_WINDOWS = 2


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


class SeasonalEnvelope(DailyStateSpace):
    """The default (daily state-space) model, its point raised to the seasonal envelope
    (module docstring); when the model is unavailable, persistence stands in unraised."""

    name = "seasonal-envelope"

    def _model_forecast(self, steps: int) -> tuple[float, float]:
        point, upper = super()._model_forecast(steps)
        values = self._history.array()
        last, season, slack = values.size - 1, self.season_windows, ENVELOPE_SLACK_WINDOWS
        peaks, levels = [], []
        for day in range(1, ENVELOPE_DAYS + 1):
            target = last + steps - day * season
            window = values[max(target - slack, 0) : min(target + slack + 1, values.size)]
            if target - slack >= 0 and np.isfinite(window).any():
                peaks.append(float(np.nanmax(window)))
            then = last - day * season
            if then >= 0 and math.isfinite(values[then]):
                levels.append(float(values[then]))
        observed = values[np.isfinite(values)]
        if not peaks or not levels or observed.size == 0:
            return point, upper
        ratio = min(max(float(observed[-1]) / float(np.mean(levels)), 0.5), 2.0)
        point = max(point, max(peaks) * ratio)
        return point, max(point, upper)


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
    parser.add_argument("--envelope", action="store_true", help="add the seasonal-envelope row")
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
        ("gang, default forecaster", build_controllers(workload, settings, ["gang"])[0]),
        (
            "gang, clairvoyant forecaster",
            build_controllers(workload, settings, ["gang"], forecaster_factory=clairvoyant)[0],
        ),
        ("hindsight max", hindsight_max(oracle, requirement)),
        ("oracle", oracle),
    ]
    if args.envelope:

        def envelope(component: str, step_s: float) -> SeasonalEnvelope:
            return SeasonalEnvelope(step_s=step_s)

        gang = build_controllers(workload, settings, ["gang"], forecaster_factory=envelope)[0]
        runs.insert(2, ("gang, seasonal-envelope forecaster", gang))
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
