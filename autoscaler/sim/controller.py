"""What a policy sees each tick and what it may do: the interface between the simulated
cluster and the policies compared (`gang`, `reactive`, `static`, `oracle`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from autoscaler.core.model import GangStatus, Signals


@dataclass(frozen=True, slots=True)
class ComponentSnapshot:
    name: str
    spec_gangs: int
    ready_gangs: int
    gangs: tuple[GangStatus, ...]
    signals: Signals
    balloon_gangs: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    now_s: float
    step: int
    components: Mapping[str, ComponentSnapshot]
    # free pod slots per ready node, balloon pods counted as free (a real gang preempts them)
    free_slots_per_node: tuple[int, ...]
    can_grow: bool
    # the demand signal per component, one value per step so far (what Prometheus stored)
    demand_history: Mapping[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class Action:
    desired_gangs: int
    balloon_gangs: int = 0
    remove_groups: tuple[int, ...] = ()  # partial gangs rolled back (group indexes)
    forecast_point: float | None = None
    forecast_upper: float | None = None
    # the demand one gang serves at target that the policy planned with (set or learned)
    capacity_per_gang: float | None = None


class Controller(Protocol):
    name: str
    gang_scheduling: bool

    def initial_gangs(self) -> Mapping[str, int]:
        """Gangs already serving at t=0."""

    def decide(self, snapshot: Snapshot) -> Mapping[str, Action]:
        """One control-loop tick."""
