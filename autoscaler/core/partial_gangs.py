"""Step 7: gangs that never finish scheduling, and gangs still starting.

A gang with a pod placed but not ready (partial, or every pod placed and not serving) holds
GPUs and serves nothing. Past its timeout it counts as not ready, and when it sits at the
top of the LWS (LWS removes the highest group indexes first) it is scaled away. One below
the desired count is reported as stuck instead: removing it would also remove ready gangs
above it.

A gang with no pod placed holds nothing. While the cluster can grow it is waiting for the
nodes ordered for it (a GPU node can take far longer than `gang-timeout` to come): scaling
it away frees nothing, only churns the LWS and the node autoscaler's plans (a queued
provisioning request starts over), so it stays and is reported once past the timeout. When
the cluster cannot grow, nothing is coming for it, and it times out like a partial gang.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autoscaler.core.model import ComponentObservation, GangState


@dataclass(frozen=True, slots=True)
class Sighting:
    """Since when a not-ready group has been in its present phase, holding GPUs (a pod
    placed) or not: the later of this loop's first sighting in it and its pods' own start,
    the start its age is counted from. And the time counted in its earlier phases since it
    was last ready. A gang that waited an hour for its nodes has held GPUs only since its
    first pod was placed; one whose pods are evicted and placed again keeps the time it
    held them."""

    group_index: int
    since_s: float
    holding: bool
    held_before_s: float = 0.0


@dataclass(frozen=True, slots=True)
class GangAges:
    timed_out: tuple[int, ...]  # group indexes past the timeout, to scale away or report
    # group indexes not ready yet, within the timeout: nothing is stacked on them
    starting: tuple[int, ...]
    # how many of the highest group indexes in a row to scale away: timed out, or waiting
    # for nodes above one that is (LWS removes the highest groups first)
    top_timed_out: int
    # the present phase's start of every not-ready group, remembered between ticks
    first_seen: tuple[Sighting, ...] = ()
    # group indexes with no pod placed past the timeout, kept: the cluster can still grow
    unplaced: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RollBack:
    """The last scale-away of timed-out gangs: when, the count it cut to, how many in a row
    (with no gang ready at or above that count in between), and what the wait is read from:
    the gang-timeout then, and the gang template then (a new one is a new gang)."""

    at_s: float
    kept_gangs: int
    gang_timeout_s: float
    template: str | None = None
    in_a_row: int = 1
    # the LWS has been seen at or below `kept_gangs` since: the roll-back took place (a dry
    # run, a standby or a refused write plans the same one again on every tick)
    landed: bool = False


# A streak of roll-backs is forgotten this long after its wait ended with no new one.
ROLL_BACK_MEMORY_S = 3600.0
MAX_ROLL_BACK_WAIT_S = 3600.0
# past this many doublings every wait is at its cap; the streak stops counting there
MAX_STREAK = 20


def roll_back_wait_s(roll_back: RollBack) -> float:
    """How long after a roll-back the gangs it took are not asked for again. The first is
    asked for again at once (a partial gang may have lost a race for nodes that is over);
    from the second in a row, one gang-timeout, doubling, at most an hour (or one
    gang-timeout, if longer): a gang that never becomes ready (a crash loop, an image that
    cannot be pulled, a model too large for its GPUs) held its GPUs for nothing all along."""
    if roll_back.in_a_row < 2:
        return 0.0
    wait = roll_back.gang_timeout_s * 2.0 ** (min(roll_back.in_a_row, MAX_STREAK) - 2)
    return min(wait, max(MAX_ROLL_BACK_WAIT_S, roll_back.gang_timeout_s))


def remembered_roll_back(
    roll_back: RollBack | None, obs: ComponentObservation, *, now: float
) -> RollBack | None:
    """The streak this tick carries on: forgotten once a gang at or above the count it cut
    to is ready (asking again worked), once the gang template changes (the usual fix of a
    crash loop or an image that cannot be pulled), or an hour after its wait ended."""
    if roll_back is None or obs.template != roll_back.template:
        return None
    if any(g.state is GangState.READY and g.group_index >= roll_back.kept_gangs for g in obs.gangs):
        return None
    at_s = min(roll_back.at_s, now)  # stamped after now: a step back of the clock
    if now - at_s > roll_back_wait_s(roll_back) + ROLL_BACK_MEMORY_S:
        return None
    landed = roll_back.landed or obs.spec_gangs <= roll_back.kept_gangs
    return replace(roll_back, at_s=at_s, landed=landed)


def next_roll_back(
    last: RollBack | None,
    *,
    now: float,
    kept_gangs: int,
    gang_timeout_s: float,
    template: str | None,
) -> RollBack:
    """The record after a roll-back planned this tick: one more in a row once the last one
    took place; the same one, planned again, while it has not."""
    if last is not None and not last.landed:
        return replace(last, at_s=now, kept_gangs=min(kept_gangs, last.kept_gangs))
    streak = 1 if last is None else min(last.in_a_row + 1, MAX_STREAK)
    return RollBack(now, kept_gangs, gang_timeout_s, template, in_a_row=streak)


def aged_from(reported_s: float | None, first_seen_s: float) -> float:
    """The start a wait is timed from: the later of what the API server's objects report
    (on its clock; None when they say nothing) and when this loop first saw it (on its own),
    so a clock running ahead of the API server's never makes a wait look longer than it
    has been seen to last."""
    return first_seen_s if reported_s is None else max(reported_s, first_seen_s)


def _aged(
    before: Sighting | None,
    index: int,
    reported_s: float | None,
    *,
    holding: bool,
    can_grow: bool,
    now: float,
) -> tuple[Sighting, float]:
    """A not-ready group's record after this tick, and its age: the time it has held GPUs
    since it was last ready (or, waiting for nodes the cluster can add, how long it has
    waited). When the cluster cannot grow, nothing is coming for a gang waiting for nodes
    either, and every phase counts."""
    if before is None:
        first, held_before = now, 0.0
    elif before.holding == holding:
        # a sighting stamped after now predates a step back of the clock: from now
        first, held_before = min(before.since_s, now), before.held_before_s
    else:  # the phase changed: the one that ended is credited if it counted
        ended = now - min(before.since_s, now)
        counted = before.holding or not can_grow
        first, held_before = now, before.held_before_s + (ended if counted else 0.0)
    # the start counted from is what is kept, so that a phase change carries over what was
    # counted; never after now (a pod time ahead of this clock)
    since = min(aged_from(reported_s, first), now)
    age = now - since + (held_before if holding or not can_grow else 0.0)
    return Sighting(index, since, holding, held_before), age


def classify(
    obs: ComponentObservation,
    *,
    gang_timeout_s: float,
    now: float,
    can_grow: bool = True,
    first_seen: tuple[Sighting, ...] = (),
) -> GangAges:
    """Age every group below the spec that is not ready, from the later of two starts: what
    its pods say (`not_ready_since_s`) and the first tick that saw it not ready in its
    present phase (`first_seen`, remembered between ticks).

    The pods' timestamps come from the API server's clock and `now` from this process's:
    a clock running ahead of the API server's would age a gang still loading its weights
    past its timeout and scale it away, on every scale-up. The tick's own record cannot be
    skewed; it is also what ages a group whose pods give no start (none created yet,
    because a quota or webhook refuses them). The price: after a restart, which forgets the
    record, a partial gang waits one more timeout before it is scaled away.

    A group with no pod placed, the cluster able to grow (`can_grow`), is not timed out on
    its own: within the timeout it is `starting` (nothing is stacked on it unless the need
    grows) and past it `unplaced`, for the operator to hear of a node order or a pod
    creation that is not coming. Scaling it away frees nothing. It goes only with a
    timed-out gang below it (LWS removes the highest groups first)."""
    timed_out: list[int] = []
    starting: list[int] = []
    unplaced: list[int] = []
    waits_for_nodes: set[int] = set()
    seen = {s.group_index: s for s in first_seen}
    remembered: list[Sighting] = []
    by_index = {g.group_index: g for g in obs.gangs}
    for index in range(obs.spec_gangs):
        gang = by_index.get(index)
        if gang is not None and gang.state is GangState.READY:
            continue
        holding = gang is not None and gang.pods_scheduled > 0
        reported = gang.not_ready_since_s if gang is not None else None
        sighting, age = _aged(
            seen.get(index), index, reported, holding=holding, can_grow=can_grow, now=now
        )
        remembered.append(sighting)
        if not holding and can_grow:
            waits_for_nodes.add(index)
            (unplaced if age > gang_timeout_s else starting).append(index)
        elif age > gang_timeout_s:
            timed_out.append(index)
        else:
            starting.append(index)
    # The run at the top to scale away: timed out, or waiting for nodes above a timed-out
    # gang (LWS removes the highest groups, so removing that gang takes them too).
    top = run = 0
    timed = set(timed_out)
    for index in range(obs.spec_gangs - 1, -1, -1):
        if index in timed:
            run += 1
            top = run
        elif index in waits_for_nodes:
            run += 1
        else:
            break
    return GangAges(tuple(timed_out), tuple(starting), top, tuple(remembered), tuple(unplaced))
