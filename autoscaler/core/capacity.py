"""Demand one gang serves at target, and the gang counts a demand forecast implies.

Capacity per gang comes from the policy, or is learned: while a component runs at 90 % of
its target or above, the demand it sees per ready gang, scaled back to the target, is a
sample of what one gang serves at target. Samples are blended exponentially so one odd tick
does not swing the forecast floor, and one under a quarter of the learned value is taken for
a stalled gang, not learned, for the first half hour at target.

The demand signal is a rate over a window (`rate(...[1m])` in the default queries), so a
sample is taken only once the component has stayed there for that whole window. A burst of
seconds fills the queue while the minute's rate still reads the quiet seconds around it:
learning from it, a bursty code assistant's prefill learned a third of what a gang serves,
and the floor then ordered three times the gangs (docs/results.md).

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import math
from dataclasses import replace

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
# A saturated sample under this share of the learned value is taken for a gang that stalled
# (a hung NCCL ring, a full queue served at a trickle), not a capacity, until the stretch at
# target has lasted `STALL_GRACE_S`. Learned from at once, five minutes of a stall took 2,800
# tokens/s per gang to 33, and the floor then ordered five times the gangs for good: learning
# needs saturation, which that floor prevents. A fall to a third or more is followed at the
# blending rate; a deeper one that lasts (traffic moving to far longer contexts) after the
# grace, so the value cannot be stuck high either.
MIN_SAMPLE_SHARE = 0.25
STALL_GRACE_S = 1800.0
# The window of the default demand queries' rate(); the service passes its own setting.
DEFAULT_DEMAND_WINDOW_S = 60.0
# Readings further apart than this many demand windows leave time unseen between them: the
# stretch starts again. Two, so a tick or two that was never planned (past its deadline, a
# failed plan) or a tick as long as the window itself does not stop learning.
MAX_GAP_WINDOWS = 2.0


def extend_stretch(
    previous: SaturatedStretch | None,
    obs: ComponentObservation,
    *,
    usage_ratio: float | None,
    now: float,
    demand_window_s: float,
) -> SaturatedStretch | None:
    """The stretch this reading belongs to, or None when the component is under 90 % of its
    target (or has no ready gang, or no readable ratio). A new one starts when the ready
    gangs or the gang template changed, when the last reading is more than
    `MAX_GAP_WINDOWS` windows old, or when the clock went back."""
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
        or previous.template != obs.template
        or not previous.last <= now
        or now - previous.last > MAX_GAP_WINDOWS * demand_window_s
    ):
        return SaturatedStretch(since=now, last=now, ready_gangs=ready, template=obs.template)
    return replace(previous, last=now)


def learn_capacity(
    previous: float | None,
    obs: ComponentObservation,
    *,
    usage_ratio: float | None,
    stretch: SaturatedStretch | None,
    demand_window_s: float,
) -> float | None:
    """Blend a new capacity sample into `previous` once the component's saturated
    `stretch` for this reading (`extend_stretch`; None: not saturated, which also covers an
    unreadable ratio and no ready gang) covers the demand signal's whole rate window."""
    demand = obs.signals.demand
    if (
        stretch is None
        or usage_ratio is None
        or not stretch.last - stretch.since >= demand_window_s > 0
        or demand is None
        or demand <= 0
    ):
        return previous
    sample = demand / stretch.ready_gangs / usage_ratio
    if not (math.isfinite(sample) and sample >= MIN_CAPACITY):
        return previous  # a denormal or absurd reading would divide by ~0 next tick
    if previous is None:
        return sample
    if sample < MIN_SAMPLE_SHARE * previous and stretch.last - stretch.since < STALL_GRACE_S:
        return previous  # a stall, not a capacity (yet)
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


def floor_gangs(value: float) -> int:
    """`floor(value)` in whole gangs, with the same tolerance of float noise as `ceil_gangs`
    (3 * 0.1 / 0.1 stays 3)."""
    if value >= GANGS_CEILING:
        return GANGS_CEILING
    return math.floor(value + 1e-9)


def gangs_for_demand(demand: float, capacity: float) -> int:
    """Whole gangs needed to serve `demand` at target."""
    if demand <= 0:
        return 0
    return ceil_gangs(demand / capacity)
