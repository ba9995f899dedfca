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
    tolerance: float = 0.0,
) -> tuple[int, Reason, str]:
    """With the forecast off, the buffer is `min-buffer`. With it on but no forecast or no
    capacity per gang to read it by (a forecaster error, a restart before back-fill), the
    balloon gangs held stay within the bounds: missing data never gives capacity back.

    A buffer keeps the balloon gangs it holds while the upper bound is within `tolerance`
    of one gang's capacity of needing them: an upper bound wavering around a gang's
    boundary (2,999 and 3,001 at 1,000 a gang) deleted and created a balloon gang on
    alternate ticks, and with a node autoscaler every re-created Pending gang can order a
    GPU node.

    Never more than the gangs `max-replicas` still allows: a balloon gang is capacity for
    the component to grow into, and one it may never use would only hold GPUs (and, Pending,
    make the cluster add nodes for it)."""
    if not policy.forecast:
        gangs, reason, detail = policy.min_buffer, Reason.BUFFER_NO_FORECAST, "forecast off"
    elif forecast is None or capacity is None:
        why = "no forecast yet" if forecast is None else "capacity per gang unknown"
        gangs = min(max(current_balloons, policy.min_buffer), policy.max_buffer)
        reason, detail = Reason.BUFFER_NO_FORECAST, f"{why}; holding {gangs} balloon gangs"
    else:
        upper_gangs = gangs_for_demand(forecast.upper, capacity)
        wanted = upper_gangs - desired_gangs
        detail = (
            f"upper bound {forecast.upper:g} needs {upper_gangs} gangs, {desired_gangs} desired"
        )
        if wanted < current_balloons:
            # The band is a fraction of one gang: it is for a boundary wavered around, and
            # 10 % of a large deployment's whole bound would keep a gang more for good.
            band_gangs = gangs_for_demand(forecast.upper + tolerance * capacity, capacity)
            kept = min(current_balloons, band_gangs - desired_gangs)
            if kept > max(wanted, 0):
                wanted = kept
                detail = (
                    f"{detail}; within {tolerance:.0%} of a gang of needing {kept} balloon "
                    "gangs: kept"
                )
        if wanted < policy.min_buffer:
            gangs, reason = policy.min_buffer, Reason.BUFFER_MIN
        elif wanted > policy.max_buffer:
            gangs, reason = policy.max_buffer, Reason.BUFFER_MAX
        else:
            gangs, reason = wanted, Reason.BUFFER_FORECAST
    room = max(policy.max_replicas - desired_gangs, 0)
    if gangs > room:
        detail = f"{detail}; max-replicas {policy.max_replicas} leaves room for {room}"
        return room, Reason.MAX_REPLICAS, detail
    return gangs, reason, detail
