"""Settings of `gang-autoscaler run`: one pydantic-settings model, one loader, one parser.

Precedence, highest first: command-line flags > environment (`GANG_AUTOSCALER_*`) > the YAML
file named by `--config` > the defaults below. The defaults live here and only here; the Helm
chart's values mirror them and `tests/charts` checks that every flag the chart passes exists.
A `GANG_AUTOSCALER_*` variable that names no setting is refused, as an unknown key in the file
is.

Durations are Go-style strings (`15s`, `1m30s`) everywhere: flags, environment and YAML. They
are held as `timedelta` so the unit travels with the value; the `*_s` properties give seconds.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)
from pydantic_settings import SettingsError as SourceError

from autoscaler import strict_yaml
from autoscaler.adapters.kube_objects import PAUSE_IMAGE
from autoscaler.adapters.prometheus_auth import (
    PrometheusCredentials,
    PrometheusCredentialsError,
    read_secret_file,
    sendable_in_a_header,
)
from autoscaler.adapters.prometheus_queries import PrometheusQueries
from autoscaler.core.policy import PREFIX, parse_duration
from autoscaler.validation_errors import describe_validation_error, refuse_yes_or_no
from forecasting.models import MODELS, PLANNING_MODEL

ENV_PREFIX = "GANG_AUTOSCALER_"
# Variables with the prefix that are no setting of `run` but are the project's own, so they
# may share its environment: the traces directory of `simulate` and `backtest`
# (forecasting.traces.TRACES_ENV; not imported, as that module brings pandas with it).
OTHER_ENV_VARIABLES = frozenset({"GANG_AUTOSCALER_TRACES"})
# What the kubelet injects for each Service in the namespace while `enableServiceLinks` is on
# (the chart turns it off): a Service named `gang-autoscaler` gives GANG_AUTOSCALER_SERVICE_HOST,
# GANG_AUTOSCALER_PORT_8080_TCP_ADDR and so on. Passed over, not refused, when they set nothing.
_SERVICE_LINK = re.compile(
    r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_[A-Z]+)?)$"
)
# `<SERVICE>_PORT` alone holds a URL such as tcp://10.96.0.7:8080; a misspelled setting
# ending in _PORT (GANG_AUTOSCALER_HTP_PORT=8080) holds a number and is still refused.
_SERVICE_LINK_URL = re.compile(r"^[A-Z0-9_]+_PORT$")


def _is_service_link(variable: str, value: str) -> bool:
    name = variable.upper()
    if _SERVICE_LINK.match(name):
        return True
    return bool(_SERVICE_LINK_URL.match(name)) and value.startswith(("tcp://", "udp://", "sctp://"))


# The shortest leader Lease that leaves whole seconds for the renew deadline and retries.
MIN_LEASE_DURATION_S = 3
MAX_LEASE_DURATION_S = 3600
# The shortest duration setting: timedelta keeps whole microseconds, so 1ns would read as 0s.
MIN_DURATION_S = 1e-3


class SettingsError(ValueError):
    """The settings of `run` are invalid; the message names every bad field and its source."""


def _to_timedelta(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value
    seconds = parse_duration(value)
    if 0 < seconds < MIN_DURATION_S:
        raise ValueError(f"{value!r} is shorter than 1ms, the shortest these settings take")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:  # not a ValueError: it left `run` with a traceback
        raise ValueError(f"{value!r} is too long to be a duration") from None


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be longer than 0s")
    return value


# A Go-style duration ("15s", "1m30s"); a bare number is refused because `5` is ambiguous.
Duration = Annotated[timedelta, BeforeValidator(_to_timedelta), AfterValidator(_positive)]


def _go_duration(value: timedelta) -> str:
    """Format a duration the way `parse_duration` reads it back (for --help and docs)."""
    total_s = value.total_seconds()
    if total_s % 3600 == 0:
        return f"{int(total_s // 3600)}h"
    if total_s % 60 == 0:
        return f"{int(total_s // 60)}m"
    if total_s == int(total_s):
        return f"{int(total_s)}s"
    return f"{int(total_s * 1000)}ms"


class BufferDefaults(BaseModel):
    """Balloon-gang buffer bounds for an LWS that sets no `min-buffer`/`max-buffer`
    annotation. The annotations, when present, always win."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_gangs: int = Field(
        default=0, ge=0, le=1000, description="Default `gang-autoscaler.io/min-buffer`."
    )
    max_gangs: int = Field(
        default=2, ge=0, le=1000, description="Default `gang-autoscaler.io/max-buffer`."
    )

    _counts_are_numbers = field_validator("min_gangs", "max_gangs", mode="before")(refuse_yes_or_no)

    @model_validator(mode="after")
    def _ordered(self) -> BufferDefaults:
        if self.min_gangs > self.max_gangs:
            raise ValueError(f"min_gangs ({self.min_gangs}) is above max_gangs ({self.max_gangs})")
        return self

    def annotations(self) -> dict[str, str]:
        """As the default annotations an LWS's own annotations are laid over."""
        return {
            PREFIX + "min-buffer": str(self.min_gangs),
            PREFIX + "max-buffer": str(self.max_gangs),
        }


