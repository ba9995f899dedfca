"""Fixtures: a running fake API server and kubernetes-asyncio clients bound to it."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from tests.harness.fake_kube import FakeKube

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    async with FakeKube.start(history_limit=50, bookmark_interval_s=0.2) as server:
        yield server


@pytest.fixture
async def api(kube: FakeKube) -> AsyncIterator[client.ApiClient]:
    async with kube.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def lws_manifest(
    name: str,
    *,
    replicas: int = 1,
    size: int = 2,
    gpus: int = 4,
    annotations: dict[str, str] | None = None,
    leader_gpus: int | None = None,
    priority_class: str | None = None,
) -> dict[str, Any]:
    """A LeaderWorkerSet shaped like lws' docs/examples/vllm/GPU/lws.yaml, resized."""

    def template(gpu_count: int, role: str) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "containers": [
                {
                    "name": f"vllm-{role}",
                    "image": "vllm/vllm-openai:latest",
                    "resources": {
                        "limits": {"nvidia.com/gpu": str(gpu_count), "memory": "64Gi"},
                        "requests": {"cpu": "8"},
                    },
                }
            ]
        }
        if priority_class:
            spec["priorityClassName"] = priority_class
        return {"metadata": {"labels": {"role": role}}, "spec": spec}

    lwt: dict[str, Any] = {"size": size, "workerTemplate": template(gpus, "worker")}
    if leader_gpus is not None:
        lwt["leaderTemplate"] = template(leader_gpus, "leader")
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": copy.deepcopy(annotations or {}),
        },
        "spec": {"replicas": replicas, "leaderWorkerTemplate": lwt},
    }
