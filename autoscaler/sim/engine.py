"""The simulation loop: one policy, one workload, one cluster, step by step.

Per step: at tick boundaries the policy sees a snapshot and acts (LWS replicas, balloon
gangs, rolled-back partial gangs); the cluster schedules pods, grows and shrinks nodes;
then the gangs ready at the start of the step serve it. Every step records a row of the
time series; TTFTs are computed at the end from the cumulative service curves.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from autoscaler.core.model import GangStatus, Signals
from autoscaler.sim.cluster import Cluster
from autoscaler.sim.config import SimSettings
from autoscaler.sim.controller import Action, ComponentSnapshot, Controller, Snapshot
from autoscaler.sim.requirement import per_step
from autoscaler.sim.serving import Serving, ServingView
from autoscaler.sim.workload import Workload

NO_METRICS = "no ready gang serves vLLM metrics"


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    workload: Workload
    settings: SimSettings
    ttft_s: np.ndarray  # per cohort (its middle request)
    series: Mapping[str, np.ndarray]  # per-step columns
    scale_events: int
    preemptions: int


def demand_series(
    workload: Workload, settings: SimSettings, *, n_steps: int
) -> dict[str, np.ndarray]:
    """The demand signal per component at each step: arrivals over the last rate() window.

    Prefill and unified: prompt tokens/s; decode: generated tokens/s of the requests
    arriving (what the adapter reconstructs as served plus queue growth).
    """
    dt = settings.step_s
    window = max(round(settings.demand_window_s / dt), 1)

    def rolling(values: np.ndarray) -> np.ndarray:
        sums = per_step(values, workload.arrival_s, dt=dt, n_steps=n_steps)
        cumulative = np.concatenate(([0.0], np.cumsum(sums)))
        end = np.arange(1, n_steps + 1)
        start = np.maximum(end - window, 0)
        return np.asarray((cumulative[end] - cumulative[start]) / ((end - start) * dt))

    prompt = rolling(workload.prompt_tokens())
    if settings.mode == "unified":
        return {"unified": prompt}
    return {"prefill": prompt, "decode": rolling(workload.generated_tokens())}


def simulate(
    workload: Workload,
    controller: Controller,
    settings: SimSettings,
    *,
    progress: bool | None = None,
) -> RunResult:
    dt = settings.step_s
    n_steps = max(math.ceil(workload.duration_s / dt), 1)
    tick_steps = round(settings.tick_s / dt)
    components = ("unified",) if settings.mode == "unified" else ("prefill", "decode")
    cluster = Cluster(settings.cluster, gang_scheduling=controller.gang_scheduling)
    cluster.add_components(*components)
    for name, gangs in controller.initial_gangs().items():
        cluster.start_ready(name, gangs, now_s=0.0)
    serving = Serving(workload, settings, n_steps=n_steps)
    demand = demand_series(workload, settings, n_steps=n_steps)
    capacity = {c: gang_capacity(c, settings) for c in components}

    cols = [f"{c}_{m}" for c in components for m in _COMPONENT_COLUMNS]
    series = {name: np.full(n_steps, np.nan) for name in ["time_s", *_GLOBAL_COLUMNS, *cols]}
    scale_events = 0
    view: ServingView | None = None
    actions: Mapping[str, Action] = {}
    show = sys.stderr.isatty() if progress is None else progress
    for k in tqdm(range(n_steps), desc=controller.name, disable=not show, file=sys.stderr):
        now = k * dt
        if k % tick_steps == 0 and k > 0:
            snapshot = _snapshot(cluster, view, demand, settings, now_s=now, step=k)
            actions = controller.decide(snapshot)
            for name, action in actions.items():
                for group in action.remove_groups:
                    cluster.remove_gang(name, group)
                if cluster.set_replicas(name, action.desired_gangs, now_s=now):
                    scale_events += 1
                cluster.set_balloons(name, action.balloon_gangs, now_s=now)
        cluster.step(now)
        ready = {c: cluster.ready_gangs(c, now) for c in components}
        if settings.mode == "unified":
            view = serving.step(k, prefill_gangs=ready["unified"], decode_gangs=ready["unified"])
        else:
            view = serving.step(k, prefill_gangs=ready["prefill"], decode_gangs=ready["decode"])
        _record(series, k, now, cluster, view, ready, demand, actions, capacity)
    return RunResult(
        policy=controller.name,
        workload=workload,
        settings=settings,
        ttft_s=serving.ttft_s(),
        series=series,
        scale_events=scale_events,
        preemptions=cluster.preemptions,
    )


_GLOBAL_COLUMNS = ("node_gpus", "partial_gpus", "prefill_waiting", "decode_waiting", "running")
_COMPONENT_COLUMNS = (
    "spec_gangs",
    "ready_gangs",
    "starting_gangs",
    "balloon_gangs",
    "balloon_ordered",
    "demand",
    "capacity",
    "forecast_point",
    "forecast_upper",
    "capacity_per_gang",
)


def _signals(name: str, view: ServingView | None, ready: int, demand: float) -> Signals:
    if view is None or ready == 0:
        reasons = {
            s: NO_METRICS
            for s in ("waiting_requests", "running_requests", "kv_usage_fraction", "demand")
        }
        return Signals(missing_reasons=reasons)
    if name == "prefill":
        # a prefill gang's KV cache holds only the prompts it is running and those waiting
        # for a decode slot: far below the target unless decode backs up
        return Signals(
            waiting_requests=view.prefill_waiting,
            running_requests=view.prefill_running,
            kv_usage_fraction=view.prefill_kv_usage,
            demand=demand,
        )
    if name == "decode":
        # the KV tokens of the running sequences: well below the target while the slot
        # limit binds first (short prompts), at it when long prompts fill the cache first
        return Signals(
            waiting_requests=view.decode_waiting,
            running_requests=view.decode_running,
            kv_usage_fraction=view.decode_kv_usage,
            demand=demand,
        )
    return Signals(
        waiting_requests=view.prefill_waiting + view.decode_waiting,
        running_requests=view.decode_running + view.prefill_running,
        kv_usage_fraction=view.decode_kv_usage,
        demand=demand,
    )


def _snapshot(
    cluster: Cluster,
    view: ServingView | None,
    demand: Mapping[str, np.ndarray],
    settings: SimSettings,
    *,
    now_s: float,
    step: int,
) -> Snapshot:
    startup = settings.cluster.gang_startup_s
    components = {}
    for name in cluster.real:
        ready = cluster.ready_gangs(name, now_s)
        gangs = tuple(
            GangStatus(
                group_index=g.group_index,
                pods_expected=g.pods_expected,
                pods_scheduled=g.pods_scheduled,
                pods_ready=g.pods_expected if g.is_ready(now_s, startup) else 0,
                not_ready_since_s=None if g.is_ready(now_s, startup) else g.created_s,
            )
            for g in cluster.real[name]
        )
        components[name] = ComponentSnapshot(
            name=name,
            spec_gangs=len(cluster.real[name]),
            ready_gangs=ready,
            gangs=gangs,
            signals=_signals(name, view, ready, float(demand[name][step - 1])),
            balloon_gangs=cluster.balloon_gangs_placed(name),
        )
    max_nodes = settings.cluster.max_nodes
    return Snapshot(
        now_s=now_s,
        step=step,
        components=components,
        free_slots_per_node=tuple(cluster.free_slots_now(now_s, count_balloons=True)),
        can_grow=max_nodes is None or len(cluster.nodes) < max_nodes,
        demand_history={name: values[:step] for name, values in demand.items()},
    )


def _record(
    series: dict[str, np.ndarray],
    k: int,
    now: float,
    cluster: Cluster,
    view: ServingView,
    ready: Mapping[str, int],
    demand: Mapping[str, np.ndarray],
    actions: Mapping[str, Action],
    capacity: Mapping[str, float],
) -> None:
    series["time_s"][k] = now
    series["node_gpus"][k] = cluster.node_gpus()
    series["partial_gpus"][k] = cluster.partial_gpus()
    series["prefill_waiting"][k] = view.prefill_waiting + view.prefill_running
    series["decode_waiting"][k] = view.decode_waiting
    series["running"][k] = view.decode_running
    for name in capacity:
        series[f"{name}_spec_gangs"][k] = len(cluster.real[name])
        series[f"{name}_ready_gangs"][k] = ready[name]
        series[f"{name}_starting_gangs"][k] = cluster.starting_gangs(name, now)
        series[f"{name}_balloon_gangs"][k] = cluster.balloon_gangs_placed(name)
        series[f"{name}_balloon_ordered"][k] = cluster.balloon_gangs_ordered(name)
        series[f"{name}_demand"][k] = demand[name][k]
        series[f"{name}_capacity"][k] = ready[name] * capacity[name]
        action = actions.get(name)
        if action is not None:
            if action.forecast_point is not None:
                series[f"{name}_forecast_point"][k] = action.forecast_point
            if action.forecast_upper is not None:
                series[f"{name}_forecast_upper"][k] = action.forecast_upper
            if action.capacity_per_gang is not None:
                series[f"{name}_capacity_per_gang"][k] = action.capacity_per_gang


def gang_capacity(component: str, settings: SimSettings) -> float:
    """What one gang serves in the component's demand unit (tokens/s), at full load."""
    pods = settings.cluster.pods_per_gang
    if component == "decode":
        return settings.serving.decode_tokens_per_s(pods)
    return settings.serving.prefill_tokens_per_s(pods)
