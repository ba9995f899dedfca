"""Step 1: the reactive proposal, HPA's algorithm counted in gangs.

Each signal proposes `ceil(ready_gangs * observed / target)` (for the queue, whose sum over
gangs is what is observed, that is `ceil(waiting / target_waiting)`), unless the usage ratio
is within the tolerance band, in which case it proposes the current count. Over target it
proposes at least the current count, whatever is not ready yet (HPA's rule for unready
pods). The largest proposal wins. A missing signal proposes nothing; if every signal is
missing the component holds, and if only some are missing it may grow but never shrink.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.core.capacity import ceil_gangs
from autoscaler.core.gang_plan import Reason
from autoscaler.core.model import ComponentObservation
from autoscaler.core.policy import Policy

DEFAULT_TOLERANCE = 0.1


@dataclass(frozen=True, slots=True)
class Proposal:
    gangs: int
    reason: Reason
    detail: str
    # True when no signal could be read: the component holds and nothing scales down
    no_data: bool = False
    # True when some signal was missing: the proposal may grow, never shrink
    partial_data: bool = False
    # largest observed/target ratio over the signals that were read
    usage_ratio: float | None = None
    # the queue's ratio alone (None when the queue was not read)
    waiting_ratio: float | None = None


def _signal_proposal(
    *, total: float, ready_gangs: int, target_per_gang: float, current_gangs: int, tolerance: float
) -> tuple[int, float]:
    """Gangs proposed by one signal, and its usage ratio (observed per gang / target)."""
    if ready_gangs == 0:
        # No ready gang to average over: size straight from the total load, and never below
        # the gangs there are. Those are all starting or broken, and what they would serve
        # once ready is not known: 6 waiting at 4 per gang proposed 2 of 4 starting gangs.
        wanted = ceil_gangs(total / target_per_gang) if total > 0 else 0
        return max(wanted, current_gangs, 1 if total > 0 else 0), (math.inf if total > 0 else 0.0)
    ratio = (total / ready_gangs) / target_per_gang
    if abs(ratio - 1.0) <= tolerance:
        return current_gangs, ratio
    wanted = ceil_gangs(ready_gangs * ratio)
    if ratio > 1.0:
        # Over target, gangs not ready yet (starting) are counted as idle, as HPA counts
        # unready pods on a scale-up; when that reverses the direction it holds. Over target
        # never proposes fewer gangs than there are: that would scale away gangs still
        # loading their weights while the ready ones are overloaded.
        return max(wanted, current_gangs), ratio
    return wanted, ratio


def reactive_proposal(
    obs: ComponentObservation, policy: Policy, *, tolerance: float = DEFAULT_TOLERANCE
) -> Proposal:
    signals = obs.signals
    ready = obs.ready_gangs
    current = obs.spec_gangs
    candidates: list[tuple[int, float, Reason, Reason, str]] = []
    missing: list[str] = []
    waiting_ratio: float | None = None

    if signals.waiting_requests is None:
        missing.append("waiting_requests")
    else:
        gangs, ratio = _signal_proposal(
            total=signals.waiting_requests,
            ready_gangs=ready,
            target_per_gang=policy.target_waiting,
            current_gangs=current,
            tolerance=tolerance,
        )
        waiting_ratio = ratio
        candidates.append(
            (
                gangs,
                ratio,
                Reason.SCALE_UP_WAITING,
                Reason.SCALE_DOWN_WAITING,
                f"{signals.waiting_requests:g} waiting over {ready} ready gangs, "
                f"target {policy.target_waiting:g} per gang",
            )
        )
    if signals.kv_usage_fraction is None:
        missing.append("kv_usage_fraction")
    else:
        # KV usage is already a per-gang mean; its "total" is mean x ready gangs.
        gangs, ratio = _signal_proposal(
            total=signals.kv_usage_fraction * max(ready, 1),
            ready_gangs=ready,
            target_per_gang=policy.target_kv_cache,
            current_gangs=current,
            tolerance=tolerance,
        )
        candidates.append(
            (
                gangs,
                ratio,
                Reason.SCALE_UP_KV_CACHE,
                Reason.SCALE_DOWN_KV_CACHE,
                f"KV cache {signals.kv_usage_fraction:.0%} over {ready} ready gangs, "
                f"target {policy.target_kv_cache:.0%}",
            )
        )

    if not candidates:
        why = "; ".join(
            f"{name}: {signals.missing_reasons.get(name, 'no data')}" for name in missing
        )
        return Proposal(current, Reason.HOLD_MISSING_DATA, f"no signal ({why})", no_data=True)

    gangs, ratio, up, down, detail = max(candidates, key=lambda c: (c[0], c[1]))
    top_ratio = max(c[1] for c in candidates)
    if gangs > current:
        reason = up
    elif gangs < current:
        reason = down
    else:
        reason = Reason.WITHIN_TOLERANCE
    if missing and gangs < current:
        names = ", ".join(missing)
        return Proposal(
            current,
            Reason.HOLD_MISSING_DATA,
            f"{detail}; not scaling down while {names} is missing",
            partial_data=True,
            usage_ratio=top_ratio,
            waiting_ratio=waiting_ratio,
        )
    return Proposal(
        gangs,
        reason,
        detail,
        partial_data=bool(missing),
        usage_ratio=top_ratio,
        waiting_ratio=waiting_ratio,
    )


def demand_proposal(
    obs: ComponentObservation, capacity: float, *, tolerance: float = DEFAULT_TOLERANCE
) -> int | None:
    """Gangs the demand signal proposes: the same rule with the capacity per gang as the
    target, so `ceil(demand / capacity)` outside the tolerance band. None without a reading.

    The queue and the KV cache saturate and say only "more"; the arrival rate says how much
    more, which is why the decision lets it raise (never lower) the reactive proposal.
    """
    demand = obs.signals.demand
    # A negative or infinite rate is no reading (a counter reset mis-read, a broken query).
    if demand is None or not 0 <= demand < math.inf or capacity <= 0:
        return None
    gangs, _ = _signal_proposal(
        total=demand,
        ready_gangs=obs.ready_gangs,
        target_per_gang=capacity,
        current_gangs=obs.spec_gangs,
        tolerance=tolerance,
    )
    return gangs
