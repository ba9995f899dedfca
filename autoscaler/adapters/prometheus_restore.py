"""The learned capacity per gang a previous instance exported, read back at start-up.

The core learns what one gang serves only while the component runs near its target, which
may be hours away after a restart or a leader change. The leader exports what it learned as
`gang_autoscaler_learned_capacity_per_gang`; a new instance reads it back from Prometheus
instead of waiting for the next saturation, so a restart does not switch off the forecast
floor and the demand step (as the demand back-fill keeps the forecast).

A value is only good for the object, the gangs and the unit it was learned for, so each
series carries the LWS's `lws_uid` (a deleted and recreated LWS learns afresh), `template`,
a digest of its gang template (a new image, model or parallelism serves differently), and
`demand_query`, a fingerprint of the demand query (a capacity in prompt tokens/s means
nothing to a query that now counts requests). Only series matching all three are restored.

A series also says whether a dry-run instance exported it (`dry_run`): a shadow release
beside the real one (docs/operators.md) learns from the same pods with its own settings and
code, and a writing instance restores only what writing instances learned (a dry-run one
takes either).

Every instance that ever led leaves its own series (scrape labels such as `pod` differ), so
each lookup asks for every series at once: its last value, and the last value of its
companion `..._reported_timestamp_seconds` (when that instance last reported it). The most
recently reported series wins. A subquery over `timestamp()` would need no companion, but at
any affordable resolution it misses a leader that lived less than one step. Lookups widen
from the last hour to the last day to the whole lookback, each only while some wanted
component is still not found: `last_over_time` reads every sample in its window, and a week
of a large fleet's series is more than Prometheus loads for one query by default (50M
samples). Values that are not finite and positive are ignored. The query count does not grow
with the number of components.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, fields
from typing import Any

from autoscaler.adapters.prometheus_http import (
    HISTORY_TIMEOUT_S,
    PrometheusHttp,
    PrometheusUnavailable,
)
from autoscaler.core.model import ComponentKey

log = logging.getLogger(__name__)

LEARNED_CAPACITY_METRIC = "gang_autoscaler_learned_capacity_per_gang"
LEARNED_CAPACITY_REPORTED_METRIC = "gang_autoscaler_learned_capacity_reported_timestamp_seconds"
VALUES_QUERY = "learned_capacity[restore]"
WRITTEN_QUERY = "learned_capacity_written[restore]"
WINDOWS_S: tuple[float, ...] = (3_600.0, 86_400.0)
# How Prometheus turns down a query too heavy for it, after answering lighter ones.
TOO_HEAVY_KINDS = frozenset({"http_4xx", "timeout"})


def demand_fingerprint(query: str) -> str:
    """A short, stable name for a demand query's text (the `demand_query` label)."""
    return hashlib.sha256(" ".join(query.split()).encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True, order=True)
class CapacityIdentity:
    """What a learned capacity is valid for: one LWS object, one gang template (its
    `kube_discovery.template_digest`) and one demand query."""

    lws_uid: str
    template: str
    demand_query: str

    def label_values(self) -> tuple[str, ...]:
        """The values of `IDENTITY_LABELS`, in that order."""
        return astuple(self)

    @property
    def key(self) -> str:
        """One string for the whole identity: the core forgets a learned capacity when the
        observation's `template` changes, and a new demand query (a component whose kind
        changed measures in another unit) must count as a change as much as a new image."""
        return "|".join(self.label_values())


# The labels, beyond the component's, that say what a learned value is valid for: the
# fields of `CapacityIdentity`, named alike.
IDENTITY_LABELS: tuple[str, ...] = tuple(f.name for f in fields(CapacityIdentity))
# "true" on a value a dry-run instance learned; absent on series of earlier versions.
DRY_RUN_LABEL = "dry_run"


@dataclass(frozen=True, slots=True)
class RestoredCapacity:
    """A learned capacity per gang as last exported, and when (Unix seconds)."""

    capacity_per_gang: float
    written_at_s: float


def lookup_windows_s(lookback_s: float) -> tuple[float, ...]:
    """The widening windows of the lookups, none longer than `lookback_s`."""
    if lookback_s <= 0:
        return ()
    return tuple(sorted({min(w, lookback_s) for w in WINDOWS_S} | {lookback_s}))


