"""Day-by-day figures (`metrics.by_day`) and the report's table of them."""

from __future__ import annotations

import numpy as np

from autoscaler.sim.config import load_settings
from autoscaler.sim.engine import RunResult, simulate
from autoscaler.sim.metrics import by_day, measure
from autoscaler.sim.report import days_table, ttft_percentiles
from autoscaler.sim.runner import Comparison, build_controllers, load_workload, with_quota
from autoscaler.sim.workload import BUILTIN_PATH, Workload


def test_one_day_is_the_whole_run() -> None:
    settings = load_settings()
    workload, _ = load_workload(BUILTIN_PATH, settings, scale=None, name="builtin")
    settings = with_quota(workload, settings)
    (controller,) = build_controllers(workload, settings, ["gang"])
    result = simulate(workload, controller, settings, progress=False)
    metrics = measure(result)
    (day,) = by_day(result)
    assert np.isclose(day.requests, workload.total_requests, rtol=1e-12)
    assert np.isclose(day.slo_attainment, metrics.slo_attainment, rtol=1e-12)
    assert np.isclose(day.gpu_hours, metrics.gpu_hours, rtol=1e-12)


def two_days(ttft_s: list[float]) -> RunResult:
    """Three requests over two days; a node of 8 GPUs for a day and a half of 12-hour steps."""
    settings = load_settings().model_copy(update={"step_s": 43_200.0})
    workload = Workload(
        name="t",
        arrival_s=np.array([10.0, 90_000.0, 100_000.0]),
        requests=np.array([1.0, 2.0, 4.0]),
        input_tokens=np.ones(3),
        output_tokens=np.ones(3),
        duration_s=172_800.0,
    )
    return RunResult(
        policy="p",
        workload=workload,
        settings=settings,
        ttft_s=np.array(ttft_s),
        series={"node_gpus": np.array([8.0, 8.0, 8.0, 0.0]), "partial_gpus": np.zeros(4)},
        scale_events=0,
        preemptions=0,
    )


def test_misses_and_gpu_hours_land_on_their_day() -> None:
    first, second = by_day(two_days([0.5, 3.0, np.nan]))  # the last one never served
    assert (first.requests, first.missed, first.gpu_hours) == (1.0, 0.0, 192.0)
    assert (second.requests, second.missed, second.gpu_hours) == (6.0, 6.0, 96.0)
    assert (first.slo_attainment, second.slo_attainment) == (1.0, 0.0)


def test_the_report_table_has_a_row_a_day_and_two_columns_a_policy() -> None:
    results = {"gang": two_days([0.5, 1.0, 3.0]), "static": two_days([0.5, 1.0, 1.0])}
    comparison = Comparison(
        trace="t",
        scale=1.0,
        workload=results["gang"].workload,
        results=results,
        metrics={name: measure(r) for name, r in results.items()},
    )
    lines = days_table(comparison).splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "day", "gang SLO", "gang GPU-h", "static SLO", "static GPU-h"
    ]  # fmt: skip
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert rows == [
        ["0", "100.00%", "192.0", "100.00%", "192.0"],
        ["1", "33.33%", "96.0", "100.00%", "96.0"],
    ]


def test_the_ttft_per_minute_counts_a_request_never_served_as_the_metrics_do() -> None:
    # the day's last request never got its first token: the report's per-minute p99 left it
    # out (a minute of misses drawn as fine) while the table's p99 counted it
    result = two_days([0.5, 3.0, np.nan])
    comparison = Comparison(
        trace="t", scale=1.0, workload=result.workload, results={"p": result},
        metrics={"p": measure(result)},
    )  # fmt: skip
    minutes = ttft_percentiles(comparison).set_index("time_s")
    waited = 172_800.0 - 100_000.0  # until the end of the run
    assert minutes.loc[99_960.0, "p99_ttft_s"] == waited
    assert minutes.loc[0.0, "p99_ttft_s"] == 0.5
