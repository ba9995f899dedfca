"""Prometheus behind authentication: basic auth on a real Prometheus (`--web.config.file`),
a bearer token file and extra headers against a recording aiohttp server (Prometheus cannot
require a bearer token itself), and https verified against a CA bundle."""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from autoscaler.adapters.prometheus_auth import (
    PrometheusCredentials,
    PrometheusCredentialsError,
    SecretFile,
    file_auth,
)
from autoscaler.adapters.prometheus_http import PrometheusUnavailable
from autoscaler.adapters.prometheus_queries import PrometheusQueries
from autoscaler.adapters.prometheus_source import ComponentTarget, PrometheusSource
from autoscaler.core.model import Component, ComponentKey
from tests.harness.http_stub import serve
from tests.harness.prometheus_server import TEST_PASSWORD, PrometheusServer, basic_auth_header
from tests.harness.vllm_exporter import PodValues, VllmExporter

KEY = ComponentKey("prod", "llama-3-70b")
TARGETS = [
    ComponentTarget(key=KEY, component=Component.UNIFIED, ready_group_indexes=frozenset({0}))
]
QUERIES = PrometheusQueries.vllm(rate_window="5s", mean_window="5s")
USER = "autoscaler"
EMPTY_VECTOR = {"status": "success", "data": {"resultType": "vector", "result": []}}


@pytest.fixture(scope="module")
def guarded() -> Iterator[PrometheusServer]:
    """A real Prometheus that answers only with basic auth, scraping one vLLM leader."""
    with VllmExporter() as exporter:
        exporter.add_lws(namespace="prod", lws="llama-3-70b", gangs=1, pods_per_gang=2,
                         values=PodValues(waiting=2.0, running=9.0))  # fmt: skip
        with PrometheusServer(
            targets=exporter.targets(), basic_auth=(USER, TEST_PASSWORD)
        ) as prometheus:
            prometheus.wait_for_series("vllm:num_requests_running", count=1)
            yield prometheus


@pytest.mark.prometheus
async def test_without_credentials_the_signals_are_missing_with_401(
    guarded: PrometheusServer,
) -> None:
    source = PrometheusSource(url=guarded.url, queries=QUERIES, timeout_s=5.0)
    signals = (await source.observe(TARGETS))[KEY]
    assert signals.running_requests is None
    assert signals.waiting_requests is None
    reason = signals.missing_reasons["running_requests"]
    assert "401" in reason and "unauthorized" in reason.lower(), reason
    assert source.stats.errors["http_4xx"] > 0


@pytest.mark.prometheus
async def test_a_basic_auth_header_from_prometheus_headers_reads_values(
    guarded: PrometheusServer,
) -> None:
    credentials = PrometheusCredentials(
        headers={"Authorization": basic_auth_header(USER, TEST_PASSWORD)}
    )
    source = PrometheusSource(
        url=guarded.url, queries=QUERIES, timeout_s=5.0, credentials=credentials
    )
    signals = (await source.observe(TARGETS))[KEY]
    assert (signals.running_requests, signals.waiting_requests) == (9.0, 2.0)
    assert signals.missing_reasons.get("running_requests") is None


