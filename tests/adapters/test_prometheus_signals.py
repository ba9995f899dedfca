"""Mapping query answers to component signals, without a server (the pure part of the source).

The rows are in the shape `/api/v1/query` returns; the live tests check the same mapping
against a real Prometheus.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from autoscaler.adapters.prometheus_queries import PrometheusQueries, sglang_queries
from autoscaler.adapters.prometheus_source import (
    ComponentTarget,
    PrometheusSource,
    QueryOutcome,
    parse_vector,
)
from autoscaler.core.model import Component, ComponentKey

REPO = Path(__file__).resolve().parents[2]
EVAL_S = 1_800_000_000.0
KEY = ComponentKey("ns", "llama-3-70b")


def vector(values: dict[str, str], *, namespace: str = "ns") -> list[dict[str, object]]:
    return [
        {"metric": {"namespace": namespace, "pod": pod}, "value": [EVAL_S, text]}
        for pod, text in values.items()
    ]


def outcomes(**overrides: QueryOutcome) -> dict[str, QueryOutcome]:
    base = {
        "waiting": parse_vector(vector({"llama-3-70b-0": "3", "llama-3-70b-1": "5"})),
        "running": parse_vector(vector({"llama-3-70b-0": "10", "llama-3-70b-1": "12"})),
        "kv_cache": parse_vector(vector({"llama-3-70b-0": "0.5", "llama-3-70b-1": "0.7"})),
        "prefill_demand": parse_vector(vector({"llama-3-70b-0": "100", "llama-3-70b-1": "50"})),
        "decode_demand": parse_vector(vector({"llama-3-70b-0": "9", "llama-3-70b-1": "1"})),
        "sample_time": parse_vector(
            vector({"llama-3-70b-0": str(EVAL_S - 1), "llama-3-70b-1": str(EVAL_S - 2)})
        ),
    }
    base.update(overrides)
    return base


def source() -> PrometheusSource:
    # No request is sent in these tests; the URL only has to parse.
    return PrometheusSource(url="http://127.0.0.1:1", staleness_limit_s=30.0)


def target(groups: set[int], component: Component = Component.PREFILL) -> ComponentTarget:
    return ComponentTarget(key=KEY, component=component, ready_group_indexes=frozenset(groups))


def test_sums_queues_averages_kv_over_ready_leaders() -> None:
    signals = source().signals_for(target({0, 1}), outcomes())
    assert signals.waiting_requests == 8.0
    assert signals.running_requests == 22.0
    assert signals.kv_usage_fraction == pytest.approx(0.6)
    assert signals.demand == 150.0
    assert signals.missing_reasons == {}


def test_only_ready_gangs_count() -> None:
    signals = source().signals_for(target({1}), outcomes())
    assert (signals.waiting_requests, signals.kv_usage_fraction) == (5.0, 0.7)


@pytest.mark.parametrize(
    ("component", "demand"),
    [
        pytest.param(Component.PREFILL, 150.0, id="prefill-reads-prompt-tokens"),
        pytest.param(Component.DECODE, 10.0, id="decode-reads-generated-tokens"),
        pytest.param(Component.UNIFIED, 150.0, id="unified-defaults-to-prompt-tokens"),
    ],
)
def test_demand_query_follows_component(component: Component, demand: float) -> None:
    assert source().signals_for(target({0, 1}, component), outcomes()).demand == demand


def test_workers_and_other_namespaces_are_ignored() -> None:
    rows = vector({"llama-3-70b-0": "3", "llama-3-70b-0-1": "100", "llama-3-70b-1": "5"})
    rows += vector({"llama-3-70b-0": "1000"}, namespace="elsewhere")
    signals = source().signals_for(target({0, 1}), outcomes(waiting=parse_vector(rows)))
    assert signals.waiting_requests == 8.0


@pytest.mark.parametrize(
    ("waiting", "reason_part"),
    [
        pytest.param({"llama-3-70b-0": "NaN", "llama-3-70b-1": "5"}, "NaN", id="nan"),
        pytest.param({"llama-3-70b-0": "+Inf", "llama-3-70b-1": "5"}, "Inf", id="inf"),
        pytest.param(
            {"llama-3-70b-1": "5"},
            "no sample for ready leader ns/llama-3-70b-0",
            id="ready-leader-missing",
        ),
        pytest.param({}, "no sample", id="empty-result"),
    ],
)
def test_untrustworthy_values_become_none_with_reason(
    waiting: dict[str, str], reason_part: str
) -> None:
    signals = source().signals_for(target({0, 1}), outcomes(waiting=parse_vector(vector(waiting))))
    assert signals.waiting_requests is None
    assert reason_part in signals.missing_reasons["waiting_requests"]
    assert signals.running_requests == 22.0  # other signals are unaffected


def test_stale_leader_makes_every_signal_none() -> None:
    old = parse_vector(vector({"llama-3-70b-0": str(EVAL_S - 31), "llama-3-70b-1": str(EVAL_S)}))
    signals = source().signals_for(target({0, 1}), outcomes(sample_time=old))
    assert (signals.waiting_requests, signals.kv_usage_fraction, signals.demand) == (None,) * 3
    assert "31s old (limit 30s)" in signals.missing_reasons["demand"]


@pytest.mark.parametrize(
    ("sample_time", "reason"),
    [
        pytest.param(
            {"llama-3-70b-1": str(EVAL_S)},
            "freshness query (sample_time) returned no sample for ready leader ns/llama-3-70b-0",
            id="leader-missing",
        ),
        # vLLM's freshness query on SGLang pods: the signal queries answer, this one does not
        pytest.param(
            {},
            "freshness query (sample_time) returned no sample for ready leader ns/llama-3-70b-0",
            id="empty-result",
        ),
        pytest.param(
            {"llama-3-70b-0": "NaN", "llama-3-70b-1": str(EVAL_S)},
            "NaN for ns/llama-3-70b-0",
            id="nan",
        ),
    ],
)
def test_leader_without_a_sample_time_makes_every_signal_none_naming_why(
    sample_time: dict[str, str], reason: str
) -> None:
    signals = source().signals_for(
        target({0, 1}), outcomes(sample_time=parse_vector(vector(sample_time)))
    )
    assert signals.missing_reasons == {
        "waiting_requests": reason,
        "running_requests": reason,
        "kv_usage_fraction": reason,
        "demand": reason,
    }
    assert signals.waiting_requests is None and signals.demand is None


def test_query_error_makes_that_signal_none() -> None:
    failed = QueryOutcome(error="prometheus http_4xx: bad_data")
    signals = source().signals_for(target({0, 1}), outcomes(kv_cache=failed))
    assert signals.kv_usage_fraction is None
    assert signals.missing_reasons == {"kv_usage_fraction": "prometheus http_4xx: bad_data"}
    assert signals.waiting_requests == 8.0


def test_a_demand_rate_with_no_sample_where_the_gauges_answer_points_at_the_window() -> None:
    """At Prometheus's default 1m scrape interval the default `rate(...[1m])` never holds two
    samples: every tick said "no sample for ready leader" of a pod whose gauges answered,
    and demand (the forecast, the learned capacity) was never read."""
    no_rate = parse_vector(vector({}))
    signals = source().signals_for(target({0, 1}), outcomes(prefill_demand=no_rate))
    assert signals.demand is None and signals.waiting_requests == 8.0
    reason = signals.missing_reasons["demand"]
    assert "ns/llama-3-70b-0 from the prefill_demand query" in reason
    assert "rate() needs two samples in its window" in reason
    # a leader that answers nothing at all is just missing
    silent = parse_vector(vector({"llama-3-70b-1": "5"}))
    signals = source().signals_for(target({0, 1}), outcomes(prefill_demand=no_rate, waiting=silent))
    assert signals.missing_reasons["demand"] == "no sample for ready leader ns/llama-3-70b-0"
    # a value that is there but unusable keeps its own reason
    nan = parse_vector(vector({"llama-3-70b-0": "NaN", "llama-3-70b-1": "5"}))
    signals = source().signals_for(target({0, 1}), outcomes(prefill_demand=nan))
    assert signals.missing_reasons["demand"] == "NaN for ns/llama-3-70b-0"


def test_no_ready_gang_is_missing_not_zero() -> None:
    signals = source().signals_for(target(set()), outcomes())
    assert signals.waiting_requests is None
    assert signals.missing_reasons["waiting_requests"] == "no ready gang"


def test_unaggregated_query_is_flagged() -> None:
    rows = vector({"llama-3-70b-0": "1"}) + vector({"llama-3-70b-0": "2", "llama-3-70b-1": "5"})
    signals = source().signals_for(target({0, 1}), outcomes(waiting=parse_vector(rows)))
    assert signals.waiting_requests is None
    assert "several series" in signals.missing_reasons["waiting_requests"]


def test_parse_vector_reads_special_floats() -> None:
    parsed = parse_vector(vector({"a-0": "NaN", "a-1": "-Inf"}))
    assert math.isnan(parsed.values[("ns", "a-0")])
    assert parsed.values[("ns", "a-1")] == -math.inf
    assert parsed.eval_time_s == EVAL_S


def test_queries_must_keep_pod_labels() -> None:
    with pytest.raises(ValidationError, match="namespace"):
        PrometheusQueries(waiting="sum(vllm:num_requests_waiting)")
    with pytest.raises(ValidationError):
        PrometheusQueries(unknown="x")  # type: ignore[call-arg]


def test_the_wake_query_keeps_the_deployment_label_not_the_pod() -> None:
    with pytest.raises(ValidationError, match="`deployment`"):
        PrometheusQueries(wake="sum by (namespace, pod) (gateway_queue)")
    queries = PrometheusQueries(wake="sum by (namespace, deployment) (gateway_queue)")
    assert "wake" in queries.instant_queries()


def test_the_wake_query_maps_by_deployment_and_a_missing_row_is_no_request() -> None:
    wake = parse_vector(
        [{"metric": {"namespace": "ns", "deployment": "llama"}, "value": [1.0, "3"]},
         {"metric": {"namespace": "ns", "deployment": "other"}, "value": [1.0, "NaN"]}],
        label="deployment",
    )  # fmt: skip
    src = source()
    for deployment, expected in (("llama", 3.0), ("other", None), ("absent", None)):
        found = replace(target(set()), deployment=deployment, at_zero=True)
        signals = src.signals_for(found, outcomes(wake=wake))
        assert signals.wake_requests == expected
        assert "wake_requests" not in signals.missing_reasons
    at_zero = replace(target(set()), deployment="llama", at_zero=True)
    failed = src.signals_for(at_zero, outcomes(wake=QueryOutcome(error="timeout")))
    assert failed.wake_requests is None and failed.missing_reasons["wake_requests"] == "timeout"
    # a component with gangs never reads it, nor reports its errors
    running = replace(at_zero, at_zero=False)
    assert src.signals_for(running, outcomes(wake=wake)).wake_requests is None
    quiet = src.signals_for(running, outcomes(wake=QueryOutcome(error="timeout")))
    assert "wake_requests" not in quiet.missing_reasons


def test_query_set_is_fixed() -> None:
    assert set(PrometheusQueries().instant_queries()) == {
        "waiting", "running", "kv_cache", "prefill_demand", "decode_demand", "sample_time",
    }  # fmt: skip
    with_unified = PrometheusQueries(
        unified_demand="sum by (namespace, pod) (rate(vllm:request_success_total[1m]))"
    )
    assert len(with_unified.instant_queries()) == 7
    assert len(sglang_queries().instant_queries()) == 6


@pytest.mark.parametrize(
    ("queries", "per_tick", "documented"),
    [
        pytest.param(
            PrometheusQueries(), 6, "With the default settings that is six", id="defaults"
        ),
        pytest.param(
            PrometheusQueries(unified_demand="sum by (namespace, pod) (vllm:requests_total)"),
            7,
            "It is seven when `unified_demand` is set",
            id="unified-demand-set",
        ),
        pytest.param(
            PrometheusQueries(sample_time=None),
            5,
            "one fewer when `sample_time` is null",
            id="no-freshness-query",
        ),
    ],
)
def test_docs_give_the_number_of_queries_a_tick_sends(
    queries: PrometheusQueries, per_tick: int, documented: str
) -> None:
    # The live test counts what a real Prometheus receives for the first two; this keeps
    # docs/prometheus.md, which operators size Prometheus by, saying the same.
    assert len(queries.instant_queries()) == per_tick
    docs = " ".join((REPO / "docs" / "prometheus.md").read_text().split())
    assert documented in docs


BY = "sum by (namespace, pod)"


@pytest.mark.parametrize(
    ("queries", "window_s"),
    [
        pytest.param(PrometheusQueries.vllm(), 60.0, id="vllm-default-not-its-5m-mean"),
        pytest.param(PrometheusQueries.vllm(rate_window="5m"), 300.0, id="vllm-5m"),
        pytest.param(PrometheusQueries.vllm(rate_window="1d", mean_window="2d"), 86_400.0,
                     id="days"),
        pytest.param(PrometheusQueries.vllm(rate_window="1h30m", mean_window="2h"), 5_400.0,
                     id="compound"),
        pytest.param(sglang_queries(), 60.0, id="sglang"),
        pytest.param(PrometheusQueries(prefill_demand=f"{BY} (rate(x[30s:5s]))",
                                       decode_demand=f"{BY} (rate(y[2m]))"), 120.0,
                     id="subquery-and-the-longest-query"),
        pytest.param(PrometheusQueries(prefill_demand=f"{BY} (x:rate1m)",
                                       decode_demand=f"{BY} (y:rate1m)"), None,
                     id="recording-rules-say-nothing"),
    ],
)  # fmt: skip
def test_the_demand_queries_rate_window_is_read_from_their_text(
    queries: PrometheusQueries, window_s: float | None
) -> None:
    assert queries.demand_rate_window_s() == window_s
