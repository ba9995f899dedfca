"""Per-component load signals from Prometheus: one fixed set of instant queries per tick.

Each query covers every pod at once (`... by (namespace, pod)`); results are mapped to
components here, in Python, through LWS pod names: only the leader pod (`<lws>-<group>`) of
each ready gang is read, since in a multi-node gang only the leader serves vLLM metrics.
The number of queries per tick is therefore the same for one deployment or two hundred.

Anything untrustworthy becomes None with a reason in `Signals.missing_reasons`: NaN or Inf,
a ready leader missing from the results, a sample older than the staleness limit, a query
that failed (Prometheus down, timeout, 4xx/5xx). A failing Prometheus never raises out of
`observe`: the tick gets "no data", the core holds, and the error is logged and counted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from autoscaler.adapters.pod_names import leader_pod_name
from autoscaler.adapters.prometheus_auth import PrometheusCredentials
from autoscaler.adapters.prometheus_backfill import BackfillResult, backfill_demand
from autoscaler.adapters.prometheus_http import (
    ErrorCallback,
    PrometheusHttp,
    PrometheusStats,
    PrometheusUnavailable,
)
from autoscaler.adapters.prometheus_queries import GROUPED_BY, PrometheusQueries
from autoscaler.adapters.prometheus_restore import (
    CapacityIdentity,
    RestoredCapacity,
    demand_fingerprint,
    restore_learned_capacity,
)
from autoscaler.core.model import Component, ComponentKey, Signals

__all__ = [
    "ComponentTarget",
    "PrometheusCredentials",
    "PrometheusQueries",
    "PrometheusSource",
    "PrometheusStats",
]

log = logging.getLogger(__name__)

# Threads finish at the deadline on their own; this grace only covers scheduling delay.
_DEADLINE_GRACE_S = 0.5


@dataclass(frozen=True, slots=True)
class ComponentTarget:
    """One component to observe: its LWS, its kind (which demand query applies) and the
    group indexes of its ready gangs (from the Kubernetes adapter's pod cache)."""

    key: ComponentKey
    component: Component
    ready_group_indexes: frozenset[int]
    deployment: str | None = None  # its deployment's name, for the `wake` query
    at_zero: bool = False  # no gang asked for: the only case the `wake` query is read for


@dataclass(frozen=True, slots=True)
class QueryOutcome:
    """One instant query's answer per (namespace, pod), or why there is none."""

    values: Mapping[tuple[str, str], float] = field(default_factory=dict)
    eval_time_s: float | None = None
    duplicated: frozenset[tuple[str, str]] = frozenset()
    error: str | None = None


def parse_vector(result: Sequence[Mapping[str, Any]], *, label: str = "pod") -> QueryOutcome:
    """Instant-vector rows -> values by (namespace, `label`). Rows without both labels are
    dropped; a pod with several rows (the query did not aggregate by pod) is flagged."""
    values: dict[tuple[str, str], float] = {}
    duplicated: set[tuple[str, str]] = set()
    eval_time_s: float | None = None
    for row in result:
        labels = row.get("metric", {})
        namespace, pod = labels.get("namespace"), labels.get(label)
        if not namespace or not pod:
            continue
        timestamp, text = row["value"]
        eval_time_s = float(timestamp)
        key = (namespace, pod)
        if key in values:
            duplicated.add(key)
        values[key] = float(text)  # Prometheus writes NaN / +Inf / -Inf as float() reads them
    return QueryOutcome(values=values, eval_time_s=eval_time_s, duplicated=frozenset(duplicated))


def _pod_value(outcome: QueryOutcome, namespace: str, pod: str) -> tuple[float | None, str | None]:
    key = (namespace, pod)
    if key in outcome.duplicated:
        return None, (
            f"query returned several series for pod {namespace}/{pod}; "
            "it must aggregate by (namespace, pod)"
        )
    value = outcome.values.get(key)
    if value is None:
        return None, f"no sample for ready leader {namespace}/{pod}"
    if math.isnan(value):
        return None, f"NaN for {namespace}/{pod}"
    if math.isinf(value):
        return None, f"Inf for {namespace}/{pod}"
    return value, None


# A leader whose gauges answer but whose demand does not: at a scrape interval as long as
# the query's rate() window (Prometheus's default 1m against `[1m]`), the window never holds
# two samples, and the demand was said to have "no sample" with nothing pointing at why.
_NO_RATE = (
    "no demand sample for ready leader {pod} from the {query} query, though it reports "
    "waiting requests: a rate() needs two samples in its window (a [1m] window reads "
    "nothing at a 1m scrape interval; make it at least twice the interval in "
    "prometheus.queries, or scrape the pods more often)"
)


def _reports_gauges(outcomes: Mapping[str, QueryOutcome], namespace: str, pod: str) -> bool:
    waiting = outcomes.get("waiting")
    return waiting is not None and waiting.error is None and (namespace, pod) in waiting.values


class PrometheusSource:
    """Reads the signal queries once per tick and maps them to components.

    Its one `PrometheusHttp`, and so one set of credentials, also serves the back-fill and
    the learned-capacity restore."""

    def __init__(
        self,
        *,
        url: str,
        queries: PrometheusQueries | None = None,
        timeout_s: float = 10.0,
        staleness_limit_s: float = 120.0,
        retries: int = 1,
        max_parallel_queries: int = 6,
        credentials: PrometheusCredentials | None = None,
        stats: PrometheusStats | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        if max_parallel_queries < 1:
            raise ValueError(f"max_parallel_queries must be at least 1, got {max_parallel_queries}")
        self.max_parallel_queries = max_parallel_queries
        self.queries = queries if queries is not None else PrometheusQueries()
        self.timeout_s = timeout_s
        self.staleness_limit_s = staleness_limit_s
        self.http = PrometheusHttp(
            url=url,
            timeout_s=timeout_s,
            retries=retries,
            credentials=credentials,
            stats=stats,
            on_error=on_error,
        )
        # History reads (back-fill range queries, the learned-capacity restore) run on a
        # thread of their own, one at a time: on the loop's default pool (6 threads on 2
        # CPUs) the back-fills of a few new LWS took the threads the tick's queries wait for.
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prom-history")

    @functools.cached_property
    def _fingerprints(self) -> dict[Component, str]:
        # The queries are fixed for the source's life; hash them once, not every tick.
        texts = self.queries.instant_queries()
        return {c: demand_fingerprint(texts[self.queries.demand_query_name(c)]) for c in Component}

    @property
    def stats(self) -> PrometheusStats:
        return self.http.stats

    def close(self) -> None:
        self.http.close()
        self._background.shutdown(wait=False, cancel_futures=True)

    async def backfill_demand(
        self,
        components: Iterable[tuple[ComponentKey, Component]],
        *,
        end_s: float,
        days: float = 7.0,
        step_s: float = 60.0,
    ) -> BackfillResult:
        """Demand history of each component for the `days` before `end_s` (see
        `prometheus_backfill`); gaps and failed chunks stay NaN."""
        return await backfill_demand(
            self.http,
            self.queries,
            components,
            end_s=end_s,
            days=days,
            step_s=step_s,
            executor=self._background,
        )

    def demand_fingerprint(self, component: Component) -> str:
        """The `demand_query` label of a learned capacity measured with this component's
        demand query."""
        return self._fingerprints[component]

    async def restore_learned_capacity(
        self,
        *,
        wanted: Mapping[ComponentKey, CapacityIdentity],
        lookback_s: float,
        include_dry_run: bool = False,
    ) -> dict[ComponentKey, RestoredCapacity]:
        """Learned capacities a previous instance exported for these components and
        identities (see `prometheus_restore`); raises PrometheusUnavailable."""
        restore = functools.partial(
            restore_learned_capacity,
            self.http,
            wanted=wanted,
            lookback_s=lookback_s,
            include_dry_run=include_dry_run,
        )
        return await asyncio.get_running_loop().run_in_executor(self._background, restore)

    def _instant_outcome(
        self, name: str, query: str, *, deadline: float, on_send: Callable[[], None]
    ) -> QueryOutcome:
        """One query, parsed, on a worker thread (parsing 800 rows is not for the loop)."""
        result = self.http.instant(name, query, deadline=deadline, on_send=on_send)
        try:
            return parse_vector(result, label=GROUPED_BY.get(name, "pod"))
        except (KeyError, TypeError, ValueError, IndexError) as err:
            bad = PrometheusUnavailable(name, kind="bad_response", detail=repr(err))
            self.http.report(bad)
            raise bad from err

    async def query_all(self) -> dict[str, QueryOutcome]:
        """Send the tick's fixed query set, each in a thread, all within the timeout."""
        deadline = time.monotonic() + self.timeout_s
        slots = asyncio.Semaphore(self.max_parallel_queries)
        # The tick's own requests: back-fills and restores share the HTTP client's counter.
        # (list.append is atomic across the query threads)
        sent: list[None] = []

        def count() -> None:
            sent.append(None)

        async def send(name: str, query: str) -> QueryOutcome:
            async with slots:
                return await asyncio.to_thread(
                    self._instant_outcome, name, query, deadline=deadline, on_send=count
                )

        tasks = {
            name: asyncio.create_task(send(name, query))
            for name, query in self.queries.instant_queries().items()
        }
        try:
            await asyncio.wait(tasks.values(), timeout=self.timeout_s + _DEADLINE_GRACE_S)
        except asyncio.CancelledError:
            for task in tasks.values():
                task.cancel()  # the caller gave up on this tick; leave nothing dangling
            raise
        outcomes: dict[str, QueryOutcome] = {}
        failures: list[PrometheusUnavailable] = []
        for name, task in tasks.items():
            if not task.done():
                task.cancel()  # the thread ends at its own deadline; its answer is dropped
                error = PrometheusUnavailable(name, kind="timeout", detail="no answer in time")
                self.http.report(error)
                failures.append(error)
                continue
            exc = task.exception()
            if exc is None:
                outcomes[name] = task.result()
            elif isinstance(exc, PrometheusUnavailable):
                failures.append(exc)  # already counted where it was raised
            else:
                # Not a Prometheus failure we know; still never stop the loop for it.
                log.error("prometheus query %s raised", name, exc_info=exc)
                error = PrometheusUnavailable(name, kind="unexpected", detail=repr(exc))
                self.http.report(error)
                failures.append(error)
        self.stats.last_tick_queries = len(sent)
        for error in failures:
            outcomes[error.query_name] = QueryOutcome(
                error=f"prometheus {error.kind}: {error.detail}"
            )
        if failures:
            log.warning(
                "prometheus queries failed, their signals are missing: %s",
                "; ".join(str(e)[:400] for e in failures),
            )
        return outcomes

    async def observe(self, components: Iterable[ComponentTarget]) -> dict[ComponentKey, Signals]:
        """Signals of every component. Never raises for Prometheus trouble."""
        targets = list(components)
        outcomes = await self.query_all()
        return {t.key: self.signals_for(t, outcomes) for t in targets}

    def _stale_reason(
        self, outcomes: Mapping[str, QueryOutcome], namespace: str, pod: str
    ) -> str | None:
        sample_time = outcomes.get("sample_time")
        if sample_time is None:
            return None  # no staleness check configured
        if sample_time.error is not None:
            return f"sample time unknown: {sample_time.error}"
        if (namespace, pod) not in sample_time.values:
            # Named apart from the signal queries' own "no sample": a freshness query that
            # reads another server's metric (vLLM's on SGLang pods) voids every signal.
            return (
                f"freshness query (sample_time) returned no sample for ready leader "
                f"{namespace}/{pod}"
            )
        newest_s, reason = _pod_value(sample_time, namespace, pod)
        if newest_s is None or sample_time.eval_time_s is None:
            return reason
        age_s = sample_time.eval_time_s - newest_s
        if age_s > self.staleness_limit_s:
            return (
                f"stale: newest sample of {namespace}/{pod} is {age_s:.0f}s old "
                f"(limit {self.staleness_limit_s:g}s)"
            )
        return None

    @staticmethod
    def _wake_requests(
        target: ComponentTarget, outcomes: Mapping[str, QueryOutcome], reasons: dict[str, str]
    ) -> float | None:
        """The `wake` query's value for the target's deployment. None when it is not
        configured or has no finite row for it (a gateway with nothing queued often exports
        nothing: not an error), and with a reason when the query failed or is ambiguous."""
        outcome = outcomes.get("wake")
        if outcome is None or target.deployment is None or not target.at_zero:
            return None
        if outcome.error is not None:
            reasons["wake_requests"] = outcome.error
            return None
        key = (target.key.namespace, target.deployment)
        if key in outcome.duplicated:
            reasons["wake_requests"] = (
                f"several series for deployment {key[0]}/{key[1]}; "
                "the wake query must aggregate by (namespace, deployment)"
            )
            return None
        value = outcome.values.get(key)
        return value if value is not None and math.isfinite(value) else None

    def signals_for(self, target: ComponentTarget, outcomes: Mapping[str, QueryOutcome]) -> Signals:
        """Aggregate one component over the leader pods of its ready gangs."""
        namespace = target.key.namespace
        leaders = [leader_pod_name(target.key.lws, g) for g in sorted(target.ready_group_indexes)]
        stale = {pod: self._stale_reason(outcomes, namespace, pod) for pod in leaders}
        reasons: dict[str, str] = {}

        def aggregate(signal: str, query_name: str, *, mean: bool) -> float | None:
            outcome = outcomes[query_name]
            if outcome.error is not None:
                reasons[signal] = outcome.error
                return None
            if not leaders:
                reasons[signal] = "no ready gang"
                return None
            values = []
            for pod in leaders:
                stale_reason = stale[pod]
                if stale_reason is not None:
                    reasons[signal] = stale_reason
                    return None
                value, reason = _pod_value(outcome, namespace, pod)
                if value is None:
                    # A partial sum would understate the load of the whole component.
                    reasons[signal] = reason or "missing"
                    absent = (namespace, pod) not in outcome.values and (
                        (namespace, pod) not in outcome.duplicated
                    )
                    if signal == "demand" and absent and _reports_gauges(outcomes, namespace, pod):
                        reasons[signal] = _NO_RATE.format(
                            pod=f"{namespace}/{pod}", query=query_name
                        )
                    return None
                values.append(value)
            total = math.fsum(values)
            return total / len(values) if mean else total

        return Signals(
            wake_requests=self._wake_requests(target, outcomes, reasons),
            waiting_requests=aggregate("waiting_requests", "waiting", mean=False),
            running_requests=aggregate("running_requests", "running", mean=False),
            kv_usage_fraction=aggregate("kv_usage_fraction", "kv_cache", mean=True),
            demand=aggregate(
                "demand", self.queries.demand_query_name(target.component), mean=False
            ),
            missing_reasons=reasons,
        )
