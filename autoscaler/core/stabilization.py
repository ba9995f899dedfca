"""Step 3: scale-down stabilization and the scale-up rate limit.

As in the HPA: a scale-down only goes as low as the highest proposal seen within the
window, so a short dip does not tear down a gang that takes minutes to bring back.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations


def prune_proposals(
    history: tuple[tuple[float, int], ...], *, window_s: float, now: float
) -> tuple[tuple[float, int], ...]:
    """Keep the proposals recorded within the last `window_s` seconds. One stamped after
    `now` was recorded before the clock was stepped back: it counts as recorded now, so the
    window holds it once more and then lets it go (kept as stamped, a day's step back held
    every gang for a day)."""
    return tuple((min(t, now), g) for t, g in history if now - t <= window_s)


def remember_proposal(
    history: tuple[tuple[float, int], ...], gangs: int, *, now: float
) -> tuple[tuple[float, int], ...]:
    """Add a proposal of `gangs` at `now` to the window's history, dropping every entry a
    newer one at least as high outranks: the highest in any window ending now or later, of
    any length, is the same. The history stays as short as the proposals' falling steps, so
    a long window (`scale-down-window: 720h`) does not keep one entry per tick, nor does a
    hold whose window is unknown (the policy is invalid)."""
    kept = [(t, g) for t, g in history if g > gangs]
    out: list[tuple[float, int]] = []
    for t, g in reversed(kept):  # newest first: keep an entry only above all newer ones
        if not out or g > out[-1][1]:
            out.append((t, g))
    return (*reversed(out), (now, gangs))


def stabilize_scale_down(
    history: tuple[tuple[float, int], ...],
    proposal: int,
    *,
    current_gangs: int,
    window_s: float,
    now: float,
) -> int:
    """The proposal after the scale-down window: never below the window's highest proposal
    (capped at the current count, since stabilization only slows a scale-down)."""
    if proposal >= current_gangs:
        return proposal
    recent = [g for _, g in prune_proposals(history, window_s=window_s, now=now)]
    highest = max([*recent, proposal])
    return min(highest, current_gangs)


def limit_scale_up(proposal: int, *, current_gangs: int, max_scale_up: int) -> int:
    """At most `max_scale_up` gangs added in one tick."""
    return min(proposal, current_gangs + max_scale_up)
