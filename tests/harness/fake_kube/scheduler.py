"""A minimal kube-scheduler: filter, pick a node, bind; preempt lower-priority pods when needed.

Filters, as the default plugins do: node unschedulable, taints with effect NoSchedule or
NoExecute against tolerations, `nodeSelector`, required node affinity (In, NotIn, Exists,
DoesNotExist, Gt, Lt), required inter-pod affinity and anti-affinity on a topology key
(including existing pods' anti-affinity against the incoming pod), and resources (every
resource in `status.allocatable`, pod count included; requests default to limits at
admission). Scoring is LeastAllocated, ties broken by node name. Pods are tried
highest priority first, then oldest first, one at a time: like the real scheduler there is no
gang scheduling, so a gang can end up partially placed.

Preemption follows the default PostFilter: on each node that passes every filter but
resources, remove all lower-priority pods, then reprieve them from the highest priority down
while the preemptor still fits; pick the node whose victims have the lowest highest priority,
then the lowest priority sum, then the fewest victims; delete the victims and bind.
Topology spread constraints with `whenUnsatisfiable: DoNotSchedule` are a filter too.
Not emulated: preferred (soft) terms, ScheduleAnyway spreading, PodDisruptionBudgets,
nominated-node reservations, volumes and ports.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from tests.harness.fake_kube.event_recorder import record_event
from tests.harness.fake_kube.quantity import parse_quantity
from tests.harness.fake_kube.selectors import label_selector_object_matches

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster

Obj = dict[str, Any]
_TERMINAL_PHASES = ("Succeeded", "Failed")
_DEFAULT_MAX_PODS = 110
_PRIORITY_OFFSET = 2**31  # makes every priority positive when summing, as the scheduler does


_REQUESTS_CACHE: dict[tuple[str, str], dict[str, Decimal]] = {}


def pod_requests(pod: Obj) -> dict[str, Decimal]:
    """Effective requests: the sum over containers, or the largest init container if larger.

    Cached per (uid, resourceVersion); callers must not change the returned mapping.
    """
    meta = pod.get("metadata") or {}
    key = (str(meta.get("uid")), str(meta.get("resourceVersion")))
    cached = _REQUESTS_CACHE.get(key)
    if cached is None:
        if len(_REQUESTS_CACHE) > 50_000:
            _REQUESTS_CACHE.clear()
        cached = _REQUESTS_CACHE[key] = _compute_requests(pod)
    return cached


def _compute_requests(pod: Obj) -> dict[str, Decimal]:
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for resource, amount in ((container.get("resources") or {}).get("requests") or {}).items():
            total[resource] = total.get(resource, Decimal(0)) + parse_quantity(amount)
    for container in spec.get("initContainers") or []:
        for resource, amount in ((container.get("resources") or {}).get("requests") or {}).items():
            total[resource] = max(total.get(resource, Decimal(0)), parse_quantity(amount))
    for resource, amount in (spec.get("overhead") or {}).items():
        total[resource] = total.get(resource, Decimal(0)) + parse_quantity(amount)
    total["pods"] = Decimal(1)
    return total


def pod_priority(pod: Obj) -> int:
    return int((pod.get("spec") or {}).get("priority") or 0)


def _is_active(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in _TERMINAL_PHASES


@dataclass
class NodeState:
    node: Obj
    pods: list[Obj] = field(default_factory=list)
    _free: dict[str, Decimal] | None = None

    @property
    def name(self) -> str:
        return str(self.node["metadata"]["name"])

    @property
    def labels(self) -> dict[str, str]:
        return self.node["metadata"].get("labels") or {}

    def allocatable(self) -> dict[str, Decimal]:
        raw = (self.node.get("status") or {}).get("allocatable") or {}
        values = {resource: parse_quantity(amount) for resource, amount in raw.items()}
        values.setdefault("pods", Decimal(_DEFAULT_MAX_PODS))
        return values

    def free(self, *, without: Iterable[Obj] = ()) -> dict[str, Decimal]:
        excluded = {id(p) for p in without}
        if not excluded and self._free is not None:
            return self._free
        free = self.allocatable()
        for pod in self.pods:
            if id(pod) in excluded:
                continue
            for resource, amount in pod_requests(pod).items():
                free[resource] = free.get(resource, Decimal(0)) - amount
        if not excluded:
            self._free = free
        return free

    def add(self, pod: Obj) -> None:
        self.pods.append(pod)
        self._free = None


def _insufficient(requests: dict[str, Decimal], free: dict[str, Decimal]) -> list[str]:
    return sorted(r for r, amount in requests.items() if amount > 0 and amount > free.get(r, 0))


def _tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
            tolerations, taint
        ):
            return taint  # type: ignore[no-any-return]
    return None


def _expression_matches(expression: Obj, labels: dict[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels:
        try:
            actual, bound = int(labels[key]), int(values[0])
        except (ValueError, IndexError):
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def _node_affinity_matches(pod: Obj, node: Obj) -> bool:
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(
        all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
        and all(_expression_matches(e, fields) for e in term.get("matchFields") or [])
        for term in terms
    )


def _required_terms(pod: Obj, kind: str) -> list[Obj]:
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    return list(
        (affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []
    )


def _term_selects(
    term: Obj, owner: Obj, candidate: Obj, namespace_labels: dict[str, dict[str, str]]
) -> bool:
    """Does `term` (declared by `owner`) select `candidate` by namespace and labels?

    The namespaces are the union of `namespaces` and those `namespaceSelector` selects; with
    neither, the owner's own namespace.
    """
    candidate_ns = candidate["metadata"].get("namespace", "")
    listed = term.get("namespaces") or []
    selector = term.get("namespaceSelector")
    if not listed and selector is None:
        in_scope = candidate_ns == owner["metadata"].get("namespace")
    else:
        in_scope = candidate_ns in listed or (
            selector is not None
            and label_selector_object_matches(selector, namespace_labels.get(candidate_ns))
        )
    return in_scope and label_selector_object_matches(
        term.get("labelSelector"), candidate["metadata"].get("labels")
    )


@dataclass
class Snapshot:
    nodes: dict[str, NodeState]
    namespace_labels: dict[str, dict[str, str]]

    @classmethod
    def take(cls, cluster: Cluster) -> Snapshot:
        nodes = {n["metadata"]["name"]: NodeState(n) for n in cluster.store.items("/nodes")}
        for pod in cluster.store.items("/pods"):
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name in nodes and _is_active(pod):
                nodes[node_name].pods.append(pod)
        namespace_labels = {
            ns["metadata"]["name"]: ns["metadata"].get("labels") or {}
            for ns in cluster.store.items("/namespaces")
        }
        return cls(nodes, namespace_labels)

    def selects(self, term: Obj, owner: Obj, candidate: Obj) -> bool:
        return _term_selects(term, owner, candidate, self.namespace_labels)

    def placed(self, *, excluding: Iterable[Obj] = ()) -> list[tuple[NodeState, Obj]]:
        excluded = {id(p) for p in excluding}
        return [(n, p) for n in self.nodes.values() for p in n.pods if id(p) not in excluded]

    def affinity_checker(
        self, pod: Obj, *, excluding: Iterable[Obj] = ()
    ) -> Callable[[NodeState], str | None]:
        """Inter-pod affinity for one pod, computed once over the placed pods."""
        placed = self.placed(excluding=excluding)
        affinity: list[tuple[str, set[str] | None]] = []
        for term in _required_terms(pod, "podAffinity"):
            key = term["topologyKey"]
            matching = [n for n, p in placed if self.selects(term, pod, p)]
            if matching:
                affinity.append((key, {n.labels[key] for n in matching if key in n.labels}))
            elif self.selects(term, pod, pod):
                # The first pod of a group may land anywhere only if it matches its own term.
                affinity.append((key, None))
            else:
                affinity.append((key, set()))
        anti: list[tuple[str, set[str]]] = []
        for term in _required_terms(pod, "podAntiAffinity"):
            key = term["topologyKey"]
            anti.append(
                (
                    key,
                    {
                        n.labels[key]
                        for n, p in placed
                        if key in n.labels and self.selects(term, pod, p)
                    },
                )
            )
        existing_anti: list[tuple[str, str]] = [
            (term["topologyKey"], n.labels[term["topologyKey"]])
            for n, other in placed
            for term in _required_terms(other, "podAntiAffinity")
            if term["topologyKey"] in n.labels and self.selects(term, other, pod)
        ]

        def check(node: NodeState) -> str | None:
            labels = node.labels
            for key, domains in affinity:
                if key not in labels or (domains is not None and labels[key] not in domains):
                    return "node(s) didn't match pod affinity rules"
            for key, domains in anti:
                if key in labels and labels[key] in domains:
                    return "node(s) didn't match pod anti-affinity rules"
            for key, value in existing_anti:
                if labels.get(key) == value:
                    return "node(s) didn't satisfy existing pods anti-affinity rules"
            return None

        return check

    def spread_checker(self, pod: Obj) -> Callable[[NodeState], str | None]:
        """PodTopologySpread with `whenUnsatisfiable: DoNotSchedule` (the filter part).

        Domains are the topology values of the nodes that match the pod's node selector and
        required node affinity (`nodeAffinityPolicy: Honor`, the default); `minDomains`,
        `matchLabelKeys` and `nodeTaintsPolicy` are not emulated.
        """
        constraints = [
            c
            for c in (pod.get("spec") or {}).get("topologySpreadConstraints") or []
            if c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
        ]
        if not constraints:
            return lambda node: None
        eligible = [n for n in self.nodes.values() if _node_affinity_matches(pod, n.node)]
        namespace = pod["metadata"].get("namespace")
        rules: list[tuple[str, int, dict[str, int], int]] = []
        for constraint in constraints:
            key = constraint["topologyKey"]
            selector = constraint.get("labelSelector")
            counts: dict[str, int] = {}
            for node in eligible:
                if key not in node.labels:
                    continue
                counts.setdefault(node.labels[key], 0)
                counts[node.labels[key]] += sum(
                    1
                    for p in node.pods
                    if p["metadata"].get("namespace") == namespace
                    and not p["metadata"].get("deletionTimestamp")
                    and label_selector_object_matches(selector, p["metadata"].get("labels"))
                )
            self_match = int(label_selector_object_matches(selector, pod["metadata"].get("labels")))
            rules.append((key, int(constraint.get("maxSkew", 1)), counts, self_match))

        def check(node: NodeState) -> str | None:
            for key, max_skew, counts, self_match in rules:
                if key not in node.labels:
                    return (
                        "node(s) didn't match pod topology spread constraints "
                        "(missing required label)"
                    )
                lowest = min(counts.values()) if counts else 0
                if counts.get(node.labels[key], 0) + self_match - lowest > max_skew:
                    return "node(s) didn't match pod topology spread constraints"
            return None

        return check

    def affinity_problem(
        self, pod: Obj, node: NodeState, *, excluding: Iterable[Obj] = ()
    ) -> str | None:
        return self.affinity_checker(pod, excluding=excluding)(node)

    def static_problem(self, pod: Obj, node: NodeState) -> str | None:
        """Filters that preemption cannot fix."""
        if (node.node.get("spec") or {}).get("unschedulable"):
            return "node(s) were unschedulable"
        if not _node_is_ready(node.node):
            return "node(s) were not ready"
        taint = _untolerated_taint(pod, node.node)
        if taint is not None:
            value = taint.get("value")
            shown = f"{taint['key']}: {value}" if value else taint["key"]
            return f"node(s) had untolerated taint {{{shown}}}"
        if not _node_affinity_matches(pod, node.node):
            return "node(s) didn't match Pod's node affinity/selector"
        return None


def _node_is_ready(node: Obj) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True


def _score(requests: dict[str, Decimal], node: NodeState) -> Decimal:
    """LeastAllocated: the mean free fraction of cpu and memory after placing the pod."""
    allocatable = node.allocatable()
    free = node.free()
    fractions = []
    for resource in ("cpu", "memory"):
        capacity = allocatable.get(resource, Decimal(0))
        if capacity > 0:
            fractions.append(
                (free.get(resource, Decimal(0)) - requests.get(resource, 0)) / capacity
            )
    return sum(fractions, Decimal(0)) / len(fractions) if fractions else Decimal(0)


def schedule_pending_pods(cluster: Cluster) -> None:
    # Like the real scheduler's queue, unschedulable pods are retried only after a change
    # to pods, nodes or priority classes.
    if not cluster.scheduling_dirty:
        return
    cluster.scheduling_dirty = False
    _start_prebound_pods(cluster)
    pending = [
        pod
        for pod in cluster.store.items("/pods")
        if not (pod.get("spec") or {}).get("nodeName")
        and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
        and (pod.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"
        and not (pod.get("spec") or {}).get("schedulingGates")
    ]
    pending.sort(
        key=lambda p: (
            -pod_priority(p),
            p["metadata"]["creationTimestamp"],
            int(p["metadata"]["resourceVersion"]),
        )
    )
    snapshot = Snapshot.take(cluster)
    for pod in pending:
        current = cluster.store.get("/pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
            continue  # preempted or deleted earlier in this pass
        if _schedule_one(cluster, current, snapshot):
            snapshot = Snapshot.take(cluster)  # after a preemption, start from the store


def _schedule_one(cluster: Cluster, pod: Obj, snapshot: Snapshot) -> bool:
    """Bind, preempt for, or mark one pod; True when it preempted (the snapshot is stale)."""
    requests = pod_requests(pod)
    reasons: Counter[str] = Counter()
    feasible: list[NodeState] = []
    affinity = snapshot.affinity_checker(pod)
    spread = snapshot.spread_checker(pod)
    for node in snapshot.nodes.values():
        # In the default plugin order, so each node reports its first failure as the real
        # scheduler does: taints and node affinity, resources, spread, inter-pod affinity.
        problem = snapshot.static_problem(pod, node)
        if problem is None:
            short = _insufficient(requests, node.free())
            if short:
                reasons.update(f"Insufficient {r}" for r in short)
                continue
            problem = spread(node) or affinity(node)
        if problem is None:
            feasible.append(node)
        else:
            reasons[problem] += 1
    if feasible:
        best = max(feasible, key=lambda n: (_score(requests, n), [-ord(c) for c in n.name]))
        best.add(_bind(cluster, pod, best.name))
        return False
    nominated = snapshot.nodes.get((pod.get("status") or {}).get("nominatedNodeName") or "")
    if nominated is not None and _fits_once_terminated(snapshot, pod, requests, nominated):
        return False  # victims of an earlier preemption are still terminating: wait for them
    preemption_reasons: Counter[str] = Counter()
    if (pod.get("spec") or {}).get("preemptionPolicy") != "Never":
        choice = _pick_preemption(snapshot, pod, requests, preemption_reasons)
        if choice is not None:
            node, victims = choice
            _preempt(cluster, pod, node.name, victims)
            after = Snapshot.take(cluster).nodes[node.name]
            if not _insufficient(requests, after.free()):
                _bind(cluster, pod, node.name)
            else:
                _nominate(cluster, pod, node.name)
            return True
    _mark_unschedulable(
        cluster,
        pod,
        _unschedulable_message(
            len(snapshot.nodes),
            reasons,
            preemption_reasons,
            never=(pod.get("spec") or {}).get("preemptionPolicy") == "Never",
        ),
    )
    return False


def _unschedulable_message(
    node_count: int, reasons: Counter[str], preemption: Counter[str], *, never: bool
) -> str:
    """The scheduler's FailedScheduling text, e.g. "0/2 nodes are available: 2 Insufficient
    nvidia.com/gpu. preemption: 0/2 nodes are available: 2 No preemption victims found for
    incoming pod."."""
    if node_count == 0:
        return "no nodes available to schedule pods"

    def counted(counter: Counter[str]) -> str:
        return ", ".join(f"{count} {reason}" for reason, count in sorted(counter.items()))

    message = f"0/{node_count} nodes are available: {counted(reasons)}."
    if never:
        return message + " preemption: not eligible due to preemptionPolicy=Never."
    return message + f" preemption: 0/{node_count} nodes are available: {counted(preemption)}."


