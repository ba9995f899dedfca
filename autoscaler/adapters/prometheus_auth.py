"""Credentials for the Prometheus HTTP API: extra headers, a bearer token or basic-auth
password read from a file, and a CA bundle for https.

Secrets are read from files, never taken as values, so they do not show in `ps`, in the
config file or in a ConfigMap. Only header names and file paths are ever logged.

The token file is re-read at most once a minute, and at the next request after a 401.
Projected ServiceAccount tokens rotate: the kubelet writes the new token at 80% of the old
one's lifetime (at least 10 minutes), so the old one stays valid for minutes after the file
changes, and a one-minute re-read (client-go's file token source does the same) picks the new
one up long before the old one is refused, without reading a file on every query. The 401
rule covers a token replaced out of band (a Secret edited by hand, a revoked token): the
query that got the 401 stays missing, the next one carries the new token.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from requests.auth import AuthBase, HTTPBasicAuth

log = logging.getLogger(__name__)

SECRET_REREAD_INTERVAL_S = 60.0
# RFC 7617: the user-id ends at the first colon; a control character breaks the header.
# The chart's values.schema.json refuses the same characters.
_UNSENDABLE_USERNAME = re.compile(r"[:\x00-\x1f\x7f]")


class PrometheusCredentialsError(ValueError):
    """A credential file cannot be used; the message names the setting and the path."""


@dataclass(frozen=True, slots=True)
class PrometheusCredentials:
    """How to authenticate to Prometheus. `setting` names in errors are the `run` settings
    these come from."""

    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # values may be secret
    bearer_token_file: Path | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: Path | None = None
    ca_file: Path | None = None

    def __post_init__(self) -> None:
        if self.bearer_token_file is not None and self.basic_auth_username is not None:
            raise PrometheusCredentialsError(
                "prometheus_bearer_token_file and prometheus_basic_auth_username both set "
                "the Authorization header; use one"
            )
        if (self.basic_auth_username is None) != (self.basic_auth_password_file is None):
            raise PrometheusCredentialsError(
                "set both prometheus_basic_auth_username and "
                "prometheus_basic_auth_password_file, or neither"
            )
        if self.basic_auth_username is not None and (
            _UNSENDABLE_USERNAME.search(self.basic_auth_username)
            or not sendable_in_a_header(self.basic_auth_username)
        ):
            raise PrometheusCredentialsError(
                "prometheus_basic_auth_username: a colon, a control character or one outside "
                "Latin-1 cannot be sent in basic auth (RFC 7617)"
            )
        authorization = any(name.lower() == "authorization" for name in self.headers)
        if authorization and self.sets_authorization:
            raise PrometheusCredentialsError(
                "prometheus_headers sets Authorization, and so does "
                + (
                    "prometheus_bearer_token_file"
                    if self.bearer_token_file is not None
                    else "prometheus_basic_auth_password_file"
                )
                + "; use one"
            )

    @property
    def sets_authorization(self) -> bool:
        return self.bearer_token_file is not None or self.basic_auth_username is not None

    def describe(self) -> str:
        """For the start-up log line: names and paths, never values."""
        parts = [f"extra headers {sorted(self.headers)}" if self.headers else "no extra headers"]
        if self.bearer_token_file is not None:
            parts.append(f"bearer token from {self.bearer_token_file}")
        if self.basic_auth_username is not None:
            parts.append(f"basic auth with the password from {self.basic_auth_password_file}")
        if self.ca_file is not None:
            parts.append(f"CA bundle {self.ca_file}")
        return ", ".join(parts)


def read_secret_file(path: Path, *, setting: str) -> str:
    """The file's text without surrounding whitespace; PrometheusCredentialsError naming
    `setting` when it cannot be read or is empty."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise PrometheusCredentialsError(f"{setting}: cannot read {path}: {err}") from err
    if not text:
        raise PrometheusCredentialsError(f"{setting}: {path} is empty")
    if any(ch in text for ch in "\r\n\0"):
        # No HTTP client sends it, and their errors quote the value: refused here by name.
        raise PrometheusCredentialsError(
            f"{setting}: {path} has a line break inside (the value is not shown)"
        )
    if not sendable_in_a_header(text):
        raise PrometheusCredentialsError(
            f"{setting}: {path} has characters an HTTP header cannot carry (outside Latin-1; "
            "the value is not shown)"
        )
    return text


