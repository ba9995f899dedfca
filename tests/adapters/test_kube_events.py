"""Event de-duplication and client configuration, against the fake API server."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio import client

from autoscaler.adapters.kube_client import new_api_client
from autoscaler.adapters.kube_errors import KubeConfigError
from autoscaler.adapters.kube_events import EventRecorder, ObjectRef, camel_reason
from tests.harness.fake_kube.server import FakeKube
from tests.harness.http_stub import serve

NS = "default"
REF = ObjectRef(NS, "llama-decode", "uid-1")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=15)
        return self.now


def test_camel_reason():
    assert camel_reason("partial_gang_rolled_back") == "PartialGangRolledBack"


async def test_repeats_bump_one_event_like_kubectl_shows_and_survive_a_restart():
    async with FakeKube.start() as kube, kube.api_client() as api:
        # every repeat written (the default coalesces those within 5 minutes, below)
        recorder = EventRecorder(api, instance="a", clock=Clock(), min_write_interval_s=0)
        for _ in range(3):
            await recorder.record(REF, type_="Warning", reason="InvalidPolicy", message="bad")
        await recorder.record(REF, type_="Warning", reason="InvalidPolicy", message="worse")
        stored = sorted(kube.objects("events", NS), key=lambda e: e["message"])
        assert [(e["message"], e["count"]) for e in stored] == [("bad", 3), ("worse", 1)]
        bad = stored[0]
        assert bad["lastTimestamp"] > bad["firstTimestamp"]
        assert bad["involvedObject"]["kind"] == "LeaderWorkerSet"
        assert bad["involvedObject"]["uid"] == "uid-1"
        assert bad["source"]["component"] == "gang-autoscaler"

        # A new instance (restart, or the other replica after a leader change) finds the
        # Event by its name and keeps counting instead of starting a second one.
        restarted = EventRecorder(api, instance="b", clock=Clock(), min_write_interval_s=0)
        assert (
            await restarted.record(REF, type_="Warning", reason="InvalidPolicy", message="bad") == 4
        )

        # An expired Event (deleted by the API server's TTL) is created afresh.
        kube.remove("events", NS, bad["metadata"]["name"])
        assert (
            await recorder.record(REF, type_="Warning", reason="InvalidPolicy", message="bad") == 1
        )
        assert len(kube.objects("events", NS)) == 2


async def test_one_event_recorded_twice_at_once_keeps_its_count():
    """The create of a pass cut off by its deadline is answered late, while the next pass
    records the same Event: both found it uncached, the second met 409 and bumped it to 2,
    then the late answer cached 1 over it, and every later repeat was counted one short."""
    async with FakeKube.start() as kube, kube.api_client() as api:
        recorder = EventRecorder(api, instance="a", clock=Clock(), min_write_interval_s=0)
        kube.inject_fault(
            code=0, method="POST", path_contains="/events", action="slow_answer", stall_s=0.5
        )
        said = {"type_": "Warning", "reason": "InvalidPolicy", "message": "bad"}
        late = asyncio.create_task(recorder.record(REF, **said))
        await asyncio.sleep(0.1)  # the create is in, its answer on its way
        await recorder.record(REF, **said)
        await late
        await recorder.record(REF, **said)
        (event,) = kube.objects("events", NS)
        assert event["count"] == 3


async def test_repeats_within_five_minutes_are_written_together():
    """A bad annotation held for a day was one PATCH a tick (5,760); the repeats of each
    5 minutes are now one, with the count they add up to."""
    async with FakeKube.start() as kube, kube.api_client() as api:
        recorder = EventRecorder(api, instance="a", clock=Clock())  # 15 s a call

        async def bad() -> int:
            return await recorder.record(
                REF, type_="Warning", reason="InvalidPolicy", message="bad"
            )

        counts = [await bad() for _ in range(20)]  # 15 s to 300 s
        assert counts == list(range(1, 21))
        (event,) = kube.objects("events", NS)
        assert event["count"] == 1  # created at 15 s; 19 repeats within 5 minutes wait
        assert kube.requests("PATCH", "/events/") == []
        assert await bad() == 21  # 315 s: 5 minutes after the write
        (event,) = kube.objects("events", NS)
        assert event["count"] == 21 and len(kube.requests("PATCH", "/events/")) == 1


async def test_a_repeat_with_none_after_it_is_written_once_its_interval_is_over():
    """A repeat within 5 minutes waited for a later one to carry it: a condition seen twice
    and then no more (an episode come back once) showed count 1 for good."""
    async with FakeKube.start() as kube, kube.api_client() as api:
        clock = Clock()
        recorder = EventRecorder(api, instance="a", clock=clock)
        for _ in range(2):
            await recorder.record(REF, type_="Warning", reason="HoldMissingData", message="m")
        await recorder.flush()  # 45 s: the interval is not over
        assert [e["count"] for e in kube.objects("events", NS)] == [1]
        clock.now += timedelta(minutes=5)
        await recorder.flush()
        (event,) = kube.objects("events", NS)
        assert event["count"] == 2 and event["lastTimestamp"] > event["firstTimestamp"]
        patches = len(kube.requests("PATCH", "/events/"))
        await recorder.flush()  # nothing waits any more
        assert len(kube.requests("PATCH", "/events/")) == patches


async def test_what_is_remembered_of_events_is_bounded():
    async with FakeKube.start() as kube, kube.api_client() as api:
        recorder = EventRecorder(
            api, instance="a", clock=Clock(), min_write_interval_s=0, max_remembered=2
        )
        for message in ("one", "two", "three", "one"):
            await recorder.record(REF, type_="Normal", reason="Scaled", message=message)
        # "one" was forgotten for "three": read back from its Event, and counted on
        assert {e["message"]: e["count"] for e in kube.objects("events", NS)} == {
            "one": 2,
            "two": 1,
            "three": 1,
        }
        assert len(recorder._known) == 2


async def test_client_from_an_explicit_kubeconfig(tmp_path):
    async with FakeKube.start() as kube:
        path = kube.write_kubeconfig(tmp_path / "config")
        api = await new_api_client(kubeconfig=path)
        async with api:
            namespaces = await client.CoreV1Api(api).list_namespace()
            assert NS in {n.metadata.name for n in namespaces.items}


async def test_missing_configuration_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(KubeConfigError, match="does not exist"):
        await new_api_client(kubeconfig=tmp_path / "nope")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(KubeConfigError, match="no Kubernetes configuration found"):
        await new_api_client()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("", "the file is empty", id="empty-file"),
        pytest.param(
            "garbage: [\n",
            "not valid YAML: expected the node content, but found '<stream end>' "
            "(line 2, column 1)",
            id="broken-yaml",
        ),
        pytest.param(
            "- a\n- b\n",
            "not a kubeconfig: the top level is a list, not a mapping",
            id="not-a-mapping",
        ),
        pytest.param(
            "contexts: 5\ncurrent-context: c\n",
            "not a valid kubeconfig (TypeError: ",
            id="wrong-type-inside",
        ),
    ],
)
async def test_an_unusable_kubeconfig_is_a_one_line_error_naming_the_file(
    tmp_path, monkeypatch, text, problem
):
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(KubeConfigError) as raised:
        await new_api_client(kubeconfig=path)
    assert str(raised.value).startswith(f"kubeconfig {path}: {problem}")
    assert "\n" not in str(raised.value)
    # The same file found through $KUBECONFIG is one of the things tried.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(KubeConfigError) as raised:
        await new_api_client()
    assert f"{path}: {problem}" in str(raised.value)
    assert "\n" not in str(raised.value)


async def test_of_several_kubeconfig_files_only_the_first_is_read(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.write_text("")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    async with FakeKube.start() as kube:
        good = kube.write_kubeconfig(tmp_path / "config")
        monkeypatch.setenv("KUBECONFIG", f"{good}:{empty}")
        async with await new_api_client() as api:
            namespaces = await client.CoreV1Api(api).list_namespace()
            assert NS in {n.metadata.name for n in namespaces.items}
        monkeypatch.setenv("KUBECONFIG", f"{empty}:{good}")
        with pytest.raises(KubeConfigError, match=f"{empty}: the file is empty"):
            await new_api_client()


def _jwt(*, exp: float) -> str:
    def part(claims: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part({'sub': 'gang-autoscaler', 'exp': exp})}.sig"


# kubernetes-asyncio's OIDC requestor uses aiohttp arguments aiohttp has deprecated
@pytest.mark.filterwarnings("ignore::DeprecationWarning:kubernetes_asyncio.config.openid")
async def test_a_token_refreshed_at_start_is_used_and_the_kubeconfig_is_not_rewritten(tmp_path):
    # An OIDC auth-provider whose id-token has expired: kubernetes-asyncio refreshes it from
    # the issuer while loading. The file may be a read-only Secret mount, and is the
    # operator's: the new token is used from memory and the file stays as it was.
    fresh = _jwt(exp=time.time() + 3600)
    refreshes: list[str] = []

    async def issuer(request: web.Request) -> web.Response:
        if request.path == "/.well-known/openid-configuration":
            return web.json_response({"token_endpoint": f"{request.url.origin()}/token"})
        refreshes.append((await request.post())["refresh_token"])
        return web.json_response({"id_token": fresh, "refresh_token": "refresh-2"})

    async with FakeKube.start() as kube, serve(issuer) as (issuer_url, _):
        path = kube.write_kubeconfig(tmp_path / "config")
        document = yaml.safe_load(path.read_text())
        document["users"][0]["user"] = {
            "auth-provider": {
                "name": "oidc",
                "config": {
                    "client-id": "gang-autoscaler",
                    "client-secret": "secret",
                    "idp-issuer-url": issuer_url,
                    "id-token": _jwt(exp=time.time() - 60),
                    "refresh-token": "refresh-1",
                },
            }
        }
        written = "# kept as the operator wrote it\n" + yaml.safe_dump(document)
        path.write_text(written)
        async with await new_api_client(kubeconfig=path) as api:
            assert refreshes == ["refresh-1"]
            assert api.configuration.api_key["BearerToken"] == f"Bearer {fresh}"
            namespaces = await client.CoreV1Api(api).list_namespace()
            assert NS in {n.metadata.name for n in namespaces.items}
        assert path.read_text() == written