def _terminating(pods: Iterable[Obj]) -> list[Obj]:
    return [p for p in pods if p["metadata"].get("deletionTimestamp")]


def _fits_once_terminated(
    snapshot: Snapshot, pod: Obj, requests: dict[str, Decimal], node: NodeState
) -> bool:
    leaving = _terminating(node.pods)
    return bool(leaving) and not _insufficient(requests, node.free(without=leaving))


def _nominate(cluster: Cluster, pod: Obj, node_name: str) -> None:
    nominated = copy.deepcopy(pod)
    nominated.setdefault("status", {})["nominatedNodeName"] = node_name
    cluster.write_internal(cluster.rtype("", "pods"), nominated)


_NOT_HELPFUL = "Preemption is not helpful for scheduling"
_NO_VICTIMS = "No preemption victims found for incoming pod"


def _pick_preemption(
    snapshot: Snapshot, pod: Obj, requests: dict[str, Decimal], reasons: Counter[str]
) -> tuple[NodeState, list[Obj]] | None:
    """The node and victims to preempt, or None with the per-node reasons counted."""
    priority = pod_priority(pod)
    candidates: list[tuple[tuple[int, int, int, str], NodeState, list[Obj]]] = []
    spread = snapshot.spread_checker(pod)
    for node in snapshot.nodes.values():
        if snapshot.static_problem(pod, node) is not None or spread(node) is not None:
            reasons[_NOT_HELPFUL] += 1
            continue
        # Pods already terminating will free their resources anyway: never victims again.
        leaving = _terminating(node.pods)
        lower = [p for p in node.pods if pod_priority(p) < priority and p not in leaving]
        if not lower or _insufficient(requests, node.free(without=lower + leaving)):
            reasons[_NO_VICTIMS] += 1
            continue
        if snapshot.affinity_problem(pod, node, excluding=lower + leaving) is not None:
            reasons[_NOT_HELPFUL] += 1
            continue
        # Reprieve the most important victims first while the preemptor still fits.
        victims = sorted(lower, key=lambda p: (-pod_priority(p), p["metadata"]["name"]))
        kept_out: list[Obj] = list(victims)
        for candidate in victims:
            trial = [p for p in kept_out if p is not candidate]
            if not _insufficient(requests, node.free(without=trial + leaving)) and (
                snapshot.affinity_problem(pod, node, excluding=trial + leaving) is None
            ):
                kept_out = trial
        rank = (
            max(pod_priority(p) for p in kept_out),
            sum(pod_priority(p) + _PRIORITY_OFFSET for p in kept_out),
            len(kept_out),
            node.name,
        )
        candidates.append((rank, node, kept_out))
    if not candidates:
        return None
    _, node, victims = min(candidates, key=lambda c: c[0])
    return node, victims


