"""Step 6: how many more whole gangs can be placed on the nodes as they are now.

A gang fits only if every one of its pods fits on some node it may run on, all in one
topology domain when the LWS names an exclusive topology key, and then in a domain of its own:
LWS's exclusive placement keeps every other group of the namespace out of it. That binds a
gang without an exclusive topology too: none of its pods may join a domain where an
exclusive gang of its namespace runs. Two nodes with 4 free GPUs each do not hold a gang of
two 8-GPU pods, however many GPUs are free in total. Subgroup exclusive placement
(`leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology`, each subgroup in a domain of its
own) is not modelled: such a gang is fitted as if its subgroups could share a domain.

Growth is handed out in deployment order: first every deployment below its minimum gets its
minimum (all components together, or none of them), then remaining scale-ups one gang at a
time, round-robin, so a short cluster is shared instead of going to whoever asked first.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.core.model import ComponentKey, DeploymentKey, NodeCapacity
from autoscaler.core.shape import GangShape, PodShape, fits, subtract_resources

FreeByNode = dict[str, dict[str, int]]


def _match_expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = expr.get("key", "")
    operator = expr.get("operator", "In")
    values = list(expr.get("values") or [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and values:
        try:
            node_value, wanted = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return node_value > wanted if operator == "Gt" else node_value < wanted
    return False


def _required_node_affinity(pod: PodShape, labels: Mapping[str, str]) -> bool:
    node_affinity = (pod.affinity or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(
        all(_match_expression(e, labels) for e in term.get("matchExpressions") or [])
        for term in terms
    )


def _extended_resource(name: str) -> bool:
    """Kubernetes' `IsExtendedResourceName`: a domain-prefixed name outside kubernetes.io."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _admission_tolerates(pod: PodShape, key: str | None, effect: str) -> bool:
    """The toleration the ExtendedResourceToleration admission plugin adds to every pod that
    requests an extended resource: `<resource>:NoSchedule`, operator Exists. GKE enables it
    and taints its GPU nodes `nvidia.com/gpu=present:NoSchedule`, and LWS templates carry no
    such toleration: without it fit found no room on any GPU node there."""
    if effect != "NoSchedule" or not key or not _extended_resource(key):
        return False
    return pod.requests.get(key, 0) > 0 or pod.limits.get(key, 0) > 0


def can_run_on(pod: PodShape, node: NodeCapacity) -> bool:
    """Node selector, required node affinity and NoSchedule/NoExecute taints (with the
    tolerations admission adds for extended resources the pod requests)."""
    if not node.schedulable:
        return False
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    if not _required_node_affinity(pod, node.labels):
        return False
    for taint in node.taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if any(t.tolerates(taint.key, taint.value, taint.effect) for t in pod.tolerations):
            continue
        if not _admission_tolerates(pod, taint.key, taint.effect):
            return False
    return True


@dataclass(frozen=True, slots=True)
class Room:
    """What is left for new gangs: free resources per node, and where gangs placed in this
    pass went."""

    free: FreeByNode
    # (namespace, topology key, domain): an exclusive topology holds one gang of a namespace
    # per domain, and keeps the namespace's other gangs out of it (LWS's own anti-affinity)
    taken: frozenset[tuple[str, str, str]] = frozenset()
    # (namespace, node): nodes where this pass placed a pod of the namespace, as a bound pod
    # would be reported in `NodeCapacity.lws_namespaces`
    occupied: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def of(cls, nodes: Sequence[NodeCapacity]) -> Room:
        return cls(free={n.name: dict(n.free) for n in nodes})


def _exclusive_domains(
    namespace: str, nodes: Sequence[NodeCapacity], room: Room
) -> set[tuple[str, str]]:
    """The (topology key, domain) pairs an exclusively placed gang of `namespace` holds, bound
    there or placed in this pass: no other gang of the namespace may put a pod in them,
    whether or not it is exclusive itself (the scheduler enforces a bound pod's required
    anti-affinity against incoming pods too)."""
    held = {(key, value) for ns, key, value in room.taken if ns == namespace}
    for node in nodes:
        for ns, key in node.exclusive_lws:
            value = node.labels.get(key)
            if ns == namespace and value is not None:
                held.add((key, value))
    return held


