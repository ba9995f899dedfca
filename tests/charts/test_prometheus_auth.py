"""The chart's Prometheus credentials: they reach the service through its config file, never
through args (which `ps` shows); a Secret or ConfigMap given in the values is mounted and its
path put in that file; combinations the service refuses are refused at render time, and the
values schema refuses malformed ones."""

from __future__ import annotations

import base64
import copy
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import requests
import yaml

from autoscaler.adapters.prometheus_auth import (
    PrometheusCredentials,
    PrometheusCredentialsError,
    file_auth,
    session_for,
)
from autoscaler.cli import build_parser
from autoscaler.service.settings import RunSettings, load_settings
from tests.charts.conftest import CHART_DIR, NAMESPACE, NON_DEFAULT_VALUES, one, render_objects
from tests.charts.test_chart import KUBE_VERSIONS

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


def _pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any]
    (container,) = _pod(objects)["containers"]
    return container


def _args(objects: list[dict[str, Any]]) -> list[str]:
    args: list[str] = _container(objects)["args"]
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


def test_unset_credentials_leave_the_config_file_and_pod_without_them(
    chart: helm.Chart,
) -> None:
    objects = render_objects(chart, None)
    assert not {
        "prometheus_bearer_token_file",
        "prometheus_basic_auth_username",
        "prometheus_basic_auth_password_file",
        "prometheus_ca_file",
        "prometheus_headers",
    } & set(_config(objects))
    assert [v["name"] for v in _pod(objects)["volumes"]] == ["config", "tmp"]
    assert [m["name"] for m in _container(objects)["volumeMounts"]] == ["config", "tmp"]


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
        pytest.param(
            {"bearerTokenSecret": {"name": "Prometheus_Token", "key": "token"}},
            id="secret-name-not-dns",
        ),
        pytest.param({"bearerTokenSecret": {"name": "t", "key": "a/b"}}, id="key-with-slash"),
        pytest.param({"bearerTokenSecret": "prometheus-token"}, id="token-secret-not-a-mapping"),
        pytest.param(
            {"bearerTokenSecret": {"name": "t", "key": "token", "optional": True}},
            id="token-secret-unknown-field",
        ),
        pytest.param({"basicAuth": {"username": "a:b"}}, id="username-with-colon"),
        pytest.param({"basicAuth": {"username": "a\tb"}}, id="username-with-tab"),
        pytest.param(
            {"basicAuth": {"username": "u", "password": "pw"}}, id="basic-auth-password-as-value"
        ),
        pytest.param({"caBundle": {"configMap": "ca", "key": ""}}, id="ca-key-empty"),
        pytest.param({"caBundle": {"configMaps": "ca"}}, id="ca-bundle-unknown-field"),
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


# -- Secrets and ConfigMaps the chart mounts ---------------------------------------------------

MOUNT_DIR = "/var/run/secrets/gang-autoscaler/prometheus"
NAME_FIELD = {"secret": "secretName", "configMap": "name"}
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@dataclass(frozen=True)
class Mounted:
    """A credential given as a Secret or ConfigMap: the values naming it, the pod volume that
    mounts it, the file the service is told to read, and what an operator stored there."""

    values: dict[str, Any]
    volume: str
    kind: str  # "secret" or "configMap"
    name: str
    key: str
    setting: str
    path: str
    data: str
    authorization: str | None  # the header the service then sends; None: sends none


BEARER = Mounted(
    values={"bearerTokenSecret": {"name": "prometheus-token"}},  # the default key
    volume="prometheus-bearer-token",
    kind="secret",
    name="prometheus-token",
    key="token",
    setting="prometheus_bearer_token_file",
    path=f"{MOUNT_DIR}/bearer-token/token",
    data="sa-token\n",
    authorization="Bearer sa-token",
)
BASIC = Mounted(
    values={
        "basicAuth": {
            "username": "autoscaler",
            "passwordSecret": {"name": "prometheus-basic-auth", "key": "pw"},
        }
    },
    volume="prometheus-basic-auth",
    kind="secret",
    name="prometheus-basic-auth",
    key="pw",
    setting="prometheus_basic_auth_password_file",
    path=f"{MOUNT_DIR}/basic-auth/password",
    data="s3cret\n",
    authorization="Basic " + base64.b64encode(b"autoscaler:s3cret").decode(),
)
CA_CONFIGMAP = Mounted(
    values={"caBundle": {"configMap": "openshift-service-ca", "key": "service-ca.crt"}},
    volume="prometheus-ca",
    kind="configMap",
    name="openshift-service-ca",
    key="service-ca.crt",
    setting="prometheus_ca_file",
    path=f"{MOUNT_DIR}/ca/ca.crt",
    data=PEM,
    authorization=None,
)
CA_SECRET = Mounted(
    values={"caBundle": {"secret": "prometheus-tls"}},  # the default key
    volume="prometheus-ca",
    kind="secret",
    name="prometheus-tls",
    key="ca.crt",
    setting="prometheus_ca_file",
    path=f"{MOUNT_DIR}/ca/ca.crt",
    data=PEM,
    authorization=None,
)
MOUNTED = [
    pytest.param(BEARER, id="bearer-token-secret"),
    pytest.param(BASIC, id="basic-auth"),
    pytest.param(CA_CONFIGMAP, id="ca-configmap"),
    pytest.param(CA_SECRET, id="ca-secret"),
]


