"""Free capacity per node, from node and pod objects, for the core's fit check.

Free means allocatable minus the requests of the live pods bound to the node, except balloon
pods: a real gang preempts them, so their requests count as free. Pure: dicts in,
`NodeCapacity` values out.
"""

from __future__ import annotations

from collections.abc import Iterable

from autoscaler.adapters.kube_objects import (
    BALLOON_FOR_LABEL,
    GROUP_KEY_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    Obj,
    condition_true,
    labels,
    meta,
    pod_is_finished,
)
from autoscaler.core.model import ClusterObservation, NodeCapacity, Taint
from autoscaler.core.shape import (
    EXCLUSIVE_TOPOLOGY_ANNOTATION,
    QuantityError,
    parse_quantity,
    pod_shape_from_spec,
)


def is_balloon(pod: Obj) -> bool:
    pod_labels = labels(pod)
    return pod_labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE and BALLOON_FOR_LABEL in pod_labels


def pod_requests(pod: Obj) -> dict[str, int]:
    """Effective requests of one pod (as the scheduler counts them), plus one `pods` slot."""
    requests = dict(pod_shape_from_spec(pod.get("spec") or {}).requests)
    requests["pods"] = requests.get("pods", 0) + 1
    return requests


def _allocatable(node: Obj) -> dict[str, int]:
    status = node.get("status") or {}
    raw = status.get("allocatable") or status.get("capacity") or {}
    out: dict[str, int] = {}
    for resource, quantity in raw.items():
        try:
            out[resource] = parse_quantity(resource, quantity)
        except QuantityError:
            # One unreadable extended resource must not hide the node's CPU and GPUs.
            continue
    return out


def _schedulable(node: Obj) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return condition_true(node, "Ready")


def node_capacities(nodes: Iterable[Obj], pods: Iterable[Obj]) -> tuple[NodeCapacity, ...]:
    """One `NodeCapacity` per node, sorted by node name."""
    used: dict[str, dict[str, int]] = {}
    lws_namespaces: dict[str, set[str]] = {}
    exclusive_lws: dict[str, set[tuple[str, str]]] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name or pod_is_finished(pod) or is_balloon(pod):
            continue
        if GROUP_KEY_LABEL in labels(pod):
            namespace = str(meta(pod).get("namespace", ""))
            lws_namespaces.setdefault(str(node_name), set()).add(namespace)
            # LWS copies the annotation onto its pods and keys the anti-affinity on it
            topology_key = (meta(pod).get("annotations") or {}).get(EXCLUSIVE_TOPOLOGY_ANNOTATION)
            if topology_key:
                exclusive_lws.setdefault(str(node_name), set()).add((namespace, topology_key))
        # A terminating pod still holds its resources until the kubelet lets it go.
        bucket = used.setdefault(str(node_name), {})
        for resource, amount in pod_requests(pod).items():
            bucket[resource] = bucket.get(resource, 0) + amount

    out = []
    for node in nodes:
        node_name = str(meta(node).get("name", ""))
        free = _allocatable(node)
        for resource, amount in used.get(node_name, {}).items():
            free[resource] = free.get(resource, 0) - amount
        taints = tuple(
            Taint(key=str(t.get("key", "")), value=str(t.get("value") or ""), effect=t["effect"])
            for t in (node.get("spec") or {}).get("taints") or []
            if t.get("effect")
        )
        out.append(
            NodeCapacity(
                name=node_name,
                free=free,
                labels=dict(labels(node)),
                taints=taints,
                schedulable=_schedulable(node),
                lws_namespaces=frozenset(lws_namespaces.get(node_name, ())),
                exclusive_lws=frozenset(exclusive_lws.get(node_name, ())),
            )
        )
    return tuple(sorted(out, key=lambda n: n.name))


def cluster_observation(
    nodes: Iterable[Obj], pods: Iterable[Obj], *, can_grow: bool
) -> ClusterObservation:
    return ClusterObservation(nodes=node_capacities(nodes, pods), can_grow=can_grow)
