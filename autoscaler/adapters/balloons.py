"""Balloon gangs (DESIGN section 7): whole-gang placeholders that real gangs preempt.

A balloon gang is one pause pod per gang member (its image the `balloon_image` setting, so a
cluster can pull a mirror) with exactly the member's resource requests, limits and placement
(node selector, tolerations, affinity, topology spread, RuntimeClass, scheduler), and its
template's image pull Secrets, at priority class `gang-autoscaler-balloon` (-5). Members of one
balloon gang share a label and a required pod affinity on the LWS's exclusive topology key,
so the capacity they hold is capacity one real gang can use. A balloon gang with a missing
member holds nothing a gang can use, so it is deleted whole and a new gang replaces it.

This module builds manifests and decides what to create and delete from the balloon pods
that exist (pure functions, tested on dicts); `BalloonWriter` carries the decisions out.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from autoscaler.adapters.kube_client import DEFAULT_REQUEST_TIMEOUT_S, TimedApi
from autoscaler.adapters.kube_errors import (
    API_CALL_ERRORS,
    BalloonShapeError,
    KubeApiError,
    NotLeader,
    describe,
    status_of,
)
from autoscaler.adapters.kube_objects import (
    BALLOON_FOR_LABEL,
    BALLOON_GANG_LABEL,
    BALLOON_MEMBER_LABEL,
    BALLOON_SHAPE_ANNOTATION,
    LWS_API_VERSION,
    LWS_KIND,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    PAUSE_IMAGE,
    Obj,
    annotations_of,
    int_label,
    is_terminating,
    labels,
    meta,
    parse_time_s,
    pod_is_bound,
    pod_is_finished,
)
from autoscaler.adapters.pod_names import parse_index
from autoscaler.core.partial_gangs import aged_from
from autoscaler.core.shape import (
    GangShape,
    PodShape,
    Resources,
    parse_tolerations,
    subtract_resources,
)

log = logging.getLogger(__name__)

PRIORITY_CLASS_NAME = "gang-autoscaler-balloon"
# Below every real workload (default 0) and above the cluster-autoscaler's expendable cutoff
# (-10), so a Pending balloon still makes the cluster grow.
PRIORITY_CLASS_VALUE = -5
# What Pod Security Admission's `restricted` level asks of every pod, so a namespace that
# enforces it admits balloons. No fixed uid: the pause image runs as 65535 by itself, and
# OpenShift's restricted SCC refuses a uid outside the namespace's range.
POD_SECURITY_CONTEXT = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
_MAX_LABEL_VALUE = 63


def balloon_pod_name(lws_name: str, gang_index: int, member: int) -> str:
    return f"{lws_name}-balloon-{gang_index}-{member}"


def balloon_name_clashes(lws_names: Iterable[str]) -> dict[str, str]:
    """For each LWS name of one namespace whose balloon pods would be named as another LWS's
    pods are, that other LWS (the first by name): `<lws>-balloon`'s workers and
    `<lws>-balloon-<n>`'s leaders are named `<lws>-balloon-<n>-<m>`, as the balloon pods of
    `<lws>` are. Whichever pod comes first takes the name, and the other is refused: a
    balloon could keep a real pod from being made. One pass over the names."""
    clashes: dict[str, str] = {}
    for other in sorted(lws_names):
        owner, sep, rest = other.rpartition("-balloon")
        if not sep or not owner:
            continue
        if rest and not (rest[0] == "-" and parse_index(rest[1:]) is not None):
            continue
        clashes.setdefault(owner, other)
    return clashes


def _quantity(resource: str, amount: int) -> str:
    # Base units back to quantities: CPU is held in millicores, everything else in units.
    return f"{amount}m" if resource == "cpu" else str(amount)


def _resources(amounts: Resources) -> dict[str, str]:
    return {name: _quantity(name, amount) for name, amount in sorted(amounts.items()) if amount}


def _member_spec(
    pod: PodShape,
    *,
    image: str,
    affinity_term: Mapping[str, Any] | None,
    anti_affinity_terms: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    requests, limits = pod.requests, pod.limits
    if pod.runtime_class_name and pod.overhead:
        # The RuntimeClass admission plugin adds the class's overhead to the balloon as it did
        # to the real pod (and refuses a template overhead that differs from it), so the
        # container asks for the rest.
        requests = subtract_resources(requests, pod.overhead)
        limits = {k: v - pod.overhead.get(k, 0) for k, v in limits.items()}
    resources: dict[str, Any] = {"requests": _resources(requests)}
    if limits:
        resources["limits"] = _resources(limits)
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "pause",
                "image": image,
                "resources": resources,
                "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
            }
        ],
        "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
        "priorityClassName": PRIORITY_CLASS_NAME,
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if pod.node_selector:
        spec["nodeSelector"] = dict(pod.node_selector)
    if pod.raw_tolerations:
        spec["tolerations"] = [dict(t) for t in pod.raw_tolerations]
    affinity = copy.deepcopy(dict(pod.affinity)) if pod.affinity else {}
    if affinity_term is not None:
        pod_affinity = affinity.setdefault("podAffinity", {})
        terms = pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
        terms.append(dict(affinity_term))
    if anti_affinity_terms:
        pod_anti = affinity.setdefault("podAntiAffinity", {})
        terms = pod_anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
        terms.extend(copy.deepcopy(dict(t)) for t in anti_affinity_terms)
    if affinity:
        spec["affinity"] = affinity
    # Only when the template sets them, so that balloons of a template without them keep
    # their digest (and are not all replaced by an upgrade).
    if pod.topology_spread_constraints:
        # Their selectors match the real pods, not balloons: a balloon goes where the
        # spread lets the next real pod go.
        spec["topologySpreadConstraints"] = copy.deepcopy(list(pod.topology_spread_constraints))
    if pod.runtime_class_name:
        spec["runtimeClassName"] = pod.runtime_class_name
    if pod.scheduler_name:
        # Placeholders hold capacity only in the view of the scheduler the real pods use.
        spec["schedulerName"] = pod.scheduler_name
    if pod.image_pull_secrets:
        spec["imagePullSecrets"] = [dict(s) for s in pod.image_pull_secrets]
    return spec


def shape_digest(shape: GangShape, *, image: str) -> str:
    """A short digest of everything a balloon pod is built from: the LWS templates (resources
    and placement) and the balloon image. When either changes, balloons built from the old
    one are replaced."""
    parts: list[Any] = [
        _member_spec(shape.leader, image=image, affinity_term=None),
        _member_spec(shape.worker, image=image, affinity_term=None),
        shape.pods_per_gang,
        shape.topology_key,
    ]
    claims = sorted({c for pod in shape.pods for c in pod.resource_claims})
    if claims:  # only then, so other templates keep their digest: balloons made before
        parts.append(claims)  # DRA templates were refused are outdated, and go
    if shape.topology_key:  # balloon gangs made before they kept out of each other's domain
        parts.append("one-balloon-gang-per-domain")

    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def balloon_gang_manifests(
    lws: Obj, *, shape: GangShape, gang_index: int, image: str
) -> tuple[dict[str, Any], ...]:
    """The pod manifests of balloon gang `gang_index` for this LWS, member 0 (leader) first."""
    lws_name = str(meta(lws).get("name", ""))
    uid = meta(lws).get("uid")
    if len(lws_name) > _MAX_LABEL_VALUE:
        raise BalloonShapeError(
            f"LWS name {lws_name!r} is longer than {_MAX_LABEL_VALUE} characters and cannot "
            f"be a label value of {BALLOON_FOR_LABEL}"
        )
    if not uid:
        raise BalloonShapeError(f"LWS {lws_name!r} has no uid; cannot own balloon pods")
    claims = sorted({c for pod in shape.pods for c in pod.resource_claims})
    if claims:
        raise BalloonShapeError(
            f"LWS {lws_name!r} claims its devices through Dynamic Resource Allocation "
            f"(resourceClaims {claims}); a balloon pod cannot hold claimed devices for it, so "
            "none is made (set gang-autoscaler.io/min-buffer and max-buffer to 0)"
        )
    gang_labels = {BALLOON_FOR_LABEL: lws_name, BALLOON_GANG_LABEL: str(gang_index)}
    term = (
        {"labelSelector": {"matchLabels": dict(gang_labels)}, "topologyKey": shape.topology_key}
        if shape.topology_key
        else None
    )
    # An exclusive gang needs a domain of its own, and LWS keeps every other group of the
    # namespace out of it (a prefill gang out of a decode gang's): two balloon gangs of the
    # namespace in one domain hold room for one real gang only. Two terms, both required:
    # the other balloon gangs of this LWS, and every balloon of another LWS. Only balloons are
    # selected, never real pods: an anti-affinity to real pods would keep them out of the
    # domain of a balloon member on a node the scheduler does not preempt on.
    others = (
        [
            {
                "labelSelector": {
                    "matchExpressions": [
                        {"key": BALLOON_FOR_LABEL, "operator": "In", "values": [lws_name]},
                        {
                            "key": BALLOON_GANG_LABEL,
                            "operator": "NotIn",
                            "values": [str(gang_index)],
                        },
                    ]
                },
                "topologyKey": shape.topology_key,
            },
            {
                "labelSelector": {
                    "matchExpressions": [
                        {"key": BALLOON_FOR_LABEL, "operator": "Exists"},
                        {"key": BALLOON_FOR_LABEL, "operator": "NotIn", "values": [lws_name]},
                    ]
                },
                "topologyKey": shape.topology_key,
            },
        ]
        if shape.topology_key
        else []
    )
    digest = shape_digest(shape, image=image)
    pods = []
    for member, pod_shape in enumerate(shape.pods):
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": balloon_pod_name(lws_name, gang_index, member),
                    "namespace": meta(lws).get("namespace"),
                    "labels": {
                        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
                        **gang_labels,
                        BALLOON_MEMBER_LABEL: str(member),
                    },
                    "annotations": {BALLOON_SHAPE_ANNOTATION: digest},
                    "ownerReferences": [
                        {
                            "apiVersion": LWS_API_VERSION,
                            "kind": LWS_KIND,
                            "name": lws_name,
                            "uid": uid,
                            "blockOwnerDeletion": False,
                            "controller": False,
                        }
                    ],
                },
                "spec": _member_spec(
                    pod_shape, image=image, affinity_term=term, anti_affinity_terms=others
                ),
            }
        )
    return tuple(pods)


@dataclass(frozen=True, slots=True)
class BalloonPlan:
    """What to do with one LWS's balloon gangs this pass."""

    delete_pods: tuple[str, ...]  # pod names, whole gangs only
    create_gangs: tuple[int, ...]  # gang indexes to create whole (no pod of them exists)
    broken_gangs: tuple[int, ...]  # gangs deleted for a missing, preempted or stale member
    held_gangs: int  # complete, current-shape balloon gangs kept (at most the desired count)
    # (gang, when this process first saw it split) of every gang split now, for the next pass
    split_seen: tuple[tuple[int, float], ...] = ()

    @property
    def changes(self) -> bool:
        return bool(self.delete_pods or self.create_gangs)


