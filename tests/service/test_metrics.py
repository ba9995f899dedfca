"""The service's own metrics: names, labels, None removes a series, one registry each."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from autoscaler.adapters.prometheus_restore import CapacityIdentity
from autoscaler.service.metrics import ComponentLabels, ServiceMetrics

DECODE = ComponentLabels(namespace="serving", deployment="llama", component="decode", lws="llama-d")


def _samples(metrics: ServiceMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def _observe(metrics: ServiceMetrics, **overrides: float | None) -> None:
    values: dict[str, float | None] = {
        "current_gangs": 2,
        "desired_gangs": 3,
        "ready_gangs": 2,
        "partial_gangs": 1,
        "unplaced_gangs": 1,
        "balloon_gangs": 1,
        "desired_balloon_gangs": 2,
        "demand": 1200.0,
        "capacity_per_gang": 500.0,
        "forecast_demand": 1500.0,
        "forecast_demand_upper": 2100.0,
        "burst_factor": 1.42,
    }
    values.update(overrides)
    metrics.observe_component(DECODE, **values)  # type: ignore[arg-type]


LABELS = frozenset({("namespace", "serving"), ("deployment", "llama"), ("component", "decode")})


def test_component_gauges_carry_namespace_deployment_component() -> None:
    metrics = ServiceMetrics()
    _observe(metrics)
    samples = _samples(metrics)
    assert samples[("gang_autoscaler_desired_gangs", LABELS)] == 3
    assert samples[("gang_autoscaler_partial_gangs", LABELS)] == 1
    assert samples[("gang_autoscaler_unplaced_gangs", LABELS)] == 1
    assert samples[("gang_autoscaler_forecast_demand_upper", LABELS)] == 2100.0
    assert samples[("gang_autoscaler_burst_factor", LABELS)] == 1.42
    info = LABELS | {("lws", "llama-d")}
    assert samples[("gang_autoscaler_component_info", info)] == 1


def test_missing_value_removes_the_series_instead_of_reporting_zero() -> None:
    metrics = ServiceMetrics()
    _observe(metrics)
    _observe(metrics, forecast_demand=None, demand=None)
    samples = _samples(metrics)
    assert ("gang_autoscaler_forecast_demand", LABELS) not in samples
    assert ("gang_autoscaler_demand", LABELS) not in samples
    assert samples[("gang_autoscaler_ready_gangs", LABELS)] == 2


LEARNED = "gang_autoscaler_learned_capacity_per_gang"
REPORTED = "gang_autoscaler_learned_capacity_reported_timestamp_seconds"


def test_learned_capacity_names_what_it_is_valid_for_and_when_it_was_reported() -> None:
    metrics = ServiceMetrics()
    identity = CapacityIdentity(lws_uid="uid-1", demand_query="3f2a9c0d1e4b", template="9b1c")
    before = time.time()
    metrics.observe_learned_capacity(DECODE, identity=identity, value=480.0)
    series = LABELS | {
        ("lws", "llama-d"),
        ("lws_uid", "uid-1"),
        ("template", "9b1c"),
        ("demand_query", "3f2a9c0d1e4b"),
        ("dry_run", "false"),
    }
    samples = _samples(metrics)
    assert samples[(LEARNED, series)] == 480.0
    assert before <= samples[(REPORTED, series)] <= time.time()
    # a dry-run instance says so: a writing one does not restore what it learned
    shadow = ServiceMetrics(dry_run=True)
    shadow.observe_learned_capacity(DECODE, identity=identity, value=900.0)
    shadow_series = (series - {("dry_run", "false")}) | {("dry_run", "true")}
    assert _samples(shadow)[(LEARNED, shadow_series)] == 900.0

    # a recreated LWS or a new template: the old series goes, the new one comes
    for recreated in (
        CapacityIdentity(lws_uid="uid-2", demand_query="3f2a9c0d1e4b", template="9b1c"),
        CapacityIdentity(lws_uid="uid-2", demand_query="3f2a9c0d1e4b", template="77aa"),
    ):
        metrics.observe_learned_capacity(DECODE, identity=recreated, value=300.0)
        samples = _samples(metrics)
        assert [
            (dict(s)["template"], v) for (name, s), v in samples.items() if name == LEARNED
        ] == [(recreated.template, 300.0)]
        assert len([name for name, _ in samples if name == REPORTED]) == 1

    # not learned (yet): nothing, rather than a 0
    metrics.observe_learned_capacity(DECODE, identity=recreated, value=None)
    assert not [name for name, _ in _samples(metrics) if "learned" in name]


def test_forget_component_drops_its_series_and_keeps_what_another_lws_shares() -> None:
    metrics = ServiceMetrics()
    _observe(metrics)
    metrics.observe_learned_capacity(
        DECODE, identity=CapacityIdentity(lws_uid="u", template="t", demand_query="q"), value=480.0
    )
    metrics.count_decision(DECODE, reason="scale_up_waiting")
    # the old role LWS of a DisaggregatedSet rollout goes; the new one reports the same
    # (namespace, deployment, component): only what names the old LWS goes
    metrics.forget_component(DECODE, series_shared=True)
    samples = _samples(metrics)
    assert not [name for name, _ in samples if "learned" in name or name.endswith("_info")]
    decision = LABELS | {("reason", "scale_up_waiting")}
    assert samples[("gang_autoscaler_decisions_total", decision)] == 1
    assert [name for name, _ in samples if name.endswith("_gangs")]
    # gone for good: nothing of it stays
    metrics.forget_component(DECODE)
    samples = _samples(metrics)
    assert not [name for name, labels in samples if ("component", "decode") in labels]


def test_forgetting_a_components_counters_leaves_the_others() -> None:
    """Each deleted deployment left its counters (every decision reason, both write
    directions) exported for as long as the service ran."""
    metrics = ServiceMetrics()
    other = ComponentLabels(namespace="serving", deployment="llama-2", component="decode",
                            lws="llama-2-d")  # fmt: skip
    for labels in (DECODE, other):
        for reason in ("scale_up_waiting", "steady"):
            metrics.count_decision(labels, reason=reason)
        metrics.count_scale_write(labels, from_gangs=1, to_gangs=2)
        metrics.count_forgotten_capacity(labels)
    metrics.count_policy_error(namespace="serving", lws="llama-d", annotation="x")
    metrics.count_policy_error(namespace="serving", lws="llama-2-d", annotation="x")
    metrics.forget_component_counters(DECODE)
    metrics.forget_policy_errors(namespace="serving", lws="llama-d")
    left = {dict(labels).get("deployment") or dict(labels).get("lws")
            for name, labels in _samples(metrics)
            if name.startswith(("gang_autoscaler_decisions", "gang_autoscaler_scale_writes",
                                "gang_autoscaler_learned_capacity_forgotten",
                                "gang_autoscaler_policy_errors"))}  # fmt: skip
    assert left == {"llama-2", "llama-2-d"}


def test_counters_histogram_and_service_gauges() -> None:
    metrics = ServiceMetrics()
    metrics.count_error("prometheus")
    metrics.count_error("prometheus")
    metrics.count_policy_error(
        namespace="serving", lws="llama-d", annotation="gang-autoscaler.io/max-replicas"
    )
    metrics.count_scale_write(DECODE, from_gangs=2, to_gangs=3)
    metrics.count_scale_write(DECODE, from_gangs=3, to_gangs=3)  # no write, no count
    metrics.observe_tick(duration_s=0.2, finished_at_s=1_700_000_000.0, queries=5)
    metrics.set_leader(True)
    samples = _samples(metrics)
    assert samples[("gang_autoscaler_errors_total", frozenset({("kind", "prometheus")}))] == 2
    policy = frozenset(
        {
            ("namespace", "serving"),
            ("lws", "llama-d"),
            ("annotation", "gang-autoscaler.io/max-replicas"),
        }
    )
    assert samples[("gang_autoscaler_policy_errors_total", policy)] == 1
    assert samples[("gang_autoscaler_scale_writes_total", LABELS | {("direction", "up")})] == 1
    assert ("gang_autoscaler_scale_writes_total", LABELS | {("direction", "down")}) not in samples
    assert samples[("gang_autoscaler_tick_duration_seconds_count", frozenset())] == 1
    le_025 = frozenset({("le", "0.25")})
    assert samples[("gang_autoscaler_tick_duration_seconds_bucket", le_025)] == 1
    assert samples[("gang_autoscaler_leader", frozenset())] == 1
    assert samples[("gang_autoscaler_prometheus_queries_per_tick", frozenset())] == 5


def test_two_instances_do_not_share_a_registry() -> None:
    first, second = ServiceMetrics(), ServiceMetrics()
    first.count_error("kubernetes")
    assert ("gang_autoscaler_errors_total", frozenset({("kind", "kubernetes")})) not in _samples(
        second
    )


def test_counters_and_histograms_export_no_created_series() -> None:
    """prometheus_client adds a `_created` sample beside every counter and histogram series
    by default: one line in seven of the exposition, read by nothing."""
    metrics = ServiceMetrics()
    _observe(metrics)
    metrics.count_error("prometheus")
    metrics.observe_tick(duration_s=0.1, finished_at_s=1.8e9, queries=5)
    text = metrics.exposition()[0].decode()
    assert "gang_autoscaler_errors_total" in text
    assert "_created" not in text
