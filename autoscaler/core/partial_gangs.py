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


def classify(obs: ComponentObservation, *, gang_timeout_s: float, now: float) -> GangAges:
    timed_out: list[int] = []
    starting: list[int] = []
    by_index = {g.group_index: g for g in obs.gangs}
    for gang in sorted(obs.gangs, key=lambda g: g.group_index):
        if gang.group_index >= obs.spec_gangs or gang.state is GangState.READY:
            continue
        since = gang.not_ready_since_s
        if since is not None and now - since > gang_timeout_s:
            timed_out.append(gang.group_index)
        else:
            starting.append(gang.group_index)
    # Groups the LWS has not even created pods for yet are starting too.
    for index in range(obs.spec_gangs):
        if index not in by_index:
            starting.append(index)
    top = 0
    timed = set(timed_out)
    for index in range(obs.spec_gangs - 1, -1, -1):
        if index not in timed:
            break
        top += 1
    return GangAges(tuple(timed_out), tuple(sorted(starting)), top)
