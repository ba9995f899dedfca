"""The optional PrometheusRule: rendered only when asked for, accepted by `promtool check
rules`, and each alert shown by `promtool test rules` to fire on its bad series once its `for`
has passed and to stay silent on healthy ones.

The input series are what Prometheus stores when it scrapes the service: each is read from a
real `ServiceMetrics` exposition (names and labels as autoscaler/service/metrics.py makes
them), plus the target labels the chart's ServiceMonitor adds (`job`, `namespace` unless the
series has its own, `pod`, `instance`).
"""

from __future__ import annotations

import copy
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.service.metrics import ComponentLabels, ServiceMetrics
from tests.charts.conftest import CHART_DIR, NAMESPACE, RELEASE, one, render_objects
from tests.charts.test_chart import KUBE_VERSIONS
from tests.harness.prometheus_server import require_binary

JOB = f"{RELEASE}-gang-autoscaler"  # the Service's name: the job its ServiceMonitor gives
ENABLED: dict[str, Any] = {
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "serviceMonitor": {"enabled": True},
}
ALERTS = {
    "GangAutoscalerDown",
    "GangAutoscalerNoLeader",
    "GangAutoscalerTickStalled",
    "GangAutoscalerRestarting",
    "GangAutoscalerClusterViewStale",
    "GangAutoscalerPartialGangs",
    "GangAutoscalerErrors",
    "GangAutoscalerPolicyErrors",
}


def enabled(**values: Any) -> dict[str, Any]:
    merged = copy.deepcopy(ENABLED)
    for key, value in values.items():
        if key == "prometheusRule":
            merged["prometheusRule"].update(value)
        else:
            merged[key] = value
    return merged


def rule_object(chart: helm.Chart, values: dict[str, Any]) -> dict[str, Any]:
    return one(render_objects(chart, values), "PrometheusRule")


