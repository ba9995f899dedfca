"""Step 8: how many balloon gangs to hold for a component.

Balloons cover the gap between what the forecast's upper bound may need `lead_time` ahead
and what is already desired, so a surge finds placed, preemptible capacity instead of
waiting minutes for a node.

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
) -> tuple[int, Reason, str]:
    if not policy.forecast or forecast is None or capacity is None:
        why = (
            "forecast off"
            if not policy.forecast
            else "no forecast yet"
            if forecast is None
            else "capacity per gang unknown"
        )
        return policy.min_buffer, Reason.BUFFER_NO_FORECAST, why
    upper_gangs = gangs_for_demand(forecast.upper, capacity)
    wanted = upper_gangs - desired_gangs
    detail = f"upper bound {forecast.upper:g} needs {upper_gangs} gangs, {desired_gangs} desired"
    if wanted < policy.min_buffer:
        return policy.min_buffer, Reason.BUFFER_MIN, detail
    if wanted > policy.max_buffer:
        return policy.max_buffer, Reason.BUFFER_MAX, detail
    return wanted, Reason.BUFFER_FORECAST, detail
