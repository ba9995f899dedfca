"""Garbage collection: owner references (background propagation) and pods of lost nodes.

An object whose every owner is gone is deleted, as kube-controller-manager's garbage
collector does; an object with at least one live owner stays. An owner reference is live
only when an object of its apiVersion's group and kind, with its name and uid, exists in the
dependent's namespace (or cluster-wide): a reference with the right uid but a wrong name or
kind gets its dependent deleted, as a real cluster would. A reference to a kind the server
does not serve is never resolved, so its dependent is never collected. Foreground deletion
and `blockOwnerDeletion` are not distinguished: dependents go right after their owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster


def collect_garbage(cluster: Cluster) -> None:
    _collect_orphaned_pods(cluster)
    while True:
        items = list(cluster.store.all_items())
        live: set[tuple[str, ...]] = set()
        for resource_key, obj in items:  # stored objects carry no apiVersion or kind
            group, _, plural = resource_key.partition("/")
            meta = obj["metadata"]
            kind = cluster.rtype(group, plural).kind
            live.add((group, kind, meta.get("namespace") or "", meta["name"], meta["uid"]))

        garbage = [
            (resource_key, obj)
            for resource_key, obj in items
            if (refs := obj["metadata"].get("ownerReferences"))
            and not any(
                _alive(cluster, ref, obj["metadata"].get("namespace") or "", live) for ref in refs
            )
            and not obj["metadata"].get("deletionTimestamp")
        ]
        if not garbage:
            return
        for resource_key, obj in garbage:
            meta = obj["metadata"]
            # Through the normal delete, so pods get their grace period as with the real GC.
            group, _, plural = resource_key.partition("/")
            cluster.delete(
                cluster.rtype(group, plural), meta.get("namespace"), meta["name"], reconcile=False
            )


def _collect_orphaned_pods(cluster: Cluster) -> None:
    """PodGC: a pod bound to a node that no longer exists is force-deleted.

    The real controller waits a 40 s quarantine first; here it is immediate.
    """
    nodes = {node["metadata"]["name"] for node in cluster.store.items("/nodes")}
    for pod in cluster.store.items("/pods"):
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name and node_name not in nodes:
            cluster.store.delete("/pods", pod["metadata"]["namespace"], pod["metadata"]["name"])


def _alive(
    cluster: Cluster, ref: dict[str, str], namespace: str, live: set[tuple[str, ...]]
) -> bool:
    group, kind = _group(ref.get("apiVersion", "")), str(ref.get("kind"))
    if cluster.registry.by_kind(ref.get("apiVersion", ""), kind) is None:
        return True  # not resolvable: the real collector leaves the dependent alone
    wanted = (str(ref.get("name")), str(ref.get("uid")))
    return (group, kind, namespace, *wanted) in live or (group, kind, "", *wanted) in live


def _group(api_version: str) -> str:
    """The API group of an apiVersion ("apps/v1" -> "apps", "v1" -> "")."""
    return api_version.rpartition("/")[0]
