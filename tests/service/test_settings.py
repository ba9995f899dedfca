"""Settings of `gang-autoscaler run`: precedence, Go durations, clear errors."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from autoscaler.service.settings import (
    OTHER_ENV_VARIABLES,
    PrometheusQueries,
    RunSettings,
    SettingsError,
    build_run_parser,
    load_settings,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("GANG_AUTOSCALER_"):
            monkeypatch.delenv(name)


def _load(*argv: str) -> RunSettings:
    return load_settings(build_run_parser().parse_args(list(argv)))


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_follow_the_design() -> None:
    settings = _load("--prometheus-url", "http://prom:9090")
    assert settings.tick_s == 15.0
    assert settings.http_port == 8080
    assert settings.namespaces == ()
    assert settings.dry_run is False
    assert settings.backfill_days == 7.0
    assert settings.queries.waiting == "sum by (namespace, pod) (vllm:num_requests_waiting)"
    assert "vllm:gpu_cache_usage_perc" in settings.queries.kv_cache
    assert "vllm:kv_cache_usage_perc" in settings.queries.kv_cache
    assert settings.kubeconfig is None
    assert settings.lease_namespace is None
    assert settings.forecast_model == "seasonal_envelope"
    plain = _load("--prometheus-url", "http://prom:9090", "--forecast-model", "state_space")
    assert plain.forecast_model == "state_space"


def test_flags_beat_environment_beat_file_beat_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _write(
        tmp_path,
        "prometheus_url: http://from-file:9090\n"
        "tick: 1m\n"
        "http_port: 9000\n"
        "log_format: json\n"
        "queries:\n  waiting: sum by (namespace, pod) (my_queue)\n",
    )
    monkeypatch.setenv("GANG_AUTOSCALER_TICK", "30s")
    monkeypatch.setenv("GANG_AUTOSCALER_HTTP_PORT", "9100")
    monkeypatch.setenv("GANG_AUTOSCALER_QUERIES__RUNNING", "sum by (namespace, pod) (my_running)")
    settings = _load("--config", config, "--http-port", "9200")
    assert settings.http_port == 9200  # flag over env over file
    assert settings.tick == timedelta(seconds=30)  # env over file
    assert settings.log_format == "json"  # file over default
    assert settings.prometheus_url == "http://from-file:9090"
    assert settings.queries.waiting == "sum by (namespace, pod) (my_queue)"
    assert settings.queries.running == "sum by (namespace, pod) (my_running)"
    # a query not overridden anywhere keeps its default
    assert settings.queries.kv_cache == PrometheusQueries().kv_cache
    assert settings.staleness_limit_s == 120.0


def test_balloon_image_comes_from_flag_environment_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _load("--prometheus-url", "http://p:1").balloon_image == "registry.k8s.io/pause:3.10"
    config = _write(
        tmp_path, "prometheus_url: http://p:1\nballoon_image: file.example/pause:3.10\n"
    )
    assert _load("--config", config).balloon_image == "file.example/pause:3.10"
    monkeypatch.setenv("GANG_AUTOSCALER_BALLOON_IMAGE", "env.example/pause:3.10")
    assert _load("--config", config).balloon_image == "env.example/pause:3.10"
    flagged = _load("--config", config, "--balloon-image", "flag.example/pause@sha256:0a1b")
    assert flagged.balloon_image == "flag.example/pause@sha256:0a1b"


def test_namespaces_repeat_on_the_command_line_and_split_from_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flags = _load("--prometheus-url", "http://p:1", "--namespace", "a", "--namespace", "b")
    assert flags.namespaces == ("a", "b")
    repeated = _load("--prometheus-url", "http://p:1", "--namespace", "a", "--namespace", "a")
    assert repeated.namespaces == ("a",)
    # a comma list, as the environment variable takes it, was refused as one bad name
    listed = _load("--prometheus-url", "http://p:1", "--namespace", "a,b", "--namespace", "c")
    assert listed.namespaces == ("a", "b", "c")
    for empty in ("", ",", " "):  # `--namespace "$NS"` with NS unset: not every namespace
        with pytest.raises(SettingsError, match="not Kubernetes namespace names"):
            _load("--prometheus-url", "http://p:1", "--namespace", empty)
    monkeypatch.setenv("GANG_AUTOSCALER_NAMESPACES", "serving, batch")
    assert _load("--prometheus-url", "http://p:1").namespaces == ("serving", "batch")


def test_dry_run_flag_can_switch_off_what_the_environment_switched_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GANG_AUTOSCALER_DRY_RUN", "true")
    assert _load("--prometheus-url", "http://p:1").dry_run is True
    assert _load("--prometheus-url", "http://p:1", "--no-dry-run").dry_run is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param([], "prometheus_url: Field required", id="missing-prometheus-url"),
        pytest.param(["--prometheus-url", "prom:9090"], "prometheus_url", id="url-no-scheme"),
        pytest.param(
            ["--prometheus-url", "http://p:1", "--tick", "15"], "tick", id="duration-no-unit"
        ),
        pytest.param(
            ["--prometheus-url", "http://p:1", "--tick", "0s"], "longer than 0s", id="zero-tick"
        ),
        pytest.param(
            ["--prometheus-url", "http://p:1", "--tick", "1ns"],
            "tick: .*'1ns' is shorter than 1ms",
            id="tick-below-1ms",
        ),
        pytest.param(
            ["--prometheus-url", "http://p:1", "--tick", "99999999999h"],
            "tick: .*'99999999999h' is too long to be a duration",
            id="tick-past-timedelta-was-a-traceback",
        ),
        pytest.param(
            ["--prometheus-url", "http://p:1", "--http-port", "70000"], "http_port", id="bad-port"
        ),
        pytest.param(
            ["--prometheus-url", "http://p:1", "--namespace", "Serving_NS"],
            "namespaces",
            id="namespace-not-dns-label",
        ),
        pytest.param(
            ["--prometheus-url", "http://p:1", "--lease-duration", "2s"],
            "lease_duration: .*at least 3s",
            id="lease-too-short-for-renewals",
        ),
        pytest.param(
            ["--prometheus-url", "http://p:1", "--balloon-image", "pause 3.10"],
            "balloon_image",
            id="balloon-image-with-a-space",
        ),
        pytest.param(
            ["--prometheus-url", "http://p:1", "--balloon-image", ""],
            "balloon_image",
            id="empty-balloon-image",
        ),
    ],
)
def test_bad_values_are_refused_with_the_field_named(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        _load(*argv)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("prometheus_url: http://p:1\ntik: 15s\n", "tik", id="typo-key"),
        pytest.param("- a\n- b\n", "YAML mapping", id="not-a-mapping"),
        pytest.param("prometheus_url: [unclosed\n", "not valid YAML", id="broken-yaml"),
        pytest.param(
            "prometheus_url: http://p:1\ntick: 15s\ntick: 1h\n",
            r"(?s)not valid YAML.*found key 'tick' twice \(lines 2 and 3\)",
            id="key-given-twice",
        ),
        pytest.param(
            "prometheus_url: http://p:1\nqueries:\n  waiting: sum(vllm:num_requests_waiting)\n",
            "namespace",
            id="query-loses-pod-label",
        ),
        pytest.param(
            "prometheus_url: http://p:1\nbuffer:\n  min_gangs: 3\n  max_gangs: 1\n",
            "min_gangs",
            id="buffer-min-above-max",
        ),
        pytest.param(
            "prometheus_url: http://p:1\nforecast_model: prophet\n",
            "unknown forecast model 'prophet'; known: persistence",
            id="unknown-forecast-model",
        ),
    ],
)
def test_bad_config_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        _load("--config", _write(tmp_path, text))


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"nope\.yaml"):
        _load("--config", str(tmp_path / "nope.yaml"), "--prometheus-url", "http://p:1")


def test_top_level_log_level_reaches_the_settings() -> None:
    from autoscaler.cli import build_parser

    args = build_parser().parse_args(
        ["--log-level", "debug", "run", "--prometheus-url", "http://p:1"]
    )
    assert load_settings(args).log_level == "DEBUG"
    assert _load("--prometheus-url", "http://p:1").log_level == "INFO"


def test_log_level_from_the_environment_is_read_in_any_case(monkeypatch) -> None:
    monkeypatch.setenv("GANG_AUTOSCALER_LOG_LEVEL", "warning")
    assert _load("--prometheus-url", "http://p:1").log_level == "WARNING"


def test_prometheus_credentials_come_from_flags_environment_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = _write(
        tmp_path,
        "prometheus_url: https://thanos-querier.openshift-monitoring.svc:9091\n"
        f"prometheus_bearer_token_file: {token}\n"
        f"prometheus_ca_file: {ca}\n"
        "prometheus_headers:\n  X-Scope-OrgID: from-file\n",
    )
    from_file = _load("--config", config).prometheus_credentials
    assert from_file.bearer_token_file == token
    assert from_file.ca_file == ca
    assert dict(from_file.headers) == {"X-Scope-OrgID": "from-file"}

    monkeypatch.setenv("GANG_AUTOSCALER_PROMETHEUS_HEADERS", '{"X-Scope-OrgID": "from-env"}')
    assert _load("--config", config).prometheus_headers == {"X-Scope-OrgID": "from-env"}
    flagged = _load(
        "--config",
        config,
        "--prometheus-header",
        "X-Scope-OrgID=from-flag",
        "--prometheus-header",
        "X-Extra = a=b",
    )
    assert flagged.prometheus_headers == {"X-Scope-OrgID": "from-flag", "X-Extra": "a=b"}
    assert "from-flag" not in repr(flagged)  # header values may be credentials


def test_a_header_in_the_environment_beats_the_file_whatever_the_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The chart writes X-Scope-OrgID into the config file; pydantic-settings reads the
    # variable's name in lower case. One header must remain, with the environment's value.
    config = _write(
        tmp_path,
        "prometheus_headers:\n  X-Scope-OrgID: from-file\n  X-Extra: kept\n",
    )
    monkeypatch.setenv("GANG_AUTOSCALER_PROMETHEUS_HEADERS__X-Scope-OrgID", "from-env")
    settings = _load("--config", config, "--prometheus-url", "http://p:1")
    assert settings.prometheus_headers == {"x-scope-orgid": "from-env", "X-Extra": "kept"}
    monkeypatch.delenv("GANG_AUTOSCALER_PROMETHEUS_HEADERS__X-Scope-OrgID")
    monkeypatch.setenv("GANG_AUTOSCALER_PROMETHEUS_HEADERS", '{"X-SCOPE-ORGID": "from-json"}')
    settings = _load("--config", config, "--prometheus-url", "http://p:1")
    assert settings.prometheus_headers == {"X-SCOPE-ORGID": "from-json", "X-Extra": "kept"}


def test_a_header_flag_adds_to_the_headers_below_it_instead_of_replacing_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One --prometheus-header used to drop every header of the file and the environment:
    the Mimir tenant header went, and every query failed."""
    config = _write(tmp_path, "prometheus_headers:\n  X-Scope-OrgID: tenant\n  X-Extra: file\n")
    monkeypatch.setenv("GANG_AUTOSCALER_PROMETHEUS_HEADERS__X-Env", "env")
    monkeypatch.setenv("GANG_AUTOSCALER_PROMETHEUS_HEADERS__Authorization", "from-env")
    settings = _load(
        "--config", config, "--prometheus-url", "http://p:1",
        "--prometheus-header", "Authorization=Bearer flag",
        "--prometheus-header", "x-extra=flag",
    )  # fmt: skip
    assert settings.prometheus_headers == {
        "Authorization": "Bearer flag",  # beats the environment's, whatever the case
        "x-extra": "flag",  # beats the file's
        "x-env": "env",
        "X-Scope-OrgID": "tenant",
    }


