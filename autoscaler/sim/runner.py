"""One comparison run: load and scale a trace, build each policy, simulate, measure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autoscaler.sim.baselines import OracleController, ReactiveController, StaticController
from autoscaler.sim.config import SimSettings
from autoscaler.sim.controller import Controller
from autoscaler.sim.engine import RunResult, simulate
from autoscaler.sim.errors import ConfigError, SimulationError, TraceError
from autoscaler.sim.metrics import PolicyMetrics, measure
from autoscaler.sim.requirement import look_ahead_max, per_step, required_gangs
from autoscaler.sim.workload import (
    Workload,
    header_columns,
    load_servegen,
    load_trace,
    read_servegen_windows,
    scale_requests,
)
from forecasting.traces import MAX_SPAN_S

if TYPE_CHECKING:
    from autoscaler.sim.gang_policy import ForecasterFactory

POLICIES = ("gang", "reactive", "static", "oracle")
PEAK_WINDOW_S = 60.0
# What one run is sized for: a longer trace (MAX_SPAN_S, as the backtest reads) or a larger
# fleet is refused with a message, not met with an allocation of hundreds of GiB (a
# per-second trace with a gap of 1e12 s) or a run of hours (traffic x1e6 of the built-in trace).
MAX_PEAK_GANGS = 2_000
DEFAULT_TARGET_WAITING = 4.0


@dataclass(frozen=True, slots=True)
class Comparison:
    trace: str
    scale: float
    workload: Workload
    results: dict[str, RunResult]
    metrics: dict[str, PolicyMetrics]

    def as_json(self) -> dict[str, object]:
        return {
            "trace": self.trace,
            "policies": {name: m.as_json() for name, m in self.metrics.items()},
        }


def auto_scale(workload: Workload, settings: SimSettings) -> float:
    """The factor that makes the trace's busiest minute need `target_peak_gangs` gangs."""
    n = max(math.ceil(workload.duration_s / PEAK_WINDOW_S), 1)
    per_minute = per_step(workload.prompt_tokens(), workload.arrival_s, dt=PEAK_WINDOW_S, n_steps=n)
    peak_tokens_per_s = float(per_minute.max()) / PEAK_WINDOW_S
    gang_tokens_per_s = settings.serving.prefill_tokens_per_s(settings.cluster.pods_per_gang)
    return settings.target_peak_gangs * gang_tokens_per_s / peak_tokens_per_s


def _checked_scale(scale: float | None, sized: float, settings: SimSettings) -> float:
    """`scale`, or `sized` (the factor that makes the busiest minute need
    `target_peak_gangs` prefill gangs) when None; refused when the peak needs too many."""
    if scale is None:
        return sized
    peak_gangs = settings.target_peak_gangs * scale / sized
    if peak_gangs > MAX_PEAK_GANGS:
        about = f"{peak_gangs:,.0f}" if peak_gangs < 1e6 else f"{peak_gangs:.3g}"
        raise TraceError(
            f"--scale {scale:g} makes the busiest minute need about {about} prefill "
            f"gangs; the simulator runs at most {MAX_PEAK_GANGS:,} (--scale {sized:.3g}, the "
            f"default, sizes it to {settings.target_peak_gangs})"
        )
    return scale


def load_workload(
    path: Path, settings: SimSettings, *, scale: float | None, name: str
) -> tuple[Workload, float]:
    """Load a trace and scale it (`scale` None: automatic)."""
    if _is_servegen(path):
        frame = read_servegen_windows(path)
        peak = float((frame["requests_per_s"] * frame["mean_input_tokens"].ffill()).max())
        if not peak > 0:  # NaN too: no window with both a rate and a prompt length
            if scale is None:
                raise TraceError(
                    f"{path}: no window has requests and a prompt length to size the traffic "
                    "by; give --scale"
                )
        else:
            gang = settings.serving.prefill_tokens_per_s(settings.cluster.pods_per_gang)
            scale = _checked_scale(scale, settings.target_peak_gangs * gang / peak, settings)
        assert scale is not None
        workload = load_servegen(path, seed=settings.seed, rate_scale=scale, name=name)
        return workload, scale
    workload = load_trace(path, seed=settings.seed, name=name)
    if workload.duration_s > MAX_SPAN_S:
        raise TraceError(
            f"{path}: the arrivals span {workload.duration_s / 86_400:,.3g} days; the "
            f"simulator replays at most {MAX_SPAN_S / 86_400:.0f} (a gap in the times?)"
        )
    scale = _checked_scale(scale, auto_scale(workload, settings), settings)
    return scale_requests(workload, scale, seed=settings.seed), scale


