"""Step 2's burst factor: how far the demand signal's readings spread above their mean.

The forecast floor plans for the demand signal, a one-minute rate, at its forecast level.
Around that level the readings move from minute to minute, and for a component whose
first tokens wait in a queue, the minutes above the level are the ones that miss. How far
they move is a property of the traffic: an hour of a production chat service spreads its
minutes to about 1.4 times their mean, a code assistant's bursts to over 2, and a large
service's merged clients stay within a few percent. So the floor is raised by the traffic's
own spread, read from the last half hour of readings (one per tick): a quantile of them
over their mean, between 1 and `MAX_BURST_FACTOR`. Until a few minutes of readings exist
(after a start, or a gap in the data) the factor is 1: a restart of the service must not
order gangs that the traffic's spread, once read, may not ask for.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BURST_WINDOW_S = 1800.0
BURST_QUANTILE = 0.9
MAX_BURST_FACTOR = 3.0
# About two minutes of 15-second ticks: fewer readings say little about a spread.
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
    read (a missing or non-finite reading adds nothing)."""
    kept = tuple((t, d) for t, d in samples if now - t < window_s)
    if demand is None or not math.isfinite(demand) or demand < 0:
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
    minutes = BURST_WINDOW_S / 60
    return BurstFactor(
        value,
        f"burst x{value:.2f} (p{BURST_QUANTILE * 100:g} of {len(values)} demand readings in "
        f"{minutes:g} min over their mean)",
    )