@pytest.mark.parametrize(
    "flag",
    [
        "Authorization: Bearer s3cr3t",
        "Authorization: Basic dXNlcjpzM2NyZXQ=",  # base64's '=' split it as NAME=VALUE
        "Authorization Bearer s3cr3t=",
    ],
)
def test_a_malformed_header_flag_is_refused_without_echoing_its_value(flag: str) -> None:
    with pytest.raises(SettingsError) as raised:
        _load("--prometheus-url", "http://p:1", "--prometheus-header", flag)
    message = str(raised.value)
    assert "s3cr3t" not in message and "dXNlcjpzM2NyZXQ" not in message
    assert "Authorization" in message


def test_credentials_in_the_prometheus_url_are_refused_without_echoing_them() -> None:
    # requests sends user:password@ as basic auth, and the URL was logged at every start.
    with pytest.raises(SettingsError) as raised:
        _load("--prometheus-url", "https://gang:s3cr3t@prometheus:9090")
    assert "s3cr3t" not in str(raised.value)
    assert "prometheus_basic_auth_password_file" in str(raised.value)


def test_a_header_value_with_leading_whitespace_is_refused_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # requests refused it on every query, quoting the value in an error that reached the
    # log and /decisions.
    message = _refusal_of(
        monkeypatch, "GANG_AUTOSCALER_PROMETHEUS_HEADERS", '{"X-Api-Key": " tok-SECRET-123"}'
    )
    assert "leading whitespace in the value of X-Api-Key" in message
    assert "SECRET" not in message