def balloon_pods_of(pods: Iterable[Obj], *, lws_name: str) -> list[Obj]:
    return [
        p
        for p in pods
        if labels(p).get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE
        and labels(p).get(BALLOON_FOR_LABEL) == lws_name
    ]


def balloons_by_lws(pods: Iterable[Obj]) -> dict[tuple[str, str], list[Obj]]:
    """Balloon pods by (namespace, the LWS they hold capacity for), in one pass: the actuator
    looks them up per component, and filtering the whole list for each was quadratic."""
    grouped: dict[tuple[str, str], list[Obj]] = {}
    for pod in pods:
        lws_name = labels(pod).get(BALLOON_FOR_LABEL)
        if lws_name and labels(pod).get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE:
            grouped.setdefault((str(meta(pod).get("namespace", "")), lws_name), []).append(pod)
    return grouped


def _is_whole(
    members: list[Obj], *, pods_per_gang: int, digest: str, stranded: Collection[str] = ()
) -> bool:
    """Every member present once, alive, built from the LWS's current shape, and none on a
    node that no longer takes pods (`stranded`, see `stranded_balloons`)."""
    indexes = [int_label(p, BALLOON_MEMBER_LABEL) for p in members]
    return (
        None not in indexes
        and sorted(i for i in indexes if i is not None) == list(range(pods_per_gang))
        and not any(is_terminating(p) or pod_is_finished(p) for p in members)
        and all(annotations_of(p).get(BALLOON_SHAPE_ANNOTATION) == digest for p in members)
        and not any(str(meta(p).get("name")) in stranded for p in members)
    )


