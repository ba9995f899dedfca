"""Demand history from Prometheus range queries, so a restarted service forecasts at once.

At start-up the last N days (default 7) of each component's demand are rebuilt at a fixed
step from the same demand queries the tick uses, one range query per 6 hours per distinct
query (Prometheus caps a range answer at 11,000 points per series, and smaller answers fail
alone and cost less memory: a day's answer for 4,000 leader pods parses to 989 MiB, 6 hours'
to 249 MiB; `benchmarks/backfill_memory.py`). Series are mapped to components through LWS
pod names; every leader pod with a value at a step adds to that step (gangs come and go over
a week, so no ready-set is applied).
A step where no leader reported, or a chunk Prometheus could not answer, stays NaN: a gap
is missing data, never zero demand. So does a step inside a gap of at most 3 minutes in one
leader's series while the others reported: a missed scrape, where the others' sum would
understate the load (the tick refuses such a partial sum too, `signals_for`). A longer gap
is a gang that was gone, scaled away and back under its pod name, and the sum is right.

Memory: one array of sums per component, filled in place into its values, and one grid that
every history shares (read-only): 2,000 components over 7 days at 60 s held 617 MiB at the
peak with a grid copy, counts and values each per component.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from autoscaler.adapters.pod_names import PodNameIndex
from autoscaler.adapters.prometheus_http import (
    HISTORY_TIMEOUT_S,
    PrometheusHttp,
    PrometheusUnavailable,
)
from autoscaler.adapters.prometheus_queries import PrometheusQueries
from autoscaler.core.model import Component, ComponentKey

log = logging.getLogger(__name__)

DAY_S = 86_400.0
CHUNK_S = 6 * 3600.0


@dataclass(frozen=True, slots=True)
class DemandHistory:
    """One component's demand at `timestamps_s` (regular, `step_s` apart); NaN = missing."""

    key: ComponentKey
    step_s: float
    timestamps_s: npt.NDArray[np.float64]
    values: npt.NDArray[np.float64]

    @property
    def observed_fraction(self) -> float:
        return float(np.isfinite(self.values).mean()) if self.values.size else 0.0


@dataclass(frozen=True, slots=True)
class BackfillResult:
    histories: Mapping[ComponentKey, DemandHistory]
    chunks_total: int
    chunks_failed: int
    errors: tuple[str, ...]
    # failed chunks Prometheus refused (`refused`: too many samples, a malformed answer, too
    # heavy to finish), not silence, a 5xx or a store still coming up
    chunks_refused: int = 0