def _is_servegen(path: Path) -> bool:
    # compressed too: a .csv.gz was sampled unscaled, then its counts multiplied
    return path.name.removesuffix(".gz").endswith(".csv") and "requests_per_s" in header_columns(
        path
    )


def cluster_quota(requirement: dict[str, np.ndarray], settings: SimSettings) -> int | None:
    """Nodes the cluster may grow to: explicit, or a multiple of what static needs.

    An explicit cap below what `static` holds from the first step is refused: the fleet every
    run starts with (sized for the first lead time, and for `static` the peak) is placed as
    it would be after running for a while, so a cap under it would be exceeded, not obeyed.
    """
    cluster = settings.cluster
    peak_gangs = sum(int(r.max()) for r in requirement.values())
    static_nodes = sum(
        math.ceil(int(r.max()) * cluster.pods_per_gang / cluster.pods_per_node)
        for r in requirement.values()
    )
    if cluster.max_nodes is not None:
        if cluster.max_nodes < static_nodes:
            raise ConfigError(
                f"cluster.max_nodes {cluster.max_nodes} is below the {static_nodes} nodes the "
                f"`static` policy holds for this trace's peak ({peak_gangs} gangs of "
                f"{cluster.pods_per_gang} pods, {cluster.pods_per_node} pod(s) per node); "
                "raise it, or scale the traffic down with --scale"
            )
        return cluster.max_nodes
    if settings.node_quota_factor is None:
        return None
    pods = peak_gangs * cluster.pods_per_gang
    return math.ceil(settings.node_quota_factor * pods / cluster.pods_per_node)


def requirement_of(workload: Workload, settings: SimSettings) -> dict[str, np.ndarray]:
    """The clairvoyant gangs per component per step for this workload."""
    n_steps = max(math.ceil(workload.duration_s / settings.step_s), 1)
    return required_gangs(workload, settings, n_steps=n_steps)


def with_quota(
    workload: Workload,
    settings: SimSettings,
    *,
    requirement: dict[str, np.ndarray] | None = None,
) -> SimSettings:
    """The settings with `cluster.max_nodes` resolved for this workload (`requirement`:
    `requirement_of(workload, settings)` when the caller has it already)."""
    if requirement is None:
        requirement = requirement_of(workload, settings)
    quota = cluster_quota(requirement, settings)
    cluster = settings.cluster.model_copy(update={"max_nodes": quota})
    return settings.model_copy(update={"cluster": cluster})


def target_waiting(workload: Workload, settings: SimSettings) -> dict[str, float]:
    """Waiting requests per ready gang that both gang and reactive aim for.

    A prefill (or unified) gang with W requests queued, of the trace's mean prompt length,
    clears them in W * mean_prompt / prefill_tokens_per_s; the target keeps that at half the
    TTFT objective (the annotation default of 4 suits a small unified model, not a prefill
    gang that finishes tens of prompts a second). Decode keeps the default: any request
    waiting for a decode slot is already late.
    """
    mean_prompt = float(workload.prompt_tokens().sum() / workload.total_requests)
    per_gang = settings.serving.prefill_tokens_per_s(settings.cluster.pods_per_gang)
    prefill = max(DEFAULT_TARGET_WAITING, per_gang * settings.slo_ttft_s / 2 / mean_prompt)
    prefill = float(round(prefill))
    if settings.mode == "unified":
        return {"unified": prefill}
    return {"prefill": prefill, "decode": DEFAULT_TARGET_WAITING}


def _share(capacity: float, utilization: float | None) -> float | None:
    return None if utilization is None else capacity * utilization


