"""The decision: observations + policies + forecasts + memory + now -> plan + memory.

`plan` runs DESIGN section 4 in order: reactive proposal (queue, KV cache, then the
demand signal, which may only raise it), forecast floor, stabilization and
rate limit, bounds, deployment coupling, fit on the cluster, partial gangs, buffer. It is a
pure function: no I/O, no clock, no randomness; the same inputs give the same plan. Every
number it returns carries a `Reason`, and `steps` records each stage for `/decisions`.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from autoscaler.core.buffer import balloon_gangs
from autoscaler.core.burst import BurstFactor, burst_factor, remember_demand
from autoscaler.core.capacity import (
    DEFAULT_DEMAND_WINDOW_S,
    capacity_per_gang,
    ceil_gangs,
    extend_stretch,
    gangs_for_demand,
    learn_capacity,
)
from autoscaler.core.coupling import couple_deployment, functional_minimum
from autoscaler.core.fit import GrowthRequest, Unplaced, allocate_growth
from autoscaler.core.gang_plan import (
    ComponentMemory,
    ComponentPlan,
    GangPlan,
    Memory,
    Reason,
    Step,
)
from autoscaler.core.model import (
    Component,
    ComponentKey,
    ComponentObservation,
    DeploymentKey,
    Forecast,
    GangState,
    Observations,
)
from autoscaler.core.partial_gangs import (
    GangAges,
    classify,
    next_roll_back,
    remembered_roll_back,
    roll_back_wait_s,
)
from autoscaler.core.policy import (
    Policy,
    PolicyProblem,
    deployment_key,
    policy_cautions,
    validate_deployment,
)
from autoscaler.core.reactive import DEFAULT_TOLERANCE, demand_proposal, reactive_proposal
from autoscaler.core.stabilization import (
    limit_scale_up,
    prune_proposals,
    remember_proposal,
    stabilize_scale_down,
)

# A note in the steps, not a stage that sets a count: the floor skipped for want of a
# capacity per gang.
NO_FLOOR_STAGE = "no_floor"


@dataclass(slots=True)
class _Draft:
    """A component's plan while the pipeline runs (private, never returned)."""

    obs: ComponentObservation
    policy: Policy
    deployment: DeploymentKey
    ages: GangAges
    gangs: int
    reason: Reason
    memory: ComponentMemory
    capacity: float | None
    need: int  # the proposal before limits, remembered at a scale-up
    # what a scale-up capped for gangs still starting remembers instead: the need it was
    # held to (remembering the need itself let it creep up by the tolerance every tick)
    scale_up_need: int | None = None
    # the count `_keep_ready` raised to: unchanged since, there is nothing new to keep for
    ready_kept_at: int | None = None
    forecast: Forecast | None = None  # a usable one (finite point and bound), else None
    forgotten_capacity: float | None = None  # learned for another gang template
    # the spread of the recent demand readings, read only when the forecast floor is computed
    burst: BurstFactor | None = None
    # the most gangs a ratio band may raise to: set while gangs rolled back are waited for
    ceiling: int | None = None
    steps: list[Step] = field(default_factory=list)

    def step(self, stage: str, gangs: int, reason: Reason, detail: str = "") -> None:
        if gangs != self.gangs:
            self.reason = reason
        self.gangs = gangs
        self.steps.append(Step(stage, gangs, reason, detail))


def _held(
    obs: ComponentObservation, reason: Reason, detail: str, memory: ComponentMemory
) -> tuple[ComponentPlan, ComponentMemory]:
    return (
        ComponentPlan(
            key=obs.key,
            current_gangs=obs.spec_gangs,
            desired_gangs=obs.spec_gangs,
            reason=reason,
            balloon_gangs=obs.balloon_gangs,
            balloon_reason=reason,
            hold=True,
            steps=(Step("hold", obs.spec_gangs, reason, detail),),
            detail=detail,
        ),
        memory,
    )


