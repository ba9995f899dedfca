"""The kubelet side of pods: readiness, container restarts, graceful termination.

The scheduler binds; these functions then do what the node's kubelet would: mark containers
ready (at once, after a delay on the event loop, or when a test says so), count a crash and
restart, and remove a deleted pod once its grace period is over.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
from typing import TYPE_CHECKING, Any

from tests.harness.fake_kube.store import Obj

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster


def _rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_grace_seconds(cluster: Cluster, pod: Obj, options: dict[str, Any]) -> int:
    """The grace period of this pod deletion; 0 means the pod goes at once."""
    if cluster.pod_termination_scale is None or not pod["spec"].get("nodeName"):
        return 0  # an unbound pod has no kubelet to wait for
    grace = options.get("gracePeriodSeconds")
    if grace is None:
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    existing = pod["metadata"].get("deletionGracePeriodSeconds")
    if existing is not None and grace >= existing:
        grace = existing  # a second delete may shorten the grace period, never extend it
    return max(int(grace), 0)


def start_termination(cluster: Cluster, pod: Obj, grace: int) -> Obj:
    meta = pod["metadata"]
    if meta.get("deletionGracePeriodSeconds") == grace:
        return pod  # already terminating with this grace period
    terminating = copy.deepcopy(pod)
    terminating["metadata"]["deletionTimestamp"] = _rfc3339(
        cluster.clock() + dt.timedelta(seconds=grace)
    )
    terminating["metadata"]["deletionGracePeriodSeconds"] = grace
    stored = cluster.store.write("/pods", terminating, change_type="MODIFIED")
    uid = meta["uid"]
    grace_s = grace * (cluster.pod_termination_scale or 0.0)

    def finish() -> None:
        current = cluster.store.get("/pods", meta["namespace"], meta["name"])
        if current is not None and current["metadata"]["uid"] == uid:
            cluster.store.delete("/pods", meta["namespace"], meta["name"])
            cluster.after_write()

    try:
        cluster.schedule_later(grace_s, finish)
    except RuntimeError:
        cluster.store.delete("/pods", meta["namespace"], meta["name"])  # no loop to wait on
    return stored


def finish_terminating(cluster: Cluster) -> None:
    """Test hook: every terminating pod's kubelet confirms now; the pods disappear."""
    for pod in cluster.store.items("/pods"):
        if pod["metadata"].get("deletionTimestamp"):
            cluster.store.delete("/pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
    cluster.after_write()


def on_pod_bound(cluster: Cluster, pod: Obj) -> None:
    """Start the pod's readiness clock after the scheduler bound it."""
    meta = pod["metadata"]
    if cluster.pod_ready_delay_s == 0:
        cluster.set_pod_ready(meta["namespace"], meta["name"], reconcile=False)
    elif cluster.pod_ready_delay_s is not None:
        uid = meta["uid"]

        def turn_ready() -> None:
            current = cluster.store.get("/pods", meta["namespace"], meta["name"])
            if current is not None and current["metadata"]["uid"] == uid:
                cluster.set_pod_ready(meta["namespace"], meta["name"])

        # Without a running event loop the pod stays unready until set_pod_ready().
        with contextlib.suppress(RuntimeError):
            cluster.schedule_later(cluster.pod_ready_delay_s, turn_ready)


def restart_container(cluster: Cluster, namespace: str, name: str) -> Obj:
    """Test hook: a container of this running pod crashed and the kubelet restarted it."""
    pods = cluster.rtype("", "pods")
    pod = cluster.get(pods, namespace, name)
    statuses = pod.get("status", {}).get("containerStatuses") or []
    if not statuses:
        raise ValueError(f"pod {namespace}/{name} has no running containers to restart")
    statuses[0]["restartCount"] = int(statuses[0].get("restartCount") or 0) + 1
    statuses[0]["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": cluster.now_text()}
    }
    result = cluster.write_internal(pods, pod)
    cluster.after_write()
    return result


def set_pod_ready(
    cluster: Cluster, namespace: str, name: str, *, ready: bool = True, reconcile: bool = True
) -> Obj:
    """Test hook: mark a bound pod's containers (un)ready, as the kubelet would."""
    pods = cluster.rtype("", "pods")
    pod = cluster.get(pods, namespace, name)
    if not pod["spec"].get("nodeName"):
        raise ValueError(f"pod {namespace}/{name} is not bound to a node; it cannot be ready")
    flag = "True" if ready else "False"
    now = cluster.now_text()
    conditions = []
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] in ("Ready", "ContainersReady") and condition["status"] != flag:
            condition = {"type": condition["type"], "status": flag, "lastTransitionTime": now}
            if not ready:
                condition["reason"] = "ContainersNotReady"
        conditions.append(condition)
    pod["status"]["conditions"] = conditions
    for container_status in pod["status"].get("containerStatuses") or []:
        container_status["ready"] = ready
    result = cluster.write_internal(pods, pod)
    if reconcile:
        cluster.after_write()
    return result
