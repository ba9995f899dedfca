"""Placement of one more gang (`place_gang`): exclusive topologies within one pass, and the
room Pending gangs will take (`allocate_growth`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.decision import plan
from autoscaler.core.fit import GrowthRequest, Room, Unplaced, allocate_growth, place_gang
from autoscaler.core.gang_plan import ComponentMemory, Memory
from autoscaler.core.model import ComponentKey, DeploymentKey, GangStatus, Taint
from tests.core.builders import exclusive_node, node, obs, observations, policy, shape

# two zones of two 16-GPU nodes; a gang is two 8-GPU pods, and best fit puts both on one node
NODES = tuple(
    node(name, gpus=16, zone=zone)
    for name, zone in zip("abcd", ["z1", "z1", "z2", "z2"], strict=True)
)
EXCLUSIVE = shape(pods_per_gang=2, gpus=8, topology_key="zone")
SHARED = shape(pods_per_gang=2, gpus=8)


def _nodes_used(before: Room, after: Room | None) -> set[str]:
    assert after is not None
    return {name for name in after.free if after.free[name] != before.free[name]}


def test_an_exclusive_gang_placed_in_this_pass_keeps_its_namespace_out_of_its_domain():
    start = Room.of(NODES)
    exclusive = place_gang(EXCLUSIVE, NODES, start, namespace="serving")
    assert _nodes_used(start, exclusive) == {"a"}
    assert exclusive is not None and ("serving", "zone", "z1") in exclusive.taken
    # b, in z1, has room for the whole gang, but the namespace's pods may not join z1
    shared = place_gang(SHARED, NODES, exclusive, namespace="serving")
    assert _nodes_used(exclusive, shared) == {"c"}
    # the exclusive gang's anti-affinity is its namespace's: another namespace may use b
    other = place_gang(SHARED, NODES, exclusive, namespace="batch")
    assert _nodes_used(exclusive, other) == {"b"}


def test_a_gang_placed_in_this_pass_keeps_exclusive_gangs_of_its_namespace_out():
    start = Room.of(NODES)
    shared = place_gang(SHARED, NODES, start, namespace="serving")
    assert shared is not None and shared.occupied == {("serving", "a")}
    exclusive = place_gang(EXCLUSIVE, NODES, shared, namespace="serving")
    assert _nodes_used(shared, exclusive) == {"c"}
    # z1 holds a pod of the namespace, z2 its exclusive gang: no domain left for another
    assert exclusive is not None
    assert place_gang(EXCLUSIVE, NODES, exclusive, namespace="serving") is None
    # another namespace's exclusive gang may still take z1's free node
    assert _nodes_used(exclusive, place_gang(EXCLUSIVE, NODES, exclusive, namespace="batch")) == {
        "b"
    }


def test_a_bound_exclusive_gang_holds_its_zone_against_another_key_and_not_unlabeled_nodes():
    nodes = (
        exclusive_node("a", "serving", gpus=16, zone="z1", rack="r1"),
        node("b", gpus=16, zone="z1", rack="r2"),
        node("c", gpus=16, zone="z2", rack="r3"),
    )
    start = Room.of(nodes)
    # by rack: r1 runs a pod of the namespace, r2 is in the held zone, r3 is free
    by_rack = shape(pods_per_gang=2, gpus=8, topology_key="rack")
    assert _nodes_used(start, place_gang(by_rack, nodes, start, namespace="serving")) == {"c"}
    # a node without the zone label is in no zone, so no exclusive gang holds it
    unlabeled = (nodes[0], nodes[1], node("d", gpus=16))
    start = Room.of(unlabeled)
    assert _nodes_used(start, place_gang(SHARED, unlabeled, start, namespace="serving")) == {"d"}
    # nor does an exclusive gang bound on an unlabeled node hold the other unlabeled nodes
    alone = (exclusive_node("e", "serving", gpus=16), node("f", gpus=16))
    start = Room.of(alone)
    assert place_gang(SHARED, alone, start, namespace="serving") is not None


# --- room that gangs already asked for will take --------------------------------------------


def _grow(unplaced: tuple[Unplaced, ...], wanted: int = 3) -> int:
    """Gangs granted on two 8-GPU nodes (one 2x8-GPU gang of room) to a component at 1 that
    wants `wanted`, on a cluster that cannot grow."""
    request = GrowthRequest(
        key=ComponentKey("serving", "decode"),
        deployment=DeploymentKey("serving", "chat"),
        shape=SHARED,
        current_gangs=1,
        minimum_gangs=1,
        wanted_gangs=wanted,
    )
    nodes = (node("a"), node("b"))
    return allocate_growth([request], nodes, can_grow=False, unplaced=unplaced)[request.key].gangs


@pytest.mark.parametrize(
    ("unplaced", "expected_gangs"),
    [
        pytest.param((), 2, id="free-room-holds-one-more-gang"),
        pytest.param((Unplaced("serving", SHARED, 2),), 1, id="a-pending-gang-takes-that-room"),
        pytest.param(
            (Unplaced("batch", SHARED, 2),), 1, id="whichever-namespace-the-pending-gang-is-in"
        ),
        pytest.param((Unplaced("serving", SHARED, 1),), 1, id="a-partial-gangs-missing-pod"),
        pytest.param(
            (Unplaced("serving", shape(pods_per_gang=2, gpus=16), 2),),
            2,
            id="a-gang-that-fits-nowhere-takes-nothing",
        ),
    ],
)
def test_pods_of_gangs_already_asked_for_take_their_room_first(unplaced, expected_gangs):
    """Counting that room for a new gang ordered gangs that competed for it with those
    already Pending: on a cluster that cannot grow, partial gangs that hold GPUs and serve
    nothing."""
    assert _grow(unplaced) == expected_gangs


def test_a_gang_being_recreated_finds_its_room_where_its_old_pods_leave():
    """Group 1's pods terminate on b (LWS recreates a group whose pod failed): b's room is
    still counted as used, and goes back to group 1. Reserving group 1 again on c left no
    room for the new gang."""
    gangs = (GangStatus(0, 2, 2, 2), GangStatus(1, 2, 0, 0, 9_000.0, pods_leaving=2))
    component = obs(ready=1, spec=2, waiting=40, kv=0.5, gangs=gangs, gang_shape=SHARED)
    nodes = (node("a", gpus=0), node("b", gpus=0), node("c", gpus=16))
    the_plan, _ = plan(
        observations(component, nodes=nodes, can_grow=False),
        {component.key: policy(max_scale_up=1)},
        {},
        Memory({component.key: ComponentMemory(last_scale_up_need=2)}),
        now=10_000.0,
    )
    assert the_plan.components[component.key].desired_gangs == 3


@pytest.mark.parametrize(
    ("taint", "fits"),
    [
        # GKE taints GPU nodes so; its ExtendedResourceToleration admission adds the
        # toleration to every pod that requests GPUs, and templates carry none
        pytest.param(Taint("nvidia.com/gpu", "present"), True, id="gke-gpu-taint"),
        pytest.param(Taint("nvidia.com/gpu", "present", "NoExecute"), False, id="no-execute"),
        pytest.param(Taint("example.com/fpga", "present"), False, id="resource-not-requested"),
        pytest.param(Taint("dedicated", "inference"), False, id="not-a-resource"),
        pytest.param(Taint("kubernetes.io/gpu"), False, id="kubernetes-io-is-native"),
    ],
)
def test_a_taint_named_after_an_extended_resource_the_pod_requests_is_tolerated(taint, fits):
    tainted = replace(node("gpu", gpus=16), taints=(taint,))
    start = Room.of((tainted,))
    assert (place_gang(SHARED, (tainted,), start, namespace="serving") is not None) is fits