def gang_capacity(workload: Workload, settings: SimSettings) -> dict[str, float | None]:
    """The `capacity-per-replica` an operator would measure, per component: the share
    `gang.prefill_target_utilization`, `gang.decode_target_utilization` or
    `gang.unified_target_utilization` of what one gang serves when saturated with this trace's
    requests, in the unit of the component's demand signal (prompt tokens/s for prefill and
    unified, generated tokens/s for decode). None where the share is None: the annotation
    stays unset and the component learns its capacity.

    A unified gang runs its decode batch on the same GPUs, which takes
    `unified_decode_interference` of its prefill capacity when full. Saturated with prompts
    it admits prefill / mean_prompt requests a second, each holding a slot for the mean hold
    time, so its slots are a share u = a / (1 + interference * a) full, with
    a = prefill_tokens_per_s * hold / (mean_prompt * slots), and it serves
    prefill_tokens_per_s * (1 - interference * u) prompt tokens/s.
    """
    serving, pods = settings.serving, settings.cluster.pods_per_gang
    prefill = serving.prefill_tokens_per_s(pods)
    if settings.mode != "unified":
        return {
            "prefill": _share(prefill, settings.gang.prefill_target_utilization),
            "decode": _share(
                serving.decode_tokens_per_s(pods), settings.gang.decode_target_utilization
            ),
        }
    slots = serving.max_sequences(pods)
    mean_prompt = float(workload.prompt_tokens().sum() / workload.total_requests)
    mean_output = float(workload.generated_tokens().sum() / workload.total_requests)
    hold_s = mean_output / (serving.decode_tokens_per_s(pods) / slots)
    interference = serving.unified_decode_interference
    a = prefill * hold_s / (mean_prompt * slots)
    full = min(a / (1.0 + interference * a), 1.0)
    return {
        "unified": _share(
            prefill * (1.0 - interference * full), settings.gang.unified_target_utilization
        )
    }


def build_controllers(
    workload: Workload,
    settings: SimSettings,
    policies: Sequence[str],
    *,
    forecaster_factory: ForecasterFactory | None = None,
    requirement: dict[str, np.ndarray] | None = None,
) -> list[Controller]:
    dt = settings.step_s
    if requirement is None:
        requirement = requirement_of(workload, settings)
    cluster = settings.cluster
    lead_s = cluster.node_provisioning_s + cluster.gang_startup_s + settings.tick_s
    lead_steps = math.ceil(lead_s / dt)
    # every dynamic policy starts in steady state: what the first lead time needs
    initial = {c: int(look_ahead_max(r, lead_steps)[0]) for c, r in requirement.items()}
    max_gangs = {
        c: max(math.ceil(settings.max_gangs_factor * r.max()), 1) for c, r in requirement.items()
    }
    waiting = target_waiting(workload, settings)
    controllers: list[Controller] = []
    for name in policies:
        if name == "gang":
            from autoscaler.sim.gang_policy import GangController

            controllers.append(
                GangController(
                    settings,
                    initial,
                    max_gangs=max_gangs,
                    target_waiting=waiting,
                    capacity=gang_capacity(workload, settings),
                    duration_s=workload.duration_s,
                    forecaster_factory=forecaster_factory,
                )
            )
        elif name == "reactive":
            controllers.append(
                ReactiveController(
                    initial,
                    target_waiting=waiting,
                    target_kv_usage=0.8,
                    max_gangs=max_gangs,
                )
            )
        elif name == "static":
            controllers.append(StaticController(requirement))
        elif name == "oracle":
            controllers.append(OracleController(requirement, lead_steps=lead_steps))
        else:
            raise SimulationError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return controllers


def compare(
    workload: Workload,
    settings: SimSettings,
    *,
    policies: Sequence[str] = POLICIES,
    trace: str,
    scale: float,
    progress: bool | None = None,
) -> Comparison:
    requirement = requirement_of(workload, settings)
    settings = with_quota(workload, settings, requirement=requirement)
    results = {}
    for controller in build_controllers(workload, settings, policies, requirement=requirement):
        results[controller.name] = simulate(workload, controller, settings, progress=progress)
    metrics = {name: measure(result) for name, result in results.items()}
    return Comparison(trace=trace, scale=scale, workload=workload, results=results, metrics=metrics)
