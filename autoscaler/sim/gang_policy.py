"""The `gang` policy: this product, driven exactly as the service drives it.

Each tick the simulated cluster is turned into the `Observations` the Prometheus and
Kubernetes adapters would produce, the policies are parsed from LWS annotations by the real
`parse_policy`, the forecaster the service plans from (`forecasting.PLANNING_MODEL`)
supplies the demand forecast one lead time ahead, and the real `core.decision.plan` decides
gangs and balloon gangs. The forecaster is refitted on a slower cadence than the tick and
updated with each tick's observation in between, as the service does; simulated time is the
clock throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from autoscaler.core.decision import plan
from autoscaler.core.gang_plan import ComponentMemory, GangPlan, Memory
from autoscaler.core.model import (
    ClusterObservation,
    ComponentKey,
    ComponentObservation,
    Forecast,
    NodeCapacity,
    Observations,
)
from autoscaler.core.policy import PREFIX, Policy, PolicyError, parse_policy
from autoscaler.core.shape import GangShape, PodShape
from autoscaler.sim.config import SimSettings
from autoscaler.sim.controller import Action, Snapshot
from autoscaler.sim.errors import ConfigError
from forecasting.models import PLANNING_MODEL, make_forecaster
from forecasting.protocol import Forecaster
from forecasting.series import Series

ForecasterFactory = Callable[[str, float], Forecaster]

NAMESPACE = "sim"
GPU = "nvidia.com/gpu"
LONG_TRACE_S = 86_400.0


def default_annotations(
    settings: SimSettings,
    component: str,
    *,
    max_gangs: int,
    target_waiting: float,
    capacity: float | None,
) -> dict[str, str]:
    """The annotations the simulated LWS of `component` carries for `gang`.

    `capacity` is what one gang serves at target, in the unit of the component's demand
    signal (`runner.gang_capacity`); None leaves `capacity-per-replica` unset, so the
    component learns it as the service does. The lead time is node provisioning plus gang
    start-up plus one tick, the time from a decision to a serving gang on a fresh node.
    Values in the YAML `gang:` section override these.
    """
    cluster = settings.cluster
    lead_s = cluster.node_provisioning_s + cluster.gang_startup_s + settings.tick_s
    annotations = {
        "enabled": "true",
        "deployment": "model",
        "component": component,
        "min-replicas": "1",
        "max-replicas": str(max_gangs),
        "target-waiting": f"{target_waiting:g}",
        "lead-time": f"{lead_s:g}s",
        "max-buffer": "2",
        # bursts come back within minutes (Azure code: silent gaps of up to 217 s); holding
        # gangs through a gap costs less than starting them again 8 minutes late
        "scale-down-window": "10m",
    }
    if capacity is not None:
        annotations["capacity-per-replica"] = f"{capacity:g}"
    if component == "prefill":
        # Measured on every shared trace in PD mode (docs/results.md): one gang per tick (4 a
        # minute) instead of 2 stops a burst of seconds from ordering gangs that serve a lead
        # time after it has gone (Azure code: 278.5 -> 251.1 GPU-hours). Unified keeps the
        # default: in unified mode the code trace lost 3.2 points of SLO attainment with one
        # gang per tick. Prefill keeps max-buffer's default 2: balloon gangs from the
        # forecast's upper bound keep ServeGen m-small at 99 % (98.97 % with none); with
        # max-buffer 1 the six traces measured kept their attainment (docs/results.md).
        annotations["max-scale-up"] = "1"
        # The queue, prefill's only fast signal, shows a burst once it is already late, and
        # a gang released in a lull is back a lead time after the next burst: holding the
        # peak for 20 minutes instead of 10 takes Mooncake from 95.91 % to 99.09 % and Azure
        # code from 85.71 % to 91.58 % for 1-2.5 % more GPU-hours on the 14-day traces.
        annotations["scale-down-window"] = "20m"
    if component == "decode":
        # A full batch of short requests fills a quarter of the KV cache, so decode scales on
        # its demand rate and queue, both late for a burst: 15 minutes instead of 10 keep the
        # third gang through the conversation hour's lulls (93.86 % -> 99.66 %, and 254.4 ->
        # 212.3 GPU-hours, fewer restarts) for 0.2 % more on the 14-day traces.
        annotations["scale-down-window"] = "15m"
    annotations.update(getattr(settings.gang, component))
    return {PREFIX + k: v for k, v in annotations.items()}


def _parse_policy(annotations: Mapping[str, str], *, component: str, lws_name: str) -> Policy:
    """The real parser; its problems name the `gang:` settings an operator would fix."""
    try:
        return parse_policy(annotations, lws_name=lws_name)
    except PolicyError as err:
        lines = (
            f"  gang.{component}.{p.annotation.removeprefix(PREFIX)}: {p.detail}"
            for p in err.problems
        )
        raise ConfigError(
            f"invalid gang policy for the {component} component:\n" + "\n".join(lines)
        ) from err


def _default_forecaster(component: str, step_s: float) -> Forecaster:
    return make_forecaster(PLANNING_MODEL, step_s=step_s)


class GangController:
    name = "gang"
    gang_scheduling = True

    def __init__(
        self,
        settings: SimSettings,
        initial: Mapping[str, int],
        *,
        max_gangs: Mapping[str, int],
        target_waiting: Mapping[str, float],
        capacity: Mapping[str, float | None],
        duration_s: float,
        forecaster_factory: ForecasterFactory | None = None,
    ) -> None:
        """`forecaster_factory(component, step_s)` builds each component's forecaster; by
        default the one the service plans from (benchmarks pass others to compare)."""
        self.settings = settings
        self.initial = dict(initial)
        self.keys = {c: ComponentKey(NAMESPACE, f"model-{c}") for c in initial}
        self.policies: dict[ComponentKey, Policy] = {
            key: _parse_policy(
                default_annotations(
                    settings,
                    c,
                    max_gangs=max_gangs[c],
                    target_waiting=target_waiting[c],
                    capacity=capacity[c],
                ),
                component=c,
                lws_name=key.lws,
            )
            for c, key in self.keys.items()
        }
        gpus = settings.cluster.gpus_per_pod
        pod = PodShape(requests={GPU: gpus, "cpu": 32_000}, limits={GPU: gpus})
        self.shape = GangShape(leader=pod, worker=pod, pods_per_gang=settings.cluster.pods_per_gang)
        resolution_s = settings.gang.forecast_resolution_s
        self.refit_s = settings.gang.forecast_refit_s
        if duration_s > LONG_TRACE_S:
            resolution_s = max(resolution_s, 300.0)  # the forecasting package's own grid
            self.refit_s = settings.gang.forecast_refit_long_s
        factory = forecaster_factory or _default_forecaster
        self.forecasters = {c: factory(c, resolution_s) for c in initial}
        self.seen_steps = {c: 0 for c in initial}
        self.last_fit_s: float | None = None
        # steady state at t=0: the loop has been holding the initial gangs (as the service
        # would after running for a while), so the scale-down window starts full
        self.memory = Memory(
            components={
                key: ComponentMemory(proposals=((0.0, self.initial[c]),))
                for c, key in self.keys.items()
            }
        )
        self.last_plan: GangPlan | None = None

    def initial_gangs(self) -> Mapping[str, int]:
        return self.initial

    def decide(self, snapshot: Snapshot) -> Mapping[str, Action]:
        forecasts = self._forecasts(snapshot)
        observations = Observations(
            components={
                self.keys[name]: ComponentObservation(
                    key=self.keys[name],
                    spec_gangs=comp.spec_gangs,
                    gangs=comp.gangs,
                    signals=comp.signals,
                    shape=self.shape,
                    balloon_gangs=comp.balloon_gangs,
                )
                for name, comp in snapshot.components.items()
            },
            cluster=ClusterObservation(
                nodes=tuple(
                    NodeCapacity(
                        name=f"node-{i}",
                        free={GPU: free * self.settings.cluster.gpus_per_pod, "cpu": 10**6},
                    )
                    for i, free in enumerate(snapshot.free_slots_per_node)
                ),
                can_grow=snapshot.can_grow,
            ),
        )
        gang_plan, self.memory = plan(
            observations,
            self.policies,
            forecasts,
            self.memory,
            now=snapshot.now_s,
            demand_window_s=self.settings.demand_window_s,
        )
        self.last_plan = gang_plan
        actions = {}
        for name, key in self.keys.items():
            component_plan = gang_plan.components[key]
            forecast = forecasts.get(key)
            desired = snapshot.components[name].spec_gangs
            if not component_plan.hold:
                desired = component_plan.desired_gangs
            actions[name] = Action(
                desired_gangs=desired,
                balloon_gangs=component_plan.balloon_gangs,
                remove_groups=component_plan.rolled_back_groups,
                forecast_point=None if forecast is None else forecast.point,
                forecast_upper=None if forecast is None else forecast.upper,
                capacity_per_gang=component_plan.capacity_per_gang,
            )
        return actions

    def _forecasts(self, snapshot: Snapshot) -> dict[ComponentKey, Forecast]:
        dt = self.settings.step_s
        refit = self.last_fit_s is None or snapshot.now_s - self.last_fit_s >= self.refit_s
        forecasts = {}
        for name, forecaster in self.forecasters.items():
            history = snapshot.demand_history[name]
            if refit:
                start = max(0, history.size - int(self.settings.gang.forecast_history_s / dt))
                times = (np.arange(start, history.size, dtype=np.float64) + 1) * dt
                forecaster.fit(Series(times, np.asarray(history[start:], dtype=np.float64)))
            elif history.size > self.seen_steps[name]:
                new = np.arange(self.seen_steps[name], history.size, dtype=np.float64)
                forecaster.update((new + 1) * dt, history[self.seen_steps[name] :])
            self.seen_steps[name] = history.size
            policy = self.policies[self.keys[name]]
            result = forecaster.forecast(policy.lead_time_s)
            if result is not None:
                forecasts[self.keys[name]] = Forecast(
                    point=result.point,
                    upper=result.upper,
                    horizon_s=result.horizon_s,
                    fallback_reason=result.fallback_reason,
                )
        if refit:
            self.last_fit_s = snapshot.now_s
        return forecasts
