"""Graceful pod deletion (opt-in): Terminating pods keep their resources until they go."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from tests.harness.fake_kube import FakeKube
from tests.harness.fake_kube_tests.conftest import lws_manifest

SCALE = 0.01  # 30 s of grace become 0.3 s


@pytest.fixture
async def graceful() -> AsyncIterator[FakeKube]:
    async with FakeKube.start(pod_termination_scale=SCALE) as server:
        yield server


def pod(name: str, *, gpus: int, priority_class: str | None = None) -> dict:
    spec: dict = {
        "containers": [
            {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ]
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def test_a_deleted_bound_pod_terminates_for_its_grace_period(graceful: FakeKube) -> None:
    graceful.add_node("n1", gpus=8)
    graceful.apply(pod("p", gpus=8))
    async with graceful.api_client() as api:
        core = client.CoreV1Api(api)
        answer = await core.delete_namespaced_pod("p", "default")
        assert answer.metadata.deletion_timestamp is not None
        assert answer.metadata.deletion_grace_period_seconds == 30
        terminating = await core.read_namespaced_pod("p", "default")
        assert terminating.metadata.deletion_timestamp is not None
        await asyncio.sleep(30 * SCALE + 0.2)
        assert (await core.list_namespaced_pod("default")).items == []


async def test_grace_period_zero_deletes_at_once(graceful: FakeKube) -> None:
    graceful.add_node("n1", gpus=8)
    graceful.apply(pod("p", gpus=8))
    async with graceful.api_client() as api:
        await client.CoreV1Api(api).delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert graceful.objects("pods") == []


async def test_preemptor_waits_for_terminating_victims_then_binds(graceful: FakeKube) -> None:
    graceful.add_priority_class("low", 1)
    graceful.add_priority_class("high", 100)
    graceful.add_node("n1", gpus=8)
    graceful.apply(pod("victim", gpus=8, priority_class="low"))
    graceful.apply(pod("preemptor", gpus=8, priority_class="high"))
    preemptor = graceful.object("pods", "default", "preemptor")
    victim = graceful.object("pods", "default", "victim")
    assert preemptor["spec"].get("nodeName") is None
    assert preemptor["status"]["nominatedNodeName"] == "n1"
    assert victim["metadata"]["deletionTimestamp"]
    # Another lower pod arriving meanwhile is not preempted again for the same room.
    graceful.apply(pod("later-low", gpus=1, priority_class="low"))
    assert graceful.preemptions == [("default/victim", "default/preemptor")]
    graceful.finish_terminating()
    assert graceful.object("pods", "default", "preemptor")["spec"]["nodeName"] == "n1"
    assert graceful.object("pods", "default", "victim") is None


async def test_lws_waits_for_terminating_names_before_recreating(graceful: FakeKube) -> None:
    graceful.add_node("n1", gpus=8)
    graceful.apply(lws_manifest("d", replicas=2, size=2, gpus=2))
    lws_type = graceful.resource("lws")
    graceful.patch(
        lws_type,
        "default",
        "d",
        {"spec": {"replicas": 1}},
        content_type="application/merge-patch+json",
    )
    names = {
        p["metadata"]["name"]: bool(p["metadata"].get("deletionTimestamp"))
        for p in graceful.objects("pods")
    }
    assert names == {"d-0": False, "d-0-1": False, "d-1": True, "d-1-1": True}
    graceful.patch(
        lws_type,
        "default",
        "d",
        {"spec": {"replicas": 2}},
        content_type="application/merge-patch+json",
    )
    assert graceful.object("pods", "default", "d-1")["metadata"].get("deletionTimestamp")
    await asyncio.sleep(30 * SCALE + 0.2)
    fresh = {p["metadata"]["name"]: p for p in graceful.objects("pods")}
    assert sorted(fresh) == ["d-0", "d-0-1", "d-1", "d-1-1"]
    assert not any(p["metadata"].get("deletionTimestamp") for p in fresh.values())


async def test_watchers_see_terminating_then_deleted(graceful: FakeKube) -> None:
    from kubernetes_asyncio import watch

    graceful.add_node("n1", gpus=8)
    graceful.apply(pod("p", gpus=1))
    async with graceful.api_client() as api:
        core = client.CoreV1Api(api)
        rv = (await core.list_namespaced_pod("default")).metadata.resource_version
        await core.delete_namespaced_pod("p", "default")
        seen = []
        stream = watch.Watch()
        async with stream:
            async for event in stream.stream(
                core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1
            ):
                seen.append(
                    (event["type"], event["object"].metadata.deletion_timestamp is not None)
                )
    assert seen == [("MODIFIED", True), ("DELETED", True)]
