"""Test hooks and server options that other tests build on."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.harness.fake_kube import FakeKube
from tests.harness.fake_kube_tests.conftest import GROUP, PLURAL, VERSION, lws_manifest
from tests.harness.shared_data import shared_data_path


async def test_kubeconfig_points_kubernetes_asyncio_at_the_server(kube: FakeKube, tmp_path) -> None:
    path = kube.write_kubeconfig(tmp_path / "kubeconfig")
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    assert configuration.host == kube.url
    async with client.ApiClient(configuration) as api:
        namespaces = await client.CoreV1Api(api).list_namespace()
    assert {n.metadata.name for n in namespaces.items} >= {"default", "kube-system"}


async def test_objects_apply_and_remove_hooks(kube: FakeKube) -> None:
    kube.add_node("n1", gpus=8)
    kube.apply(lws_manifest("d", replicas=2, size=2, gpus=4))
    leaders = kube.objects(
        "pods", "default", label_selector="leaderworkerset.sigs.k8s.io/worker-index=0"
    )
    assert [p["metadata"]["name"] for p in leaders] == ["d-0", "d-1"]
    assert kube.object("lws", "default", "d")["status"]["readyReplicas"] == 1
    kube.remove("LeaderWorkerSet", "default", "d")
    assert kube.objects("pods") == []


async def test_ready_after_a_delay_on_the_event_loop() -> None:
    async with FakeKube.start(pod_ready_delay_s=0.3) as kube:
        kube.add_node("n1")
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            }
        )

        def ready() -> str:
            pod = kube.object("pods", "default", "p")
            return next(c["status"] for c in pod["status"]["conditions"] if c["type"] == "Ready")

        assert ready() == "False"
        await asyncio.sleep(0.5)
        assert ready() == "True"


async def test_manual_reconcile_mode() -> None:
    async with FakeKube.start(auto_reconcile=False) as kube:
        kube.add_node("n1")
        kube.apply(lws_manifest("d", replicas=1, size=2, gpus=0))
        assert kube.objects("pods") == []
        kube.reconcile()
        assert len(kube.objects("pods")) == 2


async def test_cluster_wide_custom_object_watch_sees_scale_changes(
    kube: FakeKube,
    custom: client.CustomObjectsApi,
) -> None:
    kube.add_namespace("team-b")
    await custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, lws_manifest("a", gpus=0)
    )
    b = lws_manifest("b", gpus=0)
    b["metadata"]["namespace"] = "team-b"
    await custom.create_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, b)
    listed = await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a", "b"]
    await custom.patch_namespaced_custom_object_scale(
        GROUP,
        VERSION,
        "team-b",
        PLURAL,
        "b",
        {"spec": {"replicas": 2}},
        _content_type="application/merge-patch+json",
    )
    seen = []
    stream = watch.Watch()
    async with stream:
        async for event in stream.stream(
            custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=1,
        ):
            seen.append(
                (
                    event["type"],
                    event["object"]["metadata"]["name"],
                    event["object"]["spec"]["replicas"],
                )
            )
    assert ("MODIFIED", "b", 2) in seen
    assert all(name == "b" for _, name, _ in seen)


async def test_dry_run_is_refused_not_ignored(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_config_map(
            "default", {"metadata": {"name": "x"}}, dry_run="All"
        )
    assert caught.value.status == 400
    assert (await core.list_namespaced_config_map("default")).items == []


async def test_extra_crds_and_stored_hpas() -> None:
    crd = shared_data_path("crds", "autoscaling.x-k8s.io_capacitybuffers.yaml")
    async with FakeKube.start(crd_files=(crd,)) as kube, kube.api_client() as api:
        buffers = await client.CustomObjectsApi(api).list_namespaced_custom_object(
            "autoscaling.x-k8s.io", "v1beta1", "default", "capacitybuffers"
        )
        assert buffers["items"] == []
        hpa = client.V2HorizontalPodAutoscaler(
            metadata=client.V1ObjectMeta(name="decode"),
            spec=client.V2HorizontalPodAutoscalerSpec(
                max_replicas=4,
                scale_target_ref=client.V2CrossVersionObjectReference(
                    api_version=f"{GROUP}/{VERSION}", kind="LeaderWorkerSet", name="decode"
                ),
            ),
        )
        await client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(
            "default", hpa
        )
        assert kube.objects("hpa", "default")[0]["spec"]["scaleTargetRef"]["name"] == "decode"


async def test_injected_faults_answer_matching_requests_then_stop(
    kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    await custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, lws_manifest("a", gpus=0)
    )
    kube.inject_fault(code=409, method="PATCH", path_contains="/scale")
    kube.inject_fault(
        code=429, method="GET", path_contains="leaderworkersets", times=2, retry_after_s=1
    )
    with pytest.raises(ApiException) as conflict:
        await custom.patch_namespaced_custom_object_scale(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            "a",
            {"spec": {"replicas": 2}},
            _content_type="application/merge-patch+json",
        )
    assert conflict.value.status == 409
    for _ in range(2):
        with pytest.raises(ApiException) as throttled:
            await custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
        assert throttled.value.status == 429
        assert throttled.value.headers["Retry-After"] == "1"
    assert kube.object("lws", "default", "a")["spec"]["replicas"] == 1
    scale = await custom.patch_namespaced_custom_object_scale(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "a",
        {"spec": {"replicas": 2}},
        _content_type="application/merge-patch+json",
    )
    assert scale["spec"]["replicas"] == 2
    listed = await custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]


async def test_controllers_can_lag_behind_writes_like_real_ones() -> None:
    async with FakeKube.start(controller_delay_s=0.2) as kube:
        kube.add_node("n1")
        kube.apply(lws_manifest("d", replicas=2, size=2, gpus=0))
        assert kube.objects("pods") == []  # nothing yet: the controllers have not run
        await asyncio.sleep(0.35)
        pods = kube.objects("pods")
        assert len(pods) == 4
        # The LWS controller and the scheduler ran in the same delayed pass.
        assert all(p["spec"].get("nodeName") == "n1" for p in pods)
