"""Emulation of the LeaderWorkerSet controller (kubernetes-sigs/lws v0.10 behaviour).

For each LWS it keeps `spec.replicas` groups of `spec.leaderWorkerTemplate.size` pods: the
leader `<lws>-<group>` and workers `<lws>-<group>-<worker>` (worker 1..size-1), with the
labels, annotations and environment the real controller sets, and keeps `status` (replicas,
readyReplicas, hpaPodSelector, conditions) up to date. Scale-down removes the highest group
indexes.

Simplifications: the real controller owns workers through one StatefulSet per group and
leaders through a leader StatefulSet; here every pod is owned directly by the LWS (so owner
garbage collection still removes them). A template change rolls groups one by one from the
highest index, without surge.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
from typing import TYPE_CHECKING, Any

from tests.harness.fake_kube.errors import ApiError
from tests.harness.fake_kube.event_recorder import record_event

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster

PREFIX = "leaderworkerset.sigs.k8s.io"
NAME_LABEL = f"{PREFIX}/name"
GROUP_INDEX_LABEL = f"{PREFIX}/group-index"
WORKER_INDEX_LABEL = f"{PREFIX}/worker-index"
GROUP_KEY_LABEL = f"{PREFIX}/group-key"
TEMPLATE_HASH_LABEL = f"{PREFIX}/template-revision-hash"
SIZE_ANNOTATION = f"{PREFIX}/size"
LEADER_NAME_ANNOTATION = f"{PREFIX}/leader-name"
EXCLUSIVE_TOPOLOGY_ANNOTATION = f"{PREFIX}/exclusive-topology"
LWS_KEY = "leaderworkerset.x-k8s.io/leaderworkersets"

Obj = dict[str, Any]


def hpa_pod_selector(lws_name: str) -> str:
    return f"{NAME_LABEL}={lws_name},{WORKER_INDEX_LABEL}=0"


def _template_hash(template: Obj) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _group_key(namespace: str, leader_name: str) -> str:
    return hashlib.sha1(f"{namespace}/{leader_name}".encode()).hexdigest()


def _restart_count(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(status.get("restartCount") or 0) for status in statuses)


def _terminating(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def _is_ready(pod: Obj) -> bool:
    if _terminating(pod):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _build_pod(lws: Obj, *, group: int, worker: int, size: int, template_hash: str) -> Obj:
    meta = lws["metadata"]
    lws_name, namespace = meta["name"], meta["namespace"]
    lwt = lws["spec"]["leaderWorkerTemplate"]
    template = lwt.get("leaderTemplate") if worker == 0 else None
    template = copy.deepcopy(template or lwt["workerTemplate"])
    leader_name = f"{lws_name}-{group}"
    name = leader_name if worker == 0 else f"{leader_name}-{worker}"
    group_key = _group_key(namespace, leader_name)
    template_meta = template.get("metadata") or {}
    labels = {
        **(template_meta.get("labels") or {}),
        NAME_LABEL: lws_name,
        GROUP_INDEX_LABEL: str(group),
        WORKER_INDEX_LABEL: str(worker),
        GROUP_KEY_LABEL: group_key,
        TEMPLATE_HASH_LABEL: template_hash,
        "statefulset.kubernetes.io/pod-name": name,
    }
    annotations = {**(template_meta.get("annotations") or {}), SIZE_ANNOTATION: str(size)}
    if worker != 0:
        annotations[LEADER_NAME_ANNOTATION] = leader_name
    exclusive_key = (meta.get("annotations") or {}).get(EXCLUSIVE_TOPOLOGY_ANNOTATION)
    if exclusive_key:
        annotations[EXCLUSIVE_TOPOLOGY_ANNOTATION] = exclusive_key
    spec = template.get("spec") or {}
    spec.setdefault("hostname", name)
    spec.setdefault("subdomain", lws_name)
    lws_env = [
        {"name": "LWS_LEADER_ADDRESS", "value": f"{leader_name}.{lws_name}.{namespace}"},
        {"name": "LWS_GROUP_SIZE", "value": str(size)},
        {"name": "LWS_WORKER_INDEX", "value": str(worker)},
    ]
    for container in spec.get("containers") or []:
        env = container.setdefault("env", [])
        present = {item.get("name") for item in env}
        env.extend(item for item in lws_env if item["name"] not in present)
    if exclusive_key:
        # Exclusive placement: one group per topology domain, the group's pods together.
        affinity = spec.setdefault("affinity", {})
        pod_affinity = affinity.setdefault("podAffinity", {})
        pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
            {
                "labelSelector": {
                    "matchExpressions": [
                        {"key": GROUP_KEY_LABEL, "operator": "In", "values": [group_key]}
                    ]
                },
                "topologyKey": exclusive_key,
            }
        )
        anti = affinity.setdefault("podAntiAffinity", {})
        anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
            {
                "labelSelector": {
                    "matchExpressions": [
                        {"key": GROUP_KEY_LABEL, "operator": "Exists"},
                        {"key": GROUP_KEY_LABEL, "operator": "NotIn", "values": [group_key]},
                    ]
                },
                "topologyKey": exclusive_key,
            }
        )
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "leaderworkerset.x-k8s.io/v1",
                    "kind": "LeaderWorkerSet",
                    "name": lws_name,
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def reconcile_leaderworkersets(cluster: Cluster) -> None:
    for lws in list(cluster.store.items(LWS_KEY)):
        _reconcile_one(cluster, lws)


def _owned_pods(cluster: Cluster, lws: Obj) -> dict[str, Obj]:
    """The group pods this controller made: owned by the LWS and carrying its group labels.

    Other pods owned by the LWS (balloon pods, say) are left alone, as the real controller,
    which only manages its StatefulSets' pods, leaves them.
    """
    uid = lws["metadata"]["uid"]
    name = lws["metadata"]["name"]
    return {
        pod["metadata"]["name"]: pod
        for pod in cluster.store.items("/pods", lws["metadata"]["namespace"])
        if any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or [])
        and (pod["metadata"].get("labels") or {}).get(NAME_LABEL) == name
        and GROUP_INDEX_LABEL in (pod["metadata"].get("labels") or {})
    }


def _reconcile_one(cluster: Cluster, lws: Obj) -> None:
    pods_type = cluster.rtype("", "pods")
    meta = lws["metadata"]
    lws_name, namespace = meta["name"], meta["namespace"]
    spec = lws["spec"]
    replicas = int(spec.get("replicas", 1))
    lwt = spec["leaderWorkerTemplate"]
    size = int(lwt.get("size", 1))
    leader_ready_first = spec.get("startupPolicy") == "LeaderReady"
    recreate_group = lwt.get("restartPolicy", "RecreateGroupOnPodRestart") in (
        "RecreateGroupOnPodRestart",
        "Default",
    )
    template_hash = _template_hash(lwt)
    # `owned` holds every pod name still taken (Terminating ones too: a name is free only
    # once the pod is gone); `live` only the pods not being deleted.
    owned = _owned_pods(cluster, lws)
    live = {name: pod for name, pod in owned.items() if not _terminating(pod)}

    def delete(name: str) -> None:
        if name in live:
            cluster.delete(pods_type, namespace, name, reconcile=False)
            live.pop(name)

    # Scale-down and stray pods: anything outside groups 0..replicas-1 goes.
    wanted = {
        f"{lws_name}-{g}" if w == 0 else f"{lws_name}-{g}-{w}"
        for g in range(replicas)
        for w in range(size)
    }
    for name in sorted(set(live) - wanted):
        delete(name)

    for group in range(replicas):
        leader_name = f"{lws_name}-{group}"
        workers = [f"{leader_name}-{w}" for w in range(1, size)]
        leader = live.get(leader_name)
        missing_workers = [w for w in workers if w not in live]
        # Groups whose workers were all created once (by leader uid), so that a missing
        # member later means "restarted", not "not created yet".
        started = leader is not None and leader["metadata"]["uid"] in cluster.started_groups
        restarted = any(
            _restart_count(live[name]) > 0 for name in [leader_name, *workers] if name in live
        )
        if recreate_group and leader is not None and started and (missing_workers or restarted):
            # A member of a started group vanished or restarted a container: the real
            # controller deletes the leader, which recreates the whole group.
            for name in [leader_name, *workers]:
                delete(name)
            continue
        if recreate_group and leader is None and any(w in live for w in workers):
            for name in workers:
                delete(name)
            continue
        if leader is None:
            if leader_name in owned:
                continue  # the old leader is still terminating
            leader = _create(
                cluster, lws, group=group, worker=0, size=size, template_hash=template_hash
            )
            if leader is None:
                continue
        if leader_ready_first and not _is_ready(leader):
            continue
        complete = True
        for worker in range(1, size):
            if f"{leader_name}-{worker}" not in owned:
                created = _create(
                    cluster, lws, group=group, worker=worker, size=size, template_hash=template_hash
                )
                complete = complete and created is not None
            elif f"{leader_name}-{worker}" not in live:
                complete = False  # an old worker of that name is still terminating
        if complete:
            cluster.started_groups.add(leader["metadata"]["uid"])
    _roll_one_group(
        cluster,
        lws,
        live=_live_pods(cluster, lws),
        replicas=replicas,
        size=size,
        template_hash=template_hash,
    )
    _update_status(cluster, lws, replicas=replicas, size=size, template_hash=template_hash)


def _live_pods(cluster: Cluster, lws: Obj) -> dict[str, Obj]:
    return {name: pod for name, pod in _owned_pods(cluster, lws).items() if not _terminating(pod)}


def _max_unavailable(lws: Obj, replicas: int) -> int:
    config = ((lws["spec"].get("rolloutStrategy") or {}).get("rollingUpdateConfiguration")) or {}
    raw = config.get("maxUnavailable", 1)
    if isinstance(raw, str) and raw.endswith("%"):
        return max(1, replicas * int(raw[:-1]) // 100)
    return max(1, int(raw))


def _roll_one_group(
    cluster: Cluster,
    lws: Obj,
    *,
    live: dict[str, Obj],
    replicas: int,
    size: int,
    template_hash: str,
) -> None:
    """Rolling update: replace the highest out-of-date group while few enough are unready.

    Like the real controller (and a StatefulSet), groups are updated from the highest index
    down, at most `maxUnavailable` groups unready at a time; `maxSurge` and `partition` are
    not emulated.
    """
    name = lws["metadata"]["name"]

    def members(group: int) -> list[str]:
        return [f"{name}-{group}", *(f"{name}-{group}-{w}" for w in range(1, size))]

    outdated = [
        group
        for group in range(replicas)
        if any(
            (live[m]["metadata"].get("labels") or {}).get(TEMPLATE_HASH_LABEL) != template_hash
            for m in members(group)
            if m in live
        )
    ]
    if not outdated:
        return
    unready = sum(
        1
        for group in range(replicas)
        if not all(m in live and _is_ready(live[m]) for m in members(group))
    )
    if unready >= _max_unavailable(lws, replicas):
        return
    pods_type = cluster.rtype("", "pods")
    for member in members(max(outdated)):
        if member in live:
            cluster.delete(pods_type, lws["metadata"]["namespace"], member, reconcile=False)


def _create(
    cluster: Cluster, lws: Obj, *, group: int, worker: int, size: int, template_hash: str
) -> Obj | None:
    pod = _build_pod(lws, group=group, worker=worker, size=size, template_hash=template_hash)
    try:
        return cluster.create(
            cluster.rtype("", "pods"), lws["metadata"]["namespace"], pod, reconcile=False
        )
    except ApiError as err:
        # The real controller reports a failed pod creation as a Warning Event and retries.
        record_event(
            cluster,
            regarding=lws,
            kind="LeaderWorkerSet",
            api_version="leaderworkerset.x-k8s.io/v1",
            reason="FailedCreate",
            message=f"create Pod {pod['metadata']['name']} failed: {err.message}",
            type_="Warning",
        )
        return None


def _update_status(
    cluster: Cluster, lws: Obj, *, replicas: int, size: int, template_hash: str
) -> None:
    owned = _owned_pods(cluster, lws)
    lws_name = lws["metadata"]["name"]
    groups_created = sum(1 for g in range(replicas) if f"{lws_name}-{g}" in owned)
    ready_groups = 0
    for group in range(replicas):
        names = [f"{lws_name}-{group}", *(f"{lws_name}-{group}-{w}" for w in range(1, size))]
        if all(name in owned and _is_ready(owned[name]) for name in names):
            ready_groups += 1
    status = copy.deepcopy(lws.get("status") or {})
    available = ready_groups >= replicas
    old_conditions = {c["type"]: c for c in status.get("conditions") or []}
    now = cluster.clock().astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def condition(type_: str, value: bool, reason: str, message: str) -> Obj:
        previous = old_conditions.get(type_)
        flag = "True" if value else "False"
        changed_at = (
            previous["lastTransitionTime"]
            if previous is not None and previous.get("status") == flag
            else now
        )
        return {
            "type": type_,
            "status": flag,
            "reason": reason,
            "message": message,
            "lastTransitionTime": changed_at,
            "observedGeneration": lws["metadata"].get("generation", 1),
        }

    status.update(
        {
            "replicas": groups_created,
            "readyReplicas": ready_groups,
            "updatedReplicas": sum(
                1
                for g in range(replicas)
                if (owned.get(f"{lws_name}-{g}") or {})
                .get("metadata", {})
                .get("labels", {})
                .get(TEMPLATE_HASH_LABEL)
                == template_hash
            ),
            "hpaPodSelector": hpa_pod_selector(lws_name),
            "observedGeneration": lws["metadata"].get("generation", 1),
            "conditions": [
                condition(
                    "Available",
                    available,
                    "AllGroupsReady" if available else "GroupsNotReady",
                    "All replicas are ready"
                    if available
                    else f"{ready_groups} of {replicas} groups are ready",
                ),
                condition(
                    "Progressing",
                    not available,
                    "GroupsProgressing" if not available else "Ready",
                    "Replicas are progressing" if not available else "Replicas are ready",
                ),
            ],
        }
    )
    if status != lws.get("status"):
        updated = copy.deepcopy(lws)
        updated["status"] = status
        cluster.write_internal(
            cluster.rtype("leaderworkerset.x-k8s.io", "leaderworkersets"), updated
        )
