"""The alternatives `gang` is measured against.

- `static`: the gangs the busiest moment of the trace needs, held all the time.
- `oracle`: the clairvoyant requirement, each gang started one lead time before it is needed
  and dropped the moment it is not; a lower bound on GPU-hours for meeting the SLO.
- `reactive`: the Kubernetes HPA algorithm (`pkg/controller/podautoscaler`) on the same vLLM
  signals, per component, as a Pods metric on the LWS scale subresource, whose selector
  picks one leader pod per gang: usage ratio over the leaders serving metrics with a 0.1
  tolerance; leaders placed but not serving yet (HPA's missing pods) counted as idle on
  scale-up and on target on scale-down; leaders still Pending (HPA's unready pods) counted
  as idle on scale-up and left out on scale-down; default scale-up limit max(4, 100%) per
  15 s, a 300 s scale-down stabilization window, no forecast, no balloons, pods scheduled
  one by one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from autoscaler.core.model import GangState
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
        # The cluster places a gang's pods in LWS order, leader first, so a gang with no pod
        # placed is exactly one whose leader is Pending; any other gang not ready has its
        # leader placed and Running (image pulls are not modelled), without vLLM metrics
        # until the whole gang is up.
        pending = sum(1 for g in comp.gangs if g.state is GangState.PENDING)
        missing = len(comp.gangs) - ready - pending
        signals = comp.signals
        proposals: list[int] = []
        if ready > 0:
            metrics = []
            if signals.waiting_requests is not None:
                metrics.append(signals.waiting_requests / ready / self.target_waiting[name])
            if signals.kv_usage_fraction is not None:
                metrics.append(signals.kv_usage_fraction / self.target_kv_usage)
            for ratio in metrics:
                proposals.append(
                    _hpa_replicas(
                        ratio,
                        ready_gangs=ready,
                        missing_gangs=missing,
                        pending_gangs=pending,
                        spec_gangs=spec,
                    )
                )
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


def _hpa_replicas(
    ratio: float, *, ready_gangs: int, missing_gangs: int, pending_gangs: int, spec_gangs: int
) -> int:
    """HPA's replica count for one Pods metric (`replica_calculator.go`: `groupPods`, then
    `calcPlainMetricReplicas`), one leader pod per gang.

    `ratio` is the average over the `ready_gangs` leaders that serve metrics, divided by the
    target. `missing_gangs` have their leader placed but report nothing yet (vLLM loading or
    waiting for its workers): HPA's missing pods, filled in as exactly on target when the
    ratio says scale down and as idle when it says scale up. `pending_gangs` have their
    leader Pending: HPA's unready pods, filled in as idle on a scale-up and otherwise simply
    left out, so a scale-down is computed over the placed leaders only. If filling in lands
    within tolerance or flips the direction, the scale stays at `spec_gangs`; otherwise the
    count is taken over the leaders that got a value, not over the spec.
    """
    scale_up_with_pending = pending_gangs > 0 and ratio > 1.0
    if not scale_up_with_pending and missing_gangs == 0:
        if abs(ratio - 1.0) <= HPA_TOLERANCE:
            return spec_gangs
        return math.ceil(ratio * ready_gangs)
    # what HPA averages the second time: the per-leader ratios summed, over `counted` leaders
    total, counted = ratio * ready_gangs, ready_gangs
    if ratio < 1.0:
        total, counted = total + missing_gangs, counted + missing_gangs
    elif ratio > 1.0:
        counted += missing_gangs
    if scale_up_with_pending:
        counted += pending_gangs
    new_ratio = total / counted
    if (
        abs(new_ratio - 1.0) <= HPA_TOLERANCE
        or (ratio < 1.0 < new_ratio)
        or (new_ratio < 1.0 < ratio)
    ):
        return spec_gangs
    proposal = math.ceil(new_ratio * counted)
    # HPA's guard for more pods listed than the spec (a rollout); the simulated LWS lists
    # exactly its spec's gangs, so it holds nothing here
    if (new_ratio < 1.0 and proposal > spec_gangs) or (new_ratio > 1.0 and proposal < spec_gangs):
        return spec_gangs
    return proposal
