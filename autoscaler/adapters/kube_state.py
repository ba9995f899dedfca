"""One consistent snapshot of what Kubernetes says, in the core's types.

`build_state` is pure: LWS, pod, node (and RoleScaler) dicts in, a `KubeState` out. The
snapshot has every opted-in component (usable or with its policy problems), an observation
per usable component without load signals (the Prometheus adapter adds those), the
cluster's free capacity, and the ready gangs' leader pods, which the Prometheus adapter
joins its per-pod series on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from autoscaler.adapters.balloons import (
    balloon_name_clashes,
    shape_digest,
    stranded_balloons,
    whole_balloon_gangs,
)
from autoscaler.adapters.capacity import cluster_observation, is_balloon
from autoscaler.adapters.gang_state import gang_statuses, ready_leader_pods
from autoscaler.adapters.kube_discovery import DiscoveredComponent, ParseCache, discover
from autoscaler.adapters.kube_objects import (
    BALLOON_FOR_LABEL,
    LWS_NAME_LABEL,
    PAUSE_IMAGE,
    WORKER_INDEX_LABEL,
    Obj,
    int_label,
    labels,
    meta,
    namespace,
)
from autoscaler.core.fit import can_run_on
from autoscaler.core.model import (
    ClusterObservation,
    ComponentKey,
    ComponentObservation,
    NodeCapacity,
    Observations,
    Signals,
)
from autoscaler.core.policy import Policy, PolicyProblem
from autoscaler.core.shape import GangShape, parse_tolerations


@dataclass(frozen=True, slots=True)
class ComponentState:
    discovered: DiscoveredComponent
    observation: ComponentObservation | None  # None when the gang shape is unreadable
    leader_pods: Mapping[str, int]  # ready gangs' leader pod name -> group index
    balloon_pods: tuple[Obj, ...]  # this LWS's balloon pods as seen
    # another LWS of the namespace whose pods take this one's balloon pod names, if any
    balloon_name_clash: str | None = None
    # balloon pods on nodes that no longer take pods (`balloons.stranded_balloons`)
    balloon_stranded: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class KubeState:
    taken_at_s: float
    components: Mapping[ComponentKey, ComponentState]
    cluster: ClusterObservation

    @property
    def policies(self) -> dict[ComponentKey, Policy]:
        """Every component whose own annotations parse; the core checks deployments itself
        and holds a component whose policy is missing here."""
        return {
            key: c.discovered.policy
            for key, c in self.components.items()
            if c.discovered.policy is not None
        }

    @property
    def problems(self) -> dict[ComponentKey, tuple[PolicyProblem, ...]]:
        return {
            key: c.discovered.problems
            for key, c in self.components.items()
            if c.discovered.problems
        }

    def observations(
        self,
        signals: Mapping[ComponentKey, Signals],
        *,
        capacity_keys: Mapping[ComponentKey, str] | None = None,
    ) -> Observations:
        """The core's input, with the given signals (a component without an entry gets
        all-None signals, so the core holds it). Components whose gang shape is unreadable
        are left out: there is nothing to decide with. `capacity_keys` replace the template
        digest as what a learned capacity holds for (`CapacityIdentity.key`)."""
        keys = capacity_keys or {}
        comps = {
            key: dataclasses.replace(
                c.observation,
                signals=signals.get(key, Signals()),
                template=keys.get(key, c.observation.template),
            )
            for key, c in self.components.items()
            if c.observation is not None
        }
        return Observations(components=comps, cluster=self.cluster)

    def leader_pod_index(self) -> dict[tuple[str, str], tuple[ComponentKey, int]]:
        """(namespace, pod) -> (component, group index) for every ready gang's leader."""
        return {
            (key.namespace, pod): (key, group)
            for key, c in self.components.items()
            for pod, group in c.leader_pods.items()
        }