# The taints the node lifecycle controller sets from a node's conditions.
NODE_LIFECYCLE = "node.kubernetes.io/"


def stranded_balloons(pods: Iterable[Obj], nodes: Mapping[str, Obj]) -> frozenset[str]:
    """Names of balloon pods bound to a node that no longer takes new pods, for good: cordoned
    (a drain), or tainted since with a NoSchedule or NoExecute taint the pod does not
    tolerate (a cluster-autoscaler or Karpenter drain, a GPU health check). A real pod could
    not be placed there by preempting them, so their gang holds nothing: it is replaced
    elsewhere. Judged by the pod's own tolerations, which admission completed, so a node it
    was placed on is never judged against it. The node lifecycle's own taints
    (`node.kubernetes.io/...`: not ready, unreachable, memory or disk pressure) come and go
    with a node's condition and do not count: replacing a gang on each would order nodes for
    nothing."""
    stranded: set[str] = set()
    for pod in pods:
        node = nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
        if node is None:
            continue  # Pending, or a node gone (its pods go with it)
        spec = node.get("spec") or {}
        name = str(meta(pod).get("name"))
        if spec.get("unschedulable"):
            stranded.add(name)
            continue
        try:
            tolerations = parse_tolerations((pod.get("spec") or {}).get("tolerations") or ())
            taints = [
                (str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
                for t in spec.get("taints") or ()
            ]
        except (TypeError, AttributeError):
            continue
        for key, value, effect in taints:
            if effect not in ("NoSchedule", "NoExecute") or key.startswith(NODE_LIFECYCLE):
                continue
            if not any(t.tolerates(key, value, effect) for t in tolerations):
                stranded.add(name)
                break
    return frozenset(stranded)


def _by_gang(pods: Iterable[Obj], *, lws_name: str) -> tuple[dict[int, list[Obj]], list[str]]:
    gangs: dict[int, list[Obj]] = {}
    stray: list[str] = []
    for pod in balloon_pods_of(pods, lws_name=lws_name):
        gang = int_label(pod, BALLOON_GANG_LABEL)
        if gang is None:
            stray.append(str(meta(pod).get("name")))
        else:
            gangs.setdefault(gang, []).append(pod)
    return gangs, stray


def whole_balloon_gangs(
    pods: Iterable[Obj],
    *,
    lws_name: str,
    pods_per_gang: int,
    digest: str,
    stranded: Collection[str] = (),
) -> int:
    """How many complete, current-shape balloon gangs exist for this LWS."""
    gangs, _ = _by_gang(pods, lws_name=lws_name)
    return sum(
        1
        for members in gangs.values()
        if _is_whole(members, pods_per_gang=pods_per_gang, digest=digest, stranded=stranded)
    )


def _placed(members: list[Obj]) -> bool:
    return all(pod_is_bound(p) for p in members)


def _scheduled_at_s(pod: Obj) -> float | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return parse_time_s(condition.get("lastTransitionTime"))
    return None


def _is_split(members: list[Obj]) -> bool:
    """Some members placed and others Pending: a placed member pins the rest to its domain
    by the gang's pod affinity, and where that domain is full they wait there for good,
    holding a node no gang can use."""
    bound = sum(1 for p in members if pod_is_bound(p))
    return 0 < bound < len(members)


def _split_since_s(members: list[Obj]) -> float | None:
    """When a split gang's first member was bound, by its pods (None when no time is known).
    Time spent wholly Pending (waiting for nodes) does not count."""
    times = [t for t in (_scheduled_at_s(p) for p in members if pod_is_bound(p)) if t is not None]
    return min(times) if times else None


def plan_balloons(
    pods: Iterable[Obj],
    *,
    lws_name: str,
    desired_gangs: int,
    pods_per_gang: int,
    digest: str,
    now_s: float | None = None,
    split_timeout_s: float | None = None,
    split_seen: Mapping[int, float] | None = None,
    stranded: Collection[str] = (),
) -> BalloonPlan:
    """Decide deletions and creations so that `desired_gangs` whole, current gangs exist.

    The whole gangs kept are those already placed (every member bound to a node) first, then
    the lowest-numbered: a placed gang holds capacity now, a Pending one only asks for it, so
    a smaller buffer gives up Pending gangs first and a broken gang is replaced without
    giving up a placed one. A gang with a missing, terminating, finished, duplicated or
    stale-shape member is deleted whole. New gangs take the lowest numbers no pod holds (a
    gang whose pods are still terminating keeps its number until they are gone). With
    `now_s` and `split_timeout_s`, a gang split between placed and Pending members for longer
    than the timeout counts as broken too, and is replaced. Its split is timed from the later
    of its first member's binding (on the API server's clock) and when this process first
    saw it split (`split_seen`, returned in the plan for the next pass; on this clock), so a
    clock running ahead of the API server's never replaces a gang whose worker is about to be
    bound.
    """
    gangs, stray = _by_gang(pods, lws_name=lws_name)
    seen = split_seen or {}
    remembered: list[tuple[int, float]] = []
    if now_s is not None:
        for gang, members in sorted(gangs.items()):
            if _is_split(members):
                remembered.append((gang, seen.get(gang, now_s)))
    first_seen = dict(remembered)

    def split_too_long(gang: int, members: list[Obj]) -> bool:
        if now_s is None or split_timeout_s is None or gang not in first_seen:
            return False
        return now_s - aged_from(_split_since_s(members), first_seen[gang]) > split_timeout_s

    whole = [
        g
        for g, members in gangs.items()
        if _is_whole(members, pods_per_gang=pods_per_gang, digest=digest, stranded=stranded)
        and not split_too_long(g, members)
    ]
    keep = set(sorted(whole, key=lambda g: (not _placed(gangs[g]), g))[: max(desired_gangs, 0)])
    delete: list[str] = list(stray)
    broken: list[int] = []
    for gang, members in sorted(gangs.items()):
        if gang in keep:
            continue
        live = [p for p in members if not is_terminating(p)]
        if gang not in whole and live:
            broken.append(gang)
        delete.extend(str(meta(p).get("name")) for p in live)
    free = (g for g in itertools.count() if g not in gangs)
    create = tuple(next(free) for _ in range(max(desired_gangs, 0) - len(keep)))
    return BalloonPlan(
        delete_pods=tuple(sorted(delete)),
        create_gangs=create,
        broken_gangs=tuple(broken),
        held_gangs=len(keep),
        split_seen=tuple(remembered),
    )


def priority_class_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": PRIORITY_CLASS_NAME,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
        },
        "value": PRIORITY_CLASS_VALUE,
        "globalDefault": False,
        # A placeholder must never evict anything; it only waits to be evicted.
        "preemptionPolicy": "Never",
        "description": "Balloon gangs of gang-autoscaler: placeholders that real gangs preempt.",
    }