def _values(*cases: Mounted) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for case in cases:
        values.update(case.values)
    return _prometheus(**values)


@pytest.mark.parametrize("case", MOUNTED)
def test_a_secret_or_configmap_is_mounted_read_only_where_the_config_points(
    chart: helm.Chart, case: Mounted
) -> None:
    objects = render_objects(chart, _values(case))
    file = PurePosixPath(case.path)
    volumes = [v for v in _pod(objects)["volumes"] if v["name"] == case.volume]
    # only the one key, under a fixed file name, and nothing optional about it
    assert volumes == [
        {
            "name": case.volume,
            case.kind: {
                NAME_FIELD[case.kind]: case.name,
                "items": [{"key": case.key, "path": file.name}],
            },
        }
    ]
    mounts = [m for m in _container(objects)["volumeMounts"] if m["name"] == case.volume]
    assert mounts == [{"name": case.volume, "mountPath": str(file.parent), "readOnly": True}]
    assert _config(objects)[case.setting] == case.path
    assert not [arg for arg in _args(objects) if case.name in arg or MOUNT_DIR in arg]
    for kube_version in KUBE_VERSIONS:
        kubernetes_validate.validate(one(objects, "Deployment"), kube_version, strict=True)
    report = helm.lint(CHART_DIR, _values(case), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _kubelet_mounts(
    objects: list[dict[str, Any]], root: Path, data: dict[tuple[str, str, str], str]
) -> None:
    """Write under `root` the files the kubelet would put in the container from the pod's
    Secret and ConfigMap volumes that list `items`; `data` maps (kind, name, key) to text."""
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    for mount in _container(objects)["volumeMounts"]:
        for kind, name_field in NAME_FIELD.items():
            source = volumes[mount["name"]].get(kind)
            for item in (source or {}).get("items", []):
                file = root / mount["mountPath"].lstrip("/") / item["path"]
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_text(data[(kind, source[name_field], item["key"])])


def _load_in_container(objects: list[dict[str, Any]], root: Path, tmp_path: Path) -> RunSettings:
    """The service's settings from the rendered args and config file, with the container's
    paths under /var/run/secrets/gang-autoscaler/prometheus/ looked up beneath `root`."""
    config = _config(objects)
    for setting, value in config.items():
        if setting.endswith("_file"):
            assert value.startswith(MOUNT_DIR + "/"), (setting, value)
            config[setting] = str(root / value.lstrip("/"))
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    argv = [
        f"--config={config_path}" if arg.startswith("--config=") else arg for arg in _args(objects)
    ]
    return load_settings(build_parser().parse_args(argv))


@pytest.mark.parametrize(
    "cases",
    [
        *[pytest.param((p.values[0],), id=p.id) for p in MOUNTED],
        pytest.param((BEARER, CA_SECRET), id="token-and-ca-secrets"),
        pytest.param((BASIC, CA_CONFIGMAP), id="basic-auth-and-ca-configmap"),
    ],
)
def test_mounted_credentials_load_as_the_service_settings(
    chart: helm.Chart,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cases: tuple[Mounted, ...],
) -> None:
    for name in [n for n in os.environ if n.startswith("GANG_AUTOSCALER_")]:
        monkeypatch.delenv(name)
    objects = render_objects(chart, _values(*cases))
    root = tmp_path / "container"
    _kubelet_mounts(objects, root, {(c.kind, c.name, c.key): c.data for c in cases})
    settings = _load_in_container(objects, root, tmp_path)
    credentials = settings.prometheus_credentials
    for case in cases:
        assert getattr(settings, case.setting) == root / case.path.lstrip("/")
    # what the service then does with them: the header it sends, the CA it verifies against
    authorizations = [c.authorization for c in cases if c.authorization is not None]
    auth = file_auth(credentials)
    if not authorizations:
        assert auth is None
    else:
        assert auth is not None
        request = auth(requests.Request("GET", "http://prometheus/api/v1/query").prepare())
        assert request.headers["Authorization"] == authorizations[0]
    ca_files = [str(root / c.path.lstrip("/")) for c in cases if c.setting == "prometheus_ca_file"]
    assert session_for(credentials).verify == (ca_files[0] if ca_files else True)


TOKEN_SECRET = {"bearerTokenSecret": {"name": "prometheus-token"}}
BASIC_AUTH = {"basicAuth": {"username": "u", "passwordSecret": {"name": "prometheus-basic-auth"}}}
BOTH_BASIC = {"basic_auth_username": "u", "basic_auth_password_file": Path("/p")}


@pytest.mark.parametrize(
    ("auth", "message", "service_refuses"),
    [
        pytest.param(
            {"bearerTokenFile": OPENSHIFT_TOKEN, **TOKEN_SECRET},
            "prometheus.bearerTokenFile and prometheus.bearerTokenSecret.name both give the "
            "bearer token; set one",
            None,
            id="token-file-and-secret",
        ),
        pytest.param(
            {"basicAuth": {"username": "u"}},
            "prometheus.basicAuth.username is set without "
            "prometheus.basicAuth.passwordSecret.name; basic auth needs both",
            {"basic_auth_username": "u"},
            id="username-without-password",
        ),
        pytest.param(
            {"basicAuth": {"passwordSecret": {"name": "prometheus-basic-auth"}}},
            "prometheus.basicAuth.passwordSecret.name is set without "
            "prometheus.basicAuth.username; basic auth needs both",
            {"basic_auth_password_file": Path("/p")},
            id="password-without-username",
        ),
        pytest.param(
            {"bearerTokenFile": OPENSHIFT_TOKEN, **BASIC_AUTH},
            "prometheus.basicAuth and prometheus.bearerTokenFile both set the Authorization "
            "header; use one",
            {"bearer_token_file": Path("/t"), **BOTH_BASIC},
            id="basic-auth-and-token-file",
        ),
        pytest.param(
            {**TOKEN_SECRET, **BASIC_AUTH},
            "prometheus.basicAuth and prometheus.bearerTokenSecret both set the Authorization "
            "header; use one",
            {"bearer_token_file": Path("/t"), **BOTH_BASIC},
            id="basic-auth-and-token-secret",
        ),
        pytest.param(
            {"bearerTokenFile": OPENSHIFT_TOKEN, "headers": {"Authorization": "Bearer x"}},
            "prometheus.headers sets Authorization, and so does prometheus.bearerTokenFile; "
            "use one",
            {"bearer_token_file": Path("/t"), "headers": {"Authorization": "Bearer x"}},
            id="authorization-header-and-token-file",
        ),
        pytest.param(
            {**TOKEN_SECRET, "headers": {"Authorization": "Bearer x"}},
            "prometheus.headers sets Authorization, and so does prometheus.bearerTokenSecret; "
            "use one",
            {"bearer_token_file": Path("/t"), "headers": {"Authorization": "Bearer x"}},
            id="authorization-header-and-token-secret",
        ),
        pytest.param(
            {**BASIC_AUTH, "headers": {"authorization": "Basic eDp5"}},
            "prometheus.headers sets authorization, and so does prometheus.basicAuth; use one",
            {**BOTH_BASIC, "headers": {"authorization": "Basic eDp5"}},
            id="authorization-header-any-case-and-basic-auth",
        ),
        pytest.param(
            {"caFile": OPENSHIFT_CA, "caBundle": {"configMap": "openshift-service-ca"}},
            "prometheus.caFile and prometheus.caBundle both give the CA bundle; set one",
            None,
            id="ca-file-and-configmap",
        ),
        pytest.param(
            {"caFile": OPENSHIFT_CA, "caBundle": {"secret": "prometheus-tls"}},
            "prometheus.caFile and prometheus.caBundle both give the CA bundle; set one",
            None,
            id="ca-file-and-secret",
        ),
        pytest.param(
            {"caBundle": {"configMap": "openshift-service-ca", "secret": "prometheus-tls"}},
            "prometheus.caBundle.configMap and prometheus.caBundle.secret both give the CA "
            "bundle; set one",
            None,
            id="ca-configmap-and-secret",
        ),
    ],
)
def test_chart_refuses_two_sources_for_one_credential(
    chart: helm.Chart,
    auth: dict[str, Any],
    message: str,
    service_refuses: dict[str, Any] | None,
) -> None:
    if service_refuses is not None:  # the service's own rule, so the case stays honest
        with pytest.raises(PrometheusCredentialsError):
            PrometheusCredentials(**service_refuses)
    with pytest.raises(helm.HelmError) as refused:
        render_objects(chart, _prometheus(**auth))
    assert message in str(refused.value)


# they passed the schema's pattern; the pods then crash-looped on the service's refusal
BAD_URLS = [
    ("http://prom:abc", "port-not-a-number"),
    ("http://prom:65536", "port-out-of-range"),
    ("http://:9090", "without-a-host"),
]
LEADING_SPACES = [
    (" ", "space"),
    ("\xa0", "no-break-space"),
    ("\x0b", "vertical-tab"),
    ("\u2003", "em-space"),
    ("\x1c", "file-separator"),
]


@pytest.mark.parametrize(
    ("prometheus", "message", "setting"),
    [
        pytest.param(
            {"url": "https://user:s3cret@prom.example:9090"},
            "prometheus.url has credentials in it (user:password@)",
            {"prometheus_url": "https://user:s3cret@prom.example:9090"},
            id="credentials-in-the-url",
        ),
        *(
            pytest.param(
                {"headers": {"X-Scope-OrgID": f"{space}tenant"}},
                "prometheus.headers: leading whitespace in the value of X-Scope-OrgID",
                {"prometheus_url": "http://p:9090", "prometheus_headers": {"X-Scope-OrgID": space}},
                id=f"header-value-with-leading-{name}",
            )
            # Python's isspace(), which the service checks, beyond RE2's \s
            for space, name in LEADING_SPACES
        ),
        pytest.param(
            {"headers": {"X-Scope-OrgID": "租户"}},
            "prometheus.headers: characters an HTTP header cannot carry (outside Latin-1) in "
            "the value of X-Scope-OrgID",
            {"prometheus_url": "http://p:9090", "prometheus_headers": {"X-Scope-OrgID": "租户"}},
            id="header-value-outside-latin-1",
        ),
        *(
            pytest.param(
                {"url": url},
                "prometheus.url needs a host and, if given, a port from 0 to 65535",
                {"prometheus_url": url},
                id=f"url-{name}",
            )
            for url, name in BAD_URLS
        ),
    ],
)
def test_chart_refuses_what_the_service_would_refuse_at_start(
    chart: helm.Chart, prometheus: dict[str, Any], message: str, setting: dict[str, Any]
) -> None:
    """Both rendered, and the pods crash-looped on the service's refusal; the URL's password
    sat in the Deployment's args in plain text."""
    with pytest.raises(ValueError):  # the service's own rule, so the case stays honest
        RunSettings(**setting)
    with pytest.raises(helm.HelmError) as refused:
        render_objects(chart, _prometheus(**prometheus))
    assert message in str(refused.value)
    assert "s3cret" not in str(refused.value)
    render_objects(chart, _prometheus(url="https://prom.example:9090/path@x"))  # @ after host
    for url in (
        "http://[fd00::1]:9090",
        "http://prom",
        "http://prom:",  # an empty port is no port, as the service reads it
        "http://prom:65535",
        "https://prom.example/prometheus?x=1",
    ):
        objects = render_objects(chart, _prometheus(url=url))
        RunSettings(prometheus_url=url)
        # one string argument: unquoted, "- --prometheus-url=http://prom:" was a YAML mapping
        # and the API server refused the Deployment
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--prometheus-url={url}" in args


def test_chart_refuses_an_authorization_header_it_would_keep_in_plain_text(
    chart: helm.Chart,
) -> None:
    """`prometheus.headers` goes into the ConfigMap, which the `view` role reads; an
    Authorization header there was a token readable by anyone who may view the namespace."""
    for name in ("Authorization", "authorization"):
        with pytest.raises(helm.HelmError) as refused:
            render_objects(chart, _prometheus(headers={name: "Bearer s3cret"}))
        assert f"prometheus.headers sets {name}, a credential the ConfigMap would hold" in str(
            refused.value
        )
        assert "s3cret" not in str(refused.value)
    render_objects(chart, _prometheus(headers={"X-Scope-OrgID": "inference"}))


def test_chart_refuses_a_basic_auth_user_name_outside_latin_1(chart: helm.Chart) -> None:
    """requests encodes basic auth as Latin-1: the pods started, and every query failed
    with a codec error naming no setting."""
    with pytest.raises(PrometheusCredentialsError):  # the service's own rule
        PrometheusCredentials(basic_auth_username="用户", basic_auth_password_file=Path("/p"))
    auth = {"basicAuth": {"username": "用户", "passwordSecret": {"name": "prometheus-basic-auth"}}}
    with pytest.raises(helm.HelmError) as refused:
        render_objects(chart, _prometheus(**auth))
    assert "prometheus.basicAuth.username: a character outside Latin-1" in str(refused.value)
