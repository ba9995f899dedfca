"""Clairvoyant gang requirement: the fewest gangs per step that meet the SLO for the arrivals
that actually come. The `oracle` follows it (started one lead time early) and `static` holds
its peak; neither can be beaten on GPU-hours by a policy that meets the SLO.

Prefill: with aggregate capacity c, FIFO delay stays within a slack s when every window
satisfies arrivals(window) <= c * (window + s), with c held from the window's start until
its work is due (its end plus s); the slack is the SLO less the 99th percentile of a
request's own prefill time. Windows of 1 to `max_window_s` seconds
(every second) and up to `long_window_s` (every 30 s) are checked: short ones for bursts,
long ones for sustained overloads that no short window shows. Decode: enough slots for the
sequences that would be running (in slot-time, averaged over each step) if every request got
a slot on arrival. Unified: both on the same gangs, with the decode batch taking its share of
prefill capacity.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.ndimage import maximum_filter1d

from autoscaler.sim.config import SimSettings
from autoscaler.sim.serving import book_occupancy, steps_held
from autoscaler.sim.workload import Workload


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

    own_s = workload.input_tokens / prefill_per_gang
    order = np.argsort(own_s)
    weights = np.cumsum(workload.requests[order]) / workload.total_requests
    p99_index = min(int(np.searchsorted(weights, 0.99)), own_s.size - 1)
    p99_own_s = float(own_s[order][p99_index])
    slack_s = max(settings.slo_ttft_s - p99_own_s, 0.25 * settings.slo_ttft_s)

    # windows on a 1 s grid: bursts shorter than a simulation step still queue
    grid_s = min(1.0, dt)
    n_grid = int(np.ceil(n_steps * dt / grid_s))
    tokens = per_step(workload.prompt_tokens(), workload.arrival_s, dt=grid_s, n_steps=n_grid)
    cumulative = np.concatenate(([0.0], np.cumsum(tokens)))
    need_grid = np.zeros(n_grid)
    short = range(1, max(round(max_window_s / grid_s), 1) + 1)
    # long windows catch a sustained small overload, which no short window shows but which
    # grows a queue without bound
    long = range(short[-1] + 30, max(round(long_window_s / grid_s), short[-1]) + 1, 30)
    for w in (*short, *long):
        end = np.minimum(np.arange(n_grid) + w, n_grid)
        window = cumulative[end] - cumulative[:n_grid]
        # the window's work is served until its end plus the slack: capacity dropped before
        # then leaves part of it queued past the SLO
        due = math.ceil((w * grid_s + slack_s) / grid_s)
        need_grid = np.maximum(need_grid, trailing_max(window / (w * grid_s + slack_s), due))
    per = round(dt / grid_s)
    padded = np.zeros(n_steps * per)
    padded[: min(n_grid, padded.size)] = need_grid[: padded.size]
    need_rate = padded.reshape(n_steps, per).max(axis=1)

    # sequences in decode: each holds a slot from its arrival step for output / per-sequence
    # speed, counted in slot-time as the serving model counts it
    held = steps_held(workload.output_tokens, seq_rate, dt=dt)
    start = np.minimum((workload.arrival_s // dt).astype(np.int64), n_steps - 1)
    delta = np.zeros(n_steps + int(np.ceil(held.max())) + 3)
    book_occupancy(delta, start=start, sequences=workload.requests, held_steps=held)
    running = np.maximum(np.cumsum(delta)[:n_steps], 0.0)

    if settings.mode == "unified":
        interference = serving.unified_decode_interference
        need = np.maximum(
            need_rate / prefill_per_gang + interference * running / slots_per_gang,
            running / slots_per_gang,
        )
        return {"unified": _whole(need)}
    return {
        "prefill": _whole(need_rate / prefill_per_gang),
        "decode": _whole(running / slots_per_gang),
    }


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