def _held_on_policy_error(
    obs: ComponentObservation, detail: str, memory: ComponentMemory, *, now: float
) -> tuple[ComponentPlan, ComponentMemory]:
    """Hold, and remember the hold in the scale-down window as a tick without data is: once
    the annotation is fixed, the window still holds the gangs, instead of the first valid
    reading dropping every gang the load no longer seems to need in one tick. A saturated
    stretch ends: what was not read cannot count toward learning a capacity."""
    held, _ = _held(obs, Reason.HOLD_POLICY_ERROR, detail, memory)
    proposals = remember_proposal(memory.proposals, obs.spec_gangs, now=now)
    return held, replace(memory, proposals=proposals, saturated=None)


def hold_every_component(
    observations: Observations,
    policies: Mapping[ComponentKey, Policy],
    memory: Memory,
    *,
    now: float,
    reason: Reason,
    detail: str,
) -> tuple[GangPlan, Memory]:
    """Hold every component at its current gangs and balloon gangs, for a reason that
    concerns the whole view (the cluster view cannot be trusted). Each hold is remembered in
    the component's scale-down window, as a tick without data is: when the view comes back,
    the first reading must not find the window empty and drop every gang at once. A
    saturated stretch ends, as on a tick without data."""
    plans: dict[ComponentKey, ComponentPlan] = {}
    memories = dict(memory.components)
    for key, obs in observations.components.items():
        previous = memory.of(key)
        plans[key], _ = _held(obs, reason, detail, previous)
        policy = policies.get(key)
        proposals = previous.proposals
        if policy is not None:
            history = prune_proposals(proposals, window_s=policy.scale_down_window_s, now=now)
            proposals = remember_proposal(history, obs.spec_gangs, now=now)
        memories[key] = replace(previous, proposals=proposals, saturated=None)
    return GangPlan(components=plans), Memory(components=memories)


