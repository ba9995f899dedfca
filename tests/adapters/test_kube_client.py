"""A kubeconfig credential that expires is renewed while the client lives, against the fake
API server accepting only the current token (as a real one refuses an expired token)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from autoscaler.adapters.kube_client import CREDENTIAL_CHECK_INTERVAL_S, new_api_client
from tests.harness.fake_kube.server import FakeKube

LOGGER = "autoscaler.adapters.kube_client"

# An exec credential plugin as EKS's and GKE's are: prints an ExecCredential with the token
# it was handed (here: the content of a file) and when that token expires.
PLUGIN = textwrap.dedent(
    """
    import datetime, json, pathlib, sys

    token_file, runs_file, lifetime_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open(runs_file, "a") as runs:
        runs.write("run\\n")
    token = pathlib.Path(token_file).read_text()
    expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=lifetime_s)
    print(json.dumps({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": token, "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ")},
    }))
    """
)


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def advance_past_the_check_interval(self) -> None:
        self.now_s += CREDENTIAL_CHECK_INTERVAL_S + 1


def with_user(kubeconfig: Path, user: dict[str, object]) -> Path:
    document = yaml.safe_load(kubeconfig.read_text())
    document["users"][0]["user"] = user
    kubeconfig.write_text(yaml.safe_dump(document))
    return kubeconfig


class ExecPlugin:
    """The plugin's files: the token it hands out, and a line per run."""

    def __init__(self, tmp_path: Path, *, lifetime_s: float) -> None:
        self.script = tmp_path / "plugin.py"
        self.script.write_text(PLUGIN)
        self.token_file = tmp_path / "plugin-token"
        self.runs_file = tmp_path / "plugin-runs"
        self.lifetime_s = lifetime_s

    def user(self) -> dict[str, object]:
        args = [str(self.script), str(self.token_file), str(self.runs_file), str(self.lifetime_s)]
        return {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": sys.executable,
                "args": args,
                "interactiveMode": "Never",
            }
        }

    @property
    def runs(self) -> int:
        return len(self.runs_file.read_text().splitlines()) if self.runs_file.exists() else 0


@contextlib.asynccontextmanager
async def client_for(
    tmp_path: Path, user: dict[str, object], clock: Clock
) -> AsyncIterator[tuple[FakeKube, client.ApiClient]]:
    """The fake API server accepting only "token-1", and a client whose kubeconfig names
    `user`, its credential checks timed by `clock`."""
    async with FakeKube.start() as kube:
        kube.accept_only("token-1")
        path = with_user(kube.write_kubeconfig(tmp_path / "config"), user)
        async with await new_api_client(kubeconfig=path, clock=clock) as api:
            yield kube, api


async def namespaces(api: client.ApiClient) -> set[str]:
    listed = await client.CoreV1Api(api).list_namespace()
    return {n.metadata.name for n in listed.items}


# Two minutes is inside the 5 minutes before expiry in which kubernetes-asyncio renews an
# exec token: every check runs the plugin again, as it would near the end of an EKS token.
SHORT_LIVED_S = 120.0


async def test_a_rotated_exec_plugin_token_is_used_once_the_old_one_expires(tmp_path):
    plugin = ExecPlugin(tmp_path, lifetime_s=SHORT_LIVED_S)
    plugin.token_file.write_text("token-1")
    clock = Clock()
    async with client_for(tmp_path, plugin.user(), clock) as (kube, api):
        assert "default" in await namespaces(api)
        await namespaces(api)
        assert plugin.runs == 1  # within a minute of the last check: not asked again

        # The plugin now hands out a new token and the old one has expired.
        plugin.token_file.write_text("token-2")
        kube.accept_only("token-2")
        clock.advance_past_the_check_interval()
        results = await asyncio.gather(*(namespaces(api) for _ in range(5)))
        assert all("default" in listed for listed in results)
        assert plugin.runs == 2  # once for the five concurrent requests


async def test_an_exec_token_far_from_expiry_is_not_fetched_again(tmp_path):
    plugin = ExecPlugin(tmp_path, lifetime_s=3600.0)
    plugin.token_file.write_text("token-1")
    clock = Clock()
    async with client_for(tmp_path, plugin.user(), clock) as (_, api):
        for _ in range(3):
            clock.advance_past_the_check_interval()
            assert "default" in await namespaces(api)
        assert plugin.runs == 1


async def test_a_token_file_named_by_the_kubeconfig_is_read_again(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("token-1")
    clock = Clock()
    async with client_for(tmp_path, {"tokenFile": str(token_file)}, clock) as (kube, api):
        assert "default" in await namespaces(api)
        token_file.write_text("token-2")
        kube.accept_only("token-2")
        clock.advance_past_the_check_interval()
        assert "default" in await namespaces(api)


async def test_a_failing_plugin_keeps_the_token_says_why_and_is_tried_again(tmp_path, caplog):
    plugin = ExecPlugin(tmp_path, lifetime_s=SHORT_LIVED_S)
    plugin.token_file.write_text("token-1")
    clock = Clock()
    async with client_for(tmp_path, plugin.user(), clock) as (kube, api):
        plugin.token_file.unlink()  # the plugin now fails (say, its own login expired)
        clock.advance_past_the_check_interval()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            # the token still valid is sent: the request is served
            assert "default" in await namespaces(api)
        assert plugin.runs == 2
        [warning] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert warning.startswith("renewing the Kubernetes credential failed (exec: process")
        assert "plugin-token" in warning  # the plugin's own message: what is missing
        assert "\n" not in warning

        # Past its expiry the API server refuses the old token: an ordinary API error.
        kube.accept_only("token-2")
        with pytest.raises(ApiException) as refused:
            await namespaces(api)
        assert refused.value.status == 401

        plugin.token_file.write_text("token-2")  # the plugin works again
        clock.advance_past_the_check_interval()
        assert "default" in await namespaces(api)
        assert plugin.runs == 3
