"""The chart's Prometheus credentials: they reach the service through its config file, never
through args (which `ps` shows), and the values schema refuses malformed ones."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from autoscaler.cli import build_parser
from autoscaler.service.settings import RunSettings, load_settings
from tests.charts.conftest import NAMESPACE, NON_DEFAULT_VALUES, one, render_objects

OPENSHIFT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
OPENSHIFT_CA = "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt"


def _prometheus(**auth: Any) -> dict[str, Any]:
    values = copy.deepcopy(NON_DEFAULT_VALUES)
    values["prometheus"].update(auth)
    return values


def _config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(
        one(objects, "ConfigMap", "-config")["data"]["config.yaml"]
    )
    return document


def _args(objects: list[dict[str, Any]]) -> list[str]:
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    return args


def test_credentials_render_into_the_config_file_not_the_args(chart: helm.Chart) -> None:
    headers = {"X-Scope-OrgID": "tenant-1", "X-Extra": "with: colon"}
    objects = render_objects(
        chart, _prometheus(bearerTokenFile=OPENSHIFT_TOKEN, caFile=OPENSHIFT_CA, headers=headers)
    )
    config = _config(objects)
    assert config["prometheus_bearer_token_file"] == OPENSHIFT_TOKEN
    assert config["prometheus_ca_file"] == OPENSHIFT_CA
    assert config["prometheus_headers"] == headers
    deployment = yaml.safe_dump(one(objects, "Deployment"))
    for value in ("tenant-1", "X-Scope-OrgID", OPENSHIFT_TOKEN, OPENSHIFT_CA):
        assert value not in deployment
    assert not [arg for arg in _args(objects) if "header" in arg or "-file" in arg]


def test_unset_credentials_leave_the_config_file_without_them(chart: helm.Chart) -> None:
    config = _config(render_objects(chart, None))
    assert not {"prometheus_bearer_token_file", "prometheus_ca_file", "prometheus_headers"} & set(
        config
    )


def test_rendered_credentials_load_as_the_service_settings(
    chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("GANG_AUTOSCALER_")]:
        monkeypatch.delenv(name)
    token, ca = tmp_path / "token", tmp_path / "ca.crt"  # stand-ins for the mounted files
    token.write_text("sa-token\n")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    objects = render_objects(
        chart,
        _prometheus(bearerTokenFile=str(token), caFile=str(ca), headers={"X-Scope-OrgID": "t"}),
    )
    config_path = tmp_path / "config.yaml"
    config_path.write_text(one(objects, "ConfigMap", "-config")["data"]["config.yaml"])
    argv = [
        f"--config={config_path}" if arg.startswith("--config=") else arg for arg in _args(objects)
    ]
    settings: RunSettings = load_settings(build_parser().parse_args(argv))
    credentials = settings.prometheus_credentials
    assert credentials.bearer_token_file == token
    assert credentials.ca_file == ca
    assert dict(credentials.headers) == {"X-Scope-OrgID": "t"}


@pytest.mark.parametrize(
    "auth",
    [
        pytest.param({"bearerTokenFile": "token"}, id="relative-token-path"),
        pytest.param({"caFile": "certs/ca.crt"}, id="relative-ca-path"),
        pytest.param({"headers": {"X Scope": "t"}}, id="header-name-with-space"),
        pytest.param({"headers": {"X-Scope-OrgID": 1}}, id="header-value-not-a-string"),
        pytest.param({"headers": ["X-Scope-OrgID: t"]}, id="headers-not-a-mapping"),
    ],
)
def test_values_schema_rejects_bad_credentials(chart: helm.Chart, auth: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(_prometheus(**auth))
    with pytest.raises(helm.HelmError):
        chart.render(values=_prometheus(**auth), name="ga", namespace=NAMESPACE, is_install=True)