def alert_rules(rule: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


@pytest.fixture(scope="module")
def rule(chart: helm.Chart) -> dict[str, Any]:
    return rule_object(chart, ENABLED)


# -- the object ------------------------------------------------------------------------------


def test_absent_by_default(chart: helm.Chart) -> None:
    assert chart.values["prometheusRule"]["enabled"] is False
    assert "PrometheusRule" not in {o["kind"] for o in render_objects(chart, None)}


def test_rendered_when_enabled(rule: dict[str, Any]) -> None:
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"] == JOB
    assert rule["metadata"]["namespace"] == NAMESPACE
    labels = rule["metadata"]["labels"]
    assert labels["release"] == "kube-prometheus-stack"
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert set(alert_rules(rule)) == ALERTS


def test_every_alert_tells_what_is_wrong_and_where_to_look(rule: dict[str, Any]) -> None:
    for name, alert in alert_rules(rule).items():
        assert name.startswith("GangAutoscaler")
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        assert set(alert["annotations"]) == {"summary", "description"}, name
        assert len(alert["annotations"]["summary"]) > 20, name
        assert len(alert["annotations"]["description"]) > 150, name


def test_the_for_durations_are_the_documented_defaults(rule: dict[str, Any]) -> None:
    fors = {name: alert.get("for") for name, alert in alert_rules(rule).items()}
    assert fors == {
        "GangAutoscalerDown": "5m",
        "GangAutoscalerNoLeader": "5m",
        "GangAutoscalerTickStalled": "2m",
        "GangAutoscalerRestarting": "1m",
        "GangAutoscalerClusterViewStale": "2m",
        "GangAutoscalerPartialGangs": "15m",
        "GangAutoscalerErrors": "30m",
        "GangAutoscalerPolicyErrors": None,  # any increase, at once
    }


def _service_metric_names() -> set[str]:
    names = set()
    for family in ServiceMetrics().registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
    return names


def test_every_metric_is_one_the_service_exports(rule: dict[str, Any]) -> None:
    exported = _service_metric_names()
    used = set()
    for alert in alert_rules(rule).values():
        used.update(re.findall(r"\b(?:gang_autoscaler|process)_[a-z_]+", alert["expr"]))
    assert used, "the alerts read no gang_autoscaler_* series"
    assert used <= exported, f"not exported by the service: {sorted(used - exported)}"


def test_dry_run_leaves_out_the_leader_alert(chart: helm.Chart) -> None:
    # In dry-run no replica takes the Lease: every one reports gang_autoscaler_leader 0.
    names = set(alert_rules(rule_object(chart, enabled(dryRun=True))))
    assert names == ALERTS - {"GangAutoscalerNoLeader"}


def test_thresholds_follow_the_values(chart: helm.Chart, rule: dict[str, Any]) -> None:
    alerts = alert_rules(rule)
    assert alerts["GangAutoscalerTickStalled"]["expr"].endswith("> 120")  # 8 ticks of 15s
    assert alerts["GangAutoscalerClusterViewStale"]["expr"].endswith("> 60")
    values = enabled(
        tick="1m30s",
        watchStalenessLimit="1.5m",
        prometheusRule={
            "stalledTicks": 4,
            "job": "gang-autoscaler-metrics",
            "for": {
                "down": "10m",
                "noLeader": "1m",
                "tickStalled": "0s",
                "restarting": "5m",
                "clusterViewStale": "1h30m",
                "partialGangs": "30m",
                "errors": "2h",
            },
        },
    )
    alerts = alert_rules(rule_object(chart, values))
    assert alerts["GangAutoscalerTickStalled"]["expr"].endswith("> 360")
    assert alerts["GangAutoscalerClusterViewStale"]["expr"].endswith("> 90")
    assert alerts["GangAutoscalerClusterViewStale"]["for"] == "1h30m"
    assert alerts["GangAutoscalerErrors"]["for"] == "2h"
    assert alerts["GangAutoscalerNoLeader"]["for"] == "1m"
    assert alerts["GangAutoscalerRestarting"]["for"] == "5m"
    for alert in alerts.values():
        assert 'job="gang-autoscaler-metrics"' in alert["expr"], alert["alert"]
        assert JOB not in alert["expr"], alert["alert"]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_lint_with_the_rule_has_no_errors_or_warnings(kube_version: str) -> None:
    report = helm.lint(CHART_DIR, ENABLED, strict=True, kube_version=f"v{kube_version}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(enabled(prometheusRule={"for": {"noLeader": "1.5m"}}), id="fractional-for"),
        pytest.param(enabled(prometheusRule={"for": {"errors": "30"}}), id="for-without-unit"),
        pytest.param(enabled(prometheusRule={"for": {"down": "5m", "x": "1m"}}), id="unknown-for"),
        pytest.param(enabled(prometheusRule={"stalledTicks": 2}), id="stalled-before-healthz"),
        pytest.param(enabled(prometheusRule={"job": 'a"b'}), id="quote-in-job"),
        pytest.param(enabled(prometheusRule={"severity": "page"}), id="unknown-key"),
    ],
)
def test_values_schema_rejects_bad_rule_values(chart: helm.Chart, values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)


def test_values_schema_accepts_good_rule_values(chart: helm.Chart) -> None:
    # The control for the cases above: each differs from this in the one value it names.
    chart.validate_schema(
        enabled(prometheusRule={"for": {"noLeader": "90s", "errors": "1h30m"}, "stalledTicks": 4})
    )


def test_the_rule_needs_something_to_scrape_the_service(chart: helm.Chart) -> None:
    """Without a ServiceMonitor or a job of the operator's own, no series of the service
    exist and GangAutoscalerDown fires for good."""
    alone = {"prometheusRule": {"enabled": True}}
    with pytest.raises(
        helm.HelmError, match=r"set serviceMonitor\.enabled=true, or prometheusRule\.job"
    ):
        render_objects(chart, alone)
    own_job = {"prometheusRule": {"enabled": True, "job": "gang-autoscaler-pods"}}
    down = alert_rules(rule_object(chart, own_job))["GangAutoscalerDown"]
    assert 'job="gang-autoscaler-pods"' in down["expr"]