def _draft(
    obs: ComponentObservation,
    policy: Policy,
    forecast: Forecast | None,
    memory: ComponentMemory,
    *,
    deployment: DeploymentKey,
    now: float,
    can_grow: bool,
    tolerance: float,
    demand_window_s: float,
) -> _Draft:
    """Steps 1-4 for one component."""
    current = obs.spec_gangs
    ages = classify(
        obs,
        gang_timeout_s=policy.gang_timeout_s,
        now=now,
        can_grow=can_grow,
        first_seen=memory.not_ready_first_seen,
    )
    proposal = reactive_proposal(obs, policy, tolerance=tolerance)
    broken_forecast = forecast is not None and not (
        math.isfinite(forecast.point) and math.isfinite(forecast.upper)
    )
    if broken_forecast:
        forecast = None  # a forecaster's NaN or inf is no forecast
    # What one gang served under another template (a new image, model or parallelism) says
    # nothing about this one, and a stale low value would never be corrected: the floor it
    # sets keeps the component below the load at which learning happens.
    same_template = memory.learned_template == obs.template
    previous = memory.learned_capacity_per_gang if same_template else None
    # A queue's ratio to its target grows with the backlog without bound, and dividing by it
    # collapsed the learned value while a queue built (3,000 tokens/s per gang learned as 77
    # in five minutes); a gang cannot run fuller than a full KV cache, 1 / target over it.
    ratio = proposal.usage_ratio
    if policy.component is Component.PREFILL:
        # A prefill gang's KV cache also holds prompts waiting for decode to take them: full,
        # it can say decode is short, not what prefill serves. Learning from it, ServeGen
        # m-small's prefill learned 18,800 tokens/s per gang (32,000 at target) while
        # decode had 200,000 requests waiting (docs/results.md): prefill learns at its queue.
        # A backlog behind decode that lasts long enough fills that queue too; not learning
        # prefill while decode is saturated would need the deployment's view here.
        ratio = proposal.waiting_ratio
    if ratio is not None:
        ratio = min(ratio, 1.0 / policy.target_kv_cache)
    stretch = extend_stretch(
        memory.saturated,
        obs,
        usage_ratio=ratio,
        now=now,
        demand_window_s=demand_window_s,
    )
    learned = learn_capacity(
        previous, obs, usage_ratio=ratio, stretch=stretch, demand_window_s=demand_window_s
    )
    capacity = capacity_per_gang(policy, learned)
    demand_samples = remember_demand(memory.demand_samples, obs.signals.demand, now=now)
    draft = _Draft(
        obs=obs,
        policy=policy,
        deployment=deployment,
        ages=ages,
        gangs=current,
        reason=Reason.STEADY,
        memory=replace(
            memory,
            learned_capacity_per_gang=learned,
            learned_template=obs.template,
            saturated=stretch,
            not_ready_first_seen=ages.first_seen,
            roll_back=remembered_roll_back(memory.roll_back, obs, now=now),
            demand_samples=demand_samples,
        ),
        capacity=capacity,
        need=current,
        forecast=forecast,
        forgotten_capacity=None if same_template else memory.learned_capacity_per_gang,
    )
    draft.step("reactive", proposal.gangs, proposal.reason, proposal.detail)
    draft.reason = proposal.reason  # the first stage speaks even when it changes nothing

    # Step 1, the demand signal (only raises, as the forecast floor does).
    if capacity is not None and not proposal.no_data:
        wanted = demand_proposal(obs, capacity, tolerance=tolerance)
        if wanted is not None and wanted > max(draft.gangs, current):
            draft.step(
                "demand",
                wanted,
                Reason.SCALE_UP_DEMAND,
                f"demand {obs.signals.demand:g} now at {capacity:g} per gang",
            )

    # Step 2: forecast floor (skipped when no signal at all could be read). At zero gangs no
    # signal can be read, ever: the forecast is what brings a deployment back (it can only
    # raise, and there is nothing to lower).
    readable = not proposal.no_data or current == 0
    if policy.forecast and forecast is not None and capacity is not None and readable:
        burst = draft.burst = burst_factor(demand_samples)
        floor = gangs_for_demand(forecast.point * burst.value, capacity)
        if floor > draft.gangs:
            draft.step(
                "forecast",
                floor,
                Reason.FORECAST_FLOOR,
                f"forecast {forecast.point:g} in {forecast.horizon_s:g}s, {burst.detail}, at "
                f"{capacity:g} per gang",
            )
    elif policy.forecast and forecast is not None and capacity is None and readable:
        # Said in the steps, or `/decisions` shows a forecast and no floor with no reason.
        draft.steps.append(
            Step(
                NO_FLOOR_STAGE,
                draft.gangs,
                draft.reason,
                "no floor (and no demand step): no capacity per gang yet; set "
                "capacity-per-replica, or one is learned once the component has stayed at 90% "
                f"of its target or above for {demand_window_s:g}s",
            )
        )
    # Step 2, at zero gangs: requests waiting in front of the deployment (a gateway's queue)
    # bring it back to its minimum; its own pods, having none, can say nothing.
    waiting = obs.signals.wake_requests
    if current == 0 and waiting is not None and waiting > 0:
        minimum = max(policy.min_replicas, 1)
        if minimum > draft.gangs:
            draft.step(
                "wake",
                minimum,
                Reason.SCALE_FROM_ZERO,
                f"{waiting:g} requests waiting for the deployment at zero gangs",
            )
    draft.need = draft.gangs

    # Gangs still starting: do not stack more on them unless the need grew.
    last_need = memory.last_scale_up_need
    if draft.gangs > current and ages.starting and last_need is not None:
        allowed = max(current, last_need)
        grew = draft.gangs > ceil_gangs(last_need * (1 + tolerance))
        if draft.gangs > allowed and not grew:
            # Up to the need the gangs starting were ordered for is still a scale-up, and
            # says so: only a count left where it is is a hold.
            draft.step(
                "starting",
                allowed,
                Reason.HOLD_GANGS_STARTING if allowed == current else draft.reason,
                f"{len(ages.starting)} gangs still starting; need {draft.gangs} has not grown "
                f"past {last_need}",
            )
            draft.scale_up_need = allowed

    # Gangs rolled back more than once in a row: not asked for again until a wait is over.
    roll_back = draft.memory.roll_back
    wait_s = 0.0 if roll_back is None else roll_back_wait_s(roll_back)
    if roll_back is not None and now < roll_back.at_s + wait_s:
        allowed = max(current, roll_back.kept_gangs)
        draft.ceiling = allowed  # a ratio band raises no further either
        if draft.gangs > allowed:
            draft.step(
                "roll_back_backoff",
                allowed,
                Reason.HOLD_ROLL_BACK_BACKOFF if allowed == current else draft.reason,
                f"gangs above {roll_back.kept_gangs} rolled back {roll_back.in_a_row} times in "
                f"a row, the last {now - roll_back.at_s:g}s ago: asked for again in "
                f"{roll_back.at_s + wait_s - now:g}s",
            )

    # Step 3: stabilization and rate limit.
    history = prune_proposals(memory.proposals, window_s=policy.scale_down_window_s, now=now)
    if not proposal.no_data:
        stabilized = stabilize_scale_down(
            history,
            draft.gangs,
            current_gangs=current,
            window_s=policy.scale_down_window_s,
            now=now,
        )
        if stabilized != draft.gangs:
            draft.step(
                "stabilization",
                stabilized,
                Reason.SCALE_DOWN_STABILIZED,
                f"highest proposal in the last {policy.scale_down_window_s:g}s",
            )
    # A forecast that came back NaN or inf is missing data: the floor it may have been
    # holding is unknown, so nothing goes below the current count until it is a number again.
    if broken_forecast and policy.forecast and draft.gangs < current:
        draft.step(
            "forecast",
            current,
            Reason.HOLD_MISSING_DATA,
            "the forecast is not a number: not scaling down without it",
        )
        draft.need = current  # remembered as a hold is, in the scale-down window
    # Every tick is remembered, a hold too (its need is the current count): after an outage
    # longer than the window, the first reading must not find the window empty and drop
    # every gang the load no longer seems to need in one tick.
    history = remember_proposal(history, draft.need, now=now)
    limited = limit_scale_up(draft.gangs, current_gangs=current, max_scale_up=policy.max_scale_up)
    if limited != draft.gangs:
        draft.step(
            "rate_limit",
            limited,
            Reason.SCALE_UP_RATE_LIMITED,
            _rate_limit(policy),
        )
    draft.memory = replace(draft.memory, proposals=history)

    # Step 4: bounds.
    if draft.gangs > policy.max_replicas:
        draft.step("bounds", policy.max_replicas, Reason.MAX_REPLICAS)
    elif draft.gangs < policy.min_replicas:
        draft.step("bounds", policy.min_replicas, Reason.MIN_REPLICAS)
    return draft


