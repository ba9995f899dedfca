"""Gang state and free capacity from pod and node dicts (no server needed)."""

from __future__ import annotations

from datetime import datetime

import pytest

from autoscaler.adapters.capacity import node_capacities
from autoscaler.adapters.gang_state import gang_statuses, ready_leader_pods
from autoscaler.adapters.kube_state import build_state
from autoscaler.core.model import ComponentKey, GangState
from tests.adapters.kube_fixtures import gpu_node, lws_pod, vllm_lws


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


T0 = "2026-11-22T01:00:00Z"
T1 = "2026-11-22T01:02:00Z"


@pytest.mark.parametrize(
    ("pods", "expected_states", "since"),
    [
        pytest.param(
            [lws_pod("vllm", 0, 0), lws_pod("vllm", 0, 1)],
            [GangState.READY],
            [None],
            id="all-ready",
        ),
        pytest.param(
            [lws_pod("vllm", 0, 0, created=T1), lws_pod("vllm", 0, 1, node=None, created=T0)],
            [GangState.PARTIAL],
            [_epoch(T0)],
            id="one-pending-is-partial-since-oldest-not-ready-pod",
        ),
        pytest.param(
            [lws_pod("vllm", 0, 0, ready=False, created=T1), lws_pod("vllm", 0, 1)],
            [GangState.STARTING],
            [_epoch(T1)],
            id="placed-not-ready-is-starting",
        ),
        pytest.param(
            [
                lws_pod("vllm", 0, 0, ready=False, created=T0, ready_changed=T1),
                lws_pod("vllm", 0, 1),
            ],
            [GangState.STARTING],
            [_epoch(T1)],
            id="ready-lost-counts-from-losing-it-not-from-creation",
        ),
        pytest.param(
            [
                lws_pod("vllm", 0, 0, ready=False, created=T1, ready_changed=T0),
                lws_pod("vllm", 0, 1),
            ],
            [GangState.STARTING],
            [_epoch(T1)],
            id="condition-older-than-the-pod-counts-from-creation",
        ),
        pytest.param(
            [lws_pod("vllm", 0, 0, node=None), lws_pod("vllm", 0, 1, node=None)],
            [GangState.PENDING],
            [_epoch(T0)],
            id="nothing-placed-is-pending",
        ),
        pytest.param(
            [lws_pod("vllm", 0, 0), lws_pod("vllm", 0, 1, terminating=True)],
            [GangState.PARTIAL],
            [None],
            id="terminating-member-counts-as-missing-since-unknown",
        ),
        pytest.param(
            [lws_pod("vllm", 0, 0), lws_pod("vllm", 0, 1, phase="Failed")],
            [GangState.PARTIAL],
            [None],
            id="failed-member-counts-as-missing",
        ),
        pytest.param(
            [lws_pod("other", 0, 0), lws_pod("other", 0, 1)],
            [GangState.PENDING],
            [None],
            id="pods-of-another-lws-ignored",
        ),
    ],
)
def test_one_gang_state(pods, expected_states, since):
    gangs = gang_statuses(pods, lws_name="vllm", pods_per_gang=2, spec_gangs=1)
    assert [g.state for g in gangs] == expected_states
    assert [g.not_ready_since_s for g in gangs] == since


