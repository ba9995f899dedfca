"""Render the chart with Helm's own engine (helm-python-sdk, libhelm_c: no helm binary)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest

from tests.harness.helm_chart import CHART_DIR, NAMESPACE, RELEASE, REPO, render_objects

__all__ = ["CHART_DIR", "NAMESPACE", "RELEASE", "REPO", "render_objects"]

# A values set that flips every switch away from its default.
NON_DEFAULT_VALUES: dict[str, Any] = {
    "replicaCount": 3,
    "image": {"repository": "registry.example/ga", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "fullnameOverride": "autoscaler",
    "logLevel": "DEBUG",
    "logFormat": "text",
    "prometheus": {
        "url": "https://prometheus.observability.svc:9091",
        "timeout": "5s",
        "stalenessLimit": "90s",
        "demandWindow": "2m",
        "backfillDays": 3,
        "queries": {
            "waiting": "sum by (namespace, pod) (sglang:num_queue_reqs)",
            "running": "sum by (namespace, pod) (sglang:num_running_reqs)",
            "kvCache": "max by (namespace, pod) (sglang:token_usage)",
            "prefillDemand": "sum by (namespace, pod) (rate(sglang:prompt_tokens_total[2m]))",
            "decodeDemand": "sum by (namespace, pod) (rate(sglang:generation_tokens_total[2m]))",
            "unifiedDemand": "sum by (namespace, pod) (rate(sglang:prompt_tokens_total[5m]))",
            "sampleTime": "max by (namespace, pod) (timestamp(sglang:num_running_reqs))",
            "wake": "sum by (namespace, deployment) (gateway_queue_size)",
        },
    },
    "tick": "30s",
    "watchStalenessLimit": "2m",
    "namespaces": ["serving", "batch-inference"],
    "dryRun": False,  # a dry-run release is granted no writes and no Lease (test_rbac.py)
    "clusterCanGrow": False,
    "forecastModel": "state_space",
    "buffer": {"minGangs": 1, "maxGangs": 4},
    "leaderElection": {"leaseName": "autoscaler-leader", "leaseDuration": "20s"},
    "balloonPriorityClass": {"create": False, "value": -5},
    "balloonImage": "registry.airgap.example:5000/k8s/pause:3.10",
    "serviceAccount": {
        "create": True,
        "name": "autoscaler-sa",
        "annotations": {"example.com/role": "x"},
    },
    "httpPort": 9090,
    "service": {"type": "ClusterIP", "port": 80, "annotations": {"a": "b"}},
    "serviceMonitor": {
        "enabled": True,
        "interval": "15s",
        "scrapeTimeout": "5s",
        "labels": {"release": "kube-prometheus-stack"},
    },
    "podDisruptionBudget": {"enabled": False, "minAvailable": 1},
    "vllmPodMonitor": {
        "enabled": True,
        "port": "openai",
        "path": "/metrics",
        "interval": "30s",
        "labels": {"release": "kube-prometheus-stack"},
    },
    "dashboards": {
        "enabled": True,
        "label": "grafana_dashboard",
        "labelValue": "1",
        "namespace": "monitoring",
        "annotations": {"grafana_folder": "LLM serving"},
    },
    "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
    "podAnnotations": {"example.com/scrape": "false"},
    "podLabels": {"team": "inference"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
                ]
            }
        }
    },
    "priorityClassName": "system-cluster-critical",
    # OpenShift's restricted SCC: no fixed uid, the SCC assigns one from the namespace's range.
    "podSecurityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        "privileged": False,
    },
    # A proxy, a service setting from a Secret, and a ConfigMap of the operator's mounted.
    "extraEnv": [
        {"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
        {
            "name": "GANG_AUTOSCALER_PROMETHEUS_HEADERS",
            "valueFrom": {"secretKeyRef": {"name": "prometheus-tenant", "key": "headers"}},
        },
    ],
    "extraVolumes": [{"name": "corporate-ca", "configMap": {"name": "corporate-ca-bundle"}}],
    "extraVolumeMounts": [
        {"name": "corporate-ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}
    ],
}

# Everything optional switched off, and an existing ServiceAccount.
MINIMAL_VALUES: dict[str, Any] = {
    "serviceAccount": {"create": False, "name": "existing-sa", "annotations": {}},
    "dashboards": {
        "enabled": False,
        "label": "grafana_dashboard",
        "labelValue": "1",
        "namespace": "",
        "annotations": {},
    },
    "podDisruptionBudget": {"enabled": False, "minAvailable": 1},
    "balloonPriorityClass": {"create": False, "value": -5},
    "resources": {"requests": {"cpu": 0.05, "ephemeral-storage": "100Mi"}},
}

VALUE_SETS = {"default": None, "non-default": NON_DEFAULT_VALUES, "minimal": MINIMAL_VALUES}


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def render_notes(chart: helm.Chart, values: dict[str, Any] | None) -> str:
    manifests = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


@pytest.fixture(scope="session", params=sorted(VALUE_SETS), ids=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, chart: helm.Chart) -> list[dict[str, Any]]:
    return render_objects(chart, VALUE_SETS[request.param])


def one(objects: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"expected one {kind} *{suffix}, found {len(found)}"
    return found[0]