def _rate_limit(policy: Policy) -> str:
    n = policy.max_scale_up
    return f"at most {n} gang{'' if n == 1 else 's'} added per tick"


def _couple(drafts: Mapping[ComponentKey, _Draft]) -> None:
    """Step 5, in place, for the drafts of one deployment."""
    coupled = couple_deployment(
        {k: d.gangs for k, d in drafts.items()}, {k: d.policy for k, d in drafts.items()}
    )
    for key, result in coupled.items():
        if result.reason is None:
            continue
        d = drafts[key]
        gangs, detail = result.gangs, result.detail
        if result.reason is Reason.RATIO_BAND:
            # `max-scale-up` holds for a ratio raise as for any other: a deployment found far
            # outside its band (one prefill gang for ten decode) reaches it over a few ticks,
            # not by starting every missing gang at once. (The deployment minimum adds one
            # gang at most: min-replicas is a bound, applied before coupling.)
            limited = limit_scale_up(
                gangs, current_gangs=d.obs.spec_gangs, max_scale_up=d.policy.max_scale_up
            )
            allowed = max(d.gangs, limited)
            if gangs > allowed:
                detail = f"{detail}; {allowed} of {gangs} this tick, {_rate_limit(d.policy)}"
                gangs = allowed
            # (the deployment minimum, folded into a band's raise, still comes first)
            ceiling = None if d.ceiling is None else max(d.ceiling, functional_minimum(d.policy))
            if ceiling is not None and gangs > max(d.gangs, ceiling):
                gangs = max(d.gangs, ceiling)
                detail = f"{detail}; held at {gangs}: gangs rolled back are waited for"
        d.step("coupling", gangs, result.reason, detail)


