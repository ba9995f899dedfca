"""The service's own Prometheus metrics (`/metrics`), named and labelled for the dashboards.

One `ServiceMetrics` per service instance, each on its own `CollectorRegistry`, so two
instances in one process (tests, the leader-election test) never share or clash. The names
below are a contract with `dashboards/` and `docs/operators.md`; `tests/dashboards` fails
when a dashboard uses a `gang_autoscaler_*` name that is not defined here.

Per-component gauges are labelled `namespace`, `deployment`, `component` (the names of the
Kubernetes objects, never annotation text), which is why a ServiceMonitor scraping them needs
`honorLabels: true`: otherwise Prometheus renames `namespace` to `exported_namespace`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from autoscaler.adapters.prometheus_restore import (
    DRY_RUN_LABEL,
    IDENTITY_LABELS,
    LEARNED_CAPACITY_METRIC,
    LEARNED_CAPACITY_REPORTED_METRIC,
    CapacityIdentity,
)

PREFIX = "gang_autoscaler_"

COMPONENT_LABELS: tuple[str, ...] = ("namespace", "deployment", "component")

# Ticks normally take milliseconds to a second; the top buckets show a tick running into
# its deadline (a slow Prometheus or API server).
TICK_BUCKETS_S: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
    30.0,
)


@dataclass(frozen=True, slots=True)
class ComponentLabels:
    """The identity of one component on every per-component series."""

    namespace: str
    deployment: str
    component: str
    lws: str

    def values(self) -> tuple[str, str, str]:
        return (self.namespace, self.deployment, self.component)


class ServiceMetrics:
    """Every metric the service exports, on a registry of its own.

    Gauges of a component are set by `observe_component` each tick. A value that is None
    (no data this tick) removes that series instead of reporting 0: a 0 on a dashboard reads
    as "no load" and would hide the gap. `forget_component` drops every series of a component
    that is gone, and the service calls it for all components when it stops being the leader,
    so that only the leader reports per-component state.
    """

    def __init__(self, *, dry_run: bool = False) -> None:
        """`dry_run`: this instance never writes (its learned capacities say so)."""
        # No `_created` series beside every counter and histogram: nothing reads them, and
        # they were one sample in seven (prometheus_client's switch is process-wide).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.dry_run = dry_run
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # process_start_time_seconds (a restart loop: the GangAutoscalerRestarting alert),
        # resident memory against the container's limit, CPU seconds, open file descriptors
        ProcessCollector(registry=r)

        self.component_info = Gauge(
            PREFIX + "component_info",
            "Always 1: maps a component to its LeaderWorkerSet, for joining vLLM pod metrics "
            "(pods are named <lws>-<group>) to deployments and components.",
            [*COMPONENT_LABELS, "lws"],
            registry=r,
        )
        self.current_gangs = Gauge(
            PREFIX + "current_gangs",
            "Gangs the LeaderWorkerSet asks for now (spec.replicas).",
            COMPONENT_LABELS,
            registry=r,
        )
        self.desired_gangs = Gauge(
            PREFIX + "desired_gangs",
            "Gangs the last plan wants for the component.",
            COMPONENT_LABELS,
            registry=r,
        )
        self.ready_gangs = Gauge(
            PREFIX + "ready_gangs",
            "Gangs whose every pod is Ready.",
            COMPONENT_LABELS,
            registry=r,
        )
        self.partial_gangs = Gauge(
            PREFIX + "partial_gangs",
            "Gangs with some pods placed and some Pending (they hold GPUs and serve nothing).",
            COMPONENT_LABELS,
            registry=r,
        )
        self.unplaced_gangs = Gauge(
            PREFIX + "unplaced_gangs",
            "Gangs with no pod placed for longer than gang-timeout, kept while the cluster "
            "can grow: nodes that are slow or not coming, or pods refused (a quota).",
            COMPONENT_LABELS,
            registry=r,
        )
        self.balloon_gangs = Gauge(
            PREFIX + "balloon_gangs",
            "Balloon gangs that exist for the component (all members present).",
            COMPONENT_LABELS,
            registry=r,
        )
        self.desired_balloon_gangs = Gauge(
            PREFIX + "desired_balloon_gangs",
            "Balloon gangs the last plan wants for the component.",
            COMPONENT_LABELS,
            registry=r,
        )
        self.demand = Gauge(
            PREFIX + "demand",
            "Estimated demand arriving now, in the demand signal's unit (tokens/s by default).",
            COMPONENT_LABELS,
            registry=r,
        )
        self.capacity_per_gang = Gauge(
            PREFIX + "capacity_per_gang",
            "Demand one gang serves at target, from the policy or learned; same unit as demand.",
            COMPONENT_LABELS,
            registry=r,
        )
        self.burst_factor = Gauge(
            PREFIX + "burst_factor",
            "Spread of the last 30 minutes of demand readings (their p90 over their mean, "
            "1 to 3) that the forecast floor plans for.",
            COMPONENT_LABELS,
            registry=r,
        )
        # Labelled with what the value is valid for: a restarted instance reads it back
        # for the same LWS object and demand query only; and whether a dry-run instance
        # learned it (a writing one does not take a dry-run shadow's value).
        learned_labels = [*COMPONENT_LABELS, "lws", *IDENTITY_LABELS, DRY_RUN_LABEL]
        self.learned_capacity_per_gang = Gauge(
            LEARNED_CAPACITY_METRIC,
            "Capacity per gang the component learned from its saturated throughput (absent "
            "until learned); a restarted instance reads it back from Prometheus.",
            learned_labels,
            registry=r,
        )
        self.learned_capacity_reported = Gauge(
            LEARNED_CAPACITY_REPORTED_METRIC,
            "Unix time this instance last reported learned_capacity_per_gang; tells a "
            "restarted instance which of several instances' series is the newest.",
            learned_labels,
            registry=r,
        )
        self._learned_series: dict[ComponentLabels, tuple[str, ...]] = {}
        self.forecast_demand = Gauge(
            PREFIX + "forecast_demand",
            "Forecast point of demand one lead time ahead; same unit as demand.",
            COMPONENT_LABELS,
            registry=r,
        )
        self.forecast_demand_upper = Gauge(
            PREFIX + "forecast_demand_upper",
            "Upper prediction bound of demand one lead time ahead; sizes the balloon buffer.",
            COMPONENT_LABELS,
            registry=r,
        )
        self.decisions = Counter(
            PREFIX + "decisions",
            "Plans made per component, by the reason for the final number of gangs.",
            [*COMPONENT_LABELS, "reason"],
            registry=r,
        )
        self.scale_writes = Counter(
            PREFIX + "scale_writes",
            "Writes to a LeaderWorkerSet's /scale subresource, by direction (up, down).",
            [*COMPONENT_LABELS, "direction"],
            registry=r,
        )
        self.learned_capacity_forgotten = Counter(
            PREFIX + "learned_capacity_forgotten",
            "Learned capacities per gang dropped because the LeaderWorkerSet's gang template "
            "(a new image, model or parallelism), its demand query (a new component kind or "
            "query) or the object itself changed; learned again at the next saturation.",
            COMPONENT_LABELS,
            registry=r,
        )
        self.errors = Counter(
            PREFIX + "errors",
            "Errors by kind (prometheus, kubernetes, lease, forecast, plan, tick_deadline, ...); "
            "the component concerned holds.",
            ["kind"],
            registry=r,
        )
        self.policy_errors = Counter(
            PREFIX + "policy_errors",
            "Bad policy annotations found, by LeaderWorkerSet and annotation key.",
            ["namespace", "lws", "annotation"],
            registry=r,
        )
        self.policy_problems = Gauge(
            PREFIX + "policy_problems",
            "Problems in each LeaderWorkerSet's policy annotations now, by annotation key; "
            "its component holds while the series exists.",
            ["namespace", "lws", "annotation"],
            registry=r,
        )
        self._policy_problem_series: set[tuple[str, str, str]] = set()
        self.tick_duration = Histogram(
            PREFIX + "tick_duration_seconds",
            "Wall time of one control-loop tick.",
            buckets=TICK_BUCKETS_S,
            registry=r,
        )
        self.last_tick = Gauge(
            PREFIX + "last_tick_timestamp_seconds",
            "Unix time at which the last tick finished.",
            registry=r,
        )
        self.leader = Gauge(
            PREFIX + "leader",
            "1 while this instance holds the leader Lease and writes, 0 on a standby.",
            registry=r,
        )
        self.watch_failing = Gauge(
            PREFIX + "watch_failing_seconds",
            "How long each watch cache (leaderworkersets, pods, nodes, "
            "disaggregatedsetrolescalers) has failed to list and watch, 0 while it works; past "
            "watchStalenessLimit every component holds.",
            ["cache"],
            registry=r,
        )
        self.prometheus_queries = Gauge(
            PREFIX + "prometheus_queries_per_tick",
            "Prometheus queries the last tick sent; must not grow with the number of deployments.",
            registry=r,
        )

    # -- per component --------------------------------------------------------------------

    def observe_component(
        self,
        labels: ComponentLabels,
        *,
        current_gangs: int | None,
        desired_gangs: int | None,
        ready_gangs: int | None,
        partial_gangs: int | None,
        balloon_gangs: int | None,
        desired_balloon_gangs: int | None,
        demand: float | None,
        capacity_per_gang: float | None,
        forecast_demand: float | None,
        forecast_demand_upper: float | None,
        burst_factor: float | None = None,
        unplaced_gangs: int | None = None,
    ) -> None:
        """Set every gauge of one component from one tick; None removes that series."""
        self.component_info.labels(*labels.values(), labels.lws).set(1)
        for gauge, value in (
            (self.current_gangs, current_gangs),
            (self.desired_gangs, desired_gangs),
            (self.ready_gangs, ready_gangs),
            (self.partial_gangs, partial_gangs),
            (self.unplaced_gangs, unplaced_gangs),
            (self.balloon_gangs, balloon_gangs),
            (self.desired_balloon_gangs, desired_balloon_gangs),
            (self.demand, demand),
            (self.capacity_per_gang, capacity_per_gang),
            (self.forecast_demand, forecast_demand),
            (self.forecast_demand_upper, forecast_demand_upper),
            (self.burst_factor, burst_factor),
        ):
            _set_or_remove(gauge, labels.values(), value)

    def observe_learned_capacity(
        self, labels: ComponentLabels, *, identity: CapacityIdentity, value: float | None
    ) -> None:
        """The learned capacity per gang and the time of this report; None removes both."""
        series = (
            *labels.values(),
            labels.lws,
            *identity.label_values(),
            "true" if self.dry_run else "false",
        )
        previous = self._learned_series.get(labels)
        if previous is not None and (previous != series or value is None):
            self._forget_learned(labels)
        if value is None:
            return
        self.learned_capacity_per_gang.labels(*series).set(value)
        self.learned_capacity_reported.labels(*series).set_to_current_time()
        self._learned_series[labels] = series

    def _forget_learned(self, labels: ComponentLabels) -> None:
        series = self._learned_series.pop(labels, None)
        if series is not None:
            _remove(self.learned_capacity_per_gang, series)
            _remove(self.learned_capacity_reported, series)

    def count_decision(self, labels: ComponentLabels, *, reason: str) -> None:
        self.decisions.labels(*labels.values(), reason).inc()

    def count_forgotten_capacity(self, labels: ComponentLabels) -> None:
        self.learned_capacity_forgotten.labels(*labels.values()).inc()

    def count_scale_write(self, labels: ComponentLabels, *, from_gangs: int, to_gangs: int) -> None:
        if to_gangs != from_gangs:
            direction = "up" if to_gangs > from_gangs else "down"
            self.scale_writes.labels(*labels.values(), direction).inc()

    def forget_component(self, labels: ComponentLabels, *, series_shared: bool = False) -> None:
        """Drop the series of a component that is gone (or that this standby does not own).
        With `series_shared`, another LWS reports under the same (namespace, deployment,
        component) labels (a DisaggregatedSet rollout's old and new role LWS): only what
        names this LWS goes. Samples already scraped stay in Prometheus for `increase()`."""
        _remove(self.component_info, (*labels.values(), labels.lws))
        self._forget_learned(labels)
        if series_shared:
            return
        self.forget_component_counters(labels)
        for gauge in (
            self.current_gangs,
            self.desired_gangs,
            self.ready_gangs,
            self.partial_gangs,
            self.unplaced_gangs,
            self.balloon_gangs,
            self.desired_balloon_gangs,
            self.demand,
            self.capacity_per_gang,
            self.forecast_demand,
            self.forecast_demand_upper,
            self.burst_factor,
        ):
            _remove(gauge, labels.values())

    def forget_component_counters(self, labels: ComponentLabels) -> None:
        """Drop the counters of a component that is gone for good (deleted, opted out, or
        moved to another deployment or kind), whatever their other labels: kept, each deleted
        deployment left up to 30 series behind for as long as the service ran. Samples
        already scraped stay in Prometheus for `increase()`."""
        for counter in (self.decisions, self.scale_writes, self.learned_capacity_forgotten):
            _remove_matching(counter, labels.values())

    def forget_policy_errors(self, *, namespace: str, lws: str) -> None:
        """Drop the policy-error counters of an LWS that no longer exists (or opted out)."""
        _remove_matching(self.policy_errors, (namespace, lws))

    # -- service-wide ---------------------------------------------------------------------

    def count_error(self, kind: str, count: int = 1) -> None:
        self.errors.labels(kind).inc(count)

    def count_policy_error(self, *, namespace: str, lws: str, annotation: str) -> None:
        self.policy_errors.labels(namespace, lws, annotation).inc()

    def set_policy_problems(self, problems: Mapping[tuple[str, str, str], int]) -> None:
        """The current problems by (namespace, lws, annotation); series of problems that
        went away are removed (a fixed annotation leaves no series behind)."""
        for gone in self._policy_problem_series - problems.keys():
            _remove(self.policy_problems, gone)
        for labels, count in problems.items():
            self.policy_problems.labels(*labels).set(count)
        self._policy_problem_series = set(problems)

    def observe_tick(self, *, duration_s: float, finished_at_s: float, queries: int) -> None:
        self.tick_duration.observe(duration_s)
        self.last_tick.set(finished_at_s)
        self.prometheus_queries.set(queries)

    def observe_watch_caches(self, failing_s: Mapping[str, float]) -> None:
        for cache, seconds in failing_s.items():
            self.watch_failing.labels(cache).set(seconds)

    def set_leader(self, is_leader: bool) -> None:
        self.leader.set(1 if is_leader else 0)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of this registry and its content type, for `/metrics`."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _set_or_remove(gauge: Gauge, label_values: tuple[str, ...], value: float | None) -> None:
    if value is None:
        _remove(gauge, label_values)
    else:
        gauge.labels(*label_values).set(value)


def _remove_matching(metric: Counter | Gauge, leading: tuple[str, ...]) -> None:
    """Remove every series of `metric` whose first label values are `leading`."""
    # the client has no public way to list a metric's label names
    names = metric._labelnames
    found = {
        tuple(sample.labels[name] for name in names)
        for family in metric.collect()
        for sample in family.samples
        if all(sample.labels.get(n) == value for n, value in zip(names, leading, strict=False))
    }
    for label_values in found:
        _remove(metric, label_values)


def _remove(metric: Counter | Gauge, label_values: tuple[str, ...]) -> None:
    # prometheus-client raises KeyError for a series that was never set; absent is the goal.
    with contextlib.suppress(KeyError):
        metric.remove(*label_values)