@pytest.mark.prometheus
async def test_basic_auth_settings_cover_the_live_queries_and_the_backfill(
    guarded: PrometheusServer, tmp_path: Path
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(TEST_PASSWORD + "\n")  # a trailing newline, as `kubectl` writes
    end_s = datetime.datetime.now(tz=datetime.UTC).timestamp()

    def source(credentials: PrometheusCredentials | None) -> PrometheusSource:
        return PrometheusSource(
            url=guarded.url, queries=QUERIES, timeout_s=5.0, credentials=credentials
        )

    authed = source(
        PrometheusCredentials(basic_auth_username=USER, basic_auth_password_file=password_file)
    )
    assert (await authed.observe(TARGETS))[KEY].running_requests == 9.0
    filled = await authed.backfill_demand(
        [(KEY, Component.UNIFIED)], end_s=end_s, days=0.01, step_s=5
    )
    assert (filled.chunks_total, filled.chunks_failed) == (1, 0)  # answered, not refused

    refused = await source(None).backfill_demand(
        [(KEY, Component.UNIFIED)], end_s=end_s, days=0.01, step_s=5
    )
    assert (refused.chunks_total, refused.chunks_failed) == (1, 1)
    assert "401" in refused.errors[0]


@asynccontextmanager
async def recording_prometheus(
    *, accept: set[str] | None = None
) -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP fake of /api/v1/query that records each request's headers; with `accept`, an
    Authorization outside that set gets a 401 as Prometheus-behind-a-proxy would give."""
    seen: list[dict[str, str]] = []

    async def query(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        if accept is not None and request.headers.get("Authorization") not in accept:
            return web.Response(status=401, text="Unauthorized")
        return web.json_response(EMPTY_VECTOR)

    async with serve(query) as (url, _):
        yield url, seen


async def test_the_token_file_is_sent_as_bearer_and_a_401_picks_up_a_new_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("token-one\n")
    accept = {"Bearer token-one"}
    caplog.set_level(logging.DEBUG)
    async with recording_prometheus(accept=accept) as (url, seen):
        credentials = PrometheusCredentials(
            bearer_token_file=token_file, headers={"X-Scope-OrgID": "tenant-a"}
        )
        source = PrometheusSource(url=url, queries=QUERIES, timeout_s=5.0, credentials=credentials)
        await source.query_all()
        assert {h["Authorization"] for h in seen} == {"Bearer token-one"}
        assert {h["X-Scope-OrgID"] for h in seen} == {"tenant-a"}
        assert source.stats.errors["http_4xx"] == 0

        # The token rotates: the server now refuses the old one. The tick that meets the
        # 401 loses its queries; the next one re-reads the file without waiting a minute.
        token_file.write_text("token-two\n")
        accept.clear()
        accept.add("Bearer token-two")
        failed = await source.query_all()
        assert any("401" in (outcome.error or "") for outcome in failed.values())
        seen.clear()
        recovered = await source.query_all()
        assert all(outcome.error is None for outcome in recovered.values()), recovered
        assert {h["Authorization"] for h in seen} == {"Bearer token-two"}
    assert "X-Scope-OrgID" in caplog.text  # the header's name is logged...
    for secret in ("tenant-a", "token-one", "token-two"):
        assert secret not in caplog.text  # ...never a value or a token


def test_the_token_file_is_re_read_every_minute_and_a_failed_read_keeps_the_last(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first")
    now = [1000.0]
    token = SecretFile(token_file, setting="prometheus_bearer_token_file", clock=lambda: now[0])
    token_file.write_text("second")
    now[0] += 59.0
    assert token.value() == "first"  # not re-read within the minute
    now[0] += 1.0
    assert token.value() == "second"

    token_file.unlink()
    now[0] += 60.0
    with caplog.at_level(logging.WARNING):
        assert token.value() == "second"
    assert "prometheus_bearer_token_file" in caplog.text
    assert "second" not in caplog.text


def test_an_unreadable_token_file_at_start_names_the_setting(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(PrometheusCredentialsError, match="prometheus_bearer_token_file"):
        PrometheusSource(
            url="http://127.0.0.1:9", credentials=PrometheusCredentials(bearer_token_file=missing)
        )
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(PrometheusCredentialsError, match="is empty"):
        PrometheusSource(
            url="http://127.0.0.1:9", credentials=PrometheusCredentials(bearer_token_file=empty)
        )


def test_authorization_comes_from_one_place_only(tmp_path: Path) -> None:
    with pytest.raises(PrometheusCredentialsError, match="Authorization"):
        PrometheusCredentials(
            headers={"authorization": "Basic eDp5"}, bearer_token_file=tmp_path / "token"
        )


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test prometheus")])
    now = datetime.datetime.now(tz=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "ca.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_https_is_verified_against_the_ca_file(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    cert_path, key_path = _self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert_path, key_path)

    async def query(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(EMPTY_VECTOR), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/api/v1/query", query)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    try:
        errors: list[PrometheusUnavailable] = []
        untrusted = PrometheusSource(
            url=url, queries=QUERIES, timeout_s=5.0, on_error=errors.append
        )
        assert all(o.error is not None for o in (await untrusted.query_all()).values())
        assert errors and all("CERTIFICATE_VERIFY_FAILED" in str(e.__cause__) for e in errors)
        trusted = await PrometheusSource(
            url=url,
            queries=QUERIES,
            timeout_s=5.0,
            credentials=PrometheusCredentials(ca_file=cert_path),
        ).query_all()
        assert all(o.error is None for o in trusted.values()), trusted
    finally:
        await runner.cleanup()


def test_a_token_file_with_a_line_break_inside_is_refused_without_showing_it(
    tmp_path: Path,
) -> None:
    """The HTTP client refused the header on every query and quoted its value in the
    error, which went to the log, the error counters and every component's missing
    reasons in /decisions."""
    token_file = tmp_path / "token"
    token_file.write_text("token-SECRET\nsecond-line\n")
    with pytest.raises(PrometheusCredentialsError) as raised:
        file_auth(PrometheusCredentials(bearer_token_file=token_file))
    assert "line break inside" in str(raised.value) and "SECRET" not in str(raised.value)