def _fit(drafts: Mapping[ComponentKey, _Draft], observations: Observations) -> None:
    """Step 6, in place, over every component that wants to grow."""
    requests = []
    for key, d in drafts.items():
        if d.gangs <= d.obs.spec_gangs:
            continue
        minimum = functional_minimum(d.policy) if d.gangs > 0 else 0
        requests.append(
            GrowthRequest(
                key=key,
                deployment=d.deployment,
                shape=d.obs.shape,
                current_gangs=d.obs.spec_gangs,
                minimum_gangs=minimum,
                wanted_gangs=d.gangs,
            )
        )
    if not requests:
        return
    grants = allocate_growth(
        requests,
        observations.cluster.nodes,
        can_grow=observations.cluster.can_grow,
        unplaced=_unplaced(observations),
    )
    for key, grant in grants.items():
        d = drafts[key]
        wanted = d.gangs - d.obs.spec_gangs
        if grant.short:
            d.step(
                "fit",
                grant.gangs,
                Reason.CAPACITY_SHORT,
                f"{grant.fit_now} of {wanted} more gangs fit on the nodes now",
            )
        elif grant.fit_now < wanted:
            d.steps.append(
                Step(
                    "fit",
                    d.gangs,
                    d.reason,
                    f"{grant.fit_now} of {wanted} more gangs fit now; the rest wait for nodes",
                )
            )


def _unplaced(observations: Observations) -> list[Unplaced]:
    """Every component's gangs below its replicas with pods no node holds yet (Pending or
    partial, or not created at all), in a fixed order: the room they need is not free for
    new gangs, or a fixed cluster is asked for gangs that compete with them for it. A member
    replacing one still terminating on a node takes the room that one leaves, which the
    node's capacity still counts as used: it is not reserved again."""
    out = []
    for key in sorted(observations.components):
        obs = observations.components[key]
        by_index = {g.group_index: g for g in obs.gangs}
        pods_per_gang = obs.shape.pods_per_gang
        for index in range(obs.spec_gangs):
            gang = by_index.get(index)
            missing = (
                pods_per_gang
                if gang is None
                else gang.pods_expected - gang.pods_scheduled - gang.pods_leaving
            )
            if missing > 0:
                out.append(Unplaced(key.namespace, obs.shape, min(missing, pods_per_gang)))
    return out


def _detail(d: _Draft) -> str:
    """Why the count is what it is: the detail of the last step that gave the reason, and
    the fit step's note when some of the gangs wait for nodes (that step, like the note that
    no floor was set, keeps the reason of the step before it, whose detail it must not
    replace)."""
    why = next(
        (
            s.detail
            for s in reversed(d.steps)
            if s.reason is d.reason and s.stage not in ("fit", NO_FLOOR_STAGE)
        ),
        "",
    )
    waiting = next(
        (s.detail for s in d.steps if s.stage == "fit" and s.reason is not Reason.CAPACITY_SHORT),
        "",
    )
    if d.reason is Reason.CAPACITY_SHORT:
        why = next((s.detail for s in reversed(d.steps) if s.stage == "fit"), why)
    return "; ".join(part for part in (why, waiting) if part)