def _split_namespaces(value: Any) -> Any:
    # Environment gives one string: accept "a,b" as well as a YAML/flag list, and in a list
    # "a,b" too (`--namespace a,b`, as the environment variable takes it).
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        # An entry with no name in it (`--namespace "$NS"` with NS unset) stays, to be
        # refused: dropped, it would widen the watch to every namespace.
        return tuple(name for part in value for name in (_split_namespaces(part) or (part,)))
    return value


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _lease_namespace(value: str | None) -> str | None:
    if value is not None and not _DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes namespace name (lowercase letters, digits and -, "
            "at most 63)"
        )
    return value


def _lease_name(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes object name (lowercase letters, digits, - and ., "
            "at most 253)"
        )
    return value


def _valid_namespaces(value: tuple[str, ...]) -> tuple[str, ...]:
    bad = [name for name in value if not _DNS_LABEL.match(name)]
    if bad:
        raise ValueError(f"not Kubernetes namespace names: {', '.join(map(repr, bad))}")
    return tuple(dict.fromkeys(value))  # drop repeats, keep order


def _header_pairs(value: Any) -> Any:
    # Flags give a list of "Name=Value"; environment (JSON) and YAML give a mapping.
    if isinstance(value, list | tuple):
        pairs = {}
        for item in value:
            name, sep, header_value = str(item).partition("=")
            named, colon, _ = str(item).partition(":")
            if colon and (not sep or ":" in name):
                # curl's "Name: value" (perhaps with a base64 '=' in the value): never echoed
                # whole, the value is the credential
                raise ValueError(
                    f"expected NAME=VALUE, got 'NAME: VALUE' ({named.strip()!r}: write "
                    f"{named.strip()}=VALUE)"
                )
            if not sep:
                raise ValueError("expected NAME=VALUE, got a header without '='")
            pairs[name.strip()] = header_value.strip()
        return pairs
    return value


# RFC 9110 token characters; a value must not carry a line break into the request.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _valid_headers(value: dict[str, str]) -> dict[str, str]:
    bad = [name for name in value if not _HEADER_NAME.match(name)]
    if bad:
        # shown up to the first character a name cannot have: a value pasted into the
        # name ("Authorization Bearer ...") is not echoed
        shown = [re.split(r"[^!#$%&'*+.^_`|~0-9A-Za-z-]", name, maxsplit=1)[0] for name in bad]
        raise ValueError(
            f"not HTTP header names: {', '.join(repr(n + '...') for n in shown)} (a name is "
            "letters, digits and -; the value goes after =)"
        )
    # Header names are case-insensitive (RFC 9110 section 5.1): two spellings of one name in
    # one source would go out as one header with either value (requests keeps the last).
    spellings: dict[str, list[str]] = {}
    for name in value:
        spellings.setdefault(name.lower(), []).append(name)
    twice = [" and ".join(names) for names in spellings.values() if len(names) > 1]
    if twice:
        raise ValueError(f"one header named twice: {'; '.join(twice)}")
    broken = [name for name, text in value.items() if "\r" in text or "\n" in text]
    if broken:  # the value itself is never echoed: it may be a credential
        raise ValueError(f"line break in the value of {', '.join(broken)}")
    # requests refuses such a value on every query, quoting it in its error message
    padded = [name for name, text in value.items() if text[:1].isspace()]
    if padded:
        raise ValueError(f"leading whitespace in the value of {', '.join(padded)}")
    unsendable = [name for name, text in value.items() if not sendable_in_a_header(text)]
    if unsendable:
        raise ValueError(
            "characters an HTTP header cannot carry (outside Latin-1) in the value of "
            + ", ".join(unsendable)
        )
    return value


def _reachable_url(url: str) -> str:
    # `http://prom:abc`, `http://x:99999` and `http://:9090` matched the pattern, started,
    # and failed every query with a parse error while the pod stayed Ready
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError("no host in the URL (http://HOST:PORT)")
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError as err:
        raise ValueError(f"the port is not a number from 0 to 65535 ({err})") from err
    return url


def _no_userinfo(url: str) -> str:
    # requests would send user:password@ as basic auth, and the URL is logged at start and
    # stored in the chart's ConfigMap. The message never echoes the URL.
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "credentials in the URL (user:password@) would be logged and stored in plain "
            "text; set prometheus_basic_auth_username and prometheus_basic_auth_password_file"
        )
    return url