def sendable_in_a_header(text: str) -> bool:
    """Whether requests can put `text` in a header (it encodes them, and basic auth, as
    Latin-1): anything else failed every query with a codec error naming no setting."""
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


class SecretFile:
    """A secret read from a file at start (failing loudly), then re-read at most every
    `reread_interval_s` or after `mark_stale()`; a failed re-read keeps the last value."""

    def __init__(
        self,
        path: Path,
        *,
        setting: str,
        reread_interval_s: float = SECRET_REREAD_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.setting = setting
        self._reread_interval_s = reread_interval_s
        self._clock = clock
        self._lock = threading.Lock()  # queries run in several threads at once
        self._value = read_secret_file(path, setting=setting)
        self._read_at = clock()
        self._stale = False

    def mark_stale(self) -> None:
        with self._lock:
            self._stale = True

    def value(self) -> str:
        with self._lock:
            now = self._clock()
            if self._stale or now - self._read_at >= self._reread_interval_s:
                self._read_at, self._stale = now, False
                try:
                    new = read_secret_file(self.path, setting=self.setting)
                except PrometheusCredentialsError as err:
                    log.warning("keeping the last value of %s: %s", self.setting, err)
                else:
                    if new != self._value:
                        log.info("%s: read a new value from %s", self.setting, self.path)
                    self._value = new
            return self._value


class FileAuth(AuthBase):
    """requests auth that sets Authorization from a token or password file on every request
    and marks the file stale when Prometheus answers 401."""

    def __init__(
        self,
        *,
        bearer_token: SecretFile | None = None,
        basic_auth: tuple[str, SecretFile] | None = None,
    ) -> None:
        if (bearer_token is None) == (basic_auth is None):
            raise ValueError("give exactly one of bearer_token and basic_auth")
        self._bearer_token = bearer_token
        self._basic_auth = basic_auth

    @property
    def _secret(self) -> SecretFile:
        if self._bearer_token is not None:
            return self._bearer_token
        assert self._basic_auth is not None
        return self._basic_auth[1]

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        if self._bearer_token is not None:
            request.headers["Authorization"] = f"Bearer {self._bearer_token.value()}"
        else:
            assert self._basic_auth is not None
            username, password = self._basic_auth
            request = HTTPBasicAuth(username, password.value())(request)
        request.register_hook("response", self._after_response)
        return request

    def _after_response(self, response: requests.Response, **_: Any) -> requests.Response:
        if response.status_code == 401:
            self._secret.mark_stale()
        return response


def file_auth(
    credentials: PrometheusCredentials, *, clock: Callable[[], float] = time.monotonic
) -> FileAuth | None:
    """The requests auth for `credentials`, reading its file now (raises
    PrometheusCredentialsError when it cannot), or None when no file is configured."""
    if credentials.bearer_token_file is not None:
        token = SecretFile(
            credentials.bearer_token_file, setting="prometheus_bearer_token_file", clock=clock
        )
        return FileAuth(bearer_token=token)
    if credentials.basic_auth_username is not None:
        assert credentials.basic_auth_password_file is not None
        password = SecretFile(
            credentials.basic_auth_password_file,
            setting="prometheus_basic_auth_password_file",
            clock=clock,
        )
        return FileAuth(basic_auth=(credentials.basic_auth_username, password))
    return None


def session_for(credentials: PrometheusCredentials) -> requests.Session:
    """A requests session that verifies https against `ca_file` when one is given.

    PrometheusConnect sends every request with `verify=self._session.verify` and only sets
    that itself (from `disable_ssl`) when it creates the session, so a CA bundle has to come
    in on a session of our own.
    """
    session = requests.Session()
    if credentials.ca_file is not None:
        if not credentials.ca_file.is_file():
            raise PrometheusCredentialsError(
                f"prometheus_ca_file: {credentials.ca_file} is not a readable file"
            )
        session.verify = str(credentials.ca_file)
    return session
