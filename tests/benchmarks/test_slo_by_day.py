"""`benchmarks/slo_by_day.py`: the days add up to the run, and a miss lands on its day."""

from __future__ import annotations

import numpy as np

from autoscaler.sim.config import load_settings
from autoscaler.sim.engine import RunResult, simulate
from autoscaler.sim.metrics import measure
from autoscaler.sim.runner import build_controllers, load_workload, with_quota
from autoscaler.sim.workload import BUILTIN_PATH, Workload
from benchmarks.slo_by_day import by_day


def test_one_day_is_the_whole_run() -> None:
    settings = load_settings()
    workload, _ = load_workload(BUILTIN_PATH, settings, scale=None, name="builtin")
    settings = with_quota(workload, settings)
    (controller,) = build_controllers(workload, settings, ["gang"])
    result = simulate(workload, controller, settings, progress=False)
    metrics = measure(result)
    (day,) = by_day(workload, result, settings)
    assert np.isclose(day.requests, workload.total_requests, rtol=1e-12)
    assert np.isclose(1 - day.missed / day.requests, metrics.slo_attainment, rtol=1e-12)
    assert np.isclose(day.gpu_hours, metrics.gpu_hours)


def test_misses_and_gpu_hours_land_on_their_day() -> None:
    """Three requests over two days (one never served); a node of 8 GPUs for a day and a
    half of 12-hour steps."""
    settings = load_settings().model_copy(update={"step_s": 43_200.0})
    workload = Workload(
        name="t",
        arrival_s=np.array([10.0, 90_000.0, 100_000.0]),
        requests=np.array([1.0, 2.0, 4.0]),
        input_tokens=np.ones(3),
        output_tokens=np.ones(3),
        duration_s=172_800.0,
    )
    result = RunResult(
        policy="p",
        workload=workload,
        settings=settings,
        ttft_s=np.array([0.5, 3.0, np.nan]),
        series={"node_gpus": np.array([8.0, 8.0, 8.0, 0.0])},
        scale_events=0,
        preemptions=0,
    )
    first, second = by_day(workload, result, settings)
    assert (first.requests, first.missed, first.gpu_hours) == (1.0, 0.0, 192.0)
    assert (second.requests, second.missed, second.gpu_hours) == (6.0, 6.0, 96.0)
