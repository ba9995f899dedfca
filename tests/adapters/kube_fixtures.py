"""Plain-dict Kubernetes objects for the adapter's pure tests, cut from the real examples.

The LWS objects are the vLLM LWS guide's manifest
(`examples/vllm_docs_deployment_frameworks_lws.yaml`, first document: 2 pods per group,
8 GPUs, 125 CPU and 1124Gi memory per pod), read from the shared data at test time. Pods and
nodes are built the way the LWS controller and the kubelet report them.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from tests.harness.shared_data import shared_data_path


def example_lws(filename: str) -> dict[str, Any]:
    docs = yaml.safe_load_all(shared_data_path("examples", filename).read_text())
    return next(d for d in docs if d and d.get("kind") == "LeaderWorkerSet")


def vllm_lws(
    *,
    name: str = "vllm",
    namespace: str = "serving",
    annotations: dict[str, str] | None = None,
    replicas: int | None = None,
) -> dict[str, Any]:
    lws = copy.deepcopy(example_lws("vllm_docs_deployment_frameworks_lws.yaml"))
    lws["metadata"].update(name=name, namespace=namespace, uid=f"uid-{name}", resourceVersion="10")
    lws["metadata"]["annotations"] = dict(annotations or {})
    if replicas is not None:
        lws["spec"]["replicas"] = replicas
    return lws


def lws_pod(
    lws: str,
    group: int,
    worker: int,
    *,
    namespace: str = "serving",
    node: str | None = "node-a",
    ready: bool = True,
    created: str = "2026-11-22T01:00:00Z",
    ready_changed: str | None = None,
    terminating: bool = False,
    phase: str | None = None,
    requests: dict[str, str] | None = None,
) -> dict[str, Any]:
    name = f"{lws}-{group}" if worker == 0 else f"{lws}-{group}-{worker}"
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": created,
            "labels": {
                "leaderworkerset.sigs.k8s.io/name": lws,
                "leaderworkerset.sigs.k8s.io/group-index": str(group),
                "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
            },
        },
        "spec": {
            "containers": [{"name": "c", "resources": {"requests": requests or {"cpu": "1"}}}]
        },
        "status": {
            "phase": phase or ("Running" if node else "Pending"),
            "conditions": [{"type": "Ready", "status": "True" if ready and node else "False"}],
        },
    }
    if node:
        pod["spec"]["nodeName"] = node
    if ready_changed is not None:
        pod["status"]["conditions"][0]["lastTransitionTime"] = ready_changed
    if terminating:
        pod["metadata"]["deletionTimestamp"] = "2026-11-22T01:05:00Z"
    return pod


def gpu_node(name: str, *, gpus: int = 8, zone: str = "z1", ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name},
        },
        "spec": {},
        "status": {
            "allocatable": {
                "cpu": "190",
                "memory": "1500Gi",
                "ephemeral-storage": "3000Gi",
                "nvidia.com/gpu": str(gpus),
                "pods": "110",
            },
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
