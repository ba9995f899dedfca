"""A real Prometheus server for tests: Debian's `prometheus` binary on a free local port.

`PrometheusServer` writes a scrape config for the given targets (1 s scrape interval by
default), starts `prometheus` on 127.0.0.1 with its own data directory, waits for
`/-/ready`, and stops it with SIGTERM. The same data directory and port survive a
`stop()`/`start()` pair, so a test can take Prometheus away and bring it back.

`load_openmetrics` back-fills history with `promtool tsdb create-blocks-from openmetrics`
into a data directory before the server starts.

Fixtures (import them into a test module or list this module in `pytest_plugins`):

`PrometheusServer(basic_auth=(user, password))` serves its API only with those credentials
(Prometheus's `--web.config.file`, `basic_auth_users`); the harness's own requests send them.

- `prometheus_factory`: call it with `targets=[...]` (and optionally `data_dir=`,
  `scrape_interval_s=`, `lookback_delta_s=`) to get a started server; every server it made
  is stopped at teardown.

When the binary is absent the fixtures skip locally with the reason, but fail when the `CI`
environment variable is set: under CI the Prometheus tests must run.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest
import yaml

PROMETHEUS_BINARY = "prometheus"
PROMTOOL_BINARY = "promtool"


# Prometheus wants bcrypt hashes in basic_auth_users. With the `bcrypt` package one is made
# for any password; without it (it is not a dependency), this hash of TEST_PASSWORD, made
# once with Python's `crypt` at bcrypt cost 4 (the cheapest Go's bcrypt accepts), is used.
TEST_PASSWORD = "gang-autoscaler-test"
TEST_PASSWORD_BCRYPT = "$2b$04$16ioDFGuPGvCxDxhwohIZuBcmk4JbA4woFtXXaZFlseSVIrWGLaG2"


def bcrypt_hash(password: str) -> str:
    try:
        import bcrypt
    except ImportError:
        if password != TEST_PASSWORD:
            raise PrometheusHarnessError(
                f"without the bcrypt package only TEST_PASSWORD ({TEST_PASSWORD!r}) has a hash"
            ) from None
        return TEST_PASSWORD_BCRYPT
    return str(bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode())


def basic_auth_header(username: str, password: str) -> str:
    """The `Authorization` value for HTTP basic auth."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


