"""The alternatives `gang` is measured against.

- `static`: the gangs the busiest moment of the trace needs, held all the time.
- `oracle`: the clairvoyant requirement, each gang started one lead time before it is needed
  and dropped the moment it is not; a lower bound on GPU-hours for meeting the SLO.
- `reactive`: the Kubernetes HPA algorithm (`pkg/controller/podautoscaler`) on the same vLLM
  signals, per component: usage ratio over ready gangs with a 0.1 tolerance, not-yet-ready
  gangs counted as idle on scale-up, default scale-up limit max(4, 100%) per 15 s, a 300 s
  scale-down stabilization window, no forecast, no balloons, pods scheduled one by one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from autoscaler.sim.controller import Action, ComponentSnapshot, Snapshot

HPA_TOLERANCE = 0.1
HPA_SCALE_DOWN_WINDOW_S = 300.0
HPA_SCALE_UP_PODS = 4
HPA_SCALE_UP_PERCENT = 100.0


class StaticController:
    name = "static"
    gang_scheduling = True

    def __init__(self, requirement: Mapping[str, np.ndarray]) -> None:
        self.gangs = {c: int(r.max()) for c, r in requirement.items()}

    def initial_gangs(self) -> Mapping[str, int]:
        return self.gangs

    def decide(self, snapshot: Snapshot) -> Mapping[str, Action]:
        return {c: Action(desired_gangs=n) for c, n in self.gangs.items()}


class PlannedController:
    """Follows gangs per component per step fixed before the run; starts at step 0's."""

    name = "planned"
    gang_scheduling = True

    def __init__(self, plan: Mapping[str, np.ndarray]) -> None:
        self.plan = dict(plan)

    def initial_gangs(self) -> Mapping[str, int]:
        return {c: int(p[0]) for c, p in self.plan.items()}

    def decide(self, snapshot: Snapshot) -> Mapping[str, Action]:
        return {c: Action(desired_gangs=int(p[snapshot.step])) for c, p in self.plan.items()}


class OracleController(PlannedController):
    name = "oracle"

    def __init__(self, requirement: Mapping[str, np.ndarray], *, lead_steps: int) -> None:
        from autoscaler.sim.requirement import look_ahead_max

        super().__init__({c: look_ahead_max(r, lead_steps) for c, r in requirement.items()})


class ReactiveController:
    name = "reactive"
    gang_scheduling = False

    def __init__(
        self,
        initial: Mapping[str, int],
        *,
        target_waiting: Mapping[str, float],
        target_kv_usage: float,
        max_gangs: Mapping[str, int],
    ) -> None:
        self.initial = dict(initial)
        self.target_waiting = dict(target_waiting)
        self.target_kv_usage = target_kv_usage
        self.max_gangs = dict(max_gangs)
        # steady state at t=0: the HPA has been recommending the initial gangs
        self.recommendations: dict[str, list[tuple[float, int]]] = {
            c: [(0.0, n)] for c, n in initial.items()
        }

    def initial_gangs(self) -> Mapping[str, int]:
        return self.initial

    def decide(self, snapshot: Snapshot) -> Mapping[str, Action]:
        actions = {}
        for name, comp in snapshot.components.items():
            actions[name] = Action(desired_gangs=self._decide_one(name, comp, snapshot.now_s))
        return actions

    def _decide_one(self, name: str, comp: ComponentSnapshot, now_s: float) -> int:
        spec, ready = comp.spec_gangs, comp.ready_gangs
        signals = comp.signals
        proposals: list[int] = []
        if ready > 0:
            metrics = []
            if signals.waiting_requests is not None:
                metrics.append(signals.waiting_requests / ready / self.target_waiting[name])
            if signals.kv_usage_fraction is not None:
                metrics.append(signals.kv_usage_fraction / self.target_kv_usage)
            for ratio in metrics:
                proposals.append(_hpa_replicas(ratio, ready=ready, spec=spec))
        if not proposals:
            return spec  # no metrics: HPA leaves the scale alone
        raw = max(proposals)
        history = [
            (t, r) for t, r in self.recommendations[name] if now_s - t < HPA_SCALE_DOWN_WINDOW_S
        ]
        history.append((now_s, raw))
        self.recommendations[name] = history
        if raw < spec:
            desired = min(spec, max(r for _, r in history))
        else:
            limit = max(
                spec + HPA_SCALE_UP_PODS, math.ceil(spec * (1 + HPA_SCALE_UP_PERCENT / 100))
            )
            desired = min(raw, limit)
        return max(1, min(desired, self.max_gangs[name]))


def _hpa_replicas(ratio: float, *, ready: int, spec: int) -> int:
    """HPA's replica count for one metric (`replica_calculator.go`, plain metric).

    `ratio` is the average over ready gangs divided by the target. Gangs still starting
    report no metrics (their leader's vLLM is not up); like HPA's missing pods, they count as
    idle when scaling up and as exactly on target when scaling down, and if that flips the
    direction or lands within tolerance the scale stays.
    """
    if abs(ratio - 1.0) <= HPA_TOLERANCE:
        return spec
    missing = max(spec - ready, 0)
    if missing == 0:
        return math.ceil(ratio * ready)
    adjusted = ratio * ready / spec if ratio > 1.0 else (ratio * ready + missing) / spec
    if abs(adjusted - 1.0) <= HPA_TOLERANCE or (adjusted > 1.0) != (ratio > 1.0):
        return spec
    return math.ceil(adjusted * spec)