def _domains(
    shape: GangShape, nodes: Sequence[NodeCapacity]
) -> list[tuple[str | None, list[NodeCapacity]]]:
    if not shape.topology_key:
        return [(None, list(nodes))]
    by_value: dict[str, list[NodeCapacity]] = {}
    for node in nodes:
        value = node.labels.get(shape.topology_key)
        if value is not None:
            by_value.setdefault(value, []).append(node)
    return [(v, by_value[v]) for v in sorted(by_value)]


def _pod_size(pod: PodShape) -> tuple[int, int, int]:
    r = pod.requests
    return (r.get("nvidia.com/gpu", 0), r.get("cpu", 0), r.get("memory", 0))


def _best_fit(
    pods: Sequence[PodShape], domain: Sequence[NodeCapacity], free: FreeByNode
) -> tuple[FreeByNode, set[str]] | None:
    """The domain's room after placing `pods` in this order, each on the eligible node it
    leaves fullest, and the nodes used; None when one of them finds no node."""
    trial = {n.name: dict(free[n.name]) for n in domain}
    used = set()
    for pod in pods:
        candidates = [n for n in domain if can_run_on(pod, n) and fits(pod.requests, trial[n.name])]
        if not candidates:
            return None
        best = min(
            candidates,
            key=lambda n: (
                trial[n.name].get("nvidia.com/gpu", 0) - pod.requests.get("nvidia.com/gpu", 0),
                trial[n.name].get("cpu", 0),
                n.name,
            ),
        )
        trial[best.name] = subtract_resources(trial[best.name], pod.requests)
        used.add(best.name)
    return trial, used


def place_gang(
    shape: GangShape, nodes: Sequence[NodeCapacity], room: Room, *, namespace: str
) -> Room | None:
    """Room left after placing one more gang of `namespace`, or None when it does not fit.

    Pods go largest first, each to the eligible node it leaves fullest (best fit), which
    keeps whole nodes free for the next gang. No pod goes into a domain an exclusive gang of
    the namespace holds. With an exclusive topology of its own, a domain where the namespace
    has a pod (bound there, or placed in this pass) is skipped.
    """
    largest_first = sorted(shape.pods, key=_pod_size, reverse=True)
    # Best fit in one order can strand a pod that another order places (a leader that
    # needs CPU, workers that need memory): a gang has at most two pod shapes, so the
    # reverse order is the one other worth trying.
    orders = [largest_first]
    if shape.leader != shape.worker:
        orders.append(largest_first[::-1])
    key = shape.topology_key
    held = _exclusive_domains(namespace, nodes, room)
    for value, domain in _domains(shape, nodes):
        if (
            key is not None
            and value is not None
            and any(
                namespace in n.lws_namespaces or (namespace, n.name) in room.occupied
                for n in domain
            )
        ):
            continue
        usable = [n for n in domain if not any(n.labels.get(k) == v for k, v in held)]
        tries = (_best_fit(order, usable, room.free) for order in orders)
        placed = next((t for t in tries if t is not None), None)
        if placed is not None:
            trial, used = placed
            free = dict(room.free)
            free.update(trial)
            taken = room.taken
            if key is not None and value is not None:
                taken = taken | {(namespace, key, value)}
            occupied = room.occupied | {(namespace, name) for name in used}
            return Room(free=free, taken=taken, occupied=occupied)
    return None


@dataclass(frozen=True, slots=True)
class Unplaced:
    """Pods of a gang already asked for (below its LWS's replicas) that no node holds yet:
    the scheduler will place them in room a new gang would otherwise be counted on."""

    namespace: str
    shape: GangShape
    missing_pods: int  # of `shape.pods_per_gang`; all of them when none is placed