def _preempt(cluster: Cluster, preemptor: Obj, node_name: str, victims: list[Obj]) -> None:
    pods = cluster.rtype("", "pods")
    preemptor_meta = preemptor["metadata"]
    for victim in sorted(victims, key=pod_priority):
        record_event(
            cluster,
            regarding=victim,
            kind="Pod",
            api_version="v1",
            reason="Preempted",
            message=(f"Preempted by pod {preemptor_meta['uid']} on node {node_name}"),
            type_="Normal",
            component="default-scheduler",
        )
        meta = victim["metadata"]
        # Since Kubernetes 1.26 a victim is marked before deletion, so its last state (in
        # the DELETED watch event too) says why it went.
        marked = copy.deepcopy(victim)
        conditions = [
            c
            for c in marked.setdefault("status", {}).get("conditions") or []
            if c.get("type") != "DisruptionTarget"
        ]
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": "default-scheduler: preempting to accommodate a higher priority pod",
                "lastTransitionTime": cluster.now_text(),
            }
        )
        marked["status"]["conditions"] = conditions
        cluster.write_internal(pods, marked)
        cluster.delete(pods, meta["namespace"], meta["name"], reconcile=False)
        cluster.preemptions.append(
            (
                f"{meta['namespace']}/{meta['name']}",
                f"{preemptor_meta['namespace']}/{preemptor_meta['name']}",
            )
        )


