"""Gang state of one LWS from its pods: ready, starting, partial or pending, and since when.

Pods are matched to groups by the labels the LWS controller sets (`.../name`,
`.../group-index`). Pure: plain pod dicts in, `GangStatus` values out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from autoscaler.adapters.kube_objects import (
    GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    WORKER_INDEX_LABEL,
    Obj,
    condition_true,
    int_label,
    is_terminating,
    labels,
    meta,
    parse_time_s,
    pod_is_bound,
    pod_is_finished,
)
from autoscaler.core.model import GangStatus


def gang_statuses(
    pods: Iterable[Obj],
    *,
    lws_name: str,
    pods_per_gang: int,
    spec_gangs: int,
    takes_replacement: Callable[[str, Obj], bool] | None = None,
) -> tuple[GangStatus, ...]:
    """One `GangStatus` per group index below `spec_gangs`, in index order.

    Terminating and finished pods are left out: they are leaving and serve nothing, so a
    group whose pod is being replaced counts that member as missing. Groups at or above
    `spec_gangs` are being scaled away and are not reported. A group with no pod yet is
    PENDING with an unknown start (`not_ready_since_s=None`); otherwise a group is not ready
    since the earliest `not_ready_since_s` of its not-ready pods.

    `takes_replacement(node, pod)` says whether a node takes the pod that replaces a
    terminating one (None: every node does): the room the pod leaves goes to its
    replacement only there.
    """
    by_group: dict[int, list[Obj]] = {}
    leaving: dict[int, int] = {}  # terminating pods still on a node, by group
    for pod in pods:
        if labels(pod).get(LWS_NAME_LABEL) != lws_name or pod_is_finished(pod):
            continue
        group = int_label(pod, GROUP_INDEX_LABEL)
        if group is None or group >= spec_gangs:
            continue
        if is_terminating(pod):
            # its room goes to its replacement only on a node that takes it; one cordoned,
            # not Ready or tainted against it (cluster-autoscaler's ToBeDeleted, Karpenter's
            # disrupted: drained) keeps that room from everyone
            node = (pod.get("spec") or {}).get("nodeName")
            if node and (takes_replacement is None or takes_replacement(node, pod)):
                leaving[group] = leaving.get(group, 0) + 1
            continue
        by_group.setdefault(group, []).append(pod)

    statuses = []
    for group in range(spec_gangs):
        members = by_group.get(group, [])
        ready = [p for p in members if condition_true(p, "Ready")]
        scheduled = [p for p in members if pod_is_bound(p)]
        not_ready = [p for p in members if not condition_true(p, "Ready")]
        known = [t for t in map(not_ready_since_s, not_ready) if t is not None]
        is_ready = len(ready) >= pods_per_gang
        statuses.append(
            GangStatus(
                group_index=group,
                pods_expected=pods_per_gang,
                pods_scheduled=min(len(scheduled), pods_per_gang),
                pods_ready=min(len(ready), pods_per_gang),
                not_ready_since_s=None if is_ready or not known else min(known),
                pods_leaving=leaving.get(group, 0),
            )
        )
    return tuple(statuses)


def not_ready_since_s(pod: Obj) -> float | None:
    """Since when a not-ready pod has been not ready: its creation, or the moment its Ready
    condition last turned false, whichever is later. A pod that served for days and failed
    a readiness probe a moment ago has been not ready for a moment, not for days."""
    created = parse_time_s(meta(pod).get("creationTimestamp"))
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            changed = parse_time_s(cond.get("lastTransitionTime"))
            if changed is not None:
                return changed if created is None else max(created, changed)
    return created


def ready_leader_pods(
    pods: Iterable[Obj], *, lws_name: str, gangs: Iterable[GangStatus]
) -> dict[str, int]:
    """Leader pod name -> group index, for the ready gangs only.

    Only leaders (worker-index 0) serve vLLM metrics in a multi-node gang, and only ready
    gangs' numbers are trusted, so this is the map the Prometheus adapter joins on.
    """
    ready = {g.group_index for g in gangs if g.pods_ready >= g.pods_expected}
    out: dict[str, int] = {}
    for pod in pods:
        if labels(pod).get(LWS_NAME_LABEL) != lws_name or is_terminating(pod):
            continue
        group = int_label(pod, GROUP_INDEX_LABEL)
        worker = int_label(pod, WORKER_INDEX_LABEL)
        if group in ready and worker == 0:
            out[str(meta(pod).get("name"))] = group
    return out
