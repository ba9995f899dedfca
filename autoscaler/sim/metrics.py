"""The figures a run is judged by (DESIGN section 8 JSON): SLO attainment, GPU-hours,
partial-gang GPU-hours, scale events, p99 TTFT; where the GPU-hours go; and both by day."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaler.sim.engine import RunResult


@dataclass(frozen=True, slots=True)
class PolicyMetrics:
    slo_attainment: float
    gpu_hours: float
    partial_gang_gpu_hours: float
    scale_events: int
    p99_ttft_s: float

    def as_json(self) -> dict[str, float | int]:
        return {
            "slo_attainment": round(self.slo_attainment, 6),
            "gpu_hours": round(self.gpu_hours, 4),
            "partial_gang_gpu_hours": round(self.partial_gang_gpu_hours, 4),
            "scale_events": self.scale_events,
            "p99_ttft_s": round(self.p99_ttft_s, 4),
        }


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    idx = int(np.searchsorted(cumulative, q * cumulative[-1], side="left"))
    return float(values[order][min(idx, values.size - 1)])


def gpu_hours_by_use(result: RunResult) -> dict[str, float]:
    """GPU-hours split by what the GPUs were doing; the parts add up to `gpu_hours`.

    Per component: gangs serving (ready) and gangs starting (placed, loading weights). Then
    balloon gangs, pods of partly placed gangs, and the rest of the nodes' GPUs: nodes still
    booting, or idle (waiting out the cluster's idle timeout, or with slots no gang fits).
    """
    series, cluster = result.series, result.settings.cluster
    dt_h = result.settings.step_s / 3600.0
    per_gang = cluster.pods_per_gang * cluster.gpus_per_pod
    components = [c.removesuffix("_ready_gangs") for c in series if c.endswith("_ready_gangs")]
    used: dict[str, float] = {}
    for name in components:
        for state in ("ready", "starting"):
            gangs = np.nansum(series[f"{name}_{state}_gangs"])
            label = "serving" if state == "ready" else "starting"
            used[f"{name} {label}"] = float(gangs * per_gang * dt_h)
    balloons = sum(np.nansum(series[f"{name}_balloon_gangs"]) for name in components)
    used["balloon gangs"] = float(balloons * per_gang * dt_h)
    used["partial gangs"] = float(np.nansum(series["partial_gpus"]) * dt_h)
    total = float(np.nansum(series["node_gpus"]) * dt_h)
    used["nodes booting or idle"] = total - sum(used.values())
    return used


def counted_ttft_s(result: RunResult) -> np.ndarray:
    """Each cohort's TTFT as the metrics count it: a request never served by the end of the
    trace waited at least until then, and missed the SLO."""
    workload = result.workload
    ttft = result.ttft_s
    unserved = ~np.isfinite(ttft)
    ttft = np.where(unserved, workload.duration_s - workload.arrival_s, ttft)
    return np.where(unserved, np.maximum(ttft, result.settings.slo_ttft_s + 1e-9), ttft)


def measure(result: RunResult) -> PolicyMetrics:
    workload = result.workload
    dt_h = result.settings.step_s / 3600.0
    ttft = counted_ttft_s(result)
    weights = workload.requests
    met = float(weights[ttft <= result.settings.slo_ttft_s].sum() / weights.sum())
    return PolicyMetrics(
        slo_attainment=met,
        gpu_hours=float(np.nansum(result.series["node_gpus"]) * dt_h),
        partial_gang_gpu_hours=float(np.nansum(result.series["partial_gpus"]) * dt_h),
        scale_events=result.scale_events,
        p99_ttft_s=weighted_quantile(ttft, weights, 0.99),
    )


DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class DayMetrics:
    """One day of a run, counted from the trace's start."""

    day: int
    requests: float
    missed: float  # requests whose TTFT was over the SLO, or that were never served
    gpu_hours: float

    @property
    def slo_attainment(self) -> float:
        return 1.0 - self.missed / self.requests if self.requests else 1.0


def by_day(result: RunResult) -> list[DayMetrics]:
    """Each day of the run: its requests, how many missed the SLO, the GPU-hours of its
    steps. On a trace of many days the whole run's attainment hides where the 1 % went
    (days without history, a day whose level shifts, quiet days that miss nothing)."""
    workload, settings = result.workload, result.settings
    missed = (counted_ttft_s(result) > settings.slo_ttft_s) * workload.requests
    request_day = (workload.arrival_s // DAY_S).astype(int)
    gpus = np.asarray(result.series["node_gpus"], dtype=np.float64)
    step_day = (np.arange(gpus.size) * settings.step_s // DAY_S).astype(int)
    gpu_h = gpus * settings.step_s / 3600.0
    return [
        DayMetrics(
            day,
            float(workload.requests[request_day == day].sum()),
            float(missed[request_day == day].sum()),
            float(np.nansum(gpu_h[step_day == day])),
        )
        for day in range(int(max(request_day.max(initial=0), step_day.max(initial=0))) + 1)
    ]