def _secret_file_readable(setting: str) -> Any:
    def check(path: Path | None) -> Path | None:
        if path is not None:
            try:
                read_secret_file(path, setting=setting)
            except PrometheusCredentialsError as err:
                raise ValueError(str(err).removeprefix(f"{setting}: ")) from err
        return path

    return AfterValidator(check)


def _file_exists(path: Path | None) -> Path | None:
    if path is not None and not path.is_file():
        raise ValueError(f"{path} is not a readable file")
    return path


class RunSettings(BaseSettings):
    """Everything `gang-autoscaler run` needs to know. Built by `load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        case_sensitive=False,
    )

    kubeconfig: Path | None = Field(
        default=None,
        description="Kubeconfig file. Unset: in-cluster config, then ~/.kube/config.",
    )
    prometheus_url: Annotated[str, AfterValidator(_no_userinfo), AfterValidator(_reachable_url)] = (
        Field(
            ...,
            pattern=r"^https?://[^\s]+$",
            description="Base URL of the Prometheus HTTP API, e.g. "
            "http://prometheus-operated.monitoring.svc:9090.",
        )
    )
    namespaces: Annotated[
        tuple[str, ...],
        NoDecode,
        BeforeValidator(_split_namespaces),
        AfterValidator(_valid_namespaces),
    ] = Field(
        default=(),
        description="Namespaces to watch for opted-in LeaderWorkerSets (repeat the flag, or "
        "separate them by commas). Empty: all namespaces.",
    )
    tick: Duration = Field(
        default=timedelta(seconds=15), description="Interval between control-loop ticks."
    )
    dry_run: bool = Field(
        default=False, description="Decide and report every tick, but never write to the cluster."
    )
    http_port: int = Field(
        default=8080, ge=1, le=65535, description="Port of /healthz, /readyz, /metrics, /decisions."
    )
    # Checked as the API server checks them: a name it refuses left the service Ready but
    # never leading (a library traceback every 2 s, nothing scaled)
    lease_namespace: Annotated[str | None, AfterValidator(_lease_namespace)] = Field(
        default=None,
        description="Namespace of the leader-election Lease. Unset: the pod's own namespace.",
    )
    lease_name: Annotated[str, AfterValidator(_lease_name)] = Field(
        default="gang-autoscaler", description="Name of the leader-election Lease."
    )
    lease_duration: Duration = Field(
        default=timedelta(seconds=15),
        description="How long a Lease stays valid without renewal; a standby takes over after "
        "it (renewed well within it, independently of the tick).",
    )
    log_format: Literal["json", "text"] = Field(
        default="text", description="`json` (one object per line, for log pipelines) or `text`."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO",
        description="Log level; `run` fills it from the top-level `gang-autoscaler --log-level`.",
    )
    prometheus_timeout: Duration = Field(
        default=timedelta(seconds=10),
        description="Deadline of one Prometheus query, at most half the tick (7.5s at the "
        "default 15s); a slower answer counts as missing data.",
    )
    prometheus_bearer_token_file: Annotated[
        Path | None, _secret_file_readable("prometheus_bearer_token_file")
    ] = Field(
        default=None,
        description="File holding a token sent as `Authorization: Bearer <token>`, e.g. "
        "/var/run/secrets/kubernetes.io/serviceaccount/token for OpenShift's thanos-querier; "
        "re-read every minute and after a 401, so rotated tokens are picked up.",
    )
    prometheus_basic_auth_username: str | None = Field(
        default=None,
        min_length=1,
        description="User name for HTTP basic auth to Prometheus; the password comes from "
        "prometheus_basic_auth_password_file.",
    )
    prometheus_basic_auth_password_file: Annotated[
        Path | None, _secret_file_readable("prometheus_basic_auth_password_file")
    ] = Field(
        default=None,
        description="File holding the basic-auth password (re-read like the token file).",
    )
    prometheus_headers: Annotated[
        dict[str, str], BeforeValidator(_header_pairs), AfterValidator(_valid_headers)
    ] = Field(
        default={},
        repr=False,  # a value may be a credential
        description="Extra HTTP headers on every Prometheus request, e.g. X-Scope-OrgID for "
        "Grafana Mimir; flag NAME=VALUE (repeatable), environment a JSON object. Only the "
        "names are logged.",
    )
    prometheus_ca_file: Annotated[Path | None, AfterValidator(_file_exists)] = Field(
        default=None,
        description="PEM CA bundle to verify an https Prometheus against (e.g. OpenShift's "
        "service CA). Unset: the system CA store.",
    )
    staleness_limit: Duration = Field(
        default=timedelta(minutes=2),
        description="Samples older than this are missing data (None), so the component holds.",
    )
    demand_window: Duration = Field(
        default=timedelta(minutes=1),
        description="The rate() window of the demand queries. A capacity per gang is learned "
        "only once a component has stayed at 90 % of its target or above this long: a "
        "shorter burst fills the queue while the window's rate still reads the quiet seconds "
        "around it. Change it with the queries' window.",
    )
    watch_staleness_limit: Duration = Field(
        default=timedelta(seconds=60),
        description="When listing and watching LeaderWorkerSets, pods or nodes has failed for "
        "longer than this, the cluster view is stale: every component holds, nothing is "
        "written, and /readyz fails until a list succeeds.",
    )
    backfill_days: float = Field(
        default=7.0,
        ge=0,
        le=90,
        allow_inf_nan=False,  # `nan` was refused as "less than or equal to 90"
        description="Days of demand history read from Prometheus at start for the forecasters, "
        "and how far back a learned capacity per gang is looked up; 0 turns both off.",
    )
    forecast_model: str = Field(
        default=PLANNING_MODEL,
        description="The forecaster capacity is planned from: seasonal_envelope (the "
        "state-space forecast raised to the peak of the last 4 days around the same time of "
        "day) or state_space (the most accurate point forecast, cheaper and later on daily "
        "steps); docs/forecasting.md.",
    )
    cluster_can_grow: bool = Field(
        default=True,
        description=(
            "The cluster has a node autoscaler: request gangs beyond what fits now, and keep "
            "a gang with no pod placed past gang-timeout (its nodes are coming)."
        ),
    )
    balloon_image: str = Field(
        default=PAUSE_IMAGE,
        pattern=r"^\S+$",
        description="Image of the balloon pods' one container, which only sleeps: a mirror of "
        f"{PAUSE_IMAGE} for a cluster that cannot pull from registry.k8s.io. Pulled with the "
        "LWS pod template's imagePullSecrets. Changing it replaces every balloon pod.",
    )
    queries: PrometheusQueries = Field(
        default=PrometheusQueries(), description="PromQL of each signal."
    )
    buffer: BufferDefaults = Field(
        default=BufferDefaults(), description="Default balloon-gang buffer bounds."
    )

    @field_validator("lease_duration")
    @classmethod
    def _lease_long_enough(cls, value: timedelta) -> timedelta:
        # Renewals every lease/7 s and a renew deadline below the lease need whole seconds.
        if value < timedelta(seconds=MIN_LEASE_DURATION_S):
            raise ValueError(
                f"must be at least {MIN_LEASE_DURATION_S}s (client-go's default is 15s)"
            )
        if value > timedelta(seconds=MAX_LEASE_DURATION_S):
            # the Lease's leaseDurationSeconds is an int32, and a standby waits this long
            # after the leader stops: past an hour nothing is scaled for that long
            raise ValueError(f"must be at most {MAX_LEASE_DURATION_S // 3600}h")
        return value

    @model_validator(mode="after")
    def _one_authorization(self) -> RunSettings:
        self.prometheus_credentials  # noqa: B018  # raises when two settings set Authorization
        return self

    @property
    def prometheus_credentials(self) -> PrometheusCredentials:
        """The Prometheus headers, auth files and CA bundle, for `PrometheusSource`."""
        try:
            return PrometheusCredentials(
                headers=dict(self.prometheus_headers),
                bearer_token_file=self.prometheus_bearer_token_file,
                basic_auth_username=self.prometheus_basic_auth_username,
                basic_auth_password_file=self.prometheus_basic_auth_password_file,
                ca_file=self.prometheus_ca_file,
            )
        except PrometheusCredentialsError as err:
            raise ValueError(str(err)) from err

    _numbers = field_validator("http_port", "backfill_days", mode="before")(refuse_yes_or_no)

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_any_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("forecast_model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in MODELS:
            raise ValueError(f"unknown forecast model {value!r}; known: {', '.join(MODELS)}")
        return value

    @property
    def tick_s(self) -> float:
        return self.tick.total_seconds()

    @property
    def lease_duration_s(self) -> float:
        return self.lease_duration.total_seconds()

    @property
    def prometheus_timeout_s(self) -> float:
        return self.prometheus_timeout.total_seconds()

    @property
    def staleness_limit_s(self) -> float:
        return self.staleness_limit.total_seconds()

    @property
    def demand_window_s(self) -> float:
        return self.demand_window.total_seconds()

    @property
    def watch_staleness_limit_s(self) -> float:
        return self.watch_staleness_limit.total_seconds()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags arrive as init kwargs; the YAML file (if any) is set per load on a subclass.
        return (init_settings, _EnvSource(settings_cls), _ConfigFileSource(settings_cls))


def _headers_not_above(values: Mapping[str, Any], above: Mapping[str, Any]) -> dict[str, Any]:
    """`values` less the Prometheus headers that a source above it already sets, under any
    spelling of the name.

    pydantic-settings merges the sources' mappings by exact key and reads variable names in
    lower case, so GANG_AUTOSCALER_PROMETHEUS_HEADERS__X-Scope-OrgID arrives as
    `x-scope-orgid` beside the file's `X-Scope-OrgID` (which the chart's ConfigMap holds).
    Both would reach requests, which sends one header with the lower source's value. The lower
    case itself is harmless, header names being case-insensitive (Go servers such as Mimir,
    Cortex and Thanos canonicalise them).
    """
    out = dict(values)
    headers, taken_by = out.get("prometheus_headers"), above.get("prometheus_headers")
    if isinstance(headers, dict) and isinstance(taken_by, dict):
        taken = {str(name).lower() for name in taken_by}
        out["prometheus_headers"] = {
            name: text for name, text in headers.items() if str(name).lower() not in taken
        }
    return out


class _EnvSource(EnvSettingsSource):
    """The environment, less the headers the flags set (`_headers_not_above`)."""

    def __call__(self) -> dict[str, Any]:
        return _headers_not_above(super().__call__(), self.current_state)


class _ConfigFileSource(YamlConfigSettingsSource):
    """The `--config` file, less the headers the flags or the environment set."""

    def __call__(self) -> dict[str, Any]:
        return _headers_not_above(super().__call__(), self.current_state)


# Flags of `run`: (flag, field, argparse kwargs). Everything except the nested `queries` and
# `buffer`, which are set in the config file or as GANG_AUTOSCALER_QUERIES__WAITING etc.
def _duration_flag(field: str) -> dict[str, Any]:
    default = RunSettings.model_fields[field].default
    return {"metavar": "DURATION", "help_default": _go_duration(default)}


_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--kubeconfig", "kubeconfig", {"metavar": "PATH"}),
    ("--prometheus-url", "prometheus_url", {"metavar": "URL"}),
    ("--namespace", "namespaces", {"metavar": "NS", "action": "append"}),
    ("--tick", "tick", _duration_flag("tick")),
    ("--dry-run", "dry_run", {"action": argparse.BooleanOptionalAction}),
    ("--http-port", "http_port", {"metavar": "N", "type": int}),
    ("--lease-namespace", "lease_namespace", {"metavar": "NS"}),
    ("--lease-name", "lease_name", {"metavar": "NAME"}),
    ("--lease-duration", "lease_duration", _duration_flag("lease_duration")),
    ("--log-format", "log_format", {"choices": ("json", "text")}),
    ("--prometheus-timeout", "prometheus_timeout", _duration_flag("prometheus_timeout")),
    ("--prometheus-bearer-token-file", "prometheus_bearer_token_file", {"metavar": "PATH"}),
    ("--prometheus-basic-auth-username", "prometheus_basic_auth_username", {"metavar": "USER"}),
    (
        "--prometheus-basic-auth-password-file",
        "prometheus_basic_auth_password_file",
        {"metavar": "PATH"},
    ),
    (
        "--prometheus-header",
        "prometheus_headers",
        {"metavar": "NAME=VALUE", "action": "append"},
    ),
    ("--prometheus-ca-file", "prometheus_ca_file", {"metavar": "PATH"}),
    ("--staleness-limit", "staleness_limit", _duration_flag("staleness_limit")),
    ("--demand-window", "demand_window", _duration_flag("demand_window")),
    (
        "--watch-staleness-limit",
        "watch_staleness_limit",
        _duration_flag("watch_staleness_limit"),
    ),
    ("--backfill-days", "backfill_days", {"metavar": "DAYS", "type": float}),
    ("--forecast-model", "forecast_model", {"choices": tuple(MODELS)}),
    ("--cluster-can-grow", "cluster_can_grow", {"action": argparse.BooleanOptionalAction}),
    ("--balloon-image", "balloon_image", {"metavar": "IMAGE"}),
)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Register every flag of `run` on `parser`. Flags default to SUPPRESS so that only the
    ones given on the command line override the environment and the config file."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        default=argparse.SUPPRESS,
        help="YAML file with any of the settings below (keys are the field names, e.g. "
        "prometheus_url, queries.waiting); flags and GANG_AUTOSCALER_* variables override it",
    )
    for flag, field, extra in _FLAGS:
        kwargs = dict(extra)
        info = RunSettings.model_fields[field]
        shown_default = kwargs.pop("help_default", None)
        if shown_default is None and not info.is_required() and info.default not in (None, (), {}):
            shown_default = info.default
        env = ENV_PREFIX + field.upper()
        help_text = f"{info.description} [env {env}"
        help_text += f"; default {shown_default}]" if shown_default is not None else "]"
        parser.add_argument(
            flag, dest=field, default=argparse.SUPPRESS, help=help_text.replace("%", "%%"), **kwargs
        )


def build_run_parser(prog: str = "gang-autoscaler run") -> argparse.ArgumentParser:
    """A standalone parser for `run` (the CLI registers the same flags as a subcommand)."""
    parser = argparse.ArgumentParser(prog=prog, description="Run the autoscaling service.")
    add_run_arguments(parser)
    return parser


def _check_config_file(path: Path) -> None:
    # YamlConfigSettingsSource's own errors for a missing file or a non-mapping document are
    # silent or cryptic; say plainly what is wrong before it reads the file.
    try:
        document = strict_yaml.load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise SettingsError(f"cannot read config file {path}: {err}") from err
    except yaml.YAMLError as err:
        raise SettingsError(f"config file {path} is not valid YAML: {err}") from err
    if document is not None and not isinstance(document, dict):
        raise SettingsError(
            f"config file {path} must be a YAML mapping of setting names to values, "
            f"not a {type(document).__name__}"
        )


def _setting_of(variable: str) -> tuple[str, FieldInfo | None] | None:
    """The dotted setting a GANG_AUTOSCALER_ variable sets (`queries.running` for
    GANG_AUTOSCALER_QUERIES__RUNNING) and its field (None for one entry of a mapping, e.g.
    GANG_AUTOSCALER_PROMETHEUS_HEADERS__X_ORG); None when it names no setting."""
    parts = variable[len(ENV_PREFIX) :].lower().split("__")
    model: type[BaseModel] = RunSettings
    for depth, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            return None
        if depth == len(parts) - 1:
            return ".".join(parts), info
        if get_origin(info.annotation) is dict and depth == len(parts) - 2:
            return ".".join(parts), None  # one entry of a mapping, as pydantic-settings reads
        if not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)):
            return None
        model = info.annotation
    return None


def _known_variables() -> list[str]:
    names = set(OTHER_ENV_VARIABLES)
    for name, info in RunSettings.model_fields.items():
        names.add(ENV_PREFIX + name.upper())
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            names.update(
                f"{ENV_PREFIX}{name.upper()}__{sub.upper()}" for sub in info.annotation.model_fields
            )
    return sorted(names)


def _unknown_variable(variable: str) -> str:
    # Compared without the prefix, which every candidate shares: NAMESPACE finds NAMESPACES.
    known = {name.removeprefix(ENV_PREFIX): name for name in _known_variables()}
    given = variable.upper().removeprefix(ENV_PREFIX)
    close = difflib.get_close_matches(given, known, n=1, cutoff=0.8)
    return "unknown setting" + (f"; did you mean {known[close[0]]}?" if close else "")


def _check_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Refuse GANG_AUTOSCALER_ variables that set nothing, and values that cannot be decoded.

    pydantic-settings looks up only the variables of known settings, so a misspelled one
    would be ignored without a word (GANG_AUTOSCALER_NAMESPACE, singular like the flag, would
    leave the service watching every namespace), while an unknown key in the config file is
    refused. Returns each dotted setting set from the environment and its variable, to name
    the variable where its value is invalid.
    """
    problems: list[str] = []
    named: dict[str, str] = {}
    decoder = EnvSettingsSource(RunSettings)
    for variable in sorted(environ):
        if not variable.upper().startswith(ENV_PREFIX) or variable.upper() in OTHER_ENV_VARIABLES:
            continue
        found = _setting_of(variable)
        if found is None:
            if _is_service_link(variable, environ[variable]):
                continue
            problems.append(f"  environment variable {variable}: {_unknown_variable(variable)}")
            continue
        setting, info = found
        named[setting] = f"environment variable {variable}"
        if info is not None and decoder.field_is_complex(info):
            try:  # as pydantic-settings will decode it, whose own error names no variable
                decoded = decoder.decode_complex_value(setting, info, environ[variable])
            except ValueError as err:  # the value itself is never echoed: it may be a secret
                problems.append(
                    f"  environment variable {variable}: not valid JSON ({err}); "
                    "this setting takes a JSON object"
                )
                continue
            if isinstance(decoded, dict):
                # A problem with one key of the object (`queries.waitng`) names the variable
                # and the key as written; keys are matched in any case, as the settings are.
                for key in decoded:
                    where = f"environment variable {variable}, key {key}"
                    named[f"{setting}.{key}"] = named[f"{setting}.{str(key).lower()}"] = where
    if problems:
        raise SettingsError("invalid settings:\n" + "\n".join(problems))
    return named


