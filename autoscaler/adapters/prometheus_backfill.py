"""Demand history from Prometheus range queries, so a restarted service forecasts at once.

At start-up the last N days (default 7) of each component's demand are rebuilt at a fixed
step from the same demand queries the tick uses, one range query per day per distinct query
(Prometheus caps a range answer at 11,000 points per series, and smaller answers fail
alone). Series are mapped to components through LWS pod names; every leader pod with a value
at a step adds to that step (gangs come and go over a week, so no ready-set is applied).
A step where no leader reported, or a chunk Prometheus could not answer, stays NaN: a gap
is missing data, never zero demand.
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


def history_grid(*, end_s: float, days: float, step_s: float) -> npt.NDArray[np.float64]:
    """Step-aligned timestamps covering the `days` before `end_s`, the last at or before it."""
    if step_s <= 0 or days <= 0:
        raise ValueError(f"step_s and days must be positive, got {step_s}, {days}")
    last = math.floor(end_s / step_s) * step_s
    count = int(days * DAY_S // step_s)
    return last - step_s * np.arange(count - 1, -1, -1, dtype=np.float64)


ChunkPoints = list[tuple[ComponentKey, npt.NDArray[np.int64], npt.NDArray[np.float64]]]


def chunk_points(
    matrix: list[dict[str, Any]],
    *,
    index: PodNameIndex,
    keys: set[ComponentKey],
    grid: npt.NDArray[np.float64],
    step_s: float,
) -> ChunkPoints:
    """Range-query rows -> (component, grid slots, finite values) of leader pods only."""
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
        points.append((key, slots[ok], pairs[ok, 1]))
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
    chunk_s: float = DAY_S,
    executor: Executor | None = None,
) -> BackfillResult:
    """Rebuild each component's demand series; Prometheus failures leave NaN gaps. Range
    queries run on `executor` (default: the loop's own), one at a time."""
    wanted = dict(components)
    grid = history_grid(end_s=end_s, days=days, step_s=step_s)
    index = PodNameIndex((key.namespace, key.lws) for key in wanted)
    texts = queries.instant_queries()
    by_query: dict[str, list[ComponentKey]] = {}
    for key, component in wanted.items():
        by_query.setdefault(queries.demand_query_name(component), []).append(key)

    sums = {key: np.zeros(grid.size) for key in wanted}
    counts = {key: np.zeros(grid.size, dtype=np.int64) for key in wanted}
    per_chunk = max(1, int(chunk_s // step_s))
    errors: list[str] = []
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
                continue
            for key, slots, values in points:
                np.add.at(sums[key], slots, values)
                np.add.at(counts[key], slots, 1)
    if errors:
        log.warning(
            "demand back-fill: %d of %d range queries failed; their days stay missing: %s",
            len(errors),
            chunks_total,
            errors[:3],
        )
    histories = {
        key: DemandHistory(
            key=key,
            step_s=step_s,
            timestamps_s=grid.copy(),
            values=np.where(counts[key] > 0, sums[key], np.nan),
        )
        for key in wanted
    }
    return BackfillResult(
        histories=histories,
        chunks_total=chunks_total,
        chunks_failed=len(errors),
        errors=tuple(errors),
    )