def test_members_terminating_on_a_node_are_counted_as_leaving():
    """Their room is still used on the node, and goes to the pods that replace them: fit
    must not look for it a second time."""
    pods = [
        lws_pod("vllm", 0, 0, terminating=True),
        lws_pod("vllm", 0, 1, terminating=True),
        lws_pod("vllm", 1, 0),
        lws_pod("vllm", 1, 1, node=None, terminating=True),  # never placed: holds nothing
    ]
    gangs = gang_statuses(pods, lws_name="vllm", pods_per_gang=2, spec_gangs=2)
    assert [(g.pods_scheduled, g.pods_leaving) for g in gangs] == [(0, 2), (1, 0)]
    # on a node that takes no new member (cordoned, drained, not Ready) the room stays there
    cordoned = gang_statuses(
        pods,
        lws_name="vllm",
        pods_per_gang=2,
        spec_gangs=2,
        takes_replacement=lambda node, pod: node == "node-b",
    )
    assert [g.pods_leaving for g in cordoned] == [0, 0]
    # asked per pod: the node takes workers, not leaders
    workers_only = gang_statuses(
        pods,
        lws_name="vllm",
        pods_per_gang=2,
        spec_gangs=2,
        takes_replacement=lambda node, pod: pod["metadata"]["name"].count("-") == 2,
    )
    assert [g.pods_leaving for g in workers_only] == [1, 0]


def _tainted(name: str, key: str) -> dict:
    node = gpu_node(name)
    node["spec"]["taints"] = [{"key": key, "value": "1732500000", "effect": "NoSchedule"}]
    return node


def test_a_node_being_drained_by_taint_keeps_its_leaving_members_room():
    """cluster-autoscaler and Karpenter drain a node by tainting it, without cordoning it:
    the replacement of a member evicted there must find room elsewhere, so fit must look for
    it. A node whose taint the pod tolerates still takes the replacement: the pod's own
    tolerations count, which hold what admission added to the template."""
    lws = vllm_lws(name="vllm", annotations={"gang-autoscaler.io/enabled": "true"}, replicas=3)
    nodes = [
        gpu_node("node-a"),
        _tainted("node-b", "ToBeDeletedByClusterAutoscaler"),
        _tainted("node-c", "karpenter.sh/disrupted"),
        _tainted("node-d", "example.com/maintenance"),
    ]
    tolerating = lws_pod("vllm", 2, 1, node="node-d", terminating=True)
    tolerating["spec"]["tolerations"] = [{"key": "example.com/maintenance", "operator": "Exists"}]
    pods = [
        lws_pod("vllm", 0, 0, node="node-a", terminating=True),
        lws_pod("vllm", 0, 1, node="node-a"),
        lws_pod("vllm", 1, 0, node="node-b", terminating=True),
        lws_pod("vllm", 1, 1, node="node-c", terminating=True),
        lws_pod("vllm", 2, 0, node="node-d", terminating=True),  # no toleration of its own
        tolerating,
    ]
    state = build_state(lws_objects=[lws], pods=pods, nodes=nodes, now_s=0.0)
    observation = state.components[ComponentKey("serving", "vllm")].observation
    assert observation is not None
    assert [g.pods_leaving for g in observation.gangs] == [1, 0, 1]


def test_a_rolling_update_places_the_replacement_by_the_new_template():
    """A pod of the old revision may be on a node the new template no longer selects: its
    replacement cannot return there, whatever the old pod's own node selector says."""
    lws = vllm_lws(name="vllm", annotations={"gang-autoscaler.io/enabled": "true"}, replicas=1)
    for role in ("leaderTemplate", "workerTemplate"):
        template = lws["spec"]["leaderWorkerTemplate"].get(role)
        if template is not None:
            template["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": "z2"}
    old = [lws_pod("vllm", 0, w, node="node-a", terminating=True) for w in (0, 1)]
    for pod in old:
        pod["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": "z1"}
    nodes = [gpu_node("node-a", zone="z1"), gpu_node("node-b", zone="z2")]
    state = build_state(lws_objects=[lws], pods=old, nodes=nodes, now_s=0.0)
    observation = state.components[ComponentKey("serving", "vllm")].observation
    assert observation is not None
    assert [g.pods_leaving for g in observation.gangs] == [0]


def test_groups_above_spec_are_left_out_and_missing_groups_are_pending():
    pods = [lws_pod("vllm", g, w) for g in (0, 2, 3) for w in (0, 1)]
    gangs = gang_statuses(pods, lws_name="vllm", pods_per_gang=2, spec_gangs=3)
    assert [(g.group_index, g.state) for g in gangs] == [
        (0, GangState.READY),
        (1, GangState.PENDING),
        (2, GangState.READY),
    ]


