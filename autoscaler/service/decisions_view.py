"""`/decisions`: the last tick's plan per component, every input it used, and why each number.

Per component: the policy it was decided under (or the problems that made it hold), the
inputs (spec gangs, each gang's state, balloon gangs held, the signals with the reason of
each missing one, the forecast and its forecaster's status), the plan (desired gangs and
balloon gangs, each with its reason, and `steps`: every stage of the core's pipeline with
the value after it and why), and what the act step did. Pure: a `TickRecord` in, a dict of
JSON-ready values out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from autoscaler.adapters.kube_apply import ComponentApplied
from autoscaler.adapters.kube_state import ComponentState
from autoscaler.core.gang_plan import ComponentPlan
from autoscaler.core.model import ComponentKey, Forecast, Signals
from autoscaler.core.policy import Policy, policy_cautions
from autoscaler.service.control_loop import TickRecord
from autoscaler.service.forecasts import ForecastStatus


def _number(value: float | None) -> float | None:
    # JSON has no NaN or Infinity; a non-finite value is as good as missing here.
    if value is None or not math.isfinite(value):
        return None
    return value


def _time(unix_s: float | None) -> str | None:
    if unix_s is None:
        return None
    return datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="milliseconds")


def policy_view(policy: Policy | None) -> dict[str, Any] | None:
    if policy is None:
        return None
    out: dict[str, Any] = {}
    for name in type(policy).model_fields:
        value = getattr(policy, name)
        if value is None or isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = str(value)  # enums, the ratio band
    return out


def signals_view(signals: Signals | None) -> dict[str, Any]:
    s = signals or Signals()
    return {
        "waiting_requests": _number(s.waiting_requests),
        "running_requests": _number(s.running_requests),
        "kv_usage_fraction": _number(s.kv_usage_fraction),
        "demand": _number(s.demand),
        "missing_reasons": dict(s.missing_reasons),
    }


def forecast_view(forecast: Forecast | None, status: ForecastStatus | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "point": None,
        "upper": None,
        "horizon_s": None,
        "fallback_reason": None,
    }
    if forecast is not None:
        out.update(
            point=_number(forecast.point),
            upper=_number(forecast.upper),
            horizon_s=forecast.horizon_s,
            fallback_reason=forecast.fallback_reason,
        )
    if status is not None:
        out["model"] = {
            "name": status.model,
            "backfilled": status.backfilled,
            "backfill_error": status.backfill_error,
            "fits_completed": status.fits_completed,
            "last_fit_error": status.last_fit_error,
            "withheld": status.withheld,
        }
    return out


def plan_view(plan: ComponentPlan | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    return {
        "current_gangs": plan.current_gangs,
        "desired_gangs": plan.desired_gangs,
        "reason": plan.reason.value,
        "detail": plan.detail,
        "hold": plan.hold,
        "changes_replicas": plan.changes_replicas,
        "balloon_gangs": plan.balloon_gangs,
        "balloon_reason": plan.balloon_reason.value,
        "capacity_per_gang": _number(plan.capacity_per_gang),
        "forgotten_capacity_per_gang": _number(plan.forgotten_capacity_per_gang),
        "burst_factor": _number(plan.burst_factor),
        "rolled_back_groups": list(plan.rolled_back_groups),
        "stuck_groups": list(plan.stuck_groups),
        "unplaced_groups": list(plan.unplaced_groups),
        "retry_wait_s": _number(plan.retry_wait_s),
        "steps": [
            {"stage": s.stage, "gangs": s.gangs, "reason": s.reason.value, "detail": s.detail}
            for s in plan.steps
        ],
    }


def applied_view(applied: ComponentApplied | None) -> dict[str, Any] | None:
    if applied is None:
        return None
    scale = applied.scale
    balloons = applied.balloon_plan
    return {
        "dry_run": applied.dry_run,
        "scale": None
        if scale is None
        else {
            "result": scale.result.value,
            "from_gangs": scale.from_gangs,
            "to_gangs": scale.to_gangs,
            "conflicts": scale.conflicts,
            "detail": scale.detail,
        },
        "balloons": None
        if balloons is None
        else {
            "create_gangs": list(balloons.create_gangs),
            "delete_pods": list(balloons.delete_pods),
            "broken_gangs": list(balloons.broken_gangs),
            "held_gangs": balloons.held_gangs,
        },
        "events": list(applied.events),
        "errors": list(applied.errors),
    }


def _inputs(comp: ComponentState, signals: Signals | None) -> dict[str, Any]:
    found = comp.discovered
    obs = comp.observation
    return {
        "scale_target": str(found.scale_target),
        "spec_gangs": found.spec_gangs,
        "resource_version": found.resource_version,
        "pods_per_gang": found.shape.pods_per_gang if found.shape else None,
        "topology_key": found.shape.topology_key if found.shape else None,
        "ready_gangs": obs.ready_gangs if obs else None,
        "gangs": [
            {
                "group_index": g.group_index,
                "state": g.state.value,
                "pods_expected": g.pods_expected,
                "pods_scheduled": g.pods_scheduled,
                "pods_ready": g.pods_ready,
                "not_ready_since": _time(g.not_ready_since_s),
            }
            for g in (obs.gangs if obs else ())
        ],
        "balloon_gangs": obs.balloon_gangs if obs else None,
        "signals": signals_view(signals),
    }


def decisions_view(
    record: TickRecord | None,
    *,
    last_planned: TickRecord | None = None,
    forecast_status: Callable[[ComponentKey], ForecastStatus] | None = None,
) -> dict[str, Any]:
    """The JSON body of `/decisions` for the last tick (an empty shell before the first).

    When the last tick stopped before planning, each component shows the plan of
    `last_planned` (the last tick that made one), and `plan_tick` says which tick that was.
    """
    if record is None:
        return {"tick": None, "components": {}}
    components: dict[str, Any] = {}
    state = record.state or (last_planned.state if last_planned else None)
    plan = record.plan
    applied = record.applied
    plan_tick = record.number
    if plan is None and last_planned is not None:
        plan, applied, plan_tick = last_planned.plan, last_planned.applied, last_planned.number
    for key in sorted(state.components) if state else ():
        comp = state.components[key]  # type: ignore[union-attr]
        found = comp.discovered
        policy = found.policy
        components[str(key)] = {
            "namespace": key.namespace,
            "lws": key.lws,
            "deployment": found.deployment.name if found.deployment else None,
            "component": policy.component.value if policy else None,
            "policy": policy_view(policy),
            "policy_problems": [str(p) for p in found.problems],
            # valid, but working against itself (gang-timeout under lead-time): not held on
            "policy_cautions": [str(c) for c in (policy_cautions(policy) if policy else ())],
            "inputs": _inputs(comp, record.signals.get(key)),
            "forecast": forecast_view(
                record.forecasts.get(key), forecast_status(key) if forecast_status else None
            ),
            "plan": plan_view(plan.components.get(key) if plan else None),
            "plan_tick": plan_tick if plan and key in plan.components else None,
            "applied": applied_view(applied.components.get(key) if applied else None),
        }
    return {
        "tick": record.number,
        "started_at": _time(record.started_at_s),
        "duration_s": record.duration_s,
        "cpu_s": record.cpu_s,
        "role": "dry-run" if record.dry_run else ("leader" if record.leader else "standby"),
        "dry_run": record.dry_run,
        "outcome": record.outcome,
        "errors": list(record.errors),
        "cluster": None
        if state is None
        else {"nodes": len(state.cluster.nodes), "can_grow": state.cluster.can_grow},
        "orphan_balloons_deleted": list(applied.orphan_balloons_deleted) if applied else [],
        "components": components,
    }
