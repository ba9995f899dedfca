"""What the decision core returns: a plan per component, every number with its reason, and
the memory to hand back on the next tick.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from autoscaler.core.model import ComponentKey
from autoscaler.core.partial_gangs import RollBack, Sighting


class Reason(enum.StrEnum):
    """Why a number in the plan is what it is. The same value is used as the log field,
    the Event reason suffix, the metric label and the `/decisions` entry."""

    # reactive proposal
    SCALE_UP_WAITING = "scale_up_waiting"
    SCALE_UP_KV_CACHE = "scale_up_kv_cache"
    SCALE_DOWN_WAITING = "scale_down_waiting"
    SCALE_DOWN_KV_CACHE = "scale_down_kv_cache"
    SCALE_UP_DEMAND = "scale_up_demand"
    WITHIN_TOLERANCE = "within_tolerance"
    # holds
    HOLD_MISSING_DATA = "hold_missing_data"
    HOLD_POLICY_ERROR = "hold_policy_error"
    HOLD_GANGS_STARTING = "hold_gangs_starting"
    HOLD_ROLL_BACK_BACKOFF = "hold_roll_back_backoff"
    HOLD_STALE_VIEW = "hold_stale_view"
    # forecast
    FORECAST_FLOOR = "forecast_floor"
    # requests waiting for a deployment at zero
    SCALE_FROM_ZERO = "scale_from_zero"
    # stabilization and limits
    SCALE_DOWN_STABILIZED = "scale_down_stabilized"
    SCALE_UP_RATE_LIMITED = "scale_up_rate_limited"
    # bounds
    MIN_REPLICAS = "min_replicas"
    MAX_REPLICAS = "max_replicas"
    # deployment coupling
    DEPLOYMENT_MINIMUM = "deployment_minimum"
    DEPLOYMENT_AT_ZERO = "deployment_at_zero"
    RATIO_BAND = "ratio_band"
    # fit
    CAPACITY_SHORT = "capacity_short"
    # partial gangs
    PARTIAL_GANG_ROLLED_BACK = "partial_gang_rolled_back"
    KEEP_READY_GANGS = "keep_ready_gangs"
    # buffer
    BUFFER_FORECAST = "buffer_forecast"
    BUFFER_MIN = "buffer_min"
    BUFFER_MAX = "buffer_max"
    BUFFER_NO_FORECAST = "buffer_no_forecast"
    # nothing changed
    STEADY = "steady"


@dataclass(frozen=True, slots=True)
class Step:
    """One stage of the pipeline: the value after it and why."""

    stage: str
    gangs: int | None
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ComponentPlan:
    key: ComponentKey
    current_gangs: int
    desired_gangs: int
    reason: Reason  # the stage that decided desired_gangs
    balloon_gangs: int
    balloon_reason: Reason
    # True: replicas unchanged this tick whatever the stages say (a bad policy, a stale view
    # of the cluster). Missing signals hold through the reactive stage instead
    # (HOLD_MISSING_DATA: no scale-down), which the forecast floor or bounds may still raise.
    hold: bool = False
    steps: tuple[Step, ...] = ()
    # group indexes of partial gangs past their timeout that this plan scales away
    rolled_back_groups: tuple[int, ...] = ()
    # partial gangs past their timeout that stay (below the desired count): reported only
    stuck_groups: tuple[int, ...] = ()
    # gangs with no pod placed past their timeout, kept while the cluster can grow: reported
    unplaced_groups: tuple[int, ...] = ()
    # after a roll-back the second or later in a row: how long until they are asked for again
    retry_wait_s: float | None = None
    capacity_per_gang: float | None = None
    # a capacity per gang learned for another gang template, dropped by this plan
    forgotten_capacity_per_gang: float | None = None
    # the spread of the recent demand readings the forecast floor planned for (burst.py);
    # None when no floor was computed (forecast off or missing, no capacity per gang)
    burst_factor: float | None = None
    detail: str = ""

    @property
    def changes_replicas(self) -> bool:
        return not self.hold and self.desired_gangs != self.current_gangs


@dataclass(frozen=True, slots=True)
class GangPlan:
    components: Mapping[ComponentKey, ComponentPlan]


@dataclass(frozen=True, slots=True)
class SaturatedStretch:
    """Consecutive readings at or above 90 % of their target (`capacity.MIN_RATIO_TO_LEARN`),
    all with the same ready gangs (the window's demand is divided by them) and the same gang
    template (`ComponentObservation.template`)."""

    since: float
    last: float  # the latest reading in it
    ready_gangs: int
    template: str | None = None


@dataclass(frozen=True, slots=True)
class ComponentMemory:
    """What one component's decisions remember between ticks."""

    # (time_s, proposal) of recent reactive/forecast proposals, for the scale-down window
    proposals: tuple[tuple[float, int], ...] = ()
    # demand one ready gang served while saturated (exponentially weighted), learned
    learned_capacity_per_gang: float | None = None
    # the gang template (`ComponentObservation.template`) it was learned for
    learned_template: str | None = None
    # the component's current run of readings at 90 % of its target or above (None: not in
    # one); a capacity is learned only once it covers the demand signal's rate window
    saturated: SaturatedStretch | None = None
    # the proposal that caused the last scale-up, so gangs still starting are not stacked
    # on unless the need grew beyond it
    last_scale_up_need: int | None = None
    # when this loop first saw each not-ready group in its present phase (holding GPUs or not)
    not_ready_first_seen: tuple[Sighting, ...] = ()
    # the last roll-back of timed-out gangs, until asking again works (partial_gangs.py)
    roll_back: RollBack | None = None
    # (time_s, demand) readings of the last half hour, for the forecast floor's burst factor
    demand_samples: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Memory:
    components: Mapping[ComponentKey, ComponentMemory] = field(default_factory=dict)

    def of(self, key: ComponentKey) -> ComponentMemory:
        return self.components.get(key, ComponentMemory())
