"""The service's own metrics: names, labels, None removes a series, one registry each."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

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
        "balloon_gangs": 1,
        "desired_balloon_gangs": 2,
        "demand": 1200.0,
        "capacity_per_gang": 500.0,
        "learned_capacity_per_gang": 480.0,
        "forecast_demand": 1500.0,
        "forecast_demand_upper": 2100.0,
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
    assert samples[("gang_autoscaler_forecast_demand_upper", LABELS)] == 2100.0
    info = LABELS | {("lws", "llama-d")}
    assert samples[("gang_autoscaler_component_info", info)] == 1
    # the learned capacity names its LWS: a restarted instance maps it back from Prometheus
    assert samples[("gang_autoscaler_learned_capacity_per_gang", info)] == 480.0


def test_missing_value_removes_the_series_instead_of_reporting_zero() -> None:
    metrics = ServiceMetrics()
    _observe(metrics)
    _observe(metrics, forecast_demand=None, demand=None, learned_capacity_per_gang=None)
    samples = _samples(metrics)
    assert ("gang_autoscaler_forecast_demand", LABELS) not in samples
    assert not [name for name, _ in samples if name.startswith("gang_autoscaler_learned")]
    assert ("gang_autoscaler_demand", LABELS) not in samples
    assert samples[("gang_autoscaler_ready_gangs", LABELS)] == 2


def test_forget_component_drops_gauges_and_keeps_counters() -> None:
    metrics = ServiceMetrics()
    _observe(metrics)
    metrics.count_decision(DECODE, reason="scale_up_waiting")
    metrics.forget_component(DECODE)
    samples = _samples(metrics)
    assert not [name for name, _ in samples if name.endswith("_gangs")]
    assert not [name for name, _ in samples if name.endswith("_per_gang")]
    decision = LABELS | {("reason", "scale_up_waiting")}
    assert samples[("gang_autoscaler_decisions_total", decision)] == 1


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