class PrometheusHarnessError(RuntimeError):
    """The test Prometheus could not be started, reloaded or back-filled."""


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One scrape target: `address` is host:port, labels are attached as target labels.

    `labels` may carry `__metrics_path__` to scrape several pods from one HTTP server, the
    way the vLLM exporter harness serves every pod under `/pods/<namespace>/<pod>/metrics`.
    """

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


def require_binary(name: str) -> str:
    """Path of `name`; skip the test locally, fail it under CI, when it is not installed."""
    path = shutil.which(name)
    if path is not None:
        return path
    reason = f"`{name}` is not installed (Debian package `prometheus`; `make install-system`)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; Prometheus tests must run under CI", pytrace=False)
    pytest.skip(reason)
    raise AssertionError("unreachable")  # pytest.skip raises


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1 (the server retries if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_config(
    targets: Sequence[ScrapeTarget], *, scrape_interval_s: float, job: str = "vllm"
) -> dict[str, object]:
    """The prometheus.yml for `targets`, one static config per target so labels differ."""
    interval = f"{int(scrape_interval_s * 1000)}ms"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "static_configs": [
                    {"targets": [t.address], "labels": dict(t.labels)} for t in targets
                ],
            }
        ],
    }


class PrometheusServer:
    """One `prometheus` process with a generated config and its own data directory."""

    def __init__(
        self,
        *,
        targets: Sequence[ScrapeTarget] = (),
        data_dir: Path | None = None,
        scrape_interval_s: float = 1.0,
        lookback_delta_s: float | None = None,
        retention: str = "30d",
        basic_auth: tuple[str, str] | None = None,
    ) -> None:
        self._binary = require_binary(PROMETHEUS_BINARY)
        self._workdir = Path(tempfile.mkdtemp(prefix="prometheus-test-"))
        self.data_dir = data_dir if data_dir is not None else self._workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self._workdir / "prometheus.yml"
        self.log_path = self._workdir / "prometheus.log"
        self.scrape_interval_s = scrape_interval_s
        self._lookback_delta_s = lookback_delta_s
        self._retention = retention
        self._targets: list[ScrapeTarget] = list(targets)
        self._process: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self._write_config()
        self.web_config_path: Path | None = None
        self._headers: dict[str, str] = {}
        if basic_auth is not None:
            username, password = basic_auth
            self.web_config_path = self._workdir / "web.yml"
            web = {"basic_auth_users": {username: bcrypt_hash(password)}}
            self.web_config_path.write_text(yaml.safe_dump(web))
            self._headers["Authorization"] = basic_auth_header(username, password)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _write_config(self) -> None:
        config = scrape_config(self._targets, scrape_interval_s=self.scrape_interval_s)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def _command(self) -> list[str]:
        command = [
            self._binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--storage.tsdb.retention.time={self._retention}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        if self.web_config_path is not None:
            command.append(f"--web.config.file={self.web_config_path}")
        if self._lookback_delta_s is not None:
            command.append(f"--query.lookback-delta={int(self._lookback_delta_s * 1000)}ms")
        return command

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start the process and wait until `/-/ready` answers 200."""
        if self.running:
            return
        for attempt in range(3):
            with self.log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    self._command(), stdout=log, stderr=subprocess.STDOUT, cwd=self._workdir
                )
            if self._wait_ready(timeout_s=timeout_s):
                return
            self.stop()
            if "address already in use" in self.log_tail() and attempt < 2:
                self.port = free_port()  # another process took the port in between
                continue
            break
        raise PrometheusHarnessError(f"prometheus did not become ready:\n{self.log_tail()}")

    def _wait_ready(self, *, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running:
                return False
            try:
                with urllib.request.urlopen(self._request("/-/ready"), timeout=1.0) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        return False

    def stop(self, *, timeout_s: float = 15.0) -> None:
        """SIGTERM and wait (Prometheus flushes its head); SIGKILL if it hangs."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _request(self, path: str, *, method: str = "GET") -> urllib.request.Request:
        """A request of the harness's own, with the server's credentials if it has any."""
        return urllib.request.Request(f"{self.url}{path}", method=method, headers=self._headers)

    def set_targets(self, targets: Sequence[ScrapeTarget]) -> None:
        """Replace the scrape targets and hot-reload the config if the server runs."""
        self._targets = list(targets)
        self._write_config()
        if self.running:
            request = self._request("/-/reload", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=10.0) as response:
                    if response.status != 200:
                        raise PrometheusHarnessError(f"reload answered {response.status}")
            except urllib.error.URLError as err:
                raise PrometheusHarnessError(f"reload failed:\n{self.log_tail()}") from err

    def query(self, promql: str) -> list[dict[str, object]]:
        """Instant query through the HTTP API (for harness checks, not the code under test)."""
        import json
        import urllib.parse

        path = "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(self._request(path), timeout=10.0) as response:
            body = json.load(response)
        result: list[dict[str, object]] = body["data"]["result"]
        return result

    def http_requests(self, handler: str) -> float:
        """Requests Prometheus has answered on `handler` (e.g. `/api/v1/query`), from its own
        `/metrics`: an independent count of what a client sent."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self._request("/metrics"), timeout=10.0) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "prometheus_http_requests"
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels.get("handler") == handler
        )

    def wait_for_series(self, promql: str, *, count: int, timeout_s: float = 20.0) -> None:
        """Wait until `promql` returns at least `count` series (targets scraped at least once)."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            seen = len(self.query(promql))
            if seen >= count:
                return
            time.sleep(0.2)
        raise PrometheusHarnessError(
            f"{promql!r} returned {seen} series, wanted {count}, after {timeout_s} s:\n"
            f"{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        """Stop and remove the temporary work directory (not a caller-given data dir)."""
        self.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_openmetrics(
    openmetrics: str | Path, *, data_dir: Path, max_block_duration: str = "24h"
) -> None:
    """Back-fill `data_dir` with `promtool tsdb create-blocks-from openmetrics`.

    `openmetrics` is exposition text (ending in `# EOF`) or a path to such a file. Call it
    before the server starts on `data_dir`. Timestamps in the text are Unix seconds.
    """
    promtool = require_binary(PROMTOOL_BINARY)
    data_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="openmetrics-") as tmp:
        if isinstance(openmetrics, Path):
            source = openmetrics
        else:
            source = Path(tmp) / "history.om"
            source.write_text(openmetrics)
        completed = subprocess.run(
            [
                promtool,
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                f"--max-block-duration={max_block_duration}",
                str(source),
                str(data_dir),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if completed.returncode != 0:
        raise PrometheusHarnessError(
            f"promtool create-blocks-from openmetrics failed ({completed.returncode}):\n"
            f"{completed.stdout[-2000:]}\n{completed.stderr[-2000:]}"
        )


class PrometheusFactory(Protocol):
    def __call__(
        self,
        *,
        targets: Sequence[ScrapeTarget] = (),
        data_dir: Path | None = None,
        scrape_interval_s: float = 1.0,
        lookback_delta_s: float | None = None,
    ) -> PrometheusServer: ...


@pytest.fixture
def prometheus_factory() -> Iterator[PrometheusFactory]:
    """Start real Prometheus servers on demand; all are stopped and removed at teardown."""
    servers: list[PrometheusServer] = []

    def make(
        *,
        targets: Sequence[ScrapeTarget] = (),
        data_dir: Path | None = None,
        scrape_interval_s: float = 1.0,
        lookback_delta_s: float | None = None,
    ) -> PrometheusServer:
        server = PrometheusServer(
            targets=targets,
            data_dir=data_dir,
            scrape_interval_s=scrape_interval_s,
            lookback_delta_s=lookback_delta_s,
        )
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        server.close()
