"""Step 7: gangs that never finish scheduling, and gangs still starting.

A partial gang holds GPUs and serves nothing. Past its timeout it counts as not ready, and
when it sits at the top of the LWS (LWS removes the highest group indexes first) it is
scaled away. One below the desired count is reported as stuck instead: removing it would
also remove ready gangs above it.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.core.model import ComponentObservation, GangState


@dataclass(frozen=True, slots=True)
class GangAges:
    timed_out: tuple[int, ...]  # group indexes not ready for longer than the timeout
    starting: tuple[int, ...]  # group indexes not ready yet, within the timeout
    top_timed_out: int  # how many of the highest group indexes in a row are timed out
    # (group index, time this loop first saw it not ready) of every not-ready group
    first_seen: tuple[tuple[int, float], ...] = ()


def aged_from(reported_s: float | None, first_seen_s: float) -> float:
    """The start a wait is timed from: the later of what the API server's objects report
    (on its clock; None when they say nothing) and when this loop first saw it (on its own),
    so a clock running ahead of the API server's never makes a wait look longer than it
    has been seen to last."""
    return first_seen_s if reported_s is None else max(reported_s, first_seen_s)


def classify(
    obs: ComponentObservation,
    *,
    gang_timeout_s: float,
    now: float,
    first_seen: tuple[tuple[int, float], ...] = (),
) -> GangAges:
    """Age every group below the spec that is not ready, from the later of two starts: what
    its pods say (`not_ready_since_s`) and the first tick that saw it not ready
    (`first_seen`, remembered between ticks).

    The pods' timestamps come from the API server's clock and `now` from this process's:
    a clock running ahead of the API server's would age a gang still loading its weights
    past its timeout and scale it away, on every scale-up. The tick's own record cannot be
    skewed; it is also what ages a group whose pods give no start (none created yet,
    because a quota or webhook refuses them, or a member gone), so such a group times out
    like any other. The price: after a restart, which forgets the record, a partial gang
    waits one more timeout before it is scaled away."""
    timed_out: list[int] = []
    starting: list[int] = []
    seen = dict(first_seen)
    remembered: list[tuple[int, float]] = []
    by_index = {g.group_index: g for g in obs.gangs}
    for index in range(obs.spec_gangs):
        gang = by_index.get(index)
        if gang is not None and gang.state is GangState.READY:
            continue
        # a first sighting stamped after now predates a step back of the clock: from now
        first = min(seen.get(index, now), now)
        remembered.append((index, first))
        since = aged_from(gang.not_ready_since_s if gang is not None else None, first)
        if now - since > gang_timeout_s:
            timed_out.append(index)
        else:
            starting.append(index)
    top = 0
    timed = set(timed_out)
    for index in range(obs.spec_gangs - 1, -1, -1):
        if index not in timed:
            break
        top += 1
    return GangAges(tuple(timed_out), tuple(starting), top, tuple(remembered))