# -- promtool --------------------------------------------------------------------------------


def write_rules(rule: dict[str, Any], directory: Path) -> Path:
    path = directory / "gang-autoscaler.rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool")
    return subprocess.run(
        [binary, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_checks_the_rules(rule: dict[str, Any], tmp_path: Path) -> None:
    result = promtool("check", "rules", write_rules(rule, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


@dataclass
class Replica:
    """One replica of the service: its real metrics, seen as Prometheus stores them."""

    pod: str
    namespace: str = NAMESPACE
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)

    def target_labels(self) -> dict[str, str]:
        return {
            "job": JOB,
            "namespace": self.namespace,
            "pod": self.pod,
            "instance": f"{self.pod}:8080",
        }

    def series(self, name: str, **match: str) -> dict[str, str]:
        """The labels of the one sample `name` (with `match` among its labels) that the
        replica exposes now, after the scrape: its own labels win (honorLabels)."""
        text = self.metrics.exposition()[0].decode()
        found = [
            sample.labels
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and match.items() <= sample.labels.items()
        ]
        assert len(found) == 1, f"{self.pod} exposes {len(found)} samples {name}{match}"
        return {"__name__": name, **self.target_labels(), **found[0]}


def selector(labels: dict[str, str]) -> str:
    name = labels["__name__"]
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}"


def alert_labels(labels: dict[str, str]) -> dict[str, str]:
    """The labels of an alert on this one series: its labels but the metric name."""
    return {k: v for k, v in labels.items() if k != "__name__"}


@dataclass(frozen=True)
class Case:
    """Series over time (promtool's expanding notation, one sample a minute) and, at each
    evaluation time, the labels of every alert of that name that must be firing."""

    alert: str
    series: list[tuple[dict[str, str], str]]
    expect: dict[str, list[dict[str, str]]]


A, B = f"{JOB}-7d9c5-a1b2c", f"{JOB}-7d9c5-d3e4f"
PREFILL = ComponentLabels("serving", "llama", "prefill", "llama-prefill")
DECODE = ComponentLabels("serving", "llama", "decode", "llama-decode")
PREFILL_NEXT = ComponentLabels("serving", "llama", "prefill", "llama-prefill-v2")
BAD_ANNOTATION = "gang-autoscaler.io/max-replicas"


def _up(pod: str, namespace: str = NAMESPACE, job: str = JOB) -> dict[str, str]:
    return {
        "__name__": "up",
        "job": job,
        "namespace": namespace,
        "pod": pod,
        "instance": f"{pod}:8080",
    }


def _leader(pod: str, namespace: str = NAMESPACE) -> dict[str, str]:
    replica = Replica(pod, namespace)
    replica.metrics.set_leader(False)
    return replica.series("gang_autoscaler_leader")


def _last_tick(pod: str) -> dict[str, str]:
    replica = Replica(pod)
    replica.metrics.observe_tick(duration_s=0.2, finished_at_s=1.0, queries=5)
    return replica.series("gang_autoscaler_last_tick_timestamp_seconds")


def _started(pod: str) -> dict[str, str]:
    return Replica(pod).series("process_start_time_seconds")


def _watch(pod: str, cache: str) -> dict[str, str]:
    replica = Replica(pod)
    replica.metrics.observe_watch_caches(
        {"leaderworkersets": 0.0, "pods": 0.0, "nodes": 0.0, "disaggregatedsetrolescalers": 0.0}
    )
    return replica.series("gang_autoscaler_watch_failing_seconds", cache=cache)


def _component(pod: str, component: ComponentLabels, name: str) -> dict[str, str]:
    replica = Replica(pod)
    values: dict[str, Any] = dict.fromkeys(
        (
            "current_gangs",
            "desired_gangs",
            "ready_gangs",
            "balloon_gangs",
            "desired_balloon_gangs",
            "demand",
            "capacity_per_gang",
            "forecast_demand",
            "forecast_demand_upper",
        )
    )
    replica.metrics.observe_component(component, partial_gangs=1, **values)
    return replica.series(name)


def _errors(pod: str, kind: str) -> dict[str, str]:
    replica = Replica(pod)
    replica.metrics.count_error(kind)
    return replica.series("gang_autoscaler_errors_total")


def _policy_problems(pod: str) -> dict[str, str]:
    replica = Replica(pod)
    replica.metrics.set_policy_problems({("serving", "llama-decode", BAD_ANNOTATION): 1})
    return replica.series("gang_autoscaler_policy_problems")


SERVICE_NAMESPACE = {"namespace": NAMESPACE}
PREFILL_ALERT = {
    "namespace": "serving",
    "deployment": "llama",
    "component": "prefill",
    "lws": "llama-prefill",
}
PREFILL_NEXT_ALERT = {**PREFILL_ALERT, "lws": "llama-prefill-v2"}
POLICY_ALERT = {"namespace": "serving", "lws": "llama-decode", "annotation": BAD_ANNOTATION}

CASES = [
    # -- down: no replica scraped for 5m
    pytest.param(
        Case(
            "GangAutoscalerDown",
            [(_up(A), "0x20"), (_up(B), "0x20")],
            {"4m": [], "6m": [SERVICE_NAMESPACE]},
        ),
        id="down-every-replica-fails-its-scrape",
    ),
    pytest.param(
        Case(
            "GangAutoscalerDown",
            [(_up("prometheus-0", "monitoring", "prometheus"), "1x20"), (_up(A, "team-b"), "1x20")],
            {"4m": [], "6m": [SERVICE_NAMESPACE]},
        ),
        id="down-no-target-of-this-release",
    ),
    pytest.param(
        Case("GangAutoscalerDown", [(_up(A), "1x20"), (_up(B), "0x20")], {"6m": [], "15m": []}),
        id="healthy-one-replica-up",
    ),
    # -- no leader for 5m
    pytest.param(
        Case(
            "GangAutoscalerNoLeader",
            # The same release name in another namespace leads there, not here.
            [(_leader(A), "0x20"), (_leader(B), "0x20"), (_leader(A, "team-b"), "1x20")],
            {"4m": [], "6m": [SERVICE_NAMESPACE]},
        ),
        id="no-leader",
    ),
    pytest.param(
        Case(
            "GangAutoscalerNoLeader",
            [(_leader(A), "1x20"), (_leader(B), "1x20")],
            {"4m": [], "6m": [SERVICE_NAMESPACE]},
        ),
        id="two-leaders",
    ),
    pytest.param(
        Case(
            "GangAutoscalerNoLeader",
            [(_leader(A), "1x20"), (_leader(B), "0x20")],
            {"6m": [], "15m": []},
        ),
        id="healthy-exactly-one-leader",
    ),
    pytest.param(
        Case(
            "GangAutoscalerNoLeader",
            # A hands over to B: one scrape sees no leader.
            [(_leader(A), "1x4 0x15"), (_leader(B), "0x5 1x14")],
            {"6m": [], "12m": []},
        ),
        id="healthy-leader-handover",
    ),
    # -- tick stalled: 120s (8 ticks of 15s) without a finished tick, for 2m
    pytest.param(
        Case(
            "GangAutoscalerTickStalled",
            # A's last tick finished at 300s; B goes on ticking.
            [(_last_tick(A), "0+60x5 300x15"), (_last_tick(B), "0+60x20")],
            {"9m": [], "11m": [alert_labels(_last_tick(A))]},
        ),
        id="tick-stalled-on-one-replica",
    ),
    pytest.param(
        Case(
            "GangAutoscalerTickStalled",
            # Scraped up to a minute after each tick.
            [(_last_tick(A), "0 0+60x19"), (_last_tick(B), "0+60x20")],
            {"5m": [], "15m": []},
        ),
        id="healthy-ticking",
    ),
    # -- restarting: the process started twice or more within 15m, for 1m
    pytest.param(
        Case(
            "GangAutoscalerRestarting",
            # A's loop hangs after each start and the kubelet restarts it about every 2
            # minutes (a scrape missed at each restart); B runs on
            [
                (_started(A), "1000x4 1300 1300 stale 1420 1420 stale 1540 1540 stale 1660x6"),
                (_started(B), "1000x20"),
            ],
            {"6m": [], "9m": [alert_labels(_started(A))]},
        ),
        id="restarting-in-a-loop",
    ),
    pytest.param(
        Case(
            "GangAutoscalerRestarting",
            # one restart (a node drained, an OOM once), then a rollout to a new pod
            [(_started(A), "1000x5 1300x5 stale"), (_started(B), "_x11 2000x8")],
            {"8m": [], "12m": [], "19m": []},
        ),
        id="healthy-one-restart-and-a-rollout",
    ),
    # -- cluster view stale: a watch cache failing past watchStalenessLimit (60s), for 2m
    pytest.param(
        Case(
            "GangAutoscalerClusterViewStale",
            [
                (_watch(A, "pods"), "0 0 60+60x18"),
                (_watch(A, "nodes"), "0x20"),
                (_watch(A, "leaderworkersets"), "0x20"),
            ],
            {"4m": [], "6m": [alert_labels(_watch(A, "pods"))]},
        ),
        id="view-stale-pods-watch-failing",
    ),
    pytest.param(
        Case(
            "GangAutoscalerClusterViewStale",
            [
                (_watch(A, "pods"), "0 0 45 0x17"),  # failed for 45s, then listed again
                (_watch(A, "nodes"), "0x20"),
                (_watch(B, "nodes"), "60x20"),  # at the limit: the service does not hold yet
            ],
            {"6m": [], "15m": []},
        ),
        id="healthy-watch-failing-up-to-the-limit",
    ),
    pytest.param(
        Case(
            "GangAutoscalerClusterViewStale",
            # the RoleScalers' view holds the DisaggregatedSet roles only (a policy problem)
            [(_watch(A, "disaggregatedsetrolescalers"), "0 0 60+60x18")],
            {"6m": [], "15m": []},
        ),
        id="healthy-role-scalers-failing",
    ),
    # -- partial gangs for 15m
    pytest.param(
        Case(
            "GangAutoscalerPartialGangs",
            # The leader changes from A to B at 9m; the gang stays partial throughout.
            [
                (_component(A, PREFILL, "gang_autoscaler_partial_gangs"), "1x8 stale"),
                (_component(A, PREFILL, "gang_autoscaler_component_info"), "1x8 stale"),
                (_component(B, PREFILL, "gang_autoscaler_partial_gangs"), "_x9 1x21"),
                (_component(B, PREFILL, "gang_autoscaler_component_info"), "_x9 1x21"),
            ],
            {"14m": [], "16m": [PREFILL_ALERT]},
        ),
        id="partial-gangs-across-a-leader-change",
    ),
    pytest.param(
        Case(
            "GangAutoscalerPartialGangs",
            [
                (_component(A, PREFILL, "gang_autoscaler_partial_gangs"), "1x10 0x20"),
                (_component(A, PREFILL, "gang_autoscaler_component_info"), "1x30"),
                (_component(A, DECODE, "gang_autoscaler_partial_gangs"), "0x30"),
                (_component(A, DECODE, "gang_autoscaler_component_info"), "1x30"),
            ],
            {"16m": [], "25m": []},
        ),
        id="healthy-gangs-placed-within-15m",
    ),
    pytest.param(
        Case(
            "GangAutoscalerPartialGangs",
            # A DisaggregatedSet rollout: the old and the new LWS of one component both report
            # `component_info`. One series per LWS on that side refused the match
            # (many-to-many), and the rule failed when partial gangs are likeliest.
            [
                (_component(A, PREFILL, "gang_autoscaler_partial_gangs"), "1x30"),
                (_component(A, PREFILL, "gang_autoscaler_component_info"), "1x30"),
                (_component(A, PREFILL_NEXT, "gang_autoscaler_component_info"), "1x30"),
            ],
            {"14m": [], "16m": [PREFILL_ALERT, PREFILL_NEXT_ALERT]},
        ),
        id="partial-gangs-during-a-rollout-of-two-lws",
    ),
    pytest.param(
        Case(
            "GangAutoscalerPartialGangs",
            # Both replicas export the gauges at once (dry-run, where each decides on its
            # own): one alert, not one per replica, nor a refused match.
            [
                (_component(A, PREFILL, "gang_autoscaler_partial_gangs"), "1x30"),
                (_component(A, PREFILL, "gang_autoscaler_component_info"), "1x30"),
                (_component(B, PREFILL, "gang_autoscaler_partial_gangs"), "1x30"),
                (_component(B, PREFILL, "gang_autoscaler_component_info"), "1x30"),
            ],
            {"14m": [], "16m": [PREFILL_ALERT]},
        ),
        id="partial-gangs-reported-by-both-replicas",
    ),
    # -- errors of one kind for 30m
    pytest.param(
        Case(
            "GangAutoscalerErrors",
            # Both replicas reach Prometheus through the same broken path.
            [(_errors(A, "prometheus"), "0+2x60"), (_errors(B, "prometheus"), "0+2x60")],
            {"29m": [], "32m": [{"namespace": NAMESPACE, "kind": "prometheus"}]},
        ),
        id="errors-rising",
    ),
    pytest.param(
        Case(
            "GangAutoscalerErrors",
            [(_errors(A, "kubernetes"), "0 1 2 3x57"), (_errors(A, "prometheus"), "5x60")],
            {"32m": [], "45m": []},
        ),
        id="healthy-errors-that-stopped",
    ),
    pytest.param(
        Case(
            "GangAutoscalerErrors",
            [(_errors(A, "stale_view"), "0+4x60")],
            {"45m": []},
        ),
        id="healthy-stale-view-left-to-its-own-alert",
    ),
    # -- policy errors: while a replica reports the problem, at once
    pytest.param(
        Case(
            "GangAutoscalerPolicyErrors",
            # Both replicas find it at 5m; it is fixed at 25m.
            [(_policy_problems(A), "_x5 1x20"), (_policy_problems(B), "_x5 1x20")],
            {"6m": [POLICY_ALERT], "24m": [POLICY_ALERT], "31m": []},
        ),
        id="policy-problem-until-fixed",
    ),
    pytest.param(
        Case(
            "GangAutoscalerPolicyErrors",
            # Found at 2m by one replica and never fixed: it does not fade.
            [(_policy_problems(A), "_x2 1x60")],
            {"1m": [], "45m": [POLICY_ALERT]},
        ),
        id="policy-problem-that-stays",
    ),
    pytest.param(
        Case("GangAutoscalerPolicyErrors", [(_policy_problems(A), "0x30")], {"15m": []}),
        id="healthy-no-policy-problem",
    ),
]

_LABEL_TEMPLATE = re.compile(r"\{\{ \$labels\.(\w+) \}\}")


def expanded(text: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus expands it: the rules use `{{ $labels.NAME }}` only."""
    assert "{{" not in _LABEL_TEMPLATE.sub("", text), f"unexpected template in {text!r}"
    missing = set(_LABEL_TEMPLATE.findall(text)) - set(labels)
    assert not missing, f"{text!r} reads labels the alert does not carry: {sorted(missing)}"
    return _LABEL_TEMPLATE.sub(lambda m: labels[m.group(1)], text)


def unit_test_file(case: Case, rule: dict[str, Any], rules_file: Path) -> dict[str, Any]:
    alert = alert_rules(rule)[case.alert]
    return {
        "rule_files": [rules_file.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": selector(labels), "values": values} for labels, values in case.series
                ],
                "alert_rule_test": [
                    {
                        "eval_time": eval_time,
                        "alertname": case.alert,
                        "exp_alerts": [
                            {
                                "exp_labels": {**alert["labels"], **labels},
                                "exp_annotations": {
                                    key: expanded(text, {**alert["labels"], **labels})
                                    for key, text in alert["annotations"].items()
                                },
                            }
                            for labels in firing
                        ],
                    }
                    for eval_time, firing in case.expect.items()
                ],
            }
        ],
    }


def run_case(case: Case, rule: dict[str, Any], directory: Path) -> subprocess.CompletedProcess[str]:
    rules_file = write_rules(rule, directory)
    test_file = directory / "gang-autoscaler.test.yml"
    test_file.write_text(yaml.safe_dump(unit_test_file(case, rule, rules_file), sort_keys=False))
    return promtool("test", "rules", test_file)


@pytest.mark.parametrize("case", CASES)
def test_alert_fires_on_bad_series_and_not_on_healthy_ones(
    case: Case, rule: dict[str, Any], tmp_path: Path
) -> None:
    result = run_case(case, rule, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_healthy_case() -> None:
    cases: list[Case] = [p.values[0] for p in CASES]
    fires = {c.alert for c in cases if any(c.expect.values())}
    silent = {c.alert for c in cases if not any(c.expect.values())}
    assert fires == ALERTS
    assert silent == ALERTS
    # A firing case also shows the alert silent while its `for` runs (or after it clears).
    assert all(any(not firing for firing in c.expect.values()) for c in cases)


def _case(case_id: str) -> Case:
    (found,) = [p.values[0] for p in CASES if p.id == case_id]
    return found


SERVICE_SELECTOR = f'{{job="{JOB}", namespace="{NAMESPACE}"}}'
LAST_TICK = f"gang_autoscaler_last_tick_timestamp_seconds{SERVICE_SELECTOR}"


@pytest.mark.parametrize(
    ("alert", "old", "new", "case_id"),
    [
        pytest.param("GangAutoscalerNoLeader", "!= 1", "< 1", "two-leaders", id="leader-below-1"),
        pytest.param(
            "GangAutoscalerTickStalled",
            LAST_TICK,
            f"max({LAST_TICK})",
            "tick-stalled-on-one-replica",
            id="stalled-hidden-by-max-over-replicas",
        ),
        pytest.param(
            "GangAutoscalerRestarting",
            ">= 2",
            ">= 4",
            "restarting-in-a-loop",
            id="restarts-counted-too-late",
        ),
        pytest.param(
            "GangAutoscalerClusterViewStale",
            "> 60",
            ">= 60",
            "healthy-watch-failing-up-to-the-limit",
            id="stale-at-the-limit",
        ),
        pytest.param(
            "GangAutoscalerPartialGangs",
            "group_right",
            "group_left (lws)",
            "partial-gangs-during-a-rollout-of-two-lws",
            id="partial-one-lws-per-component",
        ),
        pytest.param(
            "GangAutoscalerPartialGangs",
            "max by (namespace, deployment, component) (",
            "max by (namespace, deployment, component, pod) (",
            "partial-gangs-reported-by-both-replicas",
            id="partial-per-replica",
        ),
        pytest.param(
            "GangAutoscalerPolicyErrors",
            "max by (namespace, lws, annotation) (",
            "max by (namespace, lws) (",
            "policy-problem-until-fixed",
            id="policy-without-the-annotation",
        ),
    ],
)
def test_a_broken_expression_fails_its_case(
    rule: dict[str, Any], alert: str, old: str, new: str, case_id: str, tmp_path: Path
) -> None:
    """The cases catch what they are for: each plausible mistake makes one of them fail."""
    broken = copy.deepcopy(rule)
    target = alert_rules(broken)[alert]
    assert target["expr"].count(old) == 1, target["expr"]
    target["expr"] = target["expr"].replace(old, new)
    assert run_case(_case(case_id), rule, tmp_path).returncode == 0
    result = run_case(_case(case_id), broken, tmp_path)
    assert result.returncode != 0, f"{case_id} still passes with {target['expr']!r}"
    assert "FAILED" in result.stdout + result.stderr
