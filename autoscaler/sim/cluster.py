"""The simulated cluster: nodes, gangs, schedulers, balloon preemption, node provisioning.

Capacity is counted in pod slots (a node holds `gpus_per_node // gpus_per_pod` member pods),
which is exact for the uniform GPU pods of one model. Two schedulers place real gangs:

- gang scheduling (what `gang` relies on): a gang's pods are placed all at once or not at
  all, preempting whole balloon gangs when that makes the gang fit;
- pod-by-pod (what an HPA-scaled LWS gets from the default scheduler): each pending pod is
  placed as soon as a slot is free, so a gang can sit partially placed, holding GPUs and
  serving nothing.

Pending pods make a cluster-autoscaler add nodes (after `node_provisioning_s`) for the pods
that the free slots of the nodes already there or coming up cannot hold, up to `max_nodes`;
a node left empty for `node_idle_timeout_s` is removed. Balloon pods keep a node busy, as
their priority is above the cluster-autoscaler's expendable cutoff.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from autoscaler.sim.config import ClusterSettings


@dataclass(slots=True)
class Node:
    name: str
    slots: int
    ready_at_s: float
    used_slots: int = 0
    empty_since_s: float | None = None

    def is_ready(self, now_s: float) -> bool:
        return now_s >= self.ready_at_s

    @property
    def free_slots(self) -> int:
        return self.slots - self.used_slots


@dataclass(slots=True)
class Gang:
    component: str
    group_index: int
    pods_expected: int
    balloon: bool
    created_s: float
    serial: int
    placements: list[str] = field(default_factory=list)  # node name per placed pod
    all_placed_s: float | None = None
    pending_since_s: float | None = None

    @property
    def pods_scheduled(self) -> int:
        return len(self.placements)

    @property
    def is_partial(self) -> bool:
        return 0 < len(self.placements) < self.pods_expected

    def is_ready(self, now_s: float, startup_s: float) -> bool:
        return self.all_placed_s is not None and now_s >= self.all_placed_s + startup_s


class Cluster:
    """Mutable state of one simulated cluster, advanced by `step(now_s)`."""

    def __init__(self, settings: ClusterSettings, *, gang_scheduling: bool) -> None:
        self.settings = settings
        self.gang_scheduling = gang_scheduling
        self.nodes: dict[str, Node] = {}
        self.real: dict[str, list[Gang]] = {}
        self.balloons: dict[str, list[Gang]] = {}
        self._serial = itertools.count()
        self._node_names = itertools.count()
        self.preemptions = 0

    # -- setup -------------------------------------------------------------------------------

    def add_components(self, *components: str) -> None:
        for name in components:
            self.real.setdefault(name, [])
            self.balloons.setdefault(name, [])

    def start_ready(self, component: str, gangs: int, *, now_s: float) -> None:
        """Begin a run with `gangs` already placed and serving (steady state at t=0)."""
        self.set_replicas(component, len(self.real[component]) + gangs, now_s=now_s)
        needed = sum(g.pods_expected - g.pods_scheduled for g in self.real[component])
        for _ in range(math.ceil(needed / self.settings.pods_per_node)):
            self._new_node(ready_at_s=now_s - self.settings.node_provisioning_s)
        self._schedule(now_s)
        for gang in self.real[component]:
            if gang.all_placed_s is not None:
                gang.all_placed_s = min(gang.all_placed_s, now_s - self.settings.gang_startup_s)

    # -- actions -----------------------------------------------------------------------------

    def set_replicas(self, component: str, gangs: int, *, now_s: float) -> bool:
        """Scale the component's LWS to `gangs` groups; highest group indexes go first."""
        real = self.real[component]
        if gangs == len(real):
            return False
        while len(real) < gangs:
            real.append(self._new_gang(component, len(real), balloon=False, now_s=now_s))
        while len(real) > gangs:
            self._release(real.pop())
        return True

    def set_balloons(self, component: str, gangs: int, *, now_s: float) -> None:
        """Hold `gangs` balloon gangs for the component; unplaced ones are removed first."""
        held = self.balloons[component]
        while len(held) < gangs:
            held.append(self._new_gang(component, len(held), balloon=True, now_s=now_s))
        while len(held) > gangs:
            pending = [g for g in held if g.pods_scheduled == 0]
            victim = pending[-1] if pending else held[-1]
            held.remove(victim)
            self._release(victim)

    def remove_gang(self, component: str, group_index: int) -> None:
        """Delete one real gang (a rolled-back partial gang), keeping the others' indexes."""
        real = self.real[component]
        for gang in real:
            if gang.group_index == group_index:
                real.remove(gang)
                self._release(gang)
                return

    # -- time --------------------------------------------------------------------------------

    def step(self, now_s: float) -> None:
        self._schedule(now_s)
        self._autoscale_nodes(now_s)

    def _schedule(self, now_s: float) -> None:
        pending = sorted(
            (g for gangs in self.real.values() for g in gangs if g.all_placed_s is None),
            key=lambda g: g.serial,
        )
        for gang in pending:
            if self.gang_scheduling:
                self._place_whole(gang, now_s=now_s, may_preempt=True)
            else:
                self._place_pods(gang, now_s=now_s)
        balloons = sorted(
            (g for gangs in self.balloons.values() for g in gangs if g.all_placed_s is None),
            key=lambda g: g.serial,
        )
        for gang in balloons:
            self._place_whole(gang, now_s=now_s, may_preempt=False)

    def _ready_nodes(self, now_s: float) -> list[Node]:
        return [n for n in self.nodes.values() if n.is_ready(now_s)]

    def _place_whole(self, gang: Gang, *, now_s: float, may_preempt: bool) -> bool:
        missing = gang.pods_expected - gang.pods_scheduled
        free = sum(n.free_slots for n in self._ready_nodes(now_s))
        if free < missing and may_preempt:
            free = self._preempt_balloons(gang, missing - free, now_s=now_s)
        if free < missing:
            if gang.pending_since_s is None:
                gang.pending_since_s = now_s
            return False
        self._place_pods(gang, now_s=now_s)
        return True

    def _preempt_balloons(self, gang: Gang, short: int, *, now_s: float) -> int:
        """Evict placed balloon gangs (the gang's own component first) until `short` slots
        are free; a balloon gang that loses a member is useless, so it goes whole and is
        recreated pending. Returns the free slots afterwards."""
        order = [gang.component, *sorted(c for c in self.balloons if c != gang.component)]
        placed_slots = sum(b.pods_scheduled for c in order for b in self.balloons[c])
        if placed_slots < short:
            return sum(n.free_slots for n in self._ready_nodes(now_s))
        freed = 0
        for component in order:
            for balloon in list(self.balloons[component]):
                if freed >= short:
                    break
                if balloon.pods_scheduled == 0:
                    continue
                freed += balloon.pods_scheduled
                self._release(balloon)
                balloon.placements = []
                balloon.all_placed_s = None
                balloon.pending_since_s = now_s
                self.preemptions += 1
        return sum(n.free_slots for n in self._ready_nodes(now_s))

    def _place_pods(self, gang: Gang, *, now_s: float) -> None:
        # in LWS pod order, leader first: a gang with any pod placed has its leader placed
        for node in self._ready_nodes(now_s):
            while node.free_slots > 0 and gang.pods_scheduled < gang.pods_expected:
                node.used_slots += 1
                node.empty_since_s = None
                gang.placements.append(node.name)
            if gang.pods_scheduled == gang.pods_expected:
                break
        if gang.pods_scheduled == gang.pods_expected:
            gang.all_placed_s = now_s
            gang.pending_since_s = None
        elif gang.pending_since_s is None:
            gang.pending_since_s = now_s

    def _autoscale_nodes(self, now_s: float) -> None:
        settings = self.settings
        pending_pods = sum(
            g.pods_expected - g.pods_scheduled
            for group in (*self.real.values(), *self.balloons.values())
            for g in group
        )
        # Like the cluster-autoscaler, which first simulates the pending pods onto the nodes
        # there are (ready or coming up) and asks nodes only for the pods left over: a free
        # slot counts even when a gang scheduler leaves it empty because the gang does not
        # fit whole yet, since the gang takes it once the new nodes are up.
        free = sum(n.free_slots for n in self.nodes.values())
        short = pending_pods - free
        if short > 0:
            wanted = math.ceil(short / settings.pods_per_node)
            if settings.max_nodes is not None:
                wanted = min(wanted, settings.max_nodes - len(self.nodes))
            for _ in range(max(wanted, 0)):
                self._new_node(ready_at_s=now_s + settings.node_provisioning_s)
        for node in list(self.nodes.values()):
            if not node.is_ready(now_s) or node.used_slots > 0:
                continue
            if node.empty_since_s is None:
                node.empty_since_s = now_s
            elif now_s - node.empty_since_s >= settings.node_idle_timeout_s:
                del self.nodes[node.name]

    # -- bookkeeping -------------------------------------------------------------------------

    def _new_gang(self, component: str, index: int, *, balloon: bool, now_s: float) -> Gang:
        return Gang(
            component=component,
            group_index=index,
            pods_expected=self.settings.pods_per_gang,
            balloon=balloon,
            created_s=now_s,
            serial=next(self._serial),
            pending_since_s=now_s,
        )

    def _new_node(self, *, ready_at_s: float) -> Node:
        node = Node(
            name=f"node-{next(self._node_names)}",
            slots=self.settings.pods_per_node,
            ready_at_s=ready_at_s,
        )
        self.nodes[node.name] = node
        return node

    def _release(self, gang: Gang) -> None:
        for name in gang.placements:
            node = self.nodes.get(name)
            if node is not None:
                node.used_slots -= 1
        gang.placements = []

    # -- what the adapters would see ----------------------------------------------------------

    def ready_gangs(self, component: str, now_s: float) -> int:
        startup = self.settings.gang_startup_s
        return sum(1 for g in self.real[component] if g.is_ready(now_s, startup))

    def starting_gangs(self, component: str, now_s: float) -> int:
        startup = self.settings.gang_startup_s
        return sum(
            1
            for g in self.real[component]
            if g.all_placed_s is not None and not g.is_ready(now_s, startup)
        )

    def balloon_gangs_placed(self, component: str) -> int:
        return sum(1 for g in self.balloons[component] if g.all_placed_s is not None)

    def balloon_gangs_ordered(self, component: str) -> int:
        """Balloon gangs the policy holds for the component, placed or still Pending."""
        return len(self.balloons[component])

    def partial_gpus(self) -> int:
        """GPUs held by pods of real gangs that are only partly placed (serving nothing)."""
        pods = sum(g.pods_scheduled for gs in self.real.values() for g in gs if g.is_partial)
        return pods * self.settings.gpus_per_pod

    def node_gpus(self) -> int:
        """GPUs of every node that exists (provisioning ones are billed too)."""
        return len(self.nodes) * self.settings.gpus_per_node

    def free_slots_now(self, now_s: float, *, count_balloons: bool) -> list[int]:
        """Free pod slots per ready node; balloon pods count as free when asked."""
        free = {n.name: n.free_slots for n in self._ready_nodes(now_s)}
        if count_balloons:
            for gangs in self.balloons.values():
                for gang in gangs:
                    for name in gang.placements:
                        if name in free:
                            free[name] += 1
        return list(free.values())
