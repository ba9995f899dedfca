"""The learned capacity per gang a previous instance exported, read back at start-up.

The core learns what one gang serves only while the component runs near its target, which
may be hours away after a restart or a leader change. The leader exports what it learned as
`gang_autoscaler_learned_capacity_per_gang{namespace, deployment, component, lws}`; a new
instance reads it back from Prometheus instead of waiting for the next saturation, so a
restart does not switch off the forecast floor (as the demand back-fill keeps the forecast).

Every instance that ever led leaves its own series (scrape labels such as `pod` differ), so
two queries are asked for every series at once: its last value, and the last value of its
companion `..._reported_timestamp_seconds` (the wall time of that export). The most recently
reported series of each LWS wins. A subquery over `timestamp()` would need no companion, but
at any affordable resolution it misses a leader that lived less than one step. Values that
are not finite and positive are ignored. The query count does not grow with the number of
components.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.adapters.prometheus_http import PrometheusHttp, PrometheusUnavailable
from autoscaler.core.model import ComponentKey

LEARNED_CAPACITY_METRIC = "gang_autoscaler_learned_capacity_per_gang"
LEARNED_CAPACITY_REPORTED_METRIC = "gang_autoscaler_learned_capacity_reported_timestamp_seconds"
VALUES_QUERY = "learned_capacity[restore]"
WRITTEN_QUERY = "learned_capacity_written[restore]"


@dataclass(frozen=True, slots=True)
class RestoredCapacity:
    """A learned capacity per gang as last exported, and when (Unix seconds)."""

    capacity_per_gang: float
    written_at_s: float


def restore_queries(*, lookback_s: float) -> dict[str, str]:
    """The two instant queries, named as the error counters and logs name them."""
    window = f"{max(1, int(lookback_s))}s"
    return {
        VALUES_QUERY: f"last_over_time({LEARNED_CAPACITY_METRIC}[{window}])",
        WRITTEN_QUERY: f"last_over_time({LEARNED_CAPACITY_REPORTED_METRIC}[{window}])",
    }


def _series(row: Mapping[str, Any]) -> tuple[frozenset[tuple[str, str]], float]:
    labels = {k: str(v) for k, v in row["metric"].items() if k != "__name__"}
    return frozenset(labels.items()), float(row["value"][1])


def newest_capacities(
    values: Sequence[Mapping[str, Any]], written: Sequence[Mapping[str, Any]]
) -> dict[ComponentKey, RestoredCapacity]:
    """Join the two answers on their label sets; per LWS, the most recently written value.

    Raises KeyError, TypeError or ValueError on a malformed answer.
    """
    written_at = dict(_series(row) for row in written)
    best: dict[ComponentKey, RestoredCapacity] = {}
    for row in values:
        labels, value = _series(row)
        at = written_at.get(labels)
        named = dict(labels)
        if at is None or "namespace" not in named or "lws" not in named:
            continue
        if not math.isfinite(value) or value <= 0:
            continue
        key = ComponentKey(named["namespace"], named["lws"])
        previous = best.get(key)
        if previous is None or at > previous.written_at_s:
            best[key] = RestoredCapacity(capacity_per_gang=value, written_at_s=at)
    return best


def restore_learned_capacity(
    http: PrometheusHttp, *, lookback_s: float
) -> dict[ComponentKey, RestoredCapacity]:
    """Every LWS's last exported learned capacity within `lookback_s` (blocking: run it in a
    thread). Raises PrometheusUnavailable when either query fails or answers nonsense."""
    deadline = time.monotonic() + http.timeout_s
    answers = {
        name: http.instant(name, query, deadline=deadline)
        for name, query in restore_queries(lookback_s=lookback_s).items()
    }
    values, written = answers[VALUES_QUERY], answers[WRITTEN_QUERY]
    try:
        return newest_capacities(values, written)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        bad = PrometheusUnavailable(VALUES_QUERY, kind="bad_response", detail=repr(err))
        http.report(bad)
        raise bad from err
