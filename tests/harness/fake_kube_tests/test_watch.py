"""Watch: initial state, resume from a resourceVersion, 410 Gone, bookmarks, timeouts."""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.harness.fake_kube import FakeKube


def cm(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


async def collect(stream: watch.Watch, func, *args, **kwargs) -> list[tuple[str, str]]:
    events = []
    async with stream:
        async for event in stream.stream(func, *args, **kwargs):
            events.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
    return events


async def test_watch_without_version_sends_current_objects_then_changes(
    core: client.CoreV1Api,
) -> None:
    await core.create_namespaced_config_map("default", cm("a"))
    received: list[tuple[str, str]] = []

    async def watch_it() -> None:
        received.extend(
            await collect(
                watch.Watch(), core.list_namespaced_config_map, "default", timeout_seconds=1
            )
        )

    task = asyncio.create_task(watch_it())
    await asyncio.sleep(0.2)
    await core.create_namespaced_config_map("default", cm("b"))
    await core.patch_namespaced_config_map("a", "default", {"data": {"k": "v"}})
    await core.delete_namespaced_config_map("b", "default")
    await task
    assert received == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]


async def test_watch_resumes_after_a_resource_version_without_loss_or_repeat(
    core: client.CoreV1Api,
) -> None:
    await core.create_namespaced_config_map("default", cm("a"))
    listed = await core.list_namespaced_config_map("default")
    await core.create_namespaced_config_map("default", cm("b"))
    await core.delete_namespaced_config_map("a", "default")
    events = await collect(
        watch.Watch(),
        core.list_namespaced_config_map,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=1,
    )
    assert events == [("ADDED", "b"), ("DELETED", "a")]


async def test_watch_from_a_compacted_version_gets_410_gone(
    kube: FakeKube,
    core: client.CoreV1Api,
) -> None:
    await core.create_namespaced_config_map("default", cm("a"))
    old = (await core.list_namespaced_config_map("default")).metadata.resource_version
    for index in range(60):  # more than the fixture's history_limit of 50
        await core.patch_namespaced_config_map("a", "default", {"data": {"n": str(index)}})
    with pytest.raises(ApiException) as caught:
        await collect(
            watch.Watch(),
            core.list_namespaced_config_map,
            "default",
            resource_version=old,
            timeout_seconds=1,
        )
    assert caught.value.status == 410
    assert "Expired" in caught.value.reason


async def test_410_arrives_as_an_error_event_with_a_status(kube: FakeKube) -> None:
    # Read the raw stream to pin the wire format: HTTP 200 and one ERROR event.
    kube.compact()
    async with kube.api_client() as api:
        response = await client.CoreV1Api(api).list_namespaced_config_map(
            "default", watch=True, resource_version="1", _preload_content=False
        )
        line = await response.content.readline()
        response.release()
    assert response.status == 200
    event = json.loads(line)
    assert event["type"] == "ERROR"
    assert event["object"]["kind"] == "Status"
    assert event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"


async def test_label_selected_watch_sees_objects_move_in_and_out(
    core: client.CoreV1Api,
) -> None:
    await core.create_namespaced_config_map("default", cm("a", app="x"))
    rv = (await core.list_namespaced_config_map("default")).metadata.resource_version
    await core.patch_namespaced_config_map("a", "default", {"metadata": {"labels": {"app": "y"}}})
    await core.patch_namespaced_config_map("a", "default", {"metadata": {"labels": {"app": "x"}}})
    await core.create_namespaced_config_map("default", cm("other", app="z"))
    events = await collect(
        watch.Watch(),
        core.list_namespaced_config_map,
        "default",
        label_selector="app=x",
        resource_version=rv,
        timeout_seconds=1,
    )
    assert events == [("DELETED", "a"), ("ADDED", "a")]


async def test_bookmarks_carry_the_current_resource_version(
    kube: FakeKube,
    core: client.CoreV1Api,
) -> None:
    await core.create_namespaced_config_map("default", cm("a"))
    stream = watch.Watch()
    types = []
    async with stream:
        async for event in stream.stream(
            core.list_namespaced_config_map,
            "default",
            allow_watch_bookmarks=True,
            timeout_seconds=1,
        ):
            types.append(event["type"])
            if event["type"] == "BOOKMARK":
                assert event["raw_object"]["metadata"]["resourceVersion"] == str(
                    kube.store.resource_version
                )
    assert types[0] == "ADDED"
    assert "BOOKMARK" in types  # the fixture's bookmark interval is 0.2 s


async def test_timeout_seconds_ends_the_stream(core: client.CoreV1Api) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = await collect(
        watch.Watch(), core.list_namespaced_config_map, "default", timeout_seconds=1
    )
    elapsed = loop.time() - started
    assert events == []
    assert 0.9 <= elapsed < 5


async def test_expire_watches_ends_open_streams(kube: FakeKube, core: client.CoreV1Api) -> None:
    async def watch_it() -> list[tuple[str, str]]:
        return await collect(
            watch.Watch(), core.list_namespaced_config_map, "default", timeout_seconds=30
        )

    task = asyncio.create_task(watch_it())
    await asyncio.sleep(0.2)
    kube.expire_watches()
    assert await asyncio.wait_for(task, timeout=5) == []