def _keep_ready(d: _Draft) -> None:
    """Step 7, run in turn with coupling (step 5) because each may raise what the other
    decided. On a scale-down LWS keeps the lowest groups, so when a group below the new
    count is not ready (partial, restarting, still loading), keep as many more as it takes
    for the count's ready gangs to stay, or every ready gang when fewer are ready. Else a
    not-ready group 0 outlives the ready groups above it: 3 -> 1 with only groups 1 and 2
    ready left none. Never past `max-replicas`; at zero, the whole deployment goes."""
    spec = d.obs.spec_gangs
    if not 0 < d.gangs < spec or d.gangs == d.ready_kept_at:
        return
    ready = sorted(
        g.group_index for g in d.obs.gangs if g.state is GangState.READY and g.group_index < spec
    )
    wanted = min(d.gangs, len(ready))
    if wanted == 0:
        return
    keep = min(ready[wanted - 1] + 1, max(d.gangs, d.policy.max_replicas))
    kept = sum(1 for index in ready if index < keep)
    if kept <= sum(1 for index in ready if index < d.gangs):
        return  # `max-replicas` cuts it short of any ready gang more: nothing to gain
    not_ready = sorted(set(range(keep)) - set(ready))
    d.ready_kept_at = keep
    d.step(
        "keep_ready",
        keep,
        Reason.KEEP_READY_GANGS,
        f"groups {not_ready} not ready: keeping {keep} gangs so that {kept} ready "
        f"{'gang stays' if kept == 1 else 'gangs stay'} (LWS removes the highest groups)",
    )


def _roll_back(
    d: _Draft, *, deployment_up: bool, pd: bool
) -> tuple[tuple[int, ...], tuple[int, ...], int | None]:
    """Step 7: scale away timed-out gangs at the top of the LWS. Returns (rolled back,
    stuck, the count a roll-back cut to: None when this step removed nothing, e.g. when the
    load took the count lower anyway)."""
    spec = d.obs.spec_gangs
    timed_out = d.ages.timed_out
    if not timed_out:
        return (), (), None
    floor = d.policy.min_replicas
    if pd and deployment_up:
        floor = max(floor, functional_minimum(d.policy))
    # Down to the floor at most: when every gang timed out, those above it still go.
    keep = max(spec - d.ages.top_timed_out, min(floor, spec))
    # What goes starts at a timed-out gang: a floor that cuts into the run would otherwise
    # take only the gangs waiting for nodes above it, and ask for them again next tick.
    keep = min((i for i in timed_out if keep <= i < spec), default=spec)
    cut = None
    if d.ages.top_timed_out and d.gangs > keep and keep < spec:
        cut = keep
        removed = range(keep, spec)
        waiting = [i for i in removed if i not in timed_out]
        d.step(
            "partial_gangs",
            keep,
            Reason.PARTIAL_GANG_ROLLED_BACK,
            "; ".join(
                [
                    f"groups {[i for i in removed if i in timed_out]} not ready after "
                    f"{d.policy.gang_timeout_s:g}s"
                    + (f" (with groups {waiting} waiting for nodes above them)" if waiting else ""),
                    *(f"gang-timeout {c.message}" for c in policy_cautions(d.policy)),
                ]
            ),
        )
    rolled = tuple(i for i in timed_out if i >= d.gangs)
    stuck = tuple(i for i in timed_out if i < d.gangs)
    return rolled, stuck, cut


