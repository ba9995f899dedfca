"""Step 2's burst factor: how far the demand signal's recent readings spread above their mean.

The forecast floor plans for the forecast demand at its level. Around that level the demand
signal (a one-minute rate, read every tick) swings, and for a component whose first tokens
wait in a queue the readings above the level are the ones that miss. How far they swing is
a property of the traffic, and the floor is raised by it: the 90th percentile of the last
half hour's readings over their mean, between 1 and `MAX_BURST_FACTOR`. On the shared
traces that is about 1.4 for an hour of a production chat service, 2.3 for a code
assistant's bursts and silences, and 1.05-1.07 for a large service's merged clients.

It is a measure of how much the demand moved in the last half hour, level changes
included: after a step to twice the load it reads 2 / (1 + f), f the share of the window's
readings taken at the new load (about 1.8 early on, 1.5 after 10 minutes, 1 once the old
level has left the window); a component that sat idle and then takes traffic reads 1 for
the first 3 minutes of load, the cap of 3 until about 10 minutes, then 1 / f down to 1,
since silence followed by load is the pattern the factor exists for. Readings are kept at
most one per `READING_INTERVAL_S`, so a fast tick costs little more than the default one. Until
`MIN_BURST_SAMPLES` readings exist (after a start) the factor is 1: a restart of the service
must not order gangs before it has read the traffic's spread.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Half an hour: long enough to hold several of a bursty service's silences and bursts, short
# enough that a level the traffic left behind stops counting within one scale-down window.
BURST_WINDOW_S = 1800.0
# The share of readings the floor plans for; the 95th cost the Azure conversation hour 10 %
# more GPU-hours for no attainment it needed (docs/results.md).
BURST_QUANTILE = 0.9
MAX_BURST_FACTOR = 3.0
# Readings at least this far apart: every 15-second tick's, whatever its jitter (a tick a few
# milliseconds early in its slot is still kept), and at most 180 in the window at any tick.
READING_INTERVAL_S = 10.0
# Two minutes of readings: fewer say little about a spread.
MIN_BURST_SAMPLES = 8


@dataclass(frozen=True, slots=True)
class BurstFactor:
    value: float
    detail: str


def remember_demand(
    samples: tuple[tuple[float, float], ...],
    demand: float | None,
    *,
    now: float,
    window_s: float = BURST_WINDOW_S,
) -> tuple[tuple[float, float], ...]:
    """The (time, demand) readings of the last `window_s`, this tick's added when it was
    read (a missing or non-finite reading adds nothing) and the last kept reading is at
    least `READING_INTERVAL_S` old."""
    # a reading stamped after `now` is from before the clock was stepped back: drop it, or
    # it would hold back every new one
    kept = tuple((t, d) for t, d in samples if 0 <= now - t < window_s)
    if demand is None or not math.isfinite(demand) or demand < 0:
        return kept
    if kept and now - kept[-1][0] < READING_INTERVAL_S:
        return kept
    return (*kept, (now, demand))


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def burst_factor(samples: tuple[tuple[float, float], ...]) -> BurstFactor:
    """How far the remembered readings spread above their mean."""
    values = [d for _, d in samples]
    if len(values) < MIN_BURST_SAMPLES:
        return BurstFactor(
            1.0, f"burst x1 until {MIN_BURST_SAMPLES} demand readings exist (have {len(values)})"
        )
    mean = sum(values) / len(values)
    if mean <= 0:
        return BurstFactor(1.0, "burst x1: no demand in the last readings")
    spread = _quantile(values, BURST_QUANTILE) / mean
    value = min(max(spread, 1.0), MAX_BURST_FACTOR)
    span_min = (samples[-1][0] - samples[0][0]) / 60
    return BurstFactor(
        value,
        f"burst x{value:.2f} (p{BURST_QUANTILE * 100:g} of {len(values)} demand readings over "
        f"{span_min:.0f} min, over their mean)",
    )
