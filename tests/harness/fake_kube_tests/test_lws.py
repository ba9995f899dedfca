"""LeaderWorkerSet as a custom resource: schema admission, /scale, /status, pods, GC."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.harness.fake_kube import FakeKube
from tests.harness.fake_kube_tests.conftest import GROUP, PLURAL, VERSION, lws_manifest

MERGE = "application/merge-patch+json"
NAME = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


async def create_lws(custom: client.CustomObjectsApi, manifest: dict) -> dict:
    return await custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, manifest)


async def test_lws_pods_are_replicas_times_size_with_lws_names_and_labels(
    kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    await create_lws(custom, lws_manifest("decode", replicas=3, size=4, gpus=1, leader_gpus=2))
    pods = (await core.list_namespaced_pod("default", label_selector=f"{NAME}=decode")).items
    assert sorted(p.metadata.name for p in pods) == sorted(
        [f"decode-{g}" for g in range(3)]
        + [f"decode-{g}-{w}" for g in range(3) for w in range(1, 4)]
    )
    by_name = {p.metadata.name: p for p in pods}
    leader, worker = by_name["decode-2"], by_name["decode-2-3"]
    assert leader.metadata.labels[GROUP_INDEX] == "2"
    assert leader.metadata.labels[WORKER_INDEX] == "0"
    assert worker.metadata.labels[WORKER_INDEX] == "3"
    assert (
        worker.metadata.labels["leaderworkerset.sigs.k8s.io/group-key"]
        == (leader.metadata.labels["leaderworkerset.sigs.k8s.io/group-key"])
    )
    assert leader.metadata.annotations["leaderworkerset.sigs.k8s.io/size"] == "4"
    assert worker.metadata.annotations["leaderworkerset.sigs.k8s.io/leader-name"] == "decode-2"
    assert "leaderworkerset.sigs.k8s.io/leader-name" not in leader.metadata.annotations
    # The leader uses leaderTemplate, workers the workerTemplate.
    assert leader.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    assert worker.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert leader.metadata.labels["role"] == "leader"
    ref = leader.metadata.owner_references[0]
    assert (ref.kind, ref.name, ref.controller) == ("LeaderWorkerSet", "decode", True)


async def test_scale_round_trip_through_custom_objects_api(
    kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    kube.add_node("cpu-0")
    await create_lws(custom, lws_manifest("prefill", replicas=1, size=2, gpus=0))
    scale = await custom.get_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "prefill"
    )
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"]["replicas"] == 1
    assert scale["status"] == {
        "replicas": 1,
        "selector": f"{NAME}=prefill,{WORKER_INDEX}=0",
    }
    patched = await custom.patch_namespaced_custom_object_scale(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "prefill",
        {"spec": {"replicas": 3}},
        _content_type=MERGE,
    )
    assert patched["spec"]["replicas"] == 3
    # The answer predates the controller's reaction, as on a real server.
    assert patched["status"]["replicas"] == 1
    lws = await custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "prefill")
    assert lws["spec"]["replicas"] == 3
    assert lws["metadata"]["generation"] == 2
    assert lws["status"]["replicas"] == 3
    assert lws["status"]["readyReplicas"] == 3
    leaders = await core.list_namespaced_pod("default", label_selector=scale["status"]["selector"])
    assert sorted(p.metadata.name for p in leaders.items) == ["prefill-0", "prefill-1", "prefill-2"]
    assert (
        "PATCH",
        "/apis/leaderworkerset.x-k8s.io/v1/namespaces/default/leaderworkersets/prefill/scale",
        MERGE,
    ) in kube.requests("PATCH")


async def test_scale_down_removes_the_highest_groups(
    kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    await create_lws(custom, lws_manifest("d", replicas=4, size=2, gpus=0))
    await custom.replace_namespaced_custom_object_scale(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "d",
        {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": "d", "namespace": "default"},
            "spec": {"replicas": 2},
        },
    )
    pods = await core.list_namespaced_pod("default")
    assert sorted(p.metadata.name for p in pods.items) == ["d-0", "d-0-1", "d-1", "d-1-1"]


async def test_default_json_patch_of_scale_with_a_dict_is_rejected(
    custom: client.CustomObjectsApi,
) -> None:
    # kubernetes-asyncio picks application/json-patch+json for /scale unless told otherwise;
    # a real server refuses an object body for a JSON patch.
    await create_lws(custom, lws_manifest("p", replicas=1, gpus=0))
    with pytest.raises(ApiException) as caught:
        await custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, "default", PLURAL, "p", {"spec": {"replicas": 2}}
        )
    assert caught.value.status == 400


async def test_stale_scale_write_is_409(custom: client.CustomObjectsApi) -> None:
    await create_lws(custom, lws_manifest("p", replicas=1, gpus=0))
    scale = await custom.get_namespaced_custom_object_scale(GROUP, VERSION, "default", PLURAL, "p")
    await custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "p",
        {"metadata": {"labels": {"x": "y"}}},
        _content_type=MERGE,
    )
    scale["spec"]["replicas"] = 5
    with pytest.raises(ApiException) as caught:
        await custom.replace_namespaced_custom_object_scale(
            GROUP, VERSION, "default", PLURAL, "p", scale
        )
    assert caught.value.status == 409


async def test_strategic_merge_patch_on_a_custom_resource_is_415(
    custom: client.CustomObjectsApi,
) -> None:
    await create_lws(custom, lws_manifest("p", replicas=1, gpus=0))
    with pytest.raises(ApiException) as caught:
        await custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            "p",
            {"spec": {"replicas": 2}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert caught.value.status == 415


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(
            lambda m: m["spec"].update(replicas=-1), "spec.replicas", id="negative-replicas"
        ),
        pytest.param(
            lambda m: m["spec"]["leaderWorkerTemplate"].pop("workerTemplate"),
            "spec.leaderWorkerTemplate",
            id="missing-worker-template",
        ),
        pytest.param(
            lambda m: m["spec"].update(startupPolicy="Eventually"),
            "spec.startupPolicy",
            id="unknown-startup-policy",
        ),
        pytest.param(
            lambda m: m["spec"]["leaderWorkerTemplate"].update(size="two"),
            "spec.leaderWorkerTemplate.size",
            id="size-not-an-integer",
        ),
    ],
)
async def test_invalid_lws_is_422_naming_the_field(
    custom: client.CustomObjectsApi, mutate, field: str
) -> None:
    manifest = lws_manifest("bad")
    mutate(manifest)
    with pytest.raises(ApiException) as caught:
        await create_lws(custom, manifest)
    assert caught.value.status == 422
    status = json.loads(caught.value.body)
    assert status["reason"] == "Invalid"
    assert any(c["field"].startswith(field) for c in status["details"]["causes"]), status


async def test_crd_defaults_and_pruning_are_applied(custom: client.CustomObjectsApi) -> None:
    manifest = lws_manifest("p", gpus=0)
    del manifest["spec"]["replicas"]
    del manifest["spec"]["leaderWorkerTemplate"]["size"]
    manifest["spec"]["notInSchema"] = True
    created = await create_lws(custom, manifest)
    assert created["spec"]["replicas"] == 1
    assert created["spec"]["leaderWorkerTemplate"]["size"] == 1
    assert created["spec"]["startupPolicy"] == "LeaderCreated"
    assert "notInSchema" not in created["spec"]


async def test_status_subresource_only_changes_status(custom: client.CustomObjectsApi) -> None:
    await create_lws(custom, lws_manifest("p", replicas=1, gpus=0))
    await custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "p",
        {"spec": {"replicas": 7}, "status": {"hpaPodSelector": "x=y"}},
        _content_type=MERGE,
    )
    lws = await custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "p")
    assert lws["spec"]["replicas"] == 1
    # The emulated controller owns status and puts its selector back.
    assert lws["status"]["hpaPodSelector"] == f"{NAME}=p,{WORKER_INDEX}=0"


async def test_deleting_the_lws_garbage_collects_its_pods(
    kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    lws = await create_lws(custom, lws_manifest("p", replicas=2, size=3, gpus=0))
    unrelated = {
        "metadata": {"name": "keep"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    await core.create_namespaced_pod("default", unrelated)
    balloon = {
        "metadata": {
            "name": "p-balloon-0-0",
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "LeaderWorkerSet",
                    "name": "p",
                    "uid": lws["metadata"]["uid"],
                }
            ],
        },
        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.9"}]},
    }
    await core.create_namespaced_pod("default", balloon)
    assert len((await core.list_namespaced_pod("default")).items) == 8
    await custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "p")
    remaining = await core.list_namespaced_pod("default")
    assert [p.metadata.name for p in remaining.items] == ["keep"]


@pytest.mark.parametrize(
    ("ref", "collected"),
    [
        pytest.param({"name": "other"}, True, id="right-uid-wrong-name"),
        pytest.param({"kind": "Pod", "apiVersion": "v1"}, True, id="wrong-kind"),
        pytest.param({"kind": "Widget", "apiVersion": "example.com/v1"}, False,
                     id="unserved-kind-never-collected"),
    ],
)  # fmt: skip
async def test_an_owner_reference_must_match_its_owner_not_only_its_uid(
    kube: FakeKube,
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    ref: dict[str, str],
    collected: bool,
) -> None:
    """The real collector resolves the owner by group, kind and name and compares the uid:
    a balloon whose reference had the LWS's uid but a wrong name or kind survived here and
    would be deleted at once in a cluster."""
    lws = await create_lws(custom, lws_manifest("p", replicas=1, size=2, gpus=0))
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LeaderWorkerSet", "name": "p",
             "uid": lws["metadata"]["uid"], **ref}  # fmt: skip
    dependent = {
        "metadata": {"name": "dependent", "ownerReferences": [owner]},
        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.9"}]},
    }
    await core.create_namespaced_pod("default", dependent)
    names = [p.metadata.name for p in (await core.list_namespaced_pod("default")).items]
    assert ("dependent" not in names) is collected


async def test_orphan_propagation_keeps_dependents(
    kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    await create_lws(custom, lws_manifest("p", replicas=1, size=2, gpus=0))
    await custom.delete_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "p", propagation_policy="Orphan"
    )
    pods = (await core.list_namespaced_pod("default")).items
    assert sorted(p.metadata.name for p in pods) == ["p-0", "p-0-1"]
    assert all(not p.metadata.owner_references for p in pods)


async def test_a_deleted_member_recreates_the_whole_group(
    kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    await create_lws(custom, lws_manifest("p", replicas=2, size=2, gpus=0))
    before = {
        p.metadata.name: p.metadata.uid for p in (await core.list_namespaced_pod("default")).items
    }
    await core.delete_namespaced_pod("p-1-1", "default")
    after = {
        p.metadata.name: p.metadata.uid for p in (await core.list_namespaced_pod("default")).items
    }
    assert set(after) == set(before)
    assert after["p-0"] == before["p-0"] and after["p-0-1"] == before["p-0-1"]
    assert after["p-1"] != before["p-1"] and after["p-1-1"] != before["p-1-1"]


async def test_losing_a_node_recreates_the_group_that_had_a_member_there(
    kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    for index in range(3):
        kube.add_node(f"n{index}", gpus=8)
    await create_lws(custom, lws_manifest("d", replicas=1, size=2, gpus=8))
    before = {
        p.metadata.name: (p.metadata.uid, p.spec.node_name)
        for p in (await core.list_namespaced_pod("default")).items
    }
    lost = before["d-0-1"][1]
    await core.delete_node(lost)
    after = {
        p.metadata.name: (p.metadata.uid, p.spec.node_name)
        for p in (await core.list_namespaced_pod("default")).items
    }
    assert set(after) == {"d-0", "d-0-1"}
    assert after["d-0"][0] != before["d-0"][0] and after["d-0-1"][0] != before["d-0-1"][0]
    assert lost not in {node for _, node in after.values()}
    assert None not in {node for _, node in after.values()}


@pytest.mark.parametrize(
    ("restart_policy", "group_recreated"),
    [
        pytest.param("RecreateGroupOnPodRestart", True, id="recreate-group"),
        pytest.param("None", False, id="restart-in-place"),
    ],
)
async def test_a_container_restart_recreates_the_group_per_restart_policy(
    kube: FakeKube, restart_policy: str, group_recreated: bool
) -> None:
    kube.add_node("n1")
    manifest = lws_manifest("d", replicas=2, size=2, gpus=0)
    manifest["spec"]["leaderWorkerTemplate"]["restartPolicy"] = restart_policy
    kube.apply(manifest)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kube.objects("pods")}
    kube.restart_container("default", "d-1-1")
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kube.objects("pods")}
    assert set(after) == set(before)
    assert after["d-0"] == before["d-0"] and after["d-0-1"] == before["d-0-1"]
    assert (after["d-1"] != before["d-1"]) is group_recreated
    assert (after["d-1-1"] != before["d-1-1"]) is group_recreated


async def test_a_template_change_rolls_groups_from_the_highest_index_one_at_a_time() -> None:
    async with FakeKube.start(pod_ready_delay_s=None) as kube:
        kube.add_node("n1")
        kube.apply(lws_manifest("d", replicas=3, size=2, gpus=0))
        for pod in kube.objects("pods"):
            kube.set_pod_ready("default", pod["metadata"]["name"])
        lws_type = kube.resource("lws")

        def images() -> dict[str, str]:
            return {
                p["metadata"]["name"]: p["spec"]["containers"][0]["image"]
                for p in kube.objects("pods")
            }

        kube.patch(
            lws_type,
            "default",
            "d",
            {
                "spec": {
                    "leaderWorkerTemplate": {
                        "workerTemplate": {
                            "spec": {
                                "containers": [
                                    {"name": "vllm-worker", "image": "vllm/vllm-openai:v2"}
                                ]
                            }
                        }
                    }
                }
            },
            content_type="application/merge-patch+json",
        )
        assert images() == {
            "d-0": "vllm/vllm-openai:latest",
            "d-0-1": "vllm/vllm-openai:latest",
            "d-1": "vllm/vllm-openai:latest",
            "d-1-1": "vllm/vllm-openai:latest",
            "d-2": "vllm/vllm-openai:v2",
            "d-2-1": "vllm/vllm-openai:v2",
        }
        assert kube.object("lws", "default", "d")["status"]["updatedReplicas"] == 1
        # The new group is not ready yet, so no other group goes down (maxUnavailable 1).
        kube.reconcile()
        assert images()["d-1"] == "vllm/vllm-openai:latest"
        for name in ("d-2", "d-2-1"):
            kube.set_pod_ready("default", name)
        assert images()["d-1"] == "vllm/vllm-openai:v2"
        assert images()["d-0"] == "vllm/vllm-openai:latest"


async def test_a_rollout_with_immediate_readiness_completes(kube: FakeKube) -> None:
    kube.add_node("n1")
    kube.apply(lws_manifest("d", replicas=4, size=2, gpus=0))
    kube.patch(
        kube.resource("lws"),
        "default",
        "d",
        {"metadata": {"labels": {"x": "y"}}, "spec": {"startupPolicy": "LeaderReady"}},
        content_type="application/merge-patch+json",
    )
    # startupPolicy is outside the template: nothing rolls.
    status = kube.object("lws", "default", "d")["status"]
    assert status["updatedReplicas"] == 4
    kube.patch(
        kube.resource("lws"),
        "default",
        "d",
        {
            "spec": {
                "leaderWorkerTemplate": {"workerTemplate": {"metadata": {"labels": {"role": "w2"}}}}
            }
        },
        content_type="application/merge-patch+json",
    )
    pods = kube.objects("pods")
    assert len(pods) == 8
    assert {p["metadata"]["labels"]["role"] for p in pods} == {"w2"}
    status = kube.object("lws", "default", "d")["status"]
    assert (status["updatedReplicas"], status["readyReplicas"]) == (4, 4)


async def test_invalid_lws_message_reads_like_the_apiserver(
    custom: client.CustomObjectsApi,
) -> None:
    manifest = lws_manifest("bad")
    manifest["spec"]["replicas"] = -1
    with pytest.raises(ApiException) as caught:
        await create_lws(custom, manifest)
    assert json.loads(caught.value.body)["message"] == (
        'LeaderWorkerSet.leaderworkerset.x-k8s.io "bad" is invalid: spec.replicas: Invalid '
        "value: -1: spec.replicas in body should be greater than or equal to 0"
    )


async def test_an_hpa_left_behind_holds_the_lws_within_its_bounds(
    kube: FakeKube, custom: client.CustomObjectsApi, api: client.ApiClient
) -> None:
    kube.add_node("n1")
    await create_lws(custom, lws_manifest("d", replicas=2, size=2, gpus=0))
    hpa = client.V2HorizontalPodAutoscaler(
        metadata=client.V1ObjectMeta(name="d"),
        spec=client.V2HorizontalPodAutoscalerSpec(
            min_replicas=1,
            max_replicas=3,
            scale_target_ref=client.V2CrossVersionObjectReference(
                api_version=f"{GROUP}/{VERSION}", kind="LeaderWorkerSet", name="d"
            ),
        ),
    )
    autoscaling = client.AutoscalingV2Api(api)
    await autoscaling.create_namespaced_horizontal_pod_autoscaler("default", hpa)
    scale = await custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "d", {"spec": {"replicas": 5}}, _content_type=MERGE
    )
    assert scale["spec"]["replicas"] == 5  # the write itself succeeds...
    lws = await custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "d")
    assert lws["spec"]["replicas"] == 3  # ...and the HPA takes it back to its maximum
    status = (await autoscaling.read_namespaced_horizontal_pod_autoscaler("d", "default")).status
    assert (status.current_replicas, status.desired_replicas) == (3, 3)
    assert status.last_scale_time is not None
    events = [e for e in kube.objects("events", "default") if e["reason"] == "SuccessfulRescale"]
    assert [e["message"] for e in events] == [
        "New size: 3; reason: Current number of replicas above Spec.MaxReplicas"
    ]
    # Within the bounds the HPA (without metrics) leaves the replicas alone.
    await custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "d", {"spec": {"replicas": 2}}, _content_type=MERGE
    )
    assert kube.object("lws", "default", "d")["spec"]["replicas"] == 2
