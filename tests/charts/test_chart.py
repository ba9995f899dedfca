"""The Helm chart: lint, strict Kubernetes schemas, values schema, hardening, settings."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from autoscaler.adapters.balloons import PRIORITY_CLASS_NAME, priority_class_manifest
from autoscaler.adapters.prometheus_queries import sglang_queries
from autoscaler.cli import build_parser
from autoscaler.service.settings import (
    PrometheusQueries,
    RunSettings,
    load_settings,
)
from forecasting.models import MODELS
from tests.charts.conftest import (
    CHART_DIR,
    MINIMAL_VALUES,
    NAMESPACE,
    NON_DEFAULT_VALUES,
    REPO,
    one,
    render_notes,
    render_objects,
)

# Kinds defined by CRDs: kubernetes-validate ships only the built-in API's schemas, so these
# (and only these) skip schema validation.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_lint_has_no_errors_or_warnings(kube_version: str, values: dict[str, Any] | None) -> None:
    report = helm.lint(CHART_DIR, values, strict=True, kube_version=f"v{kube_version}")
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_is_valid_for_the_kubernetes_api(
    rendered: list[dict[str, Any]], kube_version: str
) -> None:
    skipped = set()
    for obj in rendered:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            skipped.add((obj["apiVersion"], obj["kind"]))
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} ({kube_version}): {err.message}")
    assert skipped <= CRD_KINDS


def test_kube_version_range_includes_the_newest_schema() -> None:
    # The newest schema kubernetes-validate ships must be one the chart says it supports.
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.28.0-0"
    assert tuple(int(p) for p in KUBE_VERSIONS[-1].split(".")[:2]) >= (1, 30)


def test_non_default_values_render_the_optional_objects(chart: helm.Chart) -> None:
    objects = render_objects(chart, NON_DEFAULT_VALUES)
    kinds = {o["kind"] for o in objects}
    assert "ServiceMonitor" in kinds
    assert "PodDisruptionBudget" not in kinds
    assert "PriorityClass" not in kinds
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    pod_monitor = one(objects, "PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {
        "leaderworkerset.sigs.k8s.io/worker-index": "0"
    }
    assert pod_monitor["spec"]["namespaceSelector"] == {
        "matchNames": ["serving", "batch-inference"]
    }
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "openai"
    dashboards = one(objects, "ConfigMap", "-dashboards")
    assert dashboards["metadata"]["namespace"] == "monitoring"
    assert dashboards["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}


def test_values_that_read_as_numbers_or_break_yaml_render_as_strings(chart: helm.Chart) -> None:
    """A port name "on" rendered as true (and "8000" as a number, now refused), a path with ": "
    broke the YAML, and "#" cut it short; a `for` of "0" became an integer the
    PrometheusRule CRD refuses."""
    values = copy.deepcopy(NON_DEFAULT_VALUES)
    values["vllmPodMonitor"].update(port="on", path="/metrics: v1 #x")
    values["prometheusRule"] = {"enabled": True, "for": {"down": "0"}}
    objects = render_objects(chart, values)
    endpoint = one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert (endpoint["port"], endpoint["path"]) == ("on", "/metrics: v1 #x")
    rules = one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
    assert {r["alert"]: r["for"] for r in rules if "for" in r}["GangAutoscalerDown"] == "0"


def test_minimal_values_render_only_what_is_needed(chart: helm.Chart) -> None:
    objects = render_objects(chart, MINIMAL_VALUES)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "ClusterRole",  # reads
            "ClusterRole",  # writes
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Role",  # the Lease
            "RoleBinding",
            "Service",
        ]
    )
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "existing-sa"
    for binding in (o for o in objects if o["kind"].endswith("Binding")):
        assert binding["subjects"][0]["name"] == "existing-sa"


def test_default_values_render_pdb_and_balloon_priority_class(chart: helm.Chart) -> None:
    objects = render_objects(chart, None)
    assert not {"ServiceMonitor", "PodMonitor"} & {o["kind"] for o in objects}
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    # a replica that is not Ready serves nothing: a drain evicts it even with the budget short
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    priority = one(objects, "PriorityClass")
    assert priority["metadata"]["name"] == "gang-autoscaler-balloon"  # contract with the service
    assert priority["value"] == -5
    assert priority["globalDefault"] is False


@pytest.mark.parametrize(
    ("replicas", "min_available", "renders"),
    [
        pytest.param(2, 1, True, id="two-replicas-one-may-go"),
        pytest.param(3, 2, True, id="three-replicas-one-may-go"),
        pytest.param(1, 1, False, id="one-replica-no-pdb"),
        pytest.param(3, 3, False, id="min-available-at-replicas-no-pdb"),
        pytest.param(2, 5, False, id="min-available-above-replicas-no-pdb"),
    ],
)
def test_pdb_renders_only_when_it_allows_a_disruption(
    chart: helm.Chart, replicas: int, min_available: int, renders: bool
) -> None:
    # A PDB with minAvailable >= replicas allows zero disruptions: every node drain blocks.
    values = {
        "replicaCount": replicas,
        "podDisruptionBudget": {"enabled": True, "minAvailable": min_available},
    }
    pdbs = [o for o in render_objects(chart, values) if o["kind"] == "PodDisruptionBudget"]
    if renders:
        (pdb,) = pdbs
        assert pdb["spec"]["minAvailable"] == min_available < replicas
    else:
        assert pdbs == []


# A second release in the cluster, e.g. the dry-run shadow of docs/service.md: the --set
# that docs/operators.md and values.yaml give for it.
SECOND_RELEASE_SET = "dryRun=true,balloonPriorityClass.create=false,dashboards.enabled=false"


def _dashboard_uids(objects: list[dict[str, Any]]) -> list[str]:
    return [
        json.loads(text)["uid"]
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboards")
        for text in o["data"].values()
    ]


def test_a_second_release_installs_beside_the_first(chart: helm.Chart) -> None:
    assert f"--set {SECOND_RELEASE_SET}" in (REPO / "docs" / "operators.md").read_text()
    assert "balloonPriorityClass.create=false" in (CHART_DIR / "values.yaml").read_text()
    first = render_objects(chart, None)
    second = render_objects(chart, helm.parse_set_string(SECOND_RELEASE_SET), release="shadow")

    def names(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"]) for o in objects}

    # Nothing the second release owns is already owned by the first: Helm refuses to adopt
    # an object of another release, cluster-scoped or in the same namespace.
    assert names(first) & names(second) == set()
    assert "PriorityClass" not in {o["kind"] for o in second}
    # One Grafana cannot load two dashboards with one uid.
    uids = _dashboard_uids(first) + _dashboard_uids(second)
    assert len(uids) == len(set(uids))
    # The service names the class of every balloon pod by its fixed name: the first
    # release's class, which the second release's RBAC may read (and only that one).
    assert one(first, "PriorityClass")["metadata"]["name"] == PRIORITY_CLASS_NAME
    assert one(first, "PriorityClass")["value"] == priority_class_manifest()["value"]
    rule = next(
        r
        for r in one(second, "ClusterRole", "-gang-autoscaler")["rules"]
        if r["resources"] == ["priorityclasses"]
    )
    assert rule["resourceNames"] == [PRIORITY_CLASS_NAME]


def test_deployment_is_hardened_and_probed(rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] >= 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    # Service links put GANG_AUTOSCALER_SERVICE_HOST (this release's Service, when it is
    # named gang-autoscaler) among the settings' variables.
    assert pod["enableServiceLinks"] is False
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"]["memory"]
    assert container["resources"]["limits"]["memory"]
    # The service account that the RBAC binds is the one the pod runs as.
    bindings = [o for o in rendered if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) >= 3  # reads, writes, the Lease
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
        ]


def test_default_security_contexts_are_the_hardened_ones(chart: helm.Chart) -> None:
    pod = one(render_objects(chart, None), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,  # the image's USER
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# OpenShift's restricted SCC assigns the uid from the namespace's range: drop the fixed ids
# (the --set in values.yaml) and keep the rest. Helm merges a given map into the default, so
# null is what removes a key, or a whole context.
OPENSHIFT_SET = (
    "podSecurityContext.runAsUser=null,podSecurityContext.runAsGroup=null,"
    "podSecurityContext.fsGroup=null"
)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_pod_security_context_can_leave_the_uid_to_openshift(
    chart: helm.Chart, kube_version: str
) -> None:
    assert f"--set {OPENSHIFT_SET}" in (CHART_DIR / "values.yaml").read_text()
    deployment = one(render_objects(chart, helm.parse_set_string(OPENSHIFT_SET)), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["containers"]
    assert "runAsUser" not in container["securityContext"]
    kubernetes_validate.validate(deployment, kube_version, strict=True)


def test_security_contexts_can_be_overridden_or_left_out(chart: helm.Chart) -> None:
    values = {
        "podSecurityContext": None,
        "securityContext": {"runAsUser": 1000700000, "readOnlyRootFilesystem": None},
    }
    deployment = one(render_objects(chart, values), "Deployment")
    kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
    pod = deployment["spec"]["template"]["spec"]
    assert "securityContext" not in pod
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "runAsUser": 1000700000,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    values = {"securityContext": None}
    (container,) = one(render_objects(chart, values), "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    assert "securityContext" not in container


def test_extra_env_volumes_and_mounts_are_added_verbatim_after_the_charts(
    chart: helm.Chart,
) -> None:
    pod = one(render_objects(chart, NON_DEFAULT_VALUES), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    extra_env = NON_DEFAULT_VALUES["extraEnv"]
    # appended, so the chart's own (the leader-election identity among them) stay in place
    assert [e["name"] for e in container["env"][: -len(extra_env)]] == [
        "POD_NAME",
        "POD_NAMESPACE",
        "OPENBLAS_NUM_THREADS",
        "MPLCONFIGDIR",
    ]
    assert container["env"][-len(extra_env) :] == extra_env
    assert [v["name"] for v in pod["volumes"]] == ["config", "tmp", "corporate-ca"]
    assert pod["volumes"][-1] == NON_DEFAULT_VALUES["extraVolumes"][0]
    assert [m["name"] for m in container["volumeMounts"]] == ["config", "tmp", "corporate-ca"]
    assert container["volumeMounts"][-1] == NON_DEFAULT_VALUES["extraVolumeMounts"][0]


def test_metrics_service_selects_the_pods(rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment")
    service = one(rendered, "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "http"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert any(p["name"] == "http" for p in container["ports"])


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_dashboards_configmap_carries_the_repository_dashboards(
    chart: helm.Chart, values: dict[str, Any] | None
) -> None:
    configmap = one(render_objects(chart, values), "ConfigMap", "-dashboards")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = {path.name: path.read_text() for path in (REPO / "dashboards").glob("*.json")}
    assert len(shipped) >= 2
    assert set(configmap["data"]) == set(shipped)
    for name, text in shipped.items():
        assert json.loads(configmap["data"][name]) == json.loads(text), name


def test_notes_tell_how_to_opt_in(chart: helm.Chart) -> None:
    notes = render_notes(chart, {**NON_DEFAULT_VALUES, "dryRun": True})
    assert 'gang-autoscaler.io/enabled="true"' in notes
    assert "gang-autoscaler.io/component=prefill" in notes
    assert "DRY RUN" in notes
    assert "none takes the Lease" in notes and "holds the Lease" not in notes
    assert "serving, batch-inference" in notes
    default_notes = render_notes(chart, None)
    assert "DRY RUN" not in default_notes and "one leader holds the Lease" in default_notes
    # by default nothing scrapes the service: the dashboards would stay empty without a word
    assert "Nothing in this release has Prometheus scrape" in default_notes
    assert "Nothing in this release has Prometheus scrape" not in notes  # a ServiceMonitor


# -- values.schema.json -----------------------------------------------------------------------


def _with(path: str, value: Any) -> dict[str, Any]:
    values = copy.deepcopy(NON_DEFAULT_VALUES)
    *parents, leaf = path.split(".")
    node = values
    for key in parents:
        node = node[key]
    node[leaf] = value
    return values


BAD_VALUES = [
    pytest.param(_with("tick", "15"), id="tick-without-unit"),
    pytest.param(_with("tick", 15), id="tick-as-number"),
    pytest.param(_with("prometheus.url", "prometheus:9090"), id="url-without-scheme"),
    pytest.param(
        _with("prometheus.queries.waiting", "sum(vllm:num_requests_waiting)"), id="query-drops-pod"
    ),
    pytest.param(
        _with("prometheus.queries.sampleTime", "max(timestamp(up))"), id="sample-time-drops-pod"
    ),
    pytest.param(
        _with("prometheus.queries.extra", "sum by (namespace, pod) (x)"), id="unknown-query"
    ),
    pytest.param(_with("extraEnv", [{"name": "X", "value": 3}]), id="env-value-not-a-string"),
    pytest.param(_with("fullnameOverride", "1abc"), id="full-name-not-a-service-name"),
    pytest.param(_with("namespaces", "serving"), id="namespaces-not-a-list"),
    pytest.param(_with("namespaces", ["Serving_NS"]), id="namespace-not-dns-label"),
    pytest.param(_with("dryRun", "yes"), id="dry-run-not-boolean"),
    pytest.param(_with("logFormat", "xml"), id="log-format-unknown"),
    pytest.param(_with("forecastModel", "prophet"), id="forecast-model-unknown"),
    pytest.param(_with("buffer.minGangs", -1), id="negative-buffer"),
    pytest.param(_with("balloonPriorityClass.value", -10), id="balloon-at-expendable-cutoff"),
    pytest.param(_with("balloonPriorityClass.value", 0), id="balloon-not-below-workloads"),
    pytest.param(_with("balloonPriorityClass.value", -7), id="balloon-value-the-service-refuses"),
    pytest.param(_with("httpPort", 80), id="privileged-port"),
    pytest.param(_with("replicaCount", 0), id="no-replicas"),
    pytest.param(_with("serviceMonitor.interval", "soon"), id="bad-scrape-interval"),
    # prometheus-operator's Duration: whole numbers only, where the service's take fractions
    pytest.param(_with("serviceMonitor.interval", "1.5s"), id="scrape-interval-fraction"),
    pytest.param(_with("vllmPodMonitor.interval", "15us"), id="vllm-scrape-interval-unit"),
    pytest.param(_with("vllmPodMonitor.path", "metrics"), id="relative-metrics-path"),
    pytest.param(_with("vllmPodMonitor.port", "8000"), id="vllm-port-a-number-not-a-name"),
    pytest.param(_with("vllmPodMonitor.port", "HTTP"), id="vllm-port-not-a-port-name"),
    pytest.param(_with("tickInterval", "15s"), id="unknown-top-level-key"),
    pytest.param(_with("extraEnv", {"HTTPS_PROXY": "http://proxy:3128"}), id="extra-env-a-map"),
    pytest.param(_with("extraEnv", ["HTTPS_PROXY=http://proxy:3128"]), id="extra-env-strings"),
    pytest.param(_with("extraVolumes", [{"configMap": {"name": "ca"}}]), id="volume-unnamed"),
    pytest.param(_with("extraVolumeMounts", [{"name": "ca"}]), id="volume-mount-no-path"),
]


@pytest.mark.parametrize("values", BAD_VALUES)
def test_values_schema_rejects_bad_values(chart: helm.Chart, values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)
    # and an install of those values fails before anything is rendered
    with pytest.raises(helm.HelmError):
        chart.render(values=values, name="ga", namespace=NAMESPACE, is_install=True)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        pytest.param(
            "podLabels",
            {"app.kubernetes.io/name": "other"},
            "podLabels sets app.kubernetes.io/name, which the chart's selector sets",
            id="pod-label-the-selector-sets",  # written twice; the Deployment lost its pods
        ),
        pytest.param(
            "podAnnotations",
            {"checksum/config": "x"},
            "podAnnotations sets checksum/config, which the chart sets",
            id="pod-annotation-the-chart-sets",
        ),
    ],
)
def test_chart_refuses_pod_metadata_it_sets_itself(
    chart: helm.Chart, path: str, value: Any, message: str
) -> None:
    with pytest.raises(helm.HelmError) as refused:
        chart.render(values=_with(path, value), name="ga", namespace=NAMESPACE, is_install=True)
    assert message in str(refused.value)


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_values_schema_accepts_good_values(
    chart: helm.Chart, values: dict[str, Any] | None
) -> None:
    chart.validate_schema(values)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param("tick", "0s", id="tick"),
        pytest.param("tick", "0m0.0s", id="tick-in-parts"),
        pytest.param("prometheus.timeout", "0ms", id="query-timeout"),
        pytest.param("prometheus.stalenessLimit", "00s", id="staleness"),
        pytest.param("watchStalenessLimit", "0m", id="watch-staleness"),
        pytest.param("leaderElection.leaseDuration", "0h", id="lease"),
        pytest.param("serviceMonitor.interval", "0s", id="service-monitor-interval"),
        pytest.param("serviceMonitor.interval", "0m0s", id="service-monitor-interval-in-parts"),
        pytest.param("serviceMonitor.scrapeTimeout", "0m", id="service-monitor-timeout"),
        pytest.param("vllmPodMonitor.interval", "0s", id="vllm-monitor-interval"),
        pytest.param("vllmPodMonitor.interval", "0", id="vllm-monitor-interval-bare-zero"),
    ],
)
def test_values_schema_refuses_a_zero_duration_naming_it(
    chart: helm.Chart, path: str, value: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.validate_schema(_with(path, value))
    message = str(refused.value)
    # the value and the rule it breaks, not the bare "'not' failed" a `not` clause gives
    assert f"at '/{path.replace('.', '/')}': '{value}' does not match pattern '[1-9]'" in message
    assert "'not' failed" not in message


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param("serviceMonitor.interval", "1m30s", id="service-monitor-interval-in-parts"),
        pytest.param("serviceMonitor.scrapeTimeout", "0m10s", id="timeout-with-zero-part"),
        pytest.param("vllmPodMonitor.interval", "10s", id="vllm-monitor-interval"),
        pytest.param("tick", "0.5s", id="tick-fraction"),
    ],
)
def test_values_schema_accepts_durations_longer_than_zero(
    chart: helm.Chart, path: str, value: str
) -> None:
    chart.validate_schema(_with(path, value))


def test_values_schema_covers_every_value() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())

    def walk(node: dict[str, Any], props: dict[str, Any], where: str) -> None:
        assert props.get("additionalProperties") is not True, where
        for key, value in node.items():
            assert key in props["properties"], f"{where}{key} has no schema"
            sub = props["properties"][key]
            if isinstance(value, dict) and "properties" in sub:
                walk(value, sub, f"{where}{key}.")

    walk(values, schema, "")
    assert schema["additionalProperties"] is False


def test_chart_defaults_match_the_service_defaults(chart: helm.Chart) -> None:
    values = chart.values
    defaults = PrometheusQueries()
    queries = values["prometheus"]["queries"]
    assert queries == {
        "waiting": defaults.waiting,
        "running": defaults.running,
        "kvCache": defaults.kv_cache,
        "prefillDemand": defaults.prefill_demand,
        "decodeDemand": defaults.decode_demand,
        "unifiedDemand": "",  # unset: unified components read the prefill demand
        "sampleTime": defaults.sample_time,
        "wake": "",  # unset: a deployment at zero comes back on its forecast only
    }
    fields = RunSettings.model_fields
    assert values["httpPort"] == fields["http_port"].default
    assert values["prometheus"]["backfillDays"] == fields["backfill_days"].default
    assert values["forecastModel"] == fields["forecast_model"].default
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert set(schema["properties"]["forecastModel"]["enum"]) == set(MODELS)
    assert values["buffer"] == {"minGangs": 0, "maxGangs": 2}  # DESIGN section 5 defaults
    assert values["balloonImage"] == fields["balloon_image"].default


# -- the settings the service receives --------------------------------------------------------


def _settings_from_rendered(objects: list[dict[str, Any]], tmp_path: Path) -> RunSettings:
    """Parse the Deployment's args with the real CLI parser and load the settings with the
    rendered config file, as the container would."""
    deployment = one(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    config = one(objects, "ConfigMap", "-config")["data"]["config.yaml"]
    config_path = tmp_path / "config.yaml"
    config_path.write_text(config)
    assert f"--config=/etc/gang-autoscaler/{config_path.name}" in args
    argv = [f"--config={config_path}" if arg.startswith("--config=") else arg for arg in args]
    parsed = build_parser().parse_args(argv)
    assert parsed.command == "run"
    return load_settings(parsed)


def _clear_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("GANG_AUTOSCALER_")]:
        monkeypatch.delenv(name)


def test_default_values_give_valid_service_settings(
    chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_settings_env(monkeypatch)
    settings = _settings_from_rendered(render_objects(chart, None), tmp_path)
    assert settings.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    assert settings.tick_s == 15.0
    assert settings.namespaces == ()
    assert settings.dry_run is False
    assert settings.lease_namespace == NAMESPACE
    assert settings.log_format == "json"
    assert settings.log_level == "INFO"
    assert settings.queries == PrometheusQueries()
    assert settings.forecast_model == "seasonal_envelope"
    assert settings.watch_staleness_limit_s == 60.0
    assert settings.demand_window_s == 60.0  # the default queries' [1m]


def test_non_default_values_reach_the_service(
    chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_settings_env(monkeypatch)
    settings = _settings_from_rendered(render_objects(chart, NON_DEFAULT_VALUES), tmp_path)
    v = NON_DEFAULT_VALUES
    assert settings.prometheus_url == v["prometheus"]["url"]
    assert settings.tick_s == 30.0
    assert settings.namespaces == ("serving", "batch-inference")
    assert settings.dry_run is False
    (tmp_path / "dry").mkdir()
    dry = _settings_from_rendered(render_objects(chart, {"dryRun": True}), tmp_path / "dry")
    assert dry.dry_run is True
    assert settings.http_port == 9090
    assert settings.log_format == "text"
    assert settings.log_level == "DEBUG"
    assert settings.prometheus_timeout_s == 5.0
    assert settings.staleness_limit_s == 90.0
    assert settings.demand_window_s == 120.0  # the queries' [2m]
    assert settings.watch_staleness_limit_s == 120.0
    assert settings.backfill_days == 3
    assert settings.cluster_can_grow is False
    assert settings.forecast_model == "state_space"
    assert settings.lease_name == "autoscaler-leader"
    assert settings.lease_duration_s == 20.0
    assert settings.buffer.min_gangs == 1 and settings.buffer.max_gangs == 4
    queries = v["prometheus"]["queries"]
    assert settings.queries == PrometheusQueries(
        waiting=queries["waiting"],
        running=queries["running"],
        kv_cache=queries["kvCache"],
        prefill_demand=queries["prefillDemand"],
        decode_demand=queries["decodeDemand"],
        unified_demand=queries["unifiedDemand"],
        sample_time=queries["sampleTime"],
        wake=queries["wake"],
    )
    assert settings.balloon_image == v["balloonImage"]


def test_extra_env_gives_way_to_the_settings_the_chart_passes_as_flags(
    chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As docs/operators.md ("Service settings") says: the container's environment, where
    # extraEnv puts GANG_AUTOSCALER_* variables, loses to the Deployment's flags.
    _clear_settings_env(monkeypatch)
    for name, value in {
        "PROMETHEUS_URL": "http://elsewhere:9090",
        "TICK": "5s",
        "NAMESPACES": "elsewhere",
        "HTTP_PORT": "9999",
        "LEASE_NAMESPACE": "elsewhere",
        "LEASE_NAME": "elsewhere",  # the Role allows only the chart's Lease
        "LOG_FORMAT": "text",
        "LOG_LEVEL": "DEBUG",
        "STALENESS_LIMIT": "5s",  # not a flag: wins over the config file
    }.items():
        monkeypatch.setenv(f"GANG_AUTOSCALER_{name}", value)
    settings = _settings_from_rendered(render_objects(chart, {"namespaces": ["serving"]}), tmp_path)
    assert settings.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    assert settings.tick_s == 15.0
    assert settings.namespaces == ("serving",)
    assert settings.http_port == 8080
    assert settings.lease_namespace == NAMESPACE
    assert settings.lease_name == "gang-autoscaler"
    assert (settings.log_format, settings.log_level) == ("json", "INFO")
    assert settings.staleness_limit_s == 5.0


def test_empty_sample_time_turns_the_staleness_check_off(
    chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_settings_env(monkeypatch)
    values = _with("prometheus.queries.sampleTime", "")
    settings = _settings_from_rendered(render_objects(chart, values), tmp_path)
    assert settings.queries.sample_time is None
    assert "sample_time" not in settings.queries.instant_queries()
    assert settings.queries.waiting == values["prometheus"]["queries"]["waiting"]


def _documented_sglang_values() -> dict[str, Any]:
    """The SGLang values docs/operators.md gives under "Other servers"."""
    section = (REPO / "docs" / "operators.md").read_text().split("**Other servers.**", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    values: dict[str, Any] = yaml.safe_load(block)
    return values


def test_the_documented_sglang_values_give_the_sglang_queries(
    chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The freshness query too: vLLM's returns nothing for SGLang pods, so left in place it
    # voids every signal and every component holds.
    _clear_settings_env(monkeypatch)
    values = _documented_sglang_values()
    settings = _settings_from_rendered(render_objects(chart, values), tmp_path)
    assert settings.queries == sglang_queries()


# Values the service refuses at start-up (autoscaler/service/settings.py): the chart must
# refuse them too, naming the value, or the install "succeeds" and the pods crash-loop.
# (chart value path, chart value, the same setting as RunSettings fields)
SERVICE_REFUSES = [
    pytest.param("tick", "0s", {"tick": "0s"}, id="tick-zero"),
    pytest.param("tick", "0m0.0s", {"tick": "0m0.0s"}, id="tick-zero-in-parts"),
    pytest.param("tick", "1ns", {"tick": "1ns"}, id="tick-below-1ms"),
    pytest.param(
        "prometheus.timeout", "900us", {"prometheus_timeout": "900us"}, id="timeout-below-1ms"
    ),
    # units the schema takes, values under 1ms: only the templates can refuse these
    pytest.param("tick", "0.0001s", {"tick": "0.0001s"}, id="tick-below-1ms-in-seconds"),
    pytest.param(
        "prometheus.timeout", "0.5ms", {"prometheus_timeout": "0.5ms"}, id="timeout-half-a-ms"
    ),
    pytest.param(
        "prometheus.stalenessLimit",
        "0.999ms",
        {"staleness_limit": "0.999ms"},
        id="staleness-just-below-1ms",
    ),
    pytest.param(
        "watchStalenessLimit",
        "0.00001m",
        {"watch_staleness_limit": "0.00001m"},
        id="watch-staleness-below-1ms-in-minutes",
    ),
    pytest.param(
        "prometheus.timeout", "0ms", {"prometheus_timeout": "0ms"}, id="query-timeout-zero"
    ),
    pytest.param("prometheus.stalenessLimit", "0s", {"staleness_limit": "0s"}, id="staleness-zero"),
    pytest.param(
        "prometheus.demandWindow", "0.5ms", {"demand_window": "0.5ms"}, id="demand-window-below-1ms"
    ),
    pytest.param(
        "watchStalenessLimit", "0m", {"watch_staleness_limit": "0m"}, id="watch-staleness-zero"
    ),
    pytest.param("leaderElection.leaseDuration", "0s", {"lease_duration": "0s"}, id="lease-zero"),
    pytest.param(
        "leaderElection.leaseDuration", "2s", {"lease_duration": "2s"}, id="lease-below-3s"
    ),
    pytest.param(
        "leaderElection.leaseDuration",
        "2999ms",
        {"lease_duration": "2999ms"},
        id="lease-just-below-3s",
    ),
    pytest.param(
        "leaderElection.leaseDuration",
        "0.04m",
        {"lease_duration": "0.04m"},
        id="lease-below-3s-in-minutes",
    ),
    pytest.param(
        "leaderElection.leaseName", "a..b", {"lease_name": "a..b"}, id="lease-name-empty-label"
    ),
    pytest.param(
        "leaderElection.leaseDuration",
        "1000000h",  # past leaseDurationSeconds' int32, and no leader for as long
        {"lease_duration": "1000000h"},
        id="lease-over-an-hour",
    ),
    pytest.param(
        "buffer",
        {"minGangs": 3, "maxGangs": 1},
        {"buffer": {"min_gangs": 3, "max_gangs": 1}},
        id="buffer-min-above-max",
    ),
    pytest.param(
        "balloonImage", "pause 3.10", {"balloon_image": "pause 3.10"}, id="balloon-image-space"
    ),
    pytest.param(
        "prometheus.headers",
        {"X-Scope-OrgID": "a", "x-scope-orgid": "b"},
        {"prometheus_headers": {"X-Scope-OrgID": "a", "x-scope-orgid": "b"}},
        id="header-named-twice",
    ),
    pytest.param(
        "prometheus.headers",
        {"X-Scope-OrgID": "a\r\nX-Injected: b"},
        {"prometheus_headers": {"X-Scope-OrgID": "a\r\nX-Injected: b"}},
        id="header-value-line-break",
    ),
]


@pytest.mark.parametrize(("path", "value", "settings"), SERVICE_REFUSES)
def test_chart_refuses_values_the_service_refuses(
    chart: helm.Chart,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    value: Any,
    settings: dict[str, Any],
) -> None:
    _clear_settings_env(monkeypatch)
    with pytest.raises(ValidationError):  # the service's own rule, so the case stays honest
        RunSettings(prometheus_url="http://prometheus:9090", **settings)
    with pytest.raises(helm.HelmError) as refused:
        chart.render(values=_with(path, value), name="ga", namespace=NAMESPACE, is_install=True)
    message = str(refused.value)
    # schema errors name the JSON pointer (/leaderElection/leaseDuration), template fails
    # the dotted value (buffer.minGangs)
    assert path.replace(".", "/") in message or path in message, message
    if isinstance(value, str):
        assert value in message, message


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param("leaderElection.leaseDuration", "3s", id="lease-at-3s"),
        pytest.param("leaderElection.leaseDuration", "0.05m", id="lease-3s-in-minutes"),
        pytest.param("leaderElection.leaseDuration", "1m30s", id="lease-in-parts"),
        pytest.param("leaderElection.leaseDuration", "1h", id="lease-at-an-hour"),
        pytest.param("buffer", {"minGangs": 2, "maxGangs": 2}, id="buffer-min-equals-max"),
        pytest.param("tick", "500ms", id="tick-below-a-second"),
        pytest.param("tick", "0m10s", id="tick-with-zero-part"),
        pytest.param("tick", "1ms", id="tick-at-1ms"),
        pytest.param("prometheus.timeout", "1ms", id="timeout-at-1ms"),
        pytest.param("prometheus.stalenessLimit", "0.001s", id="staleness-1ms-in-seconds"),
        pytest.param("watchStalenessLimit", "1ms", id="watch-staleness-at-1ms"),
    ],
)
def test_chart_accepts_boundary_values_the_service_accepts(
    chart: helm.Chart,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    value: Any,
) -> None:
    _clear_settings_env(monkeypatch)
    _settings_from_rendered(render_objects(chart, _with(path, value)), tmp_path)


def _monitors(service_monitor: dict[str, Any], pod_monitor: dict[str, Any]) -> dict[str, Any]:
    values = copy.deepcopy(NON_DEFAULT_VALUES)
    values["serviceMonitor"].update(service_monitor)
    values["vllmPodMonitor"].update(pod_monitor)
    return values


@pytest.mark.parametrize(
    ("service_monitor", "pod_monitor", "message"),
    [
        pytest.param(
            {"interval": "10s", "scrapeTimeout": "15s"},
            {},
            'serviceMonitor.scrapeTimeout "15s" is above serviceMonitor.interval "10s"',
            id="timeout-above-interval",
        ),
        pytest.param(
            {"interval": "1m", "scrapeTimeout": "1m500ms"},
            {},
            'serviceMonitor.scrapeTimeout "1m500ms" is above serviceMonitor.interval "1m"',
            id="timeout-above-interval-by-milliseconds",
        ),
        pytest.param(
            {},
            {"interval": "31s"},
            'vllmPodMonitor.interval "31s" is above 30s',
            id="vllm-interval-above-30s",
        ),
        pytest.param(
            {},
            {"interval": "1m"},
            'vllmPodMonitor.interval "1m" is above 30s',
            id="vllm-interval-a-minute",
        ),
    ],
)
def test_chart_refuses_scrape_settings_prometheus_cannot_use(
    chart: helm.Chart, service_monitor: dict[str, Any], pod_monitor: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError) as refused:
        render_objects(chart, _monitors(service_monitor, pod_monitor))
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("service_monitor", "pod_monitor"),
    [
        pytest.param({"interval": "10s", "scrapeTimeout": "10s"}, {}, id="timeout-equals-interval"),
        pytest.param({"interval": "1m30s", "scrapeTimeout": "1m"}, {}, id="interval-in-parts"),
        pytest.param({"interval": "1d", "scrapeTimeout": "1h"}, {}, id="days"),
        pytest.param({}, {"interval": "30s"}, id="vllm-interval-at-30s"),
        pytest.param({}, {"interval": "29s999ms"}, id="vllm-interval-in-milliseconds"),
        pytest.param(
            {"enabled": False, "interval": "10s", "scrapeTimeout": "15s"},
            {"enabled": False, "interval": "1m"},
            id="monitors-off-values-unused",
        ),
    ],
)
def test_chart_accepts_scrape_settings_prometheus_can_use(
    chart: helm.Chart, service_monitor: dict[str, Any], pod_monitor: dict[str, Any]
) -> None:
    objects = render_objects(chart, _monitors(service_monitor, pod_monitor))
    if service_monitor.get("enabled", True):
        endpoint = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
        assert endpoint["scrapeTimeout"] == service_monitor.get("scrapeTimeout", "5s")


@pytest.mark.parametrize("release", ["1ga", "ga.prod", "Ga"])
def test_a_release_name_that_makes_no_object_name_is_refused(chart: helm.Chart, release: str):
    """Helm takes a leading digit, dots and capitals in a release name; the Service named
    `<release>-gang-autoscaler` was then refused by the API server at install."""
    with pytest.raises(helm.HelmError) as refused:
        render_objects(chart, None, release=release)
    assert f'release name "{release}" does not make valid object names' in str(refused.value)
    assert "fullnameOverride" in str(refused.value)
    render_objects(chart, {"fullnameOverride": "ga-prod"}, release=release)


@pytest.mark.parametrize(
    ("path", "value", "settings"),
    [
        pytest.param("balloonImage", "pause:3.10\u00a0", {"balloon_image": "pause:3.10\u00a0"},
                     id="balloon-image"),
        pytest.param("prometheus.url", "http://prometheus\u00a0:9090",
                     {"prometheus_url": "http://prometheus\u00a0:9090"}, id="url"),
        pytest.param("prometheus.url", "http://prometheus:9090/\u2003",
                     {"prometheus_url": "http://prometheus:9090/\u2003"}, id="url-em-space"),
    ],
)  # fmt: skip
def test_a_unicode_space_the_service_refuses_is_refused_at_render_time(
    chart: helm.Chart,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    value: str,
    settings: dict[str, Any],
) -> None:
    """A no-break space copied from a wiki: the chart's Go regexes read `\\s` as ASCII only,
    the service's as Unicode, so the pods rendered fine and crash-looped on `invalid
    settings`."""
    _clear_settings_env(monkeypatch)
    with pytest.raises(ValidationError):  # the service's own rule
        RunSettings(**{"prometheus_url": "http://prometheus:9090", **settings})
    with pytest.raises(helm.HelmError) as refused:
        chart.render(values=_with(path, value), name="ga", namespace=NAMESPACE, is_install=True)
    assert path.replace(".", "/") in str(refused.value) or path in str(refused.value)
