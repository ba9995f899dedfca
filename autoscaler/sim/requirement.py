"""Clairvoyant gang requirement: the fewest gangs per step that meet the SLO for the arrivals
that actually come. The `oracle` follows it (started one lead time early) and `static` holds
its peak. The criterion below is sufficient, not necessary (each window's capacity is held
until its work is due, whatever later windows need), so the oracle is a near lower bound on
GPU-hours, not an exact one.

Prefill: with aggregate capacity c, FIFO delay stays within a slack s when every window of
arrivals satisfies work(window) - own <= c * (its span + s). The span runs from the
window's first arrival to its last; `own` is its last request's prompt (that request waits
only for the work ahead of it, and its own prefill is what the slack leaves room for); c is
held from the window's start until its work is due (its last arrival plus s); the slack is
the SLO less the 99th percentile of a request's own prefill time. Windows are checked on
grids: every length up to 10 s on a 0.25 s grid (where a bin's width would matter most),
longer ones to `max_window_s` on a 1 s grid, and up to `long_window_s` every 30 s
(sustained overloads that no short window shows). A window is taken from its first bin's
first arrival to each request of its last bin, so arrivals at one instant (the per-second
cohorts of the aggregated traces) are checked exactly, and a small request late in a bin
does not lend the requests before it its later deadline.

Decode: enough slots, and KV cache, for the sequences that would be running (in slot-time,
averaged over each step) if every request got a slot on arrival. Unified: both on the same
gangs, with the decode batch taking its share of prefill capacity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy.ndimage import maximum_filter1d

from autoscaler.sim.config import SimSettings
from autoscaler.sim.serving import book_occupancy, kv_tokens_held, steps_held
from autoscaler.sim.workload import Workload

FINE_GRID_S = 0.25  # grid of the shortest windows, where a bin's width matters most
FINE_WINDOW_S = 10.0  # windows up to this long sit on the fine grid
LENGTH_RATIO = 1.02  # longer windows up to `max_window_s`: lengths this far apart


def per_step(values: np.ndarray, arrival_s: np.ndarray, *, dt: float, n_steps: int) -> np.ndarray:
    """Sum `values` of the cohorts arriving in each step."""
    index = np.minimum((arrival_s // dt).astype(np.int64), n_steps - 1)
    return np.bincount(index, weights=values, minlength=n_steps)


def required_gangs(
    workload: Workload,
    settings: SimSettings,
    *,
    n_steps: int,
    max_window_s: float = 120.0,
    long_window_s: float = 3600.0,
) -> dict[str, np.ndarray]:
    dt = settings.step_s
    pods = settings.cluster.pods_per_gang
    serving = settings.serving
    prefill_per_gang = serving.prefill_tokens_per_s(pods)
    slots_per_gang = serving.max_sequences(pods)
    seq_rate = serving.decode_tokens_per_s(pods) / slots_per_gang
    kv_per_gang = serving.kv_cache_tokens(pods)

    own_s = workload.input_tokens / prefill_per_gang
    order = np.argsort(own_s)
    weights = np.cumsum(workload.requests[order]) / workload.total_requests
    p99_index = min(int(np.searchsorted(weights, 0.99)), own_s.size - 1)
    p99_own_s = float(own_s[order][p99_index])
    slack_s = max(settings.slo_ttft_s - p99_own_s, 0.25 * settings.slo_ttft_s)

    need_rate = _prefill_rate(
        workload,
        slack_s=slack_s,
        dt=dt,
        n_steps=n_steps,
        max_window_s=max_window_s,
        long_window_s=long_window_s,
    )

    # sequences in decode: each holds a slot from its arrival step for output / per-sequence
    # speed, counted in slot-time as the serving model counts it
    held = steps_held(workload.output_tokens, seq_rate, dt=dt)
    start = np.minimum((workload.arrival_s // dt).astype(np.int64), n_steps - 1)
    delta = np.zeros(n_steps + int(np.ceil(held.max())) + 3)
    book_occupancy(delta, start=start, sequences=workload.requests, held_steps=held)
    running = np.maximum(np.cumsum(delta)[:n_steps], 0.0)
    # and room for their KV cache, as the serving model books it
    kv_delta = np.zeros(delta.size)
    kv_each = kv_tokens_held(workload)
    book_occupancy(kv_delta, start=start, sequences=workload.requests * kv_each, held_steps=held)
    kv_tokens = np.maximum(np.cumsum(kv_delta)[:n_steps], 0.0)
    decode_gangs = np.maximum(running / slots_per_gang, kv_tokens / kv_per_gang)

    if settings.mode == "unified":
        interference = serving.unified_decode_interference
        need = np.maximum(
            need_rate / prefill_per_gang + interference * running / slots_per_gang,
            decode_gangs,
        )
        return {"unified": _whole(need)}
    return {
        "prefill": _whole(need_rate / prefill_per_gang),
        "decode": _whole(decode_gangs),
    }


def _prefill_rate(
    workload: Workload,
    *,
    slack_s: float,
    dt: float,
    n_steps: int,
    max_window_s: float,
    long_window_s: float,
) -> np.ndarray:
    """Prompt tokens/s each step must serve so that no window's work waits past the slack.

    A window runs from the first arrival in its first bin to the last arrival in its last
    bin, so a burst arriving at one instant is held to `work / slack`, not to
    `work / (bin + slack)`. Windows up to `FINE_WINDOW_S` sit on a `FINE_GRID_S` grid, every
    length; longer ones on a 1 s grid, lengths `LENGTH_RATIO` apart up to `max_window_s`,
    then every 30 s up to `long_window_s` (a sustained small overload that no short window
    shows still grows a queue without bound).
    """
    duration_s = n_steps * dt
    per = math.ceil(dt / FINE_GRID_S - 1e-9)  # fine bins per step: they tile the steps
    fine = dt / per
    short = range(1, round(FINE_WINDOW_S / fine) + 1)
    need = _window_rates(
        workload, grid_s=fine, duration_s=duration_s, lengths=short, slack_s=slack_s
    )
    ratio = max(round(1.0 / fine), 1)  # fine bins per coarse bin, about 1 s
    coarse = fine * ratio
    first, top = round(FINE_WINDOW_S / coarse), round(max_window_s / coarse)
    lengths = [*_geometric(first, top), *range(top + 30, round(long_window_s / coarse) + 1, 30)]
    if lengths:
        coarse_need = _window_rates(
            workload, grid_s=coarse, duration_s=duration_s, lengths=lengths, slack_s=slack_s
        )
        need = np.maximum(need, np.repeat(coarse_need, ratio)[: need.size])
    padded = np.zeros(n_steps * per)
    padded[: min(need.size, padded.size)] = need[: padded.size]
    return np.asarray(padded.reshape(n_steps, per).max(axis=1))


def _geometric(low: int, high: int) -> list[int]:
    out, length = [], float(low)
    while length < high:
        length *= LENGTH_RATIO
        out.append(min(math.ceil(length), high))
    return out


def _window_rates(
    workload: Workload, *, grid_s: float, duration_s: float, lengths: Iterable[int], slack_s: float
) -> np.ndarray:
    """Per grid bin: the highest rate any window (of `lengths` bins) holding that bin needs.

    A window starts at its first bin's first arrival and ends at a request of its last bin;
    its rate is the work ahead of that request over the time from the window's start to the
    request's arrival plus the slack, and the highest over the last bin's requests counts
    (the last of them has the most work ahead, an earlier one less time to do it in). It is
    held from its first bin until its work is due (its last bin's end plus the slack).
    Windows starting on an empty bin are covered by the shorter window inside them.
    """
    n = max(int(np.ceil(duration_s / grid_s)), 1)
    arrival = workload.arrival_s
    bounds = np.searchsorted(arrival, np.arange(n + 1) * grid_s, side="left")
    occupied = bounds[1:] > bounds[:-1]
    first = np.where(occupied, arrival[np.minimum(bounds[:-1], arrival.size - 1)], 0.0)
    cumulative = np.concatenate(([0.0], np.cumsum(workload.prompt_tokens())))
    # the work ahead of each request: its own prompt is the prefill time the slack leaves
    # room for (a cohort's other requests arrive with it and are ahead of it)
    ahead = cumulative[1:] - workload.input_tokens
    at_start = cumulative[bounds[:-1]]
    # requests of the trace, by the bin they arrive in (those past the last bin are not
    # replayed); the occupied bins' requests are contiguous runs
    count = int(bounds[-1])
    bin_of = np.repeat(np.arange(n), np.diff(bounds))
    runs = bounds[:-1][occupied]
    last_bins = np.flatnonzero(occupied)
    need = np.zeros(n)
    rate = np.zeros(n)
    for w in lengths:
        if w > n:
            break
        start = bin_of - (w - 1)
        valid = start >= 0
        begin = np.where(valid, start, 0)
        valid &= occupied[begin]
        work = ahead[:count] - at_start[begin]
        each = np.where(valid, work / (arrival[:count] - first[begin] + slack_s), 0.0)
        # windows of bins [i, i + w), by their first bin i
        rate[:] = 0.0
        by_last = np.maximum.reduceat(each, runs) if count else np.zeros(0)
        keep = last_bins >= w - 1
        rate[last_bins[keep] - (w - 1)] = by_last[keep]
        due = math.ceil((w * grid_s + slack_s) / grid_s)
        np.maximum(need, trailing_max(rate, due), out=need)
    return need


def _whole(need: np.ndarray) -> np.ndarray:
    return np.maximum(np.ceil(need - 1e-9), 1).astype(np.int64)


def trailing_max(series: np.ndarray, steps: int) -> np.ndarray:
    """max(series[k - steps : k + 1]) for every k (van Herk's O(n) filter from scipy)."""
    size = steps + 1
    return np.asarray(
        maximum_filter1d(series, size=size, origin=(size - 1) // 2, mode="constant", cval=0.0)
    )


def look_ahead_max(series: np.ndarray, steps: int) -> np.ndarray:
    """max(series[k : k + steps + 1]) for every k: what must be running `steps` from now."""
    out = series.copy()
    for shift in range(1, steps + 1):
        out[:-shift] = np.maximum(out[:-shift], series[shift:])
    return out
