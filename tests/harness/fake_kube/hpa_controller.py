"""A HorizontalPodAutoscaler that only enforces its bounds, as a real one does without metrics.

The fake has no metrics pipeline, so an HPA here never scales on load. What it does do, like
kube-controller-manager's HPA controller when its metrics are unavailable, is hold the
target's `/scale` within `minReplicas..maxReplicas` (and leave a target scaled to zero
alone), so a test sees another writer fighting over an LWS's replicas exactly as on a
cluster where someone left an HPA behind.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from tests.harness.fake_kube.errors import ApiError
from tests.harness.fake_kube.event_recorder import record_event
from tests.harness.fake_kube.store import Obj

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster

HPA_KEY = "autoscaling/horizontalpodautoscalers"


def reconcile_hpas(cluster: Cluster) -> None:
    for hpa in cluster.store.items(HPA_KEY):
        _reconcile_one(cluster, hpa)


def _reconcile_one(cluster: Cluster, hpa: Obj) -> None:
    namespace = hpa["metadata"]["namespace"]
    ref = hpa["spec"].get("scaleTargetRef") or {}
    rtype = cluster.registry.by_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
    if rtype is None or rtype.scale is None:
        return
    try:
        scale = cluster.get_scale(rtype, namespace, ref.get("name", ""))
    except ApiError:
        return  # the target does not exist (yet)
    current = int(scale["spec"]["replicas"])
    low = int(hpa["spec"].get("minReplicas") or 1)
    high = int(hpa["spec"]["maxReplicas"])
    desired = min(max(current, low), high) if current > 0 else 0
    if desired != current:
        reason = (
            "Current number of replicas above Spec.MaxReplicas"
            if current > high
            else "Current number of replicas below Spec.MinReplicas"
        )
        scale["spec"]["replicas"] = desired
        cluster.replace_scale(rtype, namespace, ref["name"], scale)
        record_event(
            cluster,
            regarding=hpa,
            kind="HorizontalPodAutoscaler",
            api_version="autoscaling/v2",
            reason="SuccessfulRescale",
            message=f"New size: {desired}; reason: {reason}",
            type_="Normal",
            component="horizontal-pod-autoscaler",
        )
    limited = current != desired or desired in (low, high)
    status = {
        **(hpa.get("status") or {}),
        "currentReplicas": int(scale["status"].get("replicas") or 0),
        "desiredReplicas": desired,
        "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "SucceededRescale"},
            {
                "type": "ScalingActive",
                "status": "False",
                "reason": "FailedGetResourceMetric" if current > 0 else "ScalingDisabled",
                "message": "the fake API server serves no metrics"
                if current > 0
                else "scaling is disabled since the replica count of the target is zero",
            },
            {
                "type": "ScalingLimited",
                "status": "True" if limited else "False",
                "reason": "TooManyReplicas"
                if current > high
                else (
                    "TooFewReplicas" if current < low or desired == low else "DesiredWithinRange"
                ),
            },
        ],
    }
    if desired != current:
        status["lastScaleTime"] = cluster.now_text()
    if status != hpa.get("status"):
        updated = copy.deepcopy(hpa)
        updated["status"] = status
        cluster.write_internal(cluster.rtype("autoscaling", "horizontalpodautoscalers"), updated)
