"""End to end with the real command: `gang-autoscaler run` as a subprocess against the fake
API server, stopped by SIGTERM in the middle of a tick and started again.

The signal is sent from inside the fake API server while it serves the first balloon pod
creation, and the server then answers so slowly that the tick runs into its deadline in the
act phase, between the members of one balloon gang: the worst moment for crash consistency.
The restarted instance must remove the partial gang and build whole ones, never doubling.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.harness.fake_kube import FakeKube
from tests.harness.helm_chart import NAMESPACE as CHART_NAMESPACE
from tests.harness.prometheus_server import free_port
from tests.service.conftest import Live
from tests.service.stack import (
    DECODE,
    PREFILL,
    TEST_QUERIES,
    balloon_pods,
    pd_manifests,
    spec_gangs,
    wait_until,
)

pytestmark = pytest.mark.prometheus

NS = "sigterm"
SLOW_WRITE_S = 1.2


def start_command(kubeconfig: Path, config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-c",
        "import sys; from autoscaler.cli import main; sys.exit(main())",
        "run",
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--http-port={port}",
        "--log-format=json",
    ]
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def balloon_gangs(kube: FakeKube) -> Counter[tuple[str, str]]:
    """Members per (LWS, balloon gang index)."""
    return Counter(
        (
            p["metadata"]["labels"]["gang-autoscaler.io/balloon-for"],
            p["metadata"]["labels"].get("gang-autoscaler.io/balloon-gang", "?"),
        )
        for p in balloon_pods(kube, NS)
        if not p["metadata"].get("deletionTimestamp")
    )


async def wait_exit(process: subprocess.Popen[bytes], *, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the service did not exit within {timeout_s}s of SIGTERM")
        await asyncio.sleep(0.05)
    return process.returncode


async def test_sigterm_mid_tick_exits_cleanly_and_restart_does_not_duplicate_balloons(
    kube: FakeKube, live: Live, tmp_path: Path
) -> None:
    kube.add_namespace(NS)
    for manifest in pd_manifests(NS, {}):
        kube.apply(manifest)
    live.exporter.set_lws(namespace=NS, lws=PREFILL, waiting=0, kv_usage_fraction=0.5)
    live.exporter.set_lws(namespace=NS, lws=DECODE, waiting=1, kv_usage_fraction=0.6)
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "prometheus_url": live.prometheus.url,
                "tick": "2s",
                "lease_namespace": CHART_NAMESPACE,
                "lease_duration": "3s",
                "prometheus_timeout": "1s",
                "staleness_limit": "5s",
                "backfill_days": 0.01,
                "queries": TEST_QUERIES.model_dump(),
            }
        )
    )
    log = tmp_path / "service.log"
    port = free_port()
    first = start_command(kubeconfig, config, port, log)
    signalled: list[float] = []

    def slow_api_server(cluster: object) -> None:
        # Runs inside every write the fake API server serves: SIGTERM once the first
        # balloon pod exists, while the pod creates are answered late (a slow admission
        # webhook), so the tick is still in flight.
        if not balloon_pods(kube, NS) or signalled:
            return
        signalled.append(time.monotonic())
        first.send_signal(signal.SIGTERM)

    kube.inject_fault(
        code=0,
        method="POST",
        path_contains="/pods",
        action="slow_answer",
        stall_s=SLOW_WRITE_S,
        times=1000,
    )
    kube.add_controller(slow_api_server)
    try:
        await wait_until(lambda: bool(signalled), timeout_s=40, what="a balloon pod creation")
        code = await wait_exit(first, timeout_s=15)
        assert code == 0, log.read_text()[-3000:]
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        messages = [line["message"] for line in lines]
        assert any("giving the tick in flight" in m for m in messages), messages[-20:]
        assert any("released the leader lease" in m for m in messages), messages[-20:]
        lease = kube.object("leases", CHART_NAMESPACE, "gang-autoscaler")
        assert lease is not None and not lease["spec"].get("holderIdentity")
        decisions = [line for line in lines if "desired_gangs" in line]
        assert decisions and all(line["reason"] for line in decisions)
    finally:
        kube._controllers.clear()  # the API server answers at full speed again
        kube.faults.clear()
        if first.poll() is None:
            first.kill()

    after_first = balloon_gangs(kube)
    gangs_after_first = {lws: spec_gangs(kube, NS, lws) for lws in (PREFILL, DECODE)}
    second = start_command(kubeconfig, config, port, log)
    try:

        def balloons_whole() -> bool:
            members = balloon_gangs(kube)
            return bool(members) and set(members.values()) == {2}

        await wait_until(balloons_whole, timeout_s=40, what="whole balloon gangs after restart")
        await asyncio.sleep(4.5)  # two more ticks: nothing is added on top
        members = balloon_gangs(kube)
        assert set(members.values()) == {2}, members  # every gang whole, none doubled
        decode_gangs = sorted(int(g) for lws, g in members if lws == DECODE)
        assert decode_gangs == list(range(len(decode_gangs)))  # 0..n-1, no duplicates
        assert 1 <= len(decode_gangs) <= 2  # the example's decode buffer bounds
        names = [p["metadata"]["name"] for p in balloon_pods(kube, NS)]
        assert len(names) == len(set(names))
        # Idle load and a 5-10 min scale-down window: the restart changed no gang count.
        assert {lws: spec_gangs(kube, NS, lws) for lws in (PREFILL, DECODE)} == gangs_after_first
        if any(count < 2 for count in after_first.values()):
            # The first instance was cut off between two members: the new leader removed
            # the partial gang before building whole ones.
            assert "members of partial balloon gangs" in log.read_text()
    finally:
        second.send_signal(signal.SIGTERM)
        code = await wait_exit(second, timeout_s=15)
    assert code == 0
