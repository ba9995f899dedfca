"""The Prometheus test harness itself: a real server scraping the vLLM exporter.

Other tests trust these fixtures, so check that pods show up as Prometheus sees Kubernetes
pods (`namespace`/`pod` target labels), that values set by a test arrive, and that history
loaded with promtool is queryable.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness.prometheus_server import (
    PrometheusFactory,
    PrometheusServer,
    load_openmetrics,
    prometheus_factory,  # noqa: F401  (fixture)
    require_binary,
)
from tests.harness.vllm_exporter import PodValues, VllmExporter, render_pod

pytestmark = pytest.mark.prometheus


def test_exposition_matches_vllm_v1_format() -> None:
    exporter = VllmExporter()
    exporter.add_lws(namespace="ns", lws="m", gangs=1, engines=2, values=PodValues(waiting=4))
    text = render_pod(exporter._pods[("ns", "m-0")], time.time())
    assert 'vllm:num_requests_waiting{engine="0",model_name=' in text
    assert 'vllm:num_requests_waiting{engine="1",model_name=' in text
    assert "vllm:kv_cache_usage_perc" in text and "vllm:gpu_cache_usage_perc" not in text
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0"' in text
    assert "namespace=" not in text and "pod=" not in text  # identity is a target label


def test_prometheus_scrapes_leaders_and_workers_with_pod_labels() -> None:
    with VllmExporter() as exporter:
        exporter.add_lws(
            namespace="team-a",
            lws="llama-70b-decode",
            gangs=2,
            pods_per_gang=2,
            values=PodValues(waiting=3.0, running=7.0),
        )
        exporter.add_lws(namespace="team-b", lws="qwen", gangs=1, kv_metric="old", engines=0)
        with PrometheusServer(targets=exporter.targets()) as prometheus:
            prometheus.wait_for_series("up == 1", count=5)
            waiting = {
                (r["metric"]["namespace"], r["metric"]["pod"]): float(r["value"][1])  # type: ignore[index]
                for r in prometheus.query("sum by (namespace, pod) (vllm:num_requests_waiting)")
            }
    # Workers are scraped (up == 1) but serve no vLLM series.
    assert waiting == {
        ("team-a", "llama-70b-decode-0"): 3.0,
        ("team-a", "llama-70b-decode-1"): 3.0,
        ("team-b", "qwen-0"): 0.0,
    }


def test_promtool_history_is_queryable(
    tmp_path: Path,
    prometheus_factory: PrometheusFactory,  # noqa: F811  (the fixture imported above)
) -> None:
    now = int(time.time())
    start = now - 3 * 3600
    lines = ["# TYPE vllm:num_requests_waiting gauge"]
    lines += [
        f'vllm:num_requests_waiting{{namespace="ns",pod="m-0"}} {i % 5} {start + i * 60}'
        for i in range(180)
    ]
    load_openmetrics("\n".join(lines) + "\n# EOF\n", data_dir=tmp_path / "tsdb")
    prometheus = prometheus_factory(data_dir=tmp_path / "tsdb")
    result = prometheus.query(f"count_over_time(vllm:num_requests_waiting[4h] @ {now})")
    assert [float(r["value"][1]) for r in result] == [180.0]  # type: ignore[index]


def test_missing_binary_fails_under_ci_and_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run under CI"):
        require_binary("prometheus-not-installed-here")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        require_binary("prometheus-not-installed-here")
