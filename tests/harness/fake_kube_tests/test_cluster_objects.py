"""Leases, Events (core/v1 and events.k8s.io/v1), PriorityClasses and Nodes over HTTP."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from tests.harness.fake_kube import FakeKube


async def test_lease_create_renew_and_stale_update_conflicts(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    now = dt.datetime.now(dt.UTC)
    created = await leases.create_namespaced_lease(
        "kube-system",
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="gang-autoscaler"),
            spec=client.V1LeaseSpec(
                holder_identity="a", lease_duration_seconds=15, acquire_time=now, renew_time=now
            ),
        ),
    )
    assert created.spec.holder_identity == "a"
    created.spec.renew_time = now + dt.timedelta(seconds=5)
    renewed = await leases.replace_namespaced_lease("gang-autoscaler", "kube-system", created)
    assert renewed.spec.renew_time == now + dt.timedelta(seconds=5)
    created.spec.holder_identity = "b"  # a second writer with the old resourceVersion
    with pytest.raises(ApiException) as caught:
        await leases.replace_namespaced_lease("gang-autoscaler", "kube-system", created)
    assert caught.value.status == 409
    current = await leases.read_namespaced_lease("gang-autoscaler", "kube-system")
    assert current.spec.holder_identity == "a"


async def test_leader_election_library_elects_one_leader_and_fails_over(
    kube: FakeKube,
) -> None:
    leading: list[str] = []
    clients = [kube.api_client() for _ in range(2)]

    def candidate(identity: str, api: client.ApiClient) -> leaderelection.LeaderElection:
        async def started() -> None:
            leading.append(identity)

        async def stopped() -> None:
            pass

        lock = LeaseLock("gang-autoscaler", "kube-system", identity, api)
        config = electionconfig.Config(
            lock,
            lease_duration=2,
            renew_deadline=1.5,
            retry_period=1,
            onstarted_leading=started,
            onstopped_leading=stopped,
        )
        return leaderelection.LeaderElection(config)

    first = asyncio.create_task(candidate("a", clients[0]).run())
    await asyncio.sleep(0.5)
    second = asyncio.create_task(candidate("b", clients[1]).run())
    await asyncio.sleep(2)
    assert leading == ["a"]
    first.cancel()  # the leader dies without releasing; "b" must wait out the lease
    loop = asyncio.get_running_loop()
    died = loop.time()
    while leading != ["a", "b"] and loop.time() - died < 15:
        await asyncio.sleep(0.1)
    took_over_s = loop.time() - died
    assert leading == ["a", "b"]
    # Not before the 2 s lease ran out since b last saw it renewed (at most 1 s before).
    assert took_over_s >= 0.9, took_over_s
    second.cancel()
    for api in clients:
        await api.close()


async def test_events_in_both_apis(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    events = client.EventsV1Api(api)
    involved = client.V1ObjectReference(
        kind="LeaderWorkerSet",
        name="decode",
        namespace="default",
        uid="u-1",
        api_version="leaderworkerset.x-k8s.io/v1",
    )
    await core.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="decode.1"),
            involved_object=involved,
            reason="ScaledUp",
            message="2 -> 3 gangs",
            type="Normal",
            count=1,
            # Without eventTime kubernetes-asyncio cannot read the event back through
            # EventsV1Api (the real server sends null there too).
            event_time=dt.datetime.now(dt.UTC),
        ),
    )
    await events.create_namespaced_event(
        "default",
        client.EventsV1Event(
            metadata=client.V1ObjectMeta(name="decode.2"),
            regarding=involved,
            reason="PolicyRejected",
            note="bad annotation",
            type="Warning",
            action="Validate",
            reporting_controller="gang-autoscaler.io/controller",
            reporting_instance="pod-a",
            event_time=dt.datetime.now(dt.UTC),
        ),
    )
    core_events = await core.list_namespaced_event(
        "default", field_selector="involvedObject.name=decode,reason=ScaledUp"
    )
    assert [e.message for e in core_events.items] == ["2 -> 3 gangs"]
    new_events = await events.list_namespaced_event("default", field_selector="type=Warning")
    assert [(e.reason, e.note) for e in new_events.items] == [("PolicyRejected", "bad annotation")]
    # One object, two views: each API sees the other's events, fields renamed.
    seen_as_core = await core.read_namespaced_event("decode.2", "default")
    assert (seen_as_core.message, seen_as_core.involved_object.name) == ("bad annotation", "decode")
    assert seen_as_core.reporting_component == "gang-autoscaler.io/controller"
    seen_as_new = await events.read_namespaced_event("decode.1", "default")
    assert (seen_as_new.note, seen_as_new.regarding.uid, seen_as_new.deprecated_count) == (
        "2 -> 3 gangs",
        "u-1",
        1,
    )
    by_regarding = await events.list_namespaced_event(
        "default", field_selector="regarding.name=decode"
    )
    assert sorted(e.metadata.name for e in by_regarding.items) == ["decode.1", "decode.2"]
    patched = await events.patch_namespaced_event(
        "decode.1", "default", {"deprecatedCount": 2}, _content_type="application/merge-patch+json"
    )
    assert patched.deprecated_count == 2
    assert (await core.read_namespaced_event("decode.1", "default")).count == 2


async def test_priority_classes(api: client.ApiClient) -> None:
    scheduling = client.SchedulingV1Api(api)
    await scheduling.create_priority_class(
        client.V1PriorityClass(
            metadata=client.V1ObjectMeta(name="gang-autoscaler-balloon"),
            value=-5,
            preemption_policy="Never",
        )
    )
    read = await scheduling.read_priority_class("gang-autoscaler-balloon")
    assert (read.value, read.preemption_policy) == (-5, "Never")
    read.value = 7
    with pytest.raises(ApiException) as caught:
        await scheduling.replace_priority_class("gang-autoscaler-balloon", read)
    assert caught.value.status == 422
    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as missing:
        await core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": "p"},
                "spec": {"priorityClassName": "nope", "containers": [{"name": "c", "image": "i"}]},
            },
        )
    assert missing.value.status == 403
    assert "no PriorityClass with name nope" in json.loads(missing.value.body)["message"]


async def test_nodes_are_cluster_scoped_and_carry_allocatable(
    kube: FakeKube, api: client.ApiClient
) -> None:
    kube.add_node("gpu-0", gpus=8, labels={"topology.kubernetes.io/zone": "z1"})
    nodes = await client.CoreV1Api(api).list_node(label_selector="topology.kubernetes.io/zone")
    assert [n.metadata.name for n in nodes.items] == ["gpu-0"]
    assert nodes.items[0].status.allocatable["nvidia.com/gpu"] == "8"
    assert nodes.items[0].metadata.namespace is None