def plan(
    observations: Observations,
    policies: Mapping[ComponentKey, Policy],
    forecasts: Mapping[ComponentKey, Forecast],
    memory: Memory,
    *,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE,
    demand_window_s: float = DEFAULT_DEMAND_WINDOW_S,
) -> tuple[GangPlan, Memory]:
    """Decide the gangs and balloon gangs of every observed component. `demand_window_s` is
    the rate window of the demand signals: a capacity per gang is learned only once a
    component has stayed at 90 % of its target or above for that long."""
    plans: dict[ComponentKey, ComponentPlan] = {}
    memories: dict[ComponentKey, ComponentMemory] = {}

    by_deployment: dict[DeploymentKey, dict[ComponentKey, Policy]] = {}
    for key in sorted(observations.components):
        obs = observations.components[key]
        policy = policies.get(key)
        if policy is None:
            plans[key], memories[key] = _held_on_policy_error(
                obs, "no valid policy", memory.of(key), now=now
            )
            continue
        by_deployment.setdefault(deployment_key(key, policy), {})[key] = policy

    drafts: dict[ComponentKey, _Draft] = {}
    for dep, members in sorted(by_deployment.items()):
        problems: dict[ComponentKey, tuple[PolicyProblem, ...]] = validate_deployment(members)
        if problems:
            for key in members:
                why = "; ".join(str(p) for p in problems.get(key, ())) or (
                    f"another component of deployment {dep} has a policy problem"
                )
                plans[key], memories[key] = _held_on_policy_error(
                    observations.components[key], why, memory.of(key), now=now
                )
            continue
        for key, policy in members.items():
            drafts[key] = _draft(
                observations.components[key],
                policy,
                forecasts.get(key),
                memory.of(key),
                deployment=dep,
                now=now,
                can_grow=observations.cluster.can_grow,
                tolerance=tolerance,
                demand_window_s=demand_window_s,
            )

    deployments: dict[DeploymentKey, dict[ComponentKey, _Draft]] = {}
    for key, d in drafts.items():
        deployments.setdefault(d.deployment, {})[key] = d
    for members_drafts in deployments.values():
        # Keeping ready gangs and coupling each only raise, and each may call for the other
        # (a band kept around what is kept; a minimum raised from 0 onto a group not ready):
        # in turn until neither changes, at most once per gang each could add.
        while True:
            before = {key: d.gangs for key, d in members_drafts.items()}
            for d in members_drafts.values():
                _keep_ready(d)
            _couple(members_drafts)
            if all(d.gangs == before[key] for key, d in members_drafts.items()):
                break
    _fit(drafts, observations)

    for members_drafts in deployments.values():
        pd = len(members_drafts) > 1
        deployment_up = any(d.gangs > 0 for d in members_drafts.values())
        for key, d in members_drafts.items():
            rolled, stuck, cut = _roll_back(d, deployment_up=deployment_up, pd=pd)
            retry_wait_s = None
            if cut is not None:
                roll_back = next_roll_back(
                    d.memory.roll_back,
                    now=now,
                    kept_gangs=cut,
                    gang_timeout_s=d.policy.gang_timeout_s,
                    template=d.obs.template,
                )
                d.memory = replace(d.memory, roll_back=roll_back)
                retry_wait_s = roll_back_wait_s(roll_back) or None
            balloons, balloon_reason, balloon_detail = balloon_gangs(
                policy=d.policy,
                forecast=d.forecast,
                capacity=d.capacity,
                desired_gangs=d.gangs,
                current_balloons=d.obs.balloon_gangs,
                tolerance=tolerance,
            )
            d.steps.append(Step("buffer", balloons, balloon_reason, balloon_detail))
            if d.gangs > d.obs.spec_gangs:
                need = d.need if d.scale_up_need is None else d.scale_up_need
                d.memory = replace(d.memory, last_scale_up_need=need)
            plans[key] = ComponentPlan(
                key=key,
                current_gangs=d.obs.spec_gangs,
                desired_gangs=d.gangs,
                reason=d.reason,
                balloon_gangs=balloons,
                balloon_reason=balloon_reason,
                steps=tuple(d.steps),
                rolled_back_groups=rolled,
                stuck_groups=stuck,
                unplaced_groups=tuple(i for i in d.ages.unplaced if i < d.gangs),
                retry_wait_s=retry_wait_s,
                capacity_per_gang=d.capacity,
                forgotten_capacity_per_gang=d.forgotten_capacity,
                burst_factor=d.burst.value if d.burst is not None else None,
                detail=_detail(d),
            )
            memories[key] = d.memory

    return GangPlan(components=plans), Memory(components=memories)
