"""Dashboard structure, up-to-date generated files, metric names, and PromQL syntax (promtool).

The queries run against a real Prometheus in test_prometheus.py; this file needs no server.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.service.metrics import ServiceMetrics
from tests.dashboards.conftest import (
    DASHBOARD_DIR,
    DASHBOARD_FILES,
    RATE_INTERVAL,
    REPO,
    load,
    queries,
    substitute,
    variable_names,
)
from tests.harness.prometheus_server import require_binary
from tests.harness.shared_data import shared_data_path

GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s"}
SUBSTITUTIONS = {
    "namespace": "serving",
    "deployment": "llama",
    "component": "prefill|decode",
    "__rate_interval": RATE_INTERVAL,
}
# Two dashboards, by their file names; the issue names both views.
EXPECTED = {"gang-autoscaler-deployment.json", "gang-autoscaler-controller.json"}


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location(
        "dashboard_generate", DASHBOARD_DIR / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_views_exist() -> None:
    assert {p.name for p in DASHBOARD_FILES} == EXPECTED


def test_json_files_are_what_the_generator_writes() -> None:
    generator = _generator()
    assert set(generator.DASHBOARDS) == EXPECTED
    for name, build in generator.DASHBOARDS.items():
        expected = generator.render(build)
        assert (DASHBOARD_DIR / name).read_text(encoding="utf-8") == expected, (
            f"{name} is stale: run python dashboards/generate.py"
        )
        chart_copy = REPO / "charts" / "gang-autoscaler" / "dashboards" / name
        assert chart_copy.read_text(encoding="utf-8") == expected, f"chart copy of {name} drifted"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_structure(path: Path) -> None:
    board = load(path)
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    panels = board["panels"]
    assert panels
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids {ids}"
    variables = {v["name"] for v in board["templating"]["list"]}
    assert "datasource" in variables
    for panel in panels:
        where = f"{path.name} panel {panel['id']} ({panel['title']})"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], f"{where} has no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where
        for target in panel["targets"]:
            assert target["expr"].strip(), f"{where} {target['refId']} is empty"
            assert target["datasource"]["uid"] == "${datasource}", where
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, where
    for query in queries(path):
        unknown = variable_names(query.expr) - variables - GRAFANA_BUILTINS
        assert not unknown, f"{query.where} uses undefined variables {unknown}"


def test_per_deployment_view_has_the_variables_and_panels_the_issue_asks_for() -> None:
    board = load(DASHBOARD_DIR / "gang-autoscaler-deployment.json")
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"namespace", "deployment", "component"} <= set(variables)
    assert variables["component"]["multi"] and variables["component"]["includeAll"]
    exprs = "\n".join(t["expr"] for p in board["panels"] for t in p["targets"])
    for needed in (
        "gang_autoscaler_demand",
        "gang_autoscaler_forecast_demand",
        "gang_autoscaler_forecast_demand_upper",
        "gang_autoscaler_burst_factor",
        "gang_autoscaler_capacity_per_gang",
        "gang_autoscaler_desired_gangs",
        "gang_autoscaler_ready_gangs",
        "gang_autoscaler_partial_gangs",
        "gang_autoscaler_balloon_gangs",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
    ):
        assert needed in exprs, needed
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs
    annotations = [a for a in board["annotations"]["list"] if "expr" in a]
    assert annotations and "gang_autoscaler_desired_gangs" in annotations[0]["expr"]


def _service_metric_names() -> set[str]:
    names = set()
    for family in ServiceMetrics().registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type in ("counter",):
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
    return names


def _vllm_documented_names() -> set[str]:
    text = shared_data_path("vllm-metrics.md").read_text(encoding="utf-8")
    names = set(re.findall(r"`(vllm:[a-z_]+)`", text))
    histograms = {n + s for n in names for s in ("_bucket", "_sum", "_count")}
    return names | histograms


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_every_metric_name_exists(path: Path) -> None:
    service = _service_metric_names()
    vllm = _vllm_documented_names()
    for query in queries(path):
        for name in re.findall(r"\bgang_autoscaler_[a-z_]+", query.expr):
            assert name in service, f"{query.where}: {name} is not a metric of the service"
        for name in re.findall(r"vllm:[a-z_]+", query.expr):
            assert name in vllm, f"{query.where}: {name} is not a vLLM metric"


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    """promtool parses each expression as a recording rule (syntax and types, no server)."""
    promtool = require_binary("promtool")
    rules = []
    for path in DASHBOARD_FILES:
        for i, query in enumerate(queries(path)):
            rules.append(
                {"record": f"dashboard:{path.stem.replace('-', '_')}:{i}",
                 "expr": substitute(query.expr, SUBSTITUTIONS)}
            )  # fmt: skip
    assert len(rules) >= 20
    rule_file = tmp_path / "dashboards.rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(rule_file)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_promtool_check_catches_a_broken_query(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    rule_file = tmp_path / "broken.rules.yml"
    broken = {"record": "x:y", "expr": "sum by (component (gang_autoscaler_desired_gangs)"}
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [broken]}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(rule_file)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