def _flag_headers(given: list[str]) -> dict[str, str]:
    """`--prometheus-header` flags as a mapping that merges with the environment's and the
    file's headers, name by name, instead of replacing them: a list replaced them all, so
    one flag dropped the file's tenant header (X-Scope-OrgID) and every query failed. The
    sources below drop the names it sets, in any case (`_headers_not_above`).
    """
    try:
        pairs = _valid_headers(_header_pairs(given))
    except ValueError as err:
        raise SettingsError(f"invalid settings:\n  prometheus_headers: {err}") from err
    return pairs


def load_settings(args: argparse.Namespace | None = None) -> RunSettings:
    """Merge flags > environment > config file > defaults into one validated `RunSettings`.

    Raises `SettingsError` naming every bad field and where it came from; nothing is
    half-applied.
    """
    given = dict(vars(args)) if args is not None else {}  # other subcommand keys are ignored
    config_file = given.pop("config", None)
    flags = {field: given[field] for _, field, _ in _FLAGS if field in given}
    if isinstance(given.get("log_level"), str):  # the CLI's top-level --log-level
        flags["log_level"] = given["log_level"].upper()
    if "prometheus_headers" in flags:
        flags["prometheus_headers"] = _flag_headers(flags["prometheus_headers"])
    if config_file is not None:
        _check_config_file(Path(config_file))
    from_environment = _check_environment(os.environ)
    # A value a flag overrides is not the environment's; the flag is named by its setting.
    names = {
        setting: variable
        for setting, variable in from_environment.items()
        if setting.split(".")[0] not in flags
    }

    class _Loaded(RunSettings):
        model_config = SettingsConfigDict(yaml_file=config_file)

    try:
        loaded = _Loaded(**flags)
    except ValidationError as err:
        raise SettingsError(
            "invalid settings:\n" + describe_validation_error(err, names=names)
        ) from err
    except SourceError as err:  # a value pydantic-settings could not decode
        raise SettingsError(f"cannot read the settings: {err}") from err
    except (OSError, ValueError, yaml.YAMLError) as err:  # unreadable or malformed YAML
        raise SettingsError(f"cannot read config file {config_file}: {err}") from err
    return RunSettings.model_validate(loaded.model_dump())