def _api_error(what: str, err: Exception) -> KubeApiError:
    return KubeApiError(f"{what}: {describe(err)}", status=status_of(err))


class PriorityClassMismatch(KubeApiError):
    """The balloon PriorityClass exists with another value: balloons made with it would not
    be preempted as designed (or would preempt real pods), so none are made."""


async def ensure_priority_class(
    api_client: client.ApiClient, *, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
) -> str:
    """Create the balloon PriorityClass if missing; return a one-line status for the log.

    Raises PriorityClassMismatch when the class exists with another value (values are
    immutable, so a human must fix it), KubeApiError when it cannot be read or created (RBAC).
    """
    api: Any = TimedApi(client.SchedulingV1Api(api_client), timeout_s=request_timeout_s)
    try:
        existing = await api.read_priority_class(PRIORITY_CLASS_NAME)
    except API_CALL_ERRORS as err:
        if status_of(err) != 404:
            raise _api_error(f"reading PriorityClass {PRIORITY_CLASS_NAME}", err) from err
    else:
        if existing.value != PRIORITY_CLASS_VALUE:
            raise PriorityClassMismatch(
                f"PriorityClass {PRIORITY_CLASS_NAME} has value {existing.value}, expected "
                f"{PRIORITY_CLASS_VALUE}; balloons would not be preempted as designed. Delete it "
                "and let the autoscaler (or the Helm chart) recreate it."
            )
        return f"PriorityClass {PRIORITY_CLASS_NAME} exists with value {existing.value}"
    try:
        await api.create_priority_class(priority_class_manifest())
    except API_CALL_ERRORS as err:
        if status_of(err) == 409:  # created meanwhile by the other replica or the chart
            return f"PriorityClass {PRIORITY_CLASS_NAME} exists"
        raise _api_error(
            f"creating PriorityClass {PRIORITY_CLASS_NAME} (install it with the Helm chart or "
            "grant create on priorityclasses.scheduling.k8s.io)",
            err,
        ) from err
    return f"PriorityClass {PRIORITY_CLASS_NAME} created with value {PRIORITY_CLASS_VALUE}"