def test_one_header_named_twice_in_one_source_is_refused() -> None:
    with pytest.raises(SettingsError) as raised:
        _load(
            "--prometheus-url",
            "http://p:1",
            "--prometheus-header",
            "X-Scope-OrgID=a",
            "--prometheus-header",
            "x-scope-orgid=b",
        )
    assert str(raised.value) == (
        "invalid settings:\n  prometheus_headers: one header named twice: "
        "X-Scope-OrgID and x-scope-orgid"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param(
            ["--prometheus-bearer-token-file", "{missing}"],
            "prometheus_bearer_token_file: cannot read",
            id="missing-token-file",
        ),
        pytest.param(
            ["--prometheus-bearer-token-file", "{empty}"],
            "prometheus_bearer_token_file: {empty} is empty",
            id="empty-token-file",
        ),
        pytest.param(
            [
                "--prometheus-bearer-token-file",
                "{token}",
                "--prometheus-header",
                "authorization=Bearer other",
            ],
            "prometheus_headers sets Authorization, and so does prometheus_bearer_token_file",
            id="authorization-twice",
        ),
        pytest.param(
            ["--prometheus-basic-auth-username", "u"],
            "prometheus_basic_auth_password_file, or neither",
            id="basic-auth-without-password",
        ),
        pytest.param(
            [
                "--prometheus-basic-auth-username",
                "team:a",
                "--prometheus-basic-auth-password-file",
                "{token}",
            ],
            "prometheus_basic_auth_username: a colon, a control character or one outside "
            "Latin-1 cannot be sent",
            id="basic-auth-username-with-colon",
        ),
        pytest.param(
            [
                "--prometheus-basic-auth-username",
                "用户",
                "--prometheus-basic-auth-password-file",
                "{token}",
            ],
            "a colon, a control character or one outside Latin-1 cannot be sent",
            id="basic-auth-username-outside-latin-1",  # a codec error on every query
        ),
        pytest.param(
            ["--prometheus-bearer-token-file", "{unsendable}"],
            "prometheus_bearer_token_file: {unsendable} has characters an HTTP header cannot "
            "carry (outside Latin-1; the value is not shown)",
            id="token-outside-latin-1",
        ),
        pytest.param(
            ["--prometheus-header", "X-Scope-OrgID=租户"],
            "prometheus_headers: characters an HTTP header cannot carry (outside Latin-1) in "
            "the value of X-Scope-OrgID",
            id="header-value-outside-latin-1",
        ),
        pytest.param(
            ["--prometheus-url", "http://prom:abc"],
            "prometheus_url: the port is not a number from 0 to 65535",
            id="url-port-not-a-number",  # started, then every query failed to parse
        ),
        pytest.param(
            ["--prometheus-url", "http://:9090"],
            "prometheus_url: no host in the URL",
            id="url-without-a-host",
        ),
        pytest.param(
            ["--lease-namespace", "Bad_NS"],
            "lease_namespace: 'Bad_NS' is not a Kubernetes namespace name",
            id="lease-namespace",  # Ready, never leading, a traceback every 2 s
        ),
        pytest.param(
            ["--lease-name", "my_lease"],
            "lease_name: 'my_lease' is not a Kubernetes object name",
            id="lease-name",
        ),
        pytest.param(
            ["--backfill-days", "nan"],
            "backfill_days: Input should be a finite number",
            id="backfill-days-not-a-number",  # was "less than or equal to 90"
        ),
        pytest.param(
            ["--config", "{config}"],
            "http_port: true is a yes/no; a number is expected here",
            id="a-yes-or-no-for-a-port",  # served on port 1
        ),
        pytest.param(
            ["--prometheus-header", "X-Scope-OrgID"],
            "prometheus_headers: expected NAME=VALUE",
            id="header-without-value",
        ),
        pytest.param(
            ["--prometheus-ca-file", "{missing}"],
            "prometheus_ca_file: {missing} is not a readable file",
            id="missing-ca-file",
        ),
    ],
)
def test_bad_credentials_and_settings_are_named_at_start(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    paths = {
        "missing": tmp_path / "absent",
        "empty": tmp_path / "empty",
        "token": tmp_path / "t",
        "unsendable": tmp_path / "u",
        "config": tmp_path / "c.yaml",
    }
    paths["empty"].write_text("\n")
    paths["token"].write_text("x")
    paths["unsendable"].write_text("tok✓en")
    paths["config"].write_text("http_port: true\n")
    argv = [arg.format(**paths) for arg in extra]
    with pytest.raises(SettingsError) as raised:
        _load("--prometheus-url", "http://prom:9090", *argv)
    assert message.format(**paths) in str(raised.value)


def _refusal_of(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> str:
    """What loading the settings says with `variable` set to `value` in the environment."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as raised:
        _load("--prometheus-url", "http://p:1")
    return str(raised.value)


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        pytest.param(
            "GANG_AUTOSCALER_NAMESPACE",
            "team-a",
            "environment variable GANG_AUTOSCALER_NAMESPACE: unknown setting; "
            "did you mean GANG_AUTOSCALER_NAMESPACES?",
            id="singular-like-the-flag",
        ),
        pytest.param(
            "GANG_AUTOSCALER_QUERIES_WAITING",
            "sum(x)",
            "environment variable GANG_AUTOSCALER_QUERIES_WAITING: unknown setting; "
            "did you mean GANG_AUTOSCALER_QUERIES__WAITING?",
            id="one-underscore-for-a-nested-key",
        ),
        pytest.param(
            "gang_autoscaler_dryrun",  # read in any case, as the settings themselves are
            "true",
            "environment variable gang_autoscaler_dryrun: unknown setting; "
            "did you mean GANG_AUTOSCALER_DRY_RUN?",
            id="lower-case",
        ),
        pytest.param(
            "GANG_AUTOSCALER_TICK__SECONDS",
            "15",
            "environment variable GANG_AUTOSCALER_TICK__SECONDS: unknown setting",
            id="nested-under-a-plain-setting",
        ),
        pytest.param(
            "GANG_AUTOSCALER_PROMETHEUS",
            "http://p:1",
            "environment variable GANG_AUTOSCALER_PROMETHEUS: unknown setting; "
            "did you mean GANG_AUTOSCALER_PROMETHEUS_URL?",
            id="a-shortened-name",
        ),
        pytest.param(
            "GANG_AUTOSCALER_MAX_REPLICAS",
            "4",
            "environment variable GANG_AUTOSCALER_MAX_REPLICAS: unknown setting",
            id="nothing-close",
        ),
    ],
)
def test_an_unknown_variable_with_the_prefix_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, line: str
) -> None:
    assert _refusal_of(monkeypatch, variable, value) == "invalid settings:\n  " + line


def test_the_projects_own_variables_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    from forecasting.traces import TRACES_ENV

    assert TRACES_ENV in OTHER_ENV_VARIABLES  # simulate's and backtest's, not run's
    monkeypatch.setenv(TRACES_ENV, "/data/traces")
    monkeypatch.setenv("GANG_AUTOSCALER_BUFFER__MAX_GANGS", "3")
    monkeypatch.setenv("GANG_AUTOSCALER_PROMETHEUS_HEADERS__X_ORG", "team-a")  # one entry
    settings = _load("--prometheus-url", "http://p:1")
    assert settings.buffer.max_gangs == 3
    assert settings.prometheus_headers == {"x_org": "team-a"}


# What the kubelet injects for a Service named `gang-autoscaler` (the documented release
# name) or `gang-autoscaler-shadow` while `enableServiceLinks` is on.
SERVICE_LINKS = {
    "GANG_AUTOSCALER_SERVICE_HOST": "10.96.12.34",
    "GANG_AUTOSCALER_SERVICE_PORT": "8080",
    "GANG_AUTOSCALER_SERVICE_PORT_HTTP": "8080",
    "GANG_AUTOSCALER_PORT": "tcp://10.96.12.34:8080",
    "GANG_AUTOSCALER_PORT_8080_TCP": "tcp://10.96.12.34:8080",
    "GANG_AUTOSCALER_PORT_8080_TCP_PROTO": "tcp",
    "GANG_AUTOSCALER_PORT_8080_TCP_PORT": "8080",
    "GANG_AUTOSCALER_PORT_8080_TCP_ADDR": "10.96.12.34",
    "GANG_AUTOSCALER_SHADOW_SERVICE_HOST": "10.96.12.35",
    "GANG_AUTOSCALER_SHADOW_PORT": "tcp://10.96.12.35:8080",
}


def test_service_link_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """They made the service refuse to start (exit 2) in a pod of the documented install."""
    for variable, value in SERVICE_LINKS.items():
        monkeypatch.setenv(variable, value)
    settings = _load("--prometheus-url", "http://p:1")
    assert settings.http_port == 8080
    # a misspelled setting that happens to end in _PORT is still refused
    assert "GANG_AUTOSCALER_HTP_PORT: unknown setting" in _refusal_of(
        monkeypatch, "GANG_AUTOSCALER_HTP_PORT", "9090"
    )


def test_an_undecodable_environment_value_names_the_variable_not_a_config_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GANG_AUTOSCALER_PROMETHEUS_HEADERS", "bad")
    with pytest.raises(SettingsError) as raised:
        _load("--prometheus-url", "http://x")
    assert str(raised.value) == (
        "invalid settings:\n  environment variable GANG_AUTOSCALER_PROMETHEUS_HEADERS: "
        "not valid JSON (Expecting value: line 1 column 1 (char 0)); "
        "this setting takes a JSON object"
    )


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        pytest.param(
            "GANG_AUTOSCALER_QUERIES",
            '{"waitng": "sum by (namespace, pod) (vllm:num_requests_waiting)"}',
            "environment variable GANG_AUTOSCALER_QUERIES, key waitng: unknown setting",
            id="unknown-query-name",
        ),
        pytest.param(
            "GANG_AUTOSCALER_QUERIES",
            '{"WAITING": "sum(vllm:num_requests_waiting)"}',
            "environment variable GANG_AUTOSCALER_QUERIES, key WAITING: must keep the "
            "`namespace` and `pod` labels, e.g. sum by (namespace, pod)",
            id="bad-query-named-as-written",
        ),
        pytest.param(
            "GANG_AUTOSCALER_BUFFER",
            '{"max_gangs": -1}',
            "environment variable GANG_AUTOSCALER_BUFFER, key max_gangs: "
            "Input should be greater than or equal to 0",
            id="bad-buffer-bound",
        ),
    ],
)
def test_a_bad_key_in_a_json_environment_value_names_the_variable_and_the_key(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, line: str
) -> None:
    assert _refusal_of(monkeypatch, variable, value) == "invalid settings:\n  " + line


def test_a_bad_key_in_the_file_is_not_blamed_on_a_json_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both set `queries`; only the key the variable gave is named by the variable.
    monkeypatch.setenv("GANG_AUTOSCALER_QUERIES", '{"running": "sum(x)"}')
    config = _write(tmp_path, "queries:\n  waitng: sum by (namespace, pod) (x)\n")
    with pytest.raises(SettingsError) as raised:
        _load("--config", config, "--prometheus-url", "http://p:1")
    assert str(raised.value).splitlines()[1:] == [
        "  environment variable GANG_AUTOSCALER_QUERIES, key running: must keep the "
        "`namespace` and `pod` labels, e.g. sum by (namespace, pod)",
        "  queries.waitng: unknown setting",
    ]


def test_an_invalid_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANG_AUTOSCALER_TICK", "15")
    monkeypatch.setenv("GANG_AUTOSCALER_BUFFER__MIN_GANGS", "many")
    with pytest.raises(SettingsError) as raised:
        _load("--prometheus-url", "http://x")
    message = str(raised.value)
    assert "  environment variable GANG_AUTOSCALER_TICK: '15' is not a duration" in message
    assert "  environment variable GANG_AUTOSCALER_BUFFER__MIN_GANGS: Input should be" in message
    # A flag overrides the variable, whose value is then not used.
    monkeypatch.delenv("GANG_AUTOSCALER_BUFFER__MIN_GANGS")
    assert _load("--prometheus-url", "http://x", "--tick", "30s").tick_s == 30.0