def history_grid(*, end_s: float, days: float, step_s: float) -> npt.NDArray[np.float64]:
    """Step-aligned timestamps covering the `days` before `end_s`, the last at or before it."""
    if step_s <= 0 or days <= 0:
        raise ValueError(f"step_s and days must be positive, got {step_s}, {days}")
    last = math.floor(end_s / step_s) * step_s
    count = int(days * DAY_S // step_s)
    return last - step_s * np.arange(count - 1, -1, -1, dtype=np.float64)


# Thanos refusing a partial answer (`partial_response=false`) while a store is not up yet (a
# sidecar whose Prometheus replays its WAL): an error answer that passes with time.
_STORE_DOWN = ("partial response", "rpc error", "unavailable", "receive series")


def refused(err: PrometheusUnavailable) -> bool:
    """Whether Prometheus answered that it will not run the query as it stands (trying again
    will not help): a 4xx such as 422's too many samples, a malformed answer, or a query
    timing out (too heavy, as the capacity restore reads it). Not a 408 or 429 (later, it
    says), nor a refused partial answer of a store that is down: those pass."""
    if err.kind in ("bad_response", "timeout"):
        return True
    if err.kind != "http_4xx" or err.status in (408, 429):
        return False
    text = err.detail.lower()
    return not any(marker in text for marker in _STORE_DOWN)


# (component, grid slots, finite values, slots inside the series' span it has no value at)
# A leader's gap this short is a missed scrape, not a gang gone: the autoscaler holds a
# gang it scales away for its scale-down window (5 minutes by default) before it can return.
MAX_SKIP_S = 180.0


def _short_gaps(slots: npt.NDArray[np.int64], *, step_s: float) -> npt.NDArray[np.int64]:
    """The slots inside gaps of at most `MAX_SKIP_S` between consecutive `slots`."""
    ordered = np.unique(slots)
    gaps = np.diff(ordered) - 1  # missing slots between neighbours
    short = (gaps > 0) & (gaps * step_s <= MAX_SKIP_S)
    if not short.any():
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(
        [
            np.arange(a + 1, a + 1 + g, dtype=np.int64)
            for a, g in zip(ordered[:-1][short], gaps[short], strict=True)
        ]
    )


# (component, leader pod, grid slots, finite values, holes)
ChunkPoints = list[
    tuple[
        ComponentKey,
        str,
        npt.NDArray[np.int64],
        npt.NDArray[np.float64],
        npt.NDArray[np.int64],
    ]
]


def chunk_points(
    matrix: list[dict[str, Any]],
    *,
    index: PodNameIndex,
    keys: set[ComponentKey],
    grid: npt.NDArray[np.float64],
    step_s: float,
) -> ChunkPoints:
    """Range-query rows -> (component, pod, grid slots, finite values, holes) of leader
    pods only. A hole is a slot between two of the series' values, in a gap of at most
    `MAX_SKIP_S`: a leader not scraped for a moment. A longer gap is a gang that was gone
    (scaled away and back under the same pod name, a rollout), which the others' sum
    measures rightly."""
    points: ChunkPoints = []
    for row in matrix:
        labels = row.get("metric", {})
        who = index.resolve(labels.get("namespace", ""), labels.get("pod", ""))
        if who is None or not who.is_leader:
            continue  # workers serve no vLLM metrics; unknown pods are not ours
        key = ComponentKey(who.namespace, who.lws)
        if key not in keys:
            continue
        pairs = np.asarray(row["values"], dtype=np.float64).reshape(-1, 2)
        slots = np.rint((pairs[:, 0] - grid[0]) / step_s).astype(np.int64)
        ok = np.isfinite(pairs[:, 1]) & (slots >= 0) & (slots < grid.size)
        present = slots[ok]
        pod = labels.get("pod", "")
        points.append((key, pod, present, pairs[ok, 1], _short_gaps(present, step_s=step_s)))
    return points


def _fetch_chunk(
    http: PrometheusHttp,
    name: str,
    query: str,
    *,
    start_s: float,
    end_s: float,
    step_s: float,
    index: PodNameIndex,
    keys: set[ComponentKey],
    grid: npt.NDArray[np.float64],
) -> ChunkPoints:
    """One day's range query, parsed, on a worker thread; a malformed answer fails the chunk."""
    deadline = time.monotonic() + HISTORY_TIMEOUT_S
    matrix = http.range(
        f"{name}[backfill]", query, start_s=start_s, end_s=end_s, step_s=step_s, deadline=deadline
    )
    try:
        return chunk_points(matrix, index=index, keys=keys, grid=grid, step_s=step_s)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        bad = PrometheusUnavailable(name, kind="bad_response", detail=repr(err))
        http.report(bad)
        raise bad from err


async def backfill_demand(
    http: PrometheusHttp,
    queries: PrometheusQueries,
    components: Iterable[tuple[ComponentKey, Component]],
    *,
    end_s: float,
    days: float = 7.0,
    step_s: float = 60.0,
    chunk_s: float = CHUNK_S,
    executor: Executor | None = None,
) -> BackfillResult:
    """Rebuild each component's demand series; Prometheus failures leave NaN gaps. Range
    queries run on `executor` (default: the loop's own), one at a time."""
    wanted = dict(components)
    grid = history_grid(end_s=end_s, days=days, step_s=step_s)
    grid.flags.writeable = False  # shared by every history
    index = PodNameIndex((key.namespace, key.lws) for key in wanted)
    texts = queries.instant_queries()
    by_query: dict[str, list[ComponentKey]] = {}
    for key, component in wanted.items():
        by_query.setdefault(queries.demand_query_name(component), []).append(key)

    sums = {key: np.zeros(grid.size) for key in wanted}
    # steps with a leader's value, and steps a leader skipped inside its own span
    seen = {key: np.zeros(grid.size, dtype=bool) for key in wanted}
    skipped = {key: np.zeros(grid.size, dtype=bool) for key in wanted}
    per_chunk = max(1, int(chunk_s // step_s))
    # each leader's last slot with a value, for a missed scrape across two chunks' edge
    last_slot: dict[tuple[ComponentKey, str], int] = {}
    errors: list[str] = []
    refusals = 0
    chunks_total = 0
    for query_name, keys in sorted(by_query.items()):
        keys_set = set(keys)
        for first in range(0, grid.size, per_chunk):
            last = min(first + per_chunk, grid.size) - 1
            chunks_total += 1
            try:
                fetch = functools.partial(
                    _fetch_chunk,
                    http,
                    query_name,
                    texts[query_name],
                    start_s=float(grid[first]),
                    end_s=float(grid[last]),
                    step_s=step_s,
                    index=index,
                    keys=keys_set,
                    grid=grid,
                )
                points = await asyncio.get_running_loop().run_in_executor(executor, fetch)
            except PrometheusUnavailable as err:
                errors.append(str(err))
                refusals += refused(err)
                continue
            for key, pod, slots, values, holes in points:
                np.add.at(sums[key], slots, values)
                seen[key][slots] = True
                skipped[key][holes] = True
                if not slots.size:
                    continue
                before = last_slot.get((key, pod))
                first_here = int(slots.min())
                if before is not None and 0 < (first_here - before - 1) * step_s <= MAX_SKIP_S:
                    skipped[key][before + 1 : first_here] = True
                last_slot[(key, pod)] = int(slots.max())
            del points
    if errors:
        log.warning(
            "demand back-fill: %d of %d range queries failed; their days stay missing: %s",
            len(errors),
            chunks_total,
            errors[:3],
        )
    histories = {}
    for key in wanted:
        values = sums.pop(key)
        values[~seen.pop(key) | skipped.pop(key)] = np.nan
        histories[key] = DemandHistory(key=key, step_s=step_s, timestamps_s=grid, values=values)
    return BackfillResult(
        histories=histories,
        chunks_total=chunks_total,
        chunks_failed=len(errors),
        errors=tuple(errors),
        chunks_refused=refusals,
    )
