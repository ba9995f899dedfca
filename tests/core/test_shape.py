"""Gang shape from real LWS manifests and Kubernetes quantities."""

from __future__ import annotations

import pytest
import yaml

from autoscaler.core.shape import QuantityError, gang_shape_from_lws, parse_quantity, pod_resources
from tests.harness.shared_data import shared_data_path

GIB = 2**30


@pytest.mark.parametrize(
    ("resource", "text", "value"),
    [
        ("cpu", "125", 125_000),
        ("cpu", "500m", 500),
        ("cpu", "0.25", 250),
        ("memory", "1124Gi", 1124 * GIB),
        ("memory", "1G", 10**9),
        ("memory", "1e3", 1000),
        ("nvidia.com/gpu", "8", 8),
    ],
)
def test_quantities(resource, text, value):
    assert parse_quantity(resource, text) == value


@pytest.mark.parametrize(
    "text",
    [
        "8 GPUs",
        "1.2.3",
        "-1",
        "Gi",
        # The LWS schema accepts these; Decimal raised Overflow (not a ValueError) on the
        # first, which stopped discovery for every LWS in the cluster.
        pytest.param("1e999999", id="decimal-overflow"),
        pytest.param("1e30", id="over-int64"),
    ],
)
@pytest.mark.parametrize("resource", ["memory", "cpu"])
def test_bad_quantities(resource, text):
    with pytest.raises(QuantityError):
        parse_quantity(resource, text)


def load(name: str) -> dict:
    with open(shared_data_path("examples", name)) as fh:
        return next(d for d in yaml.safe_load_all(fh) if d and d["kind"] == "LeaderWorkerSet")


def test_vllm_guide_lws_shape():
    shape = gang_shape_from_lws(load("vllm_docs_deployment_frameworks_lws.yaml"))
    assert shape.pods_per_gang == 2
    assert shape.total("nvidia.com/gpu") == 16
    # requests omitted for GPUs and memory default to the limits, as Kubernetes does
    assert shape.leader.requests["memory"] == 1124 * GIB
    assert shape.leader.requests["cpu"] == 125_000
    assert shape.worker.requests["ephemeral-storage"] == 800 * GIB
    assert shape.topology_key is None


def test_exclusive_topology_annotation_sets_the_topology_key():
    lws = load("vllm_docs_deployment_frameworks_lws.yaml")
    lws["metadata"]["annotations"] = {
        "leaderworkerset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
    }
    assert gang_shape_from_lws(lws).topology_key == "cloud.google.com/gke-nodepool"


def test_leader_template_defaults_to_the_worker_template():
    lws = load("lws_docs_examples_vllm_GPU_lws.yaml")
    lws["spec"]["leaderWorkerTemplate"].pop("leaderTemplate", None)
    shape = gang_shape_from_lws(lws)
    assert shape.leader == shape.worker


def _container(requests=None, limits=None, **extra):
    return {"name": "c", "resources": {"requests": requests or {}, "limits": limits or {}}, **extra}


@pytest.mark.parametrize(
    ("spec", "requests", "limits"),
    [
        pytest.param(
            {
                "containers": [
                    _container(limits={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"})
                ]
            },
            {"cpu": 8000, "memory": 64 * GIB, "nvidia.com/gpu": 8},
            {"cpu": 8000, "memory": 64 * GIB, "nvidia.com/gpu": 8},
            id="limits-only-default-the-requests",
        ),
        pytest.param(
            {
                "containers": [
                    _container(limits={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}),
                    _container(requests={"cpu": "500m", "memory": "1Gi"}),
                ]
            },
            {"cpu": 8500, "memory": 65 * GIB, "nvidia.com/gpu": 8},
            {"nvidia.com/gpu": 8},
            id="an-unlimited-sidecar-leaves-the-pod-unlimited-but-gpus-stay-limited",
        ),
        pytest.param(
            {
                "containers": [
                    _container(limits={"cpu": "8"}),
                    _container(requests={"cpu": "500m"}, limits={"cpu": "1"}),
                ]
            },
            {"cpu": 8500},
            {"cpu": 9000},
            id="requests-default-per-container-before-summing",
        ),
        pytest.param(
            {
                "initContainers": [
                    _container(requests={"cpu": "16"}),
                    _container(requests={"cpu": "1"}, restartPolicy="Always"),
                ],
                "containers": [_container(requests={"cpu": "4"})],
                "overhead": {"cpu": "250m"},
            },
            {"cpu": 16250},
            {},
            id="largest-init-container-native-sidecar-adds-overhead-adds",
        ),
        pytest.param(
            {
                "initContainers": [
                    _container(requests={"cpu": "1"}, restartPolicy="Always"),
                    _container(requests={"cpu": "16"}),
                ],
                "containers": [_container(requests={"cpu": "4"})],
            },
            {"cpu": 17000},
            {},
            id="an-init-container-runs-beside-the-sidecars-started-before-it",
        ),
    ],
)
def test_pod_resources_count_as_kubernetes_does(spec, requests, limits):
    got_requests, got_limits = pod_resources(spec)
    assert got_requests == requests
    assert got_limits == limits
    for name, limit in got_limits.items():
        assert got_requests[name] <= limit  # what the API server requires of the balloon pod
