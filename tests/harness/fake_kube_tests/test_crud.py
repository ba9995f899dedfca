"""Create/get/list/replace/patch/delete semantics, through kubernetes-asyncio over HTTP."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.harness.fake_kube import FakeKube


def config_map(name: str, **data: str) -> dict:
    return {"metadata": {"name": name, "labels": {"app": "demo"}}, "data": data}


async def test_create_sets_server_metadata_and_get_returns_it(core: client.CoreV1Api) -> None:
    created = await core.create_namespaced_config_map("default", config_map("a", k="v"))
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert int(created.metadata.resource_version) > 0
    fetched = await core.read_namespaced_config_map("a", "default")
    assert fetched.metadata.uid == created.metadata.uid
    assert fetched.data == {"k": "v"}


async def test_missing_object_is_404_with_a_status_body(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        await core.read_namespaced_pod("nope", "default")
    assert caught.value.status == 404
    status = json.loads(caught.value.body)
    assert status["kind"] == "Status"
    assert status["reason"] == "NotFound"
    assert status["message"] == 'pods "nope" not found'


async def test_duplicate_create_is_409_already_exists(core: client.CoreV1Api) -> None:
    await core.create_namespaced_config_map("default", config_map("dup"))
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_config_map("default", config_map("dup"))
    assert caught.value.status == 409
    assert json.loads(caught.value.body)["reason"] == "AlreadyExists"


async def test_create_in_missing_namespace_is_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_config_map("ghost", config_map("a"))
    assert caught.value.status == 404
    assert json.loads(caught.value.body)["message"] == 'namespaces "ghost" not found'


async def test_replace_with_stale_resource_version_is_409_conflict(
    core: client.CoreV1Api,
) -> None:
    first = await core.create_namespaced_config_map("default", config_map("cm", k="1"))
    first.data = {"k": "2"}
    second = await core.replace_namespaced_config_map("cm", "default", first)
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    first.data = {"k": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as caught:
        await core.replace_namespaced_config_map("cm", "default", first)
    assert caught.value.status == 409
    assert json.loads(caught.value.body)["reason"] == "Conflict"
    assert (await core.read_namespaced_config_map("cm", "default")).data == {"k": "2"}


async def test_patch_with_stale_resource_version_is_409(core: client.CoreV1Api) -> None:
    created = await core.create_namespaced_config_map("default", config_map("cm", k="1"))
    await core.patch_namespaced_config_map("cm", "default", {"data": {"k": "2"}})
    stale = {"metadata": {"resourceVersion": created.metadata.resource_version}, "data": {"k": "3"}}
    with pytest.raises(ApiException) as caught:
        await core.patch_namespaced_config_map("cm", "default", stale)
    assert caught.value.status == 409


@pytest.mark.parametrize(
    ("content_type", "body", "expected"),
    [
        pytest.param(
            "application/merge-patch+json",
            {"data": {"b": "2", "a": None}},
            {"b": "2"},
            id="merge-patch-null-deletes",
        ),
        pytest.param(
            "application/strategic-merge-patch+json",
            {"data": {"b": "2"}},
            {"a": "1", "b": "2"},
            id="strategic-merge-patch",
        ),
        pytest.param(
            "application/json-patch+json",
            [{"op": "replace", "path": "/data/a", "value": "9"}],
            {"a": "9"},
            id="json-patch",
        ),
    ],
)
async def test_patch_content_types_on_a_builtin(
    core: client.CoreV1Api, content_type: str, body: object, expected: dict
) -> None:
    await core.create_namespaced_config_map("default", config_map("cm", a="1"))
    patched = await core.patch_namespaced_config_map(
        "cm", "default", body, _content_type=content_type
    )
    assert patched.data == expected


async def test_strategic_merge_patch_merges_containers_by_name(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]},
    }
    await core.create_namespaced_pod("default", pod)
    patched = await core.patch_namespaced_pod(
        "p",
        "default",
        {"spec": {"containers": [{"name": "b", "image": "b:2"}]}},
        _content_type="application/strategic-merge-patch+json",
    )
    assert [(c.name, c.image) for c in patched.spec.containers] == [("a", "a:1"), ("b", "b:2")]


async def test_patch_with_plain_json_content_type_is_415(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map("default", config_map("cm", a="1"))
    with pytest.raises(ApiException) as caught:
        await core.patch_namespaced_config_map(
            "cm", "default", {"data": {"a": "2"}}, _content_type="application/json"
        )
    assert caught.value.status == 415
    assert json.loads(caught.value.body)["reason"] == "UnsupportedMediaType"


async def test_pod_spec_is_immutable_except_images(core: client.CoreV1Api) -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "a:1"}]}}
    await core.create_namespaced_pod("default", pod)
    await core.patch_namespaced_pod(
        "p", "default", {"spec": {"containers": [{"name": "a", "image": "a:2"}]}}
    )
    with pytest.raises(ApiException) as caught:
        await core.patch_namespaced_pod("p", "default", {"spec": {"restartPolicy": "Never"}})
    assert caught.value.status == 422


async def test_delete_removes_and_delete_precondition_conflicts(
    core: client.CoreV1Api,
) -> None:
    created = await core.create_namespaced_config_map("default", config_map("cm"))
    with pytest.raises(ApiException) as caught:
        await core.delete_namespaced_config_map(
            "cm",
            "default",
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="other")),
        )
    assert caught.value.status == 409
    status = await core.delete_namespaced_config_map(
        "cm",
        "default",
        body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=created.metadata.uid)),
    )
    assert (status.kind, status.status, status.details.uid) == (
        "Status",
        "Success",
        created.metadata.uid,
    )
    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_config_map("cm", "default")
    assert missing.value.status == 404


async def test_generate_name_and_pagination(core: client.CoreV1Api) -> None:
    for _ in range(5):
        await core.create_namespaced_config_map("default", {"metadata": {"generateName": "gen-"}})
    first = await core.list_namespaced_config_map("default", limit=2)
    assert len(first.items) == 2
    assert first.metadata._continue
    names = [i.metadata.name for i in first.items]
    token = first.metadata._continue
    while token:
        page = await core.list_namespaced_config_map("default", limit=2, _continue=token)
        names += [i.metadata.name for i in page.items]
        token = page.metadata._continue
    assert len(names) == len(set(names)) == 5
    assert all(name.startswith("gen-") and len(name) == 9 for name in names)


async def test_discovery_lists_groups_and_lws_scale(api: client.ApiClient) -> None:
    groups = await client.ApisApi(api).get_api_versions()
    names = {g.name for g in groups.groups}
    assert {
        "coordination.k8s.io",
        "scheduling.k8s.io",
        "events.k8s.io",
        "leaderworkerset.x-k8s.io",
    } <= names
    resources = await client.CustomObjectsApi(api).get_api_resources(
        "leaderworkerset.x-k8s.io", "v1"
    )
    by_name = {r.name: r for r in resources.resources}
    assert by_name["leaderworkersets"].namespaced
    assert by_name["leaderworkersets/scale"].kind == "Scale"
    core = await client.CoreApi(api).get_api_versions()
    assert core.versions == ["v1"]


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param({"labels": {"app": "x" * 64}}, id="label-value-over-63"),
        pytest.param({"labels": {"app": "-x"}}, id="label-value-starts-with-dash"),
        pytest.param({"labels": {"a/b/c": "x"}}, id="label-key-two-slashes"),
        pytest.param({"labels": {"Example.com/x": "x"}}, id="label-prefix-uppercase"),
        pytest.param({"annotations": {"bad key": "x"}}, id="annotation-key-with-space"),
        pytest.param(
            {"ownerReferences": [{"kind": "LeaderWorkerSet", "name": "d"}]},
            id="owner-reference-without-uid",
        ),
    ],
)
async def test_invalid_metadata_is_422(core: client.CoreV1Api, metadata: dict) -> None:
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_config_map("default", {"metadata": {"name": "m", **metadata}})
    assert caught.value.status == 422
    assert json.loads(caught.value.body)["details"]["causes"][0]["field"].startswith("metadata")


async def test_valid_metadata_is_accepted(core: client.CoreV1Api) -> None:
    created = await core.create_namespaced_config_map(
        "default",
        {
            "metadata": {
                "name": "m",
                "labels": {"gang-autoscaler.io/balloon-for": "x" * 63, "empty": ""},
                "annotations": {"gang-autoscaler.io/max-replicas": "not validated here"},
            }
        },
    )
    assert created.metadata.labels["empty"] == ""


async def test_builtin_objects_are_checked_against_the_kubernetes_schema(
    core: client.CoreV1Api,
) -> None:
    missing_name = {"metadata": {"name": "p"}, "spec": {"containers": [{"image": "i"}]}}
    with pytest.raises(ApiException) as invalid:
        await core.create_namespaced_pod("default", missing_name)
    assert invalid.value.status == 422
    fields = {c["field"] for c in json.loads(invalid.value.body)["details"]["causes"]}
    assert fields == {"spec.containers[0]"}
    wrong_type = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}], "priority": "x"},
    }
    with pytest.raises(ApiException) as undecodable:
        await core.create_namespaced_pod("default", wrong_type)
    assert undecodable.value.status == 400
    assert "spec.priority" in json.loads(undecodable.value.body)["message"]


async def test_numeric_quantities_are_stored_as_strings(core: client.CoreV1Api) -> None:
    body = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "resources": {"limits": {"nvidia.com/gpu": 8, "cpu": 0.5}},
                }
            ]
        },
    }
    created = await core.create_namespaced_pod("default", body)
    assert created.spec.containers[0].resources.limits == {"nvidia.com/gpu": "8", "cpu": "0.5"}
    assert created.spec.containers[0].resources.requests == {"nvidia.com/gpu": "8", "cpu": "0.5"}


@pytest.mark.parametrize(
    ("resources", "field", "fragment"),
    [
        pytest.param(
            {"requests": {"cpu": "8500m"}, "limits": {"cpu": "8"}},
            "spec.containers[0].resources.requests[cpu]",
            "less than or equal to cpu limit",
            id="request-over-limit",
        ),
        pytest.param(
            {"requests": {"nvidia.com/gpu": "8"}},
            "spec.containers[0].resources.limits[nvidia.com/gpu]",
            "Limit must be set",
            id="gpu-without-limit",
        ),
        pytest.param(
            {"requests": {"nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "8"}},
            "spec.containers[0].resources.requests[nvidia.com/gpu]",
            "must be equal to nvidia.com/gpu limit",
            id="gpu-request-not-its-limit",
        ),
    ],
)
async def test_requests_are_checked_against_limits_as_the_api_server_does(
    core: client.CoreV1Api, resources: dict, field: str, fragment: str
) -> None:
    body = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]},
    }
    with pytest.raises(ApiException) as invalid:
        await core.create_namespaced_pod("default", body)
    assert invalid.value.status == 422
    causes = json.loads(invalid.value.body)["details"]["causes"]
    assert [c["field"] for c in causes] == [field]
    assert fragment in causes[0]["message"]


async def test_everything_the_fake_writes_itself_passes_the_kubernetes_schema(
    kube: FakeKube,
) -> None:
    from tests.harness.fake_kube.builtin_schemas import schema_problems
    from tests.harness.fake_kube_tests.conftest import lws_manifest

    kube.add_priority_class("high", 1000)
    kube.add_node("n1", gpus=8, labels={"rack": "r1"})
    kube.apply(
        lws_manifest(
            "d",
            replicas=3,
            size=2,
            gpus=4,
            priority_class="high",
            annotations={"leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"},
        )
    )
    checked = 0
    for rtype in kube.registry.all():
        if rtype.custom:
            continue
        for obj in kube.list_objects(rtype, None):
            problems = schema_problems(obj, api_version=rtype.api_version, kind=rtype.kind)
            assert problems == ([], []), obj
            checked += 1
    assert checked > 10


async def test_version_and_namespace_lifecycle(kube: FakeKube, api: client.ApiClient) -> None:
    version = await client.VersionApi(api).get_code()
    assert (version.major, version.minor) == ("1", "33")
    core = client.CoreV1Api(api)
    assert (await core.read_namespace_status("default")).status.phase == "Active"
    await core.create_namespace({"metadata": {"name": "team"}})
    await core.create_namespaced_config_map("team", config_map("c"))
    await core.delete_namespace("team")
    assert kube.objects("configmaps", "team") == []
    with pytest.raises(ApiException) as caught:
        await core.read_namespace("team")
    assert caught.value.status == 404


async def test_strategic_merge_patch_merge_keys_and_delete_directive(
    core: client.CoreV1Api,
) -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "image": "a:1",
                    "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
                }
            ]
        },
    }
    await core.create_namespaced_pod("default", pod)
    # Containers merge by name: the image changes and the env list is kept.
    patched = await core.patch_namespaced_pod(
        "p",
        "default",
        {
            "metadata": {"labels": {"a": "1"}},
            "spec": {"containers": [{"name": "a", "image": "a:2"}]},
        },
        _content_type="application/strategic-merge-patch+json",
    )
    container = patched.spec.containers[0]
    assert (container.image, [e.name for e in container.env]) == ("a:2", ["X", "Y"])
    node = await core.create_node(
        {
            "metadata": {"name": "n"},
            "spec": {
                "taints": [
                    {"key": "a", "effect": "NoSchedule"},
                    {"key": "b", "effect": "NoSchedule"},
                ]
            },
        }
    )
    assert len(node.spec.taints) == 2
    patched_node = await core.patch_node(
        "n",
        {
            "spec": {
                "taints": [{"key": "a", "$patch": "delete"}, {"key": "c", "effect": "NoExecute"}]
            }
        },
        _content_type="application/strategic-merge-patch+json",
    )
    assert [t.key for t in patched_node.spec.taints] == ["b", "c"]


async def test_unknown_fields_are_dropped_with_a_warning_or_refused_when_strict(
    api: client.ApiClient,
) -> None:
    core = client.CoreV1Api(api)
    typo = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}], "nodeSelecter": {"pool": "gpu"}},
    }
    created, _, headers = await core.create_namespaced_pod_with_http_info("default", typo)
    assert created.spec.node_selector is None
    # RFC 7234 warn-text with its quotes escaped, as kube-apiserver sends it.
    assert headers.getall("Warning") == ['299 - "unknown field \\"spec.nodeSelecter\\""']
    typo["metadata"]["name"] = "q"
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_pod("default", typo, field_validation="Strict")
    assert caught.value.status == 400
    assert 'unknown field "spec.nodeSelecter"' in json.loads(caught.value.body)["message"]


async def test_unknown_fields_of_a_custom_resource_are_pruned_with_a_warning(
    api: client.ApiClient,
) -> None:
    from tests.harness.fake_kube_tests.conftest import GROUP, PLURAL, VERSION, lws_manifest

    custom = client.CustomObjectsApi(api)
    manifest = lws_manifest("d", gpus=0)
    manifest["spec"]["replica"] = 3  # a typo of replicas
    created, _, headers = await custom.create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, "default", PLURAL, manifest
    )
    assert "replica" not in created["spec"] and created["spec"]["replicas"] == 1
    assert any("spec.replica" in warning for warning in headers.getall("Warning"))