def restore_queries(*, window_s: float) -> dict[str, str]:
    """The two instant queries of one lookup, named as the error counters and logs name them."""
    window = f"{max(1, int(window_s))}s"
    return {
        VALUES_QUERY: f"last_over_time({LEARNED_CAPACITY_METRIC}[{window}])",
        WRITTEN_QUERY: f"last_over_time({LEARNED_CAPACITY_REPORTED_METRIC}[{window}])",
    }


def _series(row: Mapping[str, Any]) -> tuple[frozenset[tuple[str, str]], float]:
    labels = {k: str(v) for k, v in row["metric"].items() if k != "__name__"}
    return frozenset(labels.items()), float(row["value"][1])


def newest_capacities(
    values: Sequence[Mapping[str, Any]],
    written: Sequence[Mapping[str, Any]],
    *,
    wanted: Mapping[ComponentKey, CapacityIdentity],
    include_dry_run: bool = False,
) -> dict[ComponentKey, RestoredCapacity]:
    """Join the two answers on their label sets; per wanted component, the most recently
    reported value of a series with its identity (and, unless `include_dry_run`, not
    learned by a dry-run instance).

    Raises KeyError, TypeError or ValueError on a malformed answer.
    """
    written_at = dict(_series(row) for row in written)
    best: dict[ComponentKey, RestoredCapacity] = {}
    for row in values:
        labels, value = _series(row)
        at = written_at.get(labels)
        named = dict(labels)
        if at is None or not math.isfinite(value) or value <= 0:
            continue
        if named.get(DRY_RUN_LABEL) == "true" and not include_dry_run:
            continue
        key = ComponentKey(named.get("namespace", ""), named.get("lws", ""))
        identity = wanted.get(key)
        if identity is None or identity.label_values() != tuple(
            named.get(label, "") for label in IDENTITY_LABELS
        ):
            continue
        previous = best.get(key)
        if previous is None or at > previous.written_at_s:
            best[key] = RestoredCapacity(capacity_per_gang=value, written_at_s=at)
    return best


def restore_learned_capacity(
    http: PrometheusHttp,
    *,
    wanted: Mapping[ComponentKey, CapacityIdentity],
    lookback_s: float,
    include_dry_run: bool = False,
) -> dict[ComponentKey, RestoredCapacity]:
    """The last exported learned capacity of each wanted component within `lookback_s`
    (blocking: run it in a thread); a dry-run instance's only with `include_dry_run`.

    Raises PrometheusUnavailable when the first lookup fails or answers nonsense; when a
    wider one fails, what the narrower ones found is returned.
    """
    found: dict[ComponentKey, RestoredCapacity] = {}
    for attempt, window_s in enumerate(lookup_windows_s(lookback_s)):
        missing = {k: v for k, v in wanted.items() if k not in found}
        if not missing:
            break
        try:
            found.update(
                _lookup(http, wanted=missing, window_s=window_s, include_dry_run=include_dry_run)
            )
        except PrometheusUnavailable as err:
            if attempt == 0 or err.kind not in TOO_HEAVY_KINDS:
                raise  # Prometheus unreachable or failing: the caller asks again later
            # Prometheus answered the narrower lookups and refused this one (a 422 for
            # `--query.max-samples`) or ran out of time on it: a week of a large fleet is
            # too heavy. Raising would have the caller ask again every minute, for good;
            # what was found stands.
            log.warning(
                "learned capacity: the %gs lookup failed (%s); %d of %d components found",
                window_s,
                err,
                len(found),
                len(wanted),
            )
            break
    return found


def _lookup(
    http: PrometheusHttp,
    *,
    wanted: Mapping[ComponentKey, CapacityIdentity],
    window_s: float,
    include_dry_run: bool,
) -> dict[ComponentKey, RestoredCapacity]:
    deadline = time.monotonic() + HISTORY_TIMEOUT_S
    answers = {
        name: http.instant(name, query, deadline=deadline)
        for name, query in restore_queries(window_s=window_s).items()
    }
    try:
        return newest_capacities(
            answers[VALUES_QUERY],
            answers[WRITTEN_QUERY],
            wanted=wanted,
            include_dry_run=include_dry_run,
        )
    except (KeyError, TypeError, ValueError, IndexError) as err:
        bad = PrometheusUnavailable(VALUES_QUERY, kind="bad_response", detail=repr(err))
        http.report(bad)
        raise bad from err