def test_ready_leader_pods_only_for_ready_gangs():
    pods = [
        lws_pod("vllm", 0, 0),
        lws_pod("vllm", 0, 1),
        lws_pod("vllm", 1, 0),
        lws_pod("vllm", 1, 1, node=None),
    ]
    gangs = gang_statuses(pods, lws_name="vllm", pods_per_gang=2, spec_gangs=2)
    assert ready_leader_pods(pods, lws_name="vllm", gangs=gangs) == {"vllm-0": 0}


def _balloon(node: str) -> dict:
    pod = lws_pod("x", 0, 0, node=node, requests={"cpu": "125", "nvidia.com/gpu": "8"})
    pod["metadata"]["labels"] = {
        "app.kubernetes.io/managed-by": "gang-autoscaler",
        "gang-autoscaler.io/balloon-for": "vllm",
    }
    return pod


def test_free_capacity_counts_balloons_as_free_and_skips_finished_pods():
    nodes = [gpu_node("node-a"), gpu_node("node-b"), gpu_node("node-c", ready=False)]
    pods = [
        lws_pod("vllm", 0, 0, node="node-a", requests={"cpu": "125", "nvidia.com/gpu": "8"}),
        lws_pod("vllm", 0, 1, node="node-b", requests={"cpu": "500m"}, phase="Succeeded"),
        _balloon("node-b"),
        lws_pod("vllm", 1, 0, node=None, requests={"cpu": "125", "nvidia.com/gpu": "8"}),
    ]
    caps = {c.name: c for c in node_capacities(nodes, pods)}
    assert caps["node-a"].free["nvidia.com/gpu"] == 0
    assert caps["node-a"].free["cpu"] == 190_000 - 125_000
    assert caps["node-a"].free["pods"] == 109
    assert caps["node-b"].free["nvidia.com/gpu"] == 8  # the balloon is preemptible: free
    assert caps["node-b"].free["cpu"] == 190_000
    assert caps["node-b"].free["memory"] == 1500 * 2**30
    assert not caps["node-c"].schedulable
    assert caps["node-a"].labels["topology.kubernetes.io/zone"] == "z1"


def test_taints_and_cordon_are_reported():
    node = gpu_node("node-a")
    node["spec"] = {
        "unschedulable": True,
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    }
    (cap,) = node_capacities([node], [])
    assert not cap.schedulable
    assert cap.taints[0].key == "nvidia.com/gpu" and cap.taints[0].effect == "NoSchedule"


def test_lws_pods_and_exclusive_placement_are_reported_per_node():
    """LWS labels every pod of a group with its group key and copies the LWS's
    exclusive-topology annotation onto it; balloons and pods of other owners carry neither."""
    nodes = [gpu_node("node-a"), gpu_node("node-b"), gpu_node("node-c")]
    exclusive = lws_pod("prefill", 0, 0, node="node-a")
    exclusive["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-key"] = "k0"
    exclusive["metadata"]["annotations"] = {
        "leaderworkerset.sigs.k8s.io/exclusive-topology": "topology.kubernetes.io/zone"
    }
    shared = lws_pod("decode", 0, 0, node="node-b", namespace="batch")
    shared["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-key"] = "k1"
    caps = {c.name: c for c in node_capacities(nodes, [exclusive, shared, _balloon("node-c")])}
    assert caps["node-a"].lws_namespaces == {"serving"}
    assert caps["node-a"].exclusive_lws == {("serving", "topology.kubernetes.io/zone")}
    assert caps["node-b"].lws_namespaces == {"batch"} and caps["node-b"].exclusive_lws == set()
    assert caps["node-c"].lws_namespaces == set() and caps["node-c"].exclusive_lws == set()