_ip_counter = itertools.count(1)


def _start_prebound_pods(cluster: Cluster) -> None:
    """Pods created with `spec.nodeName` skip the scheduler; the node's kubelet admits them."""
    snapshot = Snapshot.take(cluster)
    for pod in cluster.store.items("/pods"):
        node_name = (pod.get("spec") or {}).get("nodeName")
        status = pod.get("status") or {}
        if not node_name or status.get("phase") != "Pending" or status.get("conditions"):
            continue
        node = snapshot.nodes.get(node_name)
        if node is None:
            continue  # no kubelet answers for a node that does not exist
        others = [p for p in node.pods if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        short = _insufficient(pod_requests(pod), NodeState(node.node, others).free())
        if short:
            failed = copy.deepcopy(pod)
            failed["status"].update(
                {
                    "phase": "Failed",
                    "reason": f"OutOf{short[0]}",
                    "message": f"Pod was rejected: Node didn't have enough resource: {short[0]}",
                }
            )
            cluster.write_internal(cluster.rtype("", "pods"), failed)
            continue
        _bind(cluster, pod, node_name)


def _bind(cluster: Cluster, pod: Obj, node_name: str) -> Obj:
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"] = node_name
    now = cluster.now_text()
    index = next(_ip_counter)
    node = cluster.store.get("/nodes", "", node_name) or {}
    addresses = (node.get("status") or {}).get("addresses") or []
    host_ip = next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "10.0.0.1")
    status = bound.setdefault("status", {})
    status.pop("nominatedNodeName", None)
    status.update(
        {
            "phase": "Running",
            "hostIP": host_ip,
            "podIP": f"10.244.{index // 250}.{index % 250 + 1}",
            "startTime": now,
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {
                    "type": "ContainersReady",
                    "status": "False",
                    "lastTransitionTime": now,
                    "reason": "ContainersNotReady",
                },
                {
                    "type": "Ready",
                    "status": "False",
                    "lastTransitionTime": now,
                    "reason": "ContainersNotReady",
                },
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": f"{c.get('image', '')}@sha256:{'0' * 64}",
                    "containerID": "containerd://"
                    + hashlib.sha256(f"{pod['metadata']['uid']}/{c['name']}".encode()).hexdigest(),
                    "ready": False,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in bound["spec"].get("containers") or []
            ],
        }
    )
    stored = cluster.write_internal(cluster.rtype("", "pods"), bound)
    record_event(
        cluster,
        regarding=bound,
        kind="Pod",
        api_version="v1",
        reason="Scheduled",
        message=f"Successfully assigned {bound['metadata']['namespace']}/"
        f"{bound['metadata']['name']} to {node_name}",
        type_="Normal",
        component="default-scheduler",
    )
    cluster.on_pod_bound(bound)
    return stored


def _mark_unschedulable(cluster: Cluster, pod: Obj, message: str) -> None:
    updated = copy.deepcopy(pod)
    status = updated.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    previous = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None
    )
    changed_at = (
        previous["lastTransitionTime"]
        if previous is not None and previous.get("status") == "False"
        else cluster.now_text()
    )
    conditions.append(
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": changed_at,
            "lastProbeTime": None,
        }
    )
    status["conditions"] = conditions
    cluster.write_internal(cluster.rtype("", "pods"), updated)
    record_event(
        cluster,
        regarding=updated,
        kind="Pod",
        api_version="v1",
        reason="FailedScheduling",
        message=message,
        type_="Warning",
        component="default-scheduler",
    )