def build_state(
    *,
    lws_objects: Iterable[Obj],
    pods: Iterable[Obj],
    nodes: Iterable[Obj],
    now_s: float,
    namespaces: Collection[str] | None = None,
    can_grow: bool = True,
    default_annotations: Mapping[str, str] | None = None,
    parse_cache: ParseCache | None = None,
    role_scalers: Iterable[Obj] = (),
    role_scalers_error: str | None = None,
    role_scalers_stale: str | None = None,
    balloon_image: str = PAUSE_IMAGE,
) -> KubeState:
    pod_list = list(pods)
    node_list = list(nodes)
    raw_nodes = {str(meta(n).get("name", "")): n for n in node_list}
    cluster = cluster_observation(node_list, pod_list, can_grow=can_grow)
    nodes_by_name = {node.name: node for node in cluster.nodes}
    by_lws: dict[tuple[str, str], list[Obj]] = {}
    balloons_by_lws: dict[tuple[str, str], list[Obj]] = {}
    for pod in pod_list:
        lws_name = labels(pod).get(LWS_NAME_LABEL)
        if lws_name:
            by_lws.setdefault((namespace(pod), lws_name), []).append(pod)
        elif is_balloon(pod):
            balloons_by_lws.setdefault((namespace(pod), labels(pod)[BALLOON_FOR_LABEL]), []).append(
                pod
            )
    lws_list = list(lws_objects)
    lws_names: dict[str, list[str]] = {}
    for lws in lws_list:
        lws_names.setdefault(namespace(lws), []).append(str(meta(lws).get("name", "")))
    clashes = {ns: balloon_name_clashes(names) for ns, names in lws_names.items()}
    components: dict[ComponentKey, ComponentState] = {}
    for key, found in discover(
        lws_list,
        namespaces=namespaces,
        default_annotations=default_annotations,
        cache=parse_cache,
        role_scalers=role_scalers,
        role_scalers_error=role_scalers_error,
        role_scalers_stale=role_scalers_stale,
    ).items():
        lws_pods = by_lws.get((key.namespace, key.lws), [])
        balloons = tuple(balloons_by_lws.get((key.namespace, key.lws), ()))
        stranded = stranded_balloons(balloons, raw_nodes)
        observation = None
        leaders: dict[str, int] = {}
        if found.shape is not None:
            gangs = gang_statuses(
                lws_pods,
                lws_name=key.lws,
                pods_per_gang=found.shape.pods_per_gang,
                spec_gangs=found.spec_gangs,
                takes_replacement=_takes_replacement(found.shape, nodes_by_name),
            )
            held = whole_balloon_gangs(
                balloons,
                lws_name=key.lws,
                pods_per_gang=found.shape.pods_per_gang,
                digest=shape_digest(found.shape, image=balloon_image),
                stranded=stranded,
            )
            observation = ComponentObservation(
                key=key,
                spec_gangs=found.spec_gangs,
                gangs=gangs,
                signals=Signals(),
                shape=found.shape,
                balloon_gangs=held,
                template=found.template,
            )
            leaders = ready_leader_pods(lws_pods, lws_name=key.lws, gangs=gangs)
        clash = clashes.get(key.namespace, {}).get(key.lws)
        components[key] = ComponentState(found, observation, leaders, balloons, clash, stranded)
    return KubeState(
        taken_at_s=now_s,
        components=components,
        cluster=cluster,
    )


def _takes_replacement(
    shape: GangShape, nodes: Mapping[str, NodeCapacity]
) -> Callable[[str, Obj], bool]:
    """Whether a node takes the pod that replaces `pod`. The replacement is made from the
    template (a rolling update's new one, with its node selector and affinity), plus the
    tolerations admission added to the pod (GKE's GPU toleration, for one), which the
    template does not hold and the replacement gets again."""

    def takes(node_name: str, pod: Obj) -> bool:
        node = nodes.get(node_name)
        if node is None:
            return False
        member = shape.leader if int_label(pod, WORKER_INDEX_LABEL) == 0 else shape.worker
        try:
            added = parse_tolerations((pod.get("spec") or {}).get("tolerations") or ())
        except (TypeError, AttributeError):  # not a list of objects: the template's alone
            added = ()
        return can_run_on(dataclasses.replace(member, tolerations=member.tolerations + added), node)

    return takes
