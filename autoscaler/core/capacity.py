"""Demand one gang serves at target, and the gang counts a demand forecast implies.

Capacity per gang comes from the policy, or is learned: while a component runs at or above
its target, the demand it sees per ready gang, scaled back to the target, is a sample of
what one gang serves at target. Samples are blended exponentially so one odd tick does not
swing the forecast floor.

The demand signal is a rate over a window (`rate(...[1m])` in the default queries), so a
sample is taken only once the component has stayed at or above its target for that whole
window. A burst of seconds fills the queue while the minute's rate still reads the quiet
seconds around it: learning from it, a bursty code assistant's prefill learned a third of
what a gang serves, and the floor then ordered three times the gangs (docs/results.md).

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import math

from autoscaler.core.gang_plan import SaturatedStretch
from autoscaler.core.model import ComponentObservation
from autoscaler.core.policy import Policy

LEARNING_WEIGHT = 0.2
# Below this usage ratio the component is not loaded enough for its throughput to say
# anything about what it could serve.
MIN_RATIO_TO_LEARN = 0.9
# Smallest capacity per gang worth learning, in the demand unit (tokens/s): below it a
# sample is a rounding artefact, not a gang.
MIN_CAPACITY = 1e-6
# The window of the default demand queries' rate(); the service passes its own setting.
DEFAULT_DEMAND_WINDOW_S = 60.0


def extend_stretch(
    previous: SaturatedStretch | None,
    obs: ComponentObservation,
    *,
    usage_ratio: float | None,
    now: float,
    demand_window_s: float,
) -> SaturatedStretch | None:
    """The stretch this reading belongs to, or None when the component is not at its
    target (or has no ready gang, or no readable ratio). A new one starts when the ready
    gangs changed, when the last reading is more than a window old (a tick that was never
    planned saw nothing), or when the clock went back."""
    ready = obs.ready_gangs
    if (
        usage_ratio is None
        or not math.isfinite(usage_ratio)
        or usage_ratio < MIN_RATIO_TO_LEARN
        or ready == 0
    ):
        return None
    if (
        previous is None
        or previous.ready_gangs != ready
        or not previous.since <= previous.last <= now
        or now - previous.last > demand_window_s
    ):
        return SaturatedStretch(since=now, last=now, ready_gangs=ready)
    return SaturatedStretch(since=previous.since, last=now, ready_gangs=ready)


def learn_capacity(
    previous: float | None,
    obs: ComponentObservation,
    *,
    usage_ratio: float | None,
    stretch: SaturatedStretch | None,
    demand_window_s: float,
) -> float | None:
    """Blend a new capacity sample into `previous` once the component's saturated
    `stretch` (None: not saturated) covers the demand signal's whole rate window."""
    demand = obs.signals.demand
    ready = obs.ready_gangs
    if (
        demand is None
        or usage_ratio is None
        or not math.isfinite(usage_ratio)
        or usage_ratio < MIN_RATIO_TO_LEARN
        or stretch is None
        or stretch.last - stretch.since < demand_window_s
        or ready == 0
        or demand <= 0
    ):
        return previous
    sample = demand / ready / usage_ratio
    if not (math.isfinite(sample) and sample >= MIN_CAPACITY):
        return previous  # a denormal or absurd reading would divide by ~0 next tick
    if previous is None:
        return sample
    return (1 - LEARNING_WEIGHT) * previous + LEARNING_WEIGHT * sample


def capacity_per_gang(policy: Policy, learned: float | None) -> float | None:
    return policy.capacity_per_replica if policy.capacity_per_replica is not None else learned


# Far above any `max-replicas` (at most 1,000,000); the bounds clamp to it.
GANGS_CEILING = 10**9


def ceil_gangs(value: float) -> int:
    """`ceil(value)` in whole gangs. The epsilon keeps float noise from adding a gang
    (2 * 4.0 / 4.0 stays 2); an absurd but finite quotient (2 waiting over a target of
    1e-308 is inf) gives `GANGS_CEILING`, which the bounds then clamp, not OverflowError."""
    if value >= GANGS_CEILING:
        return GANGS_CEILING
    return math.ceil(value - 1e-9)


def gangs_for_demand(demand: float, capacity: float) -> int:
    """Whole gangs needed to serve `demand` at target."""
    if demand <= 0:
        return 0
    return ceil_gangs(demand / capacity)
