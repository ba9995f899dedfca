"""The chart rendered by Helm's own engine (helm-python-sdk, libhelm_c: no helm binary), for
the chart's tests and for the service tests that run under the chart's RBAC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests.harness.fake_kube.rbac import Rbac

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "gang-autoscaler"
RELEASE = "ga"
NAMESPACE = "gang-system"


def render_objects(
    chart: helm.Chart, values: dict[str, Any] | None, *, release: str = RELEASE
) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (NOTES.txt excluded)."""
    manifests = chart.render(values=values, name=release, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for document in yaml.safe_load_all(text):
            if document is not None:
                objects.append(document)
    return objects


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART_DIR) as chart:
        return render_objects(chart, values)


def service_rbac(objects: list[dict[str, Any]]) -> Rbac:
    """What the rendered objects grant the service: the account its Deployment runs as."""
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    return Rbac(objects, service_account=account, namespace=deployment["metadata"]["namespace"])
