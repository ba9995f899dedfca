"""Step 8: how many balloon gangs to hold for a component.

Balloons cover the gap between what the forecast's upper bound may need `lead_time` ahead
and what is already desired, so a surge finds placed, preemptible capacity instead of
waiting minutes for a node; at most as many as `max-replicas` leaves room for.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

from autoscaler.core.capacity import gangs_for_demand
from autoscaler.core.gang_plan import Reason
from autoscaler.core.model import Forecast
from autoscaler.core.policy import Policy


def balloon_gangs(
    *,
    policy: Policy,
    forecast: Forecast | None,
    capacity: float | None,
    desired_gangs: int,
    current_balloons: int,
) -> tuple[int, Reason, str]:
    """With the forecast off, the buffer is `min-buffer`. With it on but no forecast or no
    capacity per gang to read it by (a forecaster error, a restart before back-fill), the
    balloon gangs held stay within the bounds: missing data never gives capacity back.

    Never more than the gangs `max-replicas` still allows: a balloon gang is capacity for
    the component to grow into, and one it may never use would only hold GPUs (and, Pending,
    make the cluster add nodes for it)."""
    gangs, reason, detail = _buffer(
        policy=policy,
        forecast=forecast,
        capacity=capacity,
        desired_gangs=desired_gangs,
        current_balloons=current_balloons,
    )
    room = max(policy.max_replicas - desired_gangs, 0)
    if gangs > room:
        return (
            room,
            Reason.MAX_REPLICAS,
            f"{detail}; max-replicas {policy.max_replicas} leaves room for {room}",
        )
    return gangs, reason, detail


def _buffer(
    *,
    policy: Policy,
    forecast: Forecast | None,
    capacity: float | None,
    desired_gangs: int,
    current_balloons: int,
) -> tuple[int, Reason, str]:
    if not policy.forecast:
        return policy.min_buffer, Reason.BUFFER_NO_FORECAST, "forecast off"
    if forecast is None or capacity is None:
        why = "no forecast yet" if forecast is None else "capacity per gang unknown"
        held = min(max(current_balloons, policy.min_buffer), policy.max_buffer)
        return held, Reason.BUFFER_NO_FORECAST, f"{why}; holding {held} balloon gangs"
    upper_gangs = gangs_for_demand(forecast.upper, capacity)
    wanted = upper_gangs - desired_gangs
    detail = f"upper bound {forecast.upper:g} needs {upper_gangs} gangs, {desired_gangs} desired"
    if wanted < policy.min_buffer:
        return policy.min_buffer, Reason.BUFFER_MIN, detail
    if wanted > policy.max_buffer:
        return policy.max_buffer, Reason.BUFFER_MAX, detail
    return wanted, Reason.BUFFER_FORECAST, detail
