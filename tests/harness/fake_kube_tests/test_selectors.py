"""Label and field selectors, pinned to apimachinery's semantics, through list over HTTP."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.harness.fake_kube import FakeKube

LABELS = {
    "a": {"tier": "gpu", "role": "leader"},
    "b": {"tier": "gpu", "role": "worker"},
    "c": {"tier": "cpu"},
    "d": {},
}


@pytest.fixture
async def labelled(core: client.CoreV1Api) -> None:
    for name, labels in LABELS.items():
        await core.create_namespaced_config_map(
            "default", {"metadata": {"name": name, "labels": labels}}
        )


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param("tier=gpu", "ab", id="equals"),
        pytest.param("tier==gpu", "ab", id="double-equals"),
        pytest.param("tier!=gpu", "cd", id="not-equals-includes-unlabelled"),
        pytest.param("tier in (gpu,cpu)", "abc", id="in"),
        pytest.param("tier notin (gpu)", "cd", id="notin-includes-unlabelled"),
        pytest.param("role", "ab", id="exists"),
        pytest.param("!role", "cd", id="does-not-exist"),
        pytest.param("tier=gpu,role=worker", "b", id="and"),
        pytest.param("tier in (gpu, cpu),!role", "c", id="set-with-spaces-and-not-exists"),
        pytest.param("", "abcd", id="empty-selects-all"),
    ],
)
async def test_label_selector(
    labelled: None, core: client.CoreV1Api, selector: str, expected: str
) -> None:
    found = await core.list_namespaced_config_map("default", label_selector=selector)
    assert "".join(sorted(i.metadata.name for i in found.items)) == expected


@pytest.mark.parametrize("selector", ["tier in gpu", "=x", "tier=gpu=x", "ti er=gpu"])
async def test_bad_label_selector_is_400(
    labelled: None, core: client.CoreV1Api, selector: str
) -> None:
    with pytest.raises(ApiException) as caught:
        await core.list_namespaced_config_map("default", label_selector=selector)
    assert caught.value.status == 400


async def test_pod_field_selectors(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.add_node("n1", cpu="4")
    for name, cpu in (("small", "1"), ("huge", "64")):
        await core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": name},
                "spec": {
                    "containers": [
                        {"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}
                    ]
                },
            },
        )

    async def names(selector: str) -> list[str]:
        pods = await core.list_pod_for_all_namespaces(field_selector=selector)
        return sorted(p.metadata.name for p in pods.items)

    assert await names("spec.nodeName=n1") == ["small"]
    assert await names("spec.nodeName=") == ["huge"]
    assert await names("status.phase=Pending") == ["huge"]
    assert await names("status.phase!=Pending,metadata.name=small") == ["small"]
    assert await names("metadata.name=huge") == ["huge"]
    with pytest.raises(ApiException) as caught:
        await names("spec.priority=3")
    assert caught.value.status == 400