def reserve(unplaced: Iterable[Unplaced], nodes: Sequence[NodeCapacity], room: Room) -> Room:
    """The room left once every unplaced pod takes its share, each where it fits best. A
    gang with no pod placed is placed whole (its topology, its exclusive domain); the missing
    members of a partial gang go to any node they may run on (the domain its placed members
    hold is not known here), the workers' shape for each (the leader is made first). What
    does not fit takes nothing: it waits for nodes, as the new gangs would."""
    for gang in unplaced:
        if gang.missing_pods <= 0:
            continue
        if gang.missing_pods >= gang.shape.pods_per_gang:
            after = place_gang(gang.shape, nodes, room, namespace=gang.namespace)
            room = after if after is not None else room
            continue
        pods = gang.shape.pods[gang.shape.pods_per_gang - gang.missing_pods :]
        placed = _best_fit(pods, nodes, room.free)
        if placed is not None:
            trial, used = placed
            room = Room(
                free={**room.free, **trial},
                taken=room.taken,
                occupied=room.occupied | {(gang.namespace, name) for name in used},
            )
    return room


@dataclass(frozen=True, slots=True)
class GrowthRequest:
    """A component that wants more gangs than it has."""

    key: ComponentKey
    deployment: DeploymentKey
    shape: GangShape
    current_gangs: int
    minimum_gangs: int  # its min-replicas (at least 1 while its deployment is up)
    wanted_gangs: int


@dataclass(frozen=True, slots=True)
class Grant:
    gangs: int  # the count the component may scale to
    fit_now: int  # additional gangs that fit on the nodes as they are
    short: bool  # True when the grant is below what was wanted for lack of room


def allocate_growth(
    requests: Iterable[GrowthRequest],
    nodes: Sequence[NodeCapacity],
    *,
    can_grow: bool,
    unplaced: Iterable[Unplaced] = (),
) -> dict[ComponentKey, Grant]:
    """Hand out the room on `nodes`, less what the `unplaced` pods of gangs already asked
    for will take, to scale-ups, in three rounds:

    1. every deployment with a component at zero gets one gang of each component, all of
       them or none, so it can serve;
    2. components below their minimum, one gang each per round;
    3. the remaining scale-ups, one gang each per round.

    With `can_grow`, every scale-up is granted in full (new nodes will come); the room is
    still computed so the plan can say how many gangs wait for nodes.
    """
    ordered = sorted(requests, key=lambda r: (r.deployment, r.key))
    room = reserve(unplaced, nodes, Room.of(nodes))
    granted = {r.key: r.current_gangs for r in ordered}
    fit_now = {r.key: 0 for r in ordered}

    def try_place(request: GrowthRequest) -> bool:
        nonlocal room
        after = place_gang(request.shape, nodes, room, namespace=request.key.namespace)
        if after is None:
            return False
        room = after
        fit_now[request.key] += 1
        return True

    by_deployment: dict[DeploymentKey, list[GrowthRequest]] = {}
    for r in ordered:
        by_deployment.setdefault(r.deployment, []).append(r)
    serving: list[GrowthRequest] = []
    for members in by_deployment.values():
        starting = [r for r in members if r.current_gangs == 0]
        if not starting:
            serving.extend(members)
            continue
        saved_room, saved_fit = room, dict(fit_now)
        if all(try_place(r) for r in starting):
            for r in starting:
                granted[r.key] = 1
            serving.extend(members)
        else:
            room, fit_now = saved_room, saved_fit

    def round_robin(targets: dict[ComponentKey, int]) -> None:
        active = [r for r in serving if granted[r.key] < targets[r.key]]
        while active:
            still = []
            for r in active:
                if try_place(r):
                    granted[r.key] += 1
                    if granted[r.key] < targets[r.key]:
                        still.append(r)
            active = still

    round_robin({r.key: min(r.minimum_gangs, r.wanted_gangs) for r in serving})
    round_robin({r.key: r.wanted_gangs for r in serving})

    out = {}
    for r in ordered:
        gangs = r.wanted_gangs if can_grow else granted[r.key]
        out[r.key] = Grant(gangs=gangs, fit_now=fit_now[r.key], short=gangs < r.wanted_gangs)
    return out
