"""Garbage collection: owner references (background propagation) and pods of lost nodes.

An object whose every owner (by uid) is gone is deleted, as kube-controller-manager's
garbage collector does; an object with at least one live owner stays. Foreground deletion
and `blockOwnerDeletion` are not distinguished: dependents go right after their owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster


def collect_garbage(cluster: Cluster) -> None:
    _collect_orphaned_pods(cluster)
    while True:
        live_uids = {obj["metadata"]["uid"] for _, obj in cluster.store.all_items()}
        garbage = [
            (resource_key, obj)
            for resource_key, obj in cluster.store.all_items()
            if (refs := obj["metadata"].get("ownerReferences"))
            and not any(ref.get("uid") in live_uids for ref in refs)
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
