"""Names and small readers for the Kubernetes objects the adapter handles as plain dicts.

The adapter keeps API objects as the JSON dicts the server sends (camelCase keys), not as
client model classes: the pure parts (gang state, capacity, balloons) are then tested on
dicts cut from real manifests, and the watch caches skip a costly model conversion.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_VERSION = "v1"
LWS_API_VERSION = f"{LWS_GROUP}/{LWS_VERSION}"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# Set by LWS on every pod of a group; its exclusive placement keys on it.
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"

# LWS v0.9+'s prefill/decode API: a DisaggregatedSet makes one LWS per role; a role with
# `scaling.mode: External` is scaled through its DisaggregatedSetRoleScaler `<set>-<role>`.
DS_GROUP = "disaggregatedset.x-k8s.io"
DS_VERSION = "v1"
DS_KIND = "DisaggregatedSet"
ROLE_SCALER_KIND = "DisaggregatedSetRoleScaler"
ROLE_SCALER_PLURAL = "disaggregatedsetrolescalers"
DS_NAME_LABEL = "disaggregatedset.x-k8s.io/name"
DS_ROLE_LABEL = "disaggregatedset.x-k8s.io/role"

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "gang-autoscaler"
BALLOON_FOR_LABEL = "gang-autoscaler.io/balloon-for"
BALLOON_GANG_LABEL = "gang-autoscaler.io/balloon-gang"
BALLOON_MEMBER_LABEL = "gang-autoscaler.io/balloon-member"
BALLOON_SHAPE_ANNOTATION = "gang-autoscaler.io/balloon-shape"
# The balloon pods' container by default (`balloon_image` setting). Kept here, not in
# balloons.py, so the settings can name it without importing the Kubernetes client.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ScaleTarget:
    """The object whose `/scale` sets a component's gang count: the LWS itself, or the
    DisaggregatedSetRoleScaler of the DisaggregatedSet role the LWS belongs to."""

    group: str
    version: str
    plural: str
    kind: str
    name: str

    @classmethod
    def lws(cls, name: str) -> ScaleTarget:
        return cls(LWS_GROUP, LWS_VERSION, LWS_PLURAL, LWS_KIND, name)

    @classmethod
    def role_scaler(cls, name: str) -> ScaleTarget:
        return cls(DS_GROUP, DS_VERSION, ROLE_SCALER_PLURAL, ROLE_SCALER_KIND, name)

    def is_target_of(self, scale_target_ref: Mapping[str, Any]) -> bool:
        """Whether an autoscaler's `scaleTargetRef` (HPA, KEDA ScaledObject) names this
        object: kind, name and API group (any version)."""
        group = str(scale_target_ref.get("apiVersion", "")).split("/")[0]
        return (scale_target_ref.get("kind"), scale_target_ref.get("name"), group) == (
            self.kind,
            self.name,
            self.group,
        )

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def labels(obj: Obj) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def annotations_of(obj: Obj) -> Mapping[str, str]:
    return meta(obj).get("annotations") or {}


def name(obj: Obj) -> str:
    return str(meta(obj).get("name", ""))


def namespace(obj: Obj) -> str:
    return str(meta(obj).get("namespace", ""))


def is_terminating(obj: Obj) -> bool:
    return meta(obj).get("deletionTimestamp") is not None


def parse_time_s(text: str | None) -> float | None:
    """An RFC 3339 timestamp as epoch seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def int_label(obj: Obj, key: str) -> int | None:
    """A label holding a non-negative integer (group or worker index); None if absent or bad."""
    raw = labels(obj).get(key)
    if raw is None or not str(raw).isdigit():
        return None
    return int(raw)


def condition_true(pod: Obj, kind: str) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status")) == "True"
    return False


def pod_is_finished(pod: Obj) -> bool:
    """Succeeded and Failed pods hold no resources and serve nothing."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_is_bound(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))