@dataclass(frozen=True, slots=True)
class BalloonResult:
    deleted_pods: tuple[str, ...]
    created_gangs: tuple[int, ...]
    broken_gangs: tuple[int, ...]
    failed: tuple[str, ...]  # one line per failed gang or pod


def merged_results(first: BalloonResult, then: BalloonResult) -> BalloonResult:
    """One pass's result carried out in two parts (the deletions, then the creations)."""
    return BalloonResult(
        first.deleted_pods + then.deleted_pods,
        first.created_gangs + then.created_gangs,
        first.broken_gangs,
        first.failed + then.failed,
    )


CREATE_RETRY_S = 15.0
MAX_CREATE_RETRY_S = 300.0


class BalloonWriter:
    """Carries out a `BalloonPlan` through the API, one whole gang at a time."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        image: str = PAUSE_IMAGE,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        may_write: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core: Any = TimedApi(client.CoreV1Api(api_client), timeout_s=request_timeout_s)
        self.image = image
        self._clock = clock
        # (namespace, LWS) -> (retry at, delay, the failure): after a gang could not be
        # created, none is tried for that LWS until the delay has passed, doubling from
        # CREATE_RETRY_S to MAX_CREATE_RETRY_S. A quota that admits part of a gang made every
        # tick create a member, fail the next and delete the first again.
        self._create_backoff: dict[tuple[str, str], tuple[float, float, str]] = {}
        # Asked before every pod created: a pass of many gangs outlasts the Lease check
        # made before it.
        self._may_write = may_write
        # Why no balloon gang may be created now (the PriorityClass has another value), or
        # None. Deletions go on: giving capacity back is always safe.
        self.refused: str | None = None

    def forget(self, namespace: str, lws_name: str) -> None:
        """Drop an LWS's create backoff: nothing is asked of it now, so its next failure,
        perhaps a day later, starts again short."""
        self._create_backoff.pop((namespace, lws_name), None)

    def forget_except(self, lws: Collection[tuple[str, str]]) -> None:
        """Drop the create backoff of every LWS but these (namespace, name): one deleted and
        created again starts afresh."""
        for key in self._create_backoff.keys() - set(lws):
            del self._create_backoff[key]

    async def _delete(self, namespace: str, pod_name: str, *, uid: str | None = None) -> str | None:
        """Delete a balloon pod; with `uid`, only that pod, not one created since under its
        name (by the next leader, after a lost Lease)."""
        options = None if uid is None else client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid)
        )  # fmt: skip
        try:
            await self._core.delete_namespaced_pod(
                pod_name,
                namespace,
                grace_period_seconds=0,
                propagation_policy="Background",
                body=options,
            )
        except API_CALL_ERRORS as err:
            # gone, or (409) already another pod of that name: either way, not ours to delete
            if status_of(err) == 404 or (uid is not None and status_of(err) == 409):
                return None
            return f"delete {namespace}/{pod_name}: {describe(err)}"
        return None

    async def _take_back(self, namespace: str, pods: Iterable[tuple[str, str | None]]) -> None:
        """Delete the members of a gang this pass made, all at once; a uid of None deletes
        by name (a member whose creation got no answer may exist). A delete that fails is
        logged: the start-up repair, or the next pass, finds the half gang."""
        problems = await asyncio.gather(
            *(self._delete(namespace, name, uid=uid) for name, uid in pods)
        )
        for problem in filter(None, problems):
            log.warning("taking back a balloon gang member failed: %s", problem)

    async def _create_gang(self, namespace: str, manifests: Iterable[dict[str, Any]]) -> str | None:
        """Create every member of one balloon gang at once, or none: a member that fails
        takes back the others. One after another, a gang of 8 at a second a create outlasted
        the tick's deadline, which cut it off before its clean-up: the next pass deleted the
        half gang and started another, cut off again, and no whole gang ever existed."""
        manifests = list(manifests)
        if not self._may_write():
            raise NotLeader("the leader Lease was lost before creating balloon pods")

        async def create(manifest: dict[str, Any]) -> tuple[str | None, Exception | None]:
            try:
                pod = await self._core.create_namespaced_pod(namespace, manifest)
            except API_CALL_ERRORS as err:
                return None, err
            return getattr(getattr(pod, "metadata", None), "uid", None), None

        def made(outcomes: Iterable[tuple[str, object]]) -> list[tuple[str, str | None]]:
            """The members that exist or may: created (by uid), or with no answer, cut off,
            or failed in a way that says nothing (by name)."""
            out = []
            for name, outcome in outcomes:
                if isinstance(outcome, tuple):
                    uid, err = outcome
                    if err is None:
                        out.append((name, uid))
                    elif status_of(err) is None:
                        out.append((name, None))
                else:  # an exception, or cut off before its outcome
                    out.append((name, None))
            return out

        names = [str(m["metadata"]["name"]) for m in manifests]
        tasks = [asyncio.ensure_future(create(m)) for m in manifests]
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            # Cut off (the tick's deadline): no half gang left behind.
            cut: list[tuple[str, object]] = [
                (
                    name,
                    "cut off"
                    if not task.done() or task.cancelled()
                    else (task.exception() or task.result()),
                )
                for name, task in zip(names, tasks, strict=True)
            ]
            await asyncio.shield(self._take_back(namespace, made(cut)))
            raise
        outcomes: list[tuple[str, object]] = list(zip(names, results, strict=True))
        unexpected = [r for r in results if isinstance(r, BaseException)]
        if unexpected:  # not an API error: every member may exist, and the error is a bug
            await self._take_back(namespace, made(outcomes))
            raise unexpected[0]
        failed = [(name, r[1]) for name, r in outcomes if isinstance(r, tuple) and r[1] is not None]
        if not failed and not self._may_write():
            # Lost while the members were being made: an instance that no longer leads
            # leaves nothing behind (deleting gives capacity back, always safe).
            await self._take_back(namespace, made(outcomes))
            raise NotLeader("the leader Lease was lost while creating balloon pods")
        if not failed:
            return None
        await self._take_back(namespace, made(outcomes))
        name, err = failed[0]
        assert err is not None
        return f"create {namespace}/{name}: {describe(err)}"

    async def carry_out(
        self, lws: Obj, *, shape: GangShape, plan: BalloonPlan, dry_run: bool
    ) -> BalloonResult:
        namespace = str(meta(lws).get("namespace"))
        failed: list[str] = []
        if dry_run:
            return BalloonResult((), (), plan.broken_gangs, ())
        # all at once: on a scale-up these go before the `/scale` write (a quota counts
        # them), and one round trip after another held it back by a round trip per pod
        problems = await asyncio.gather(*(self._delete(namespace, p) for p in plan.delete_pods))
        failed.extend(p for p in problems if p)
        created: list[int] = []
        key = (namespace, str(meta(lws).get("name")))
        now = self._clock()
        retry_at, delay_s, last_failure = self._create_backoff.get(key, (now, 0.0, ""))
        if self.refused is not None and plan.create_gangs:
            failed.append(f"no balloon gang created: {self.refused}")
        elif plan.create_gangs and now < retry_at:
            failed.append(
                f"no balloon gang created: the last attempt failed ({last_failure}); "
                f"trying again {delay_s:g}s after it"
            )
        may_create = self.refused is None and now >= retry_at
        for gang in plan.create_gangs if may_create else ():
            try:
                manifests = balloon_gang_manifests(
                    lws, shape=shape, gang_index=gang, image=self.image
                )
            except BalloonShapeError as err:
                failed.append(str(err))
                break
            problem = await self._create_gang(namespace, manifests)
            if problem:
                failed.append(problem)
                delay_s = min(max(2 * delay_s, CREATE_RETRY_S), MAX_CREATE_RETRY_S)
                self._create_backoff[key] = (self._clock() + delay_s, delay_s, problem)
                break  # the next gangs would meet what this one met
            created.append(gang)
            self._create_backoff.pop(key, None)
        if failed:
            log.warning("balloon writes failed for %s: %s", meta(lws).get("name"), failed)
        return BalloonResult(plan.delete_pods, tuple(created), plan.broken_gangs, tuple(failed))
