"""Readable builders for core inputs, so each table row says only what matters to it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoscaler.core.model import (
    ClusterObservation,
    ComponentKey,
    ComponentObservation,
    Forecast,
    GangStatus,
    NodeCapacity,
    Observations,
    Signals,
)
from autoscaler.core.policy import PREFIX, Policy, parse_policy
from autoscaler.core.shape import GangShape, PodShape

GIB = 2**30


def pod(gpus: int = 8, cpu_m: int = 16_000, memory_gib: int = 64) -> PodShape:
    requests = {"nvidia.com/gpu": gpus, "cpu": cpu_m, "memory": memory_gib * GIB}
    return PodShape(requests=requests, limits={"nvidia.com/gpu": gpus})


def shape(pods_per_gang: int = 2, gpus: int = 8, topology_key: str | None = None) -> GangShape:
    return GangShape(
        leader=pod(gpus), worker=pod(gpus), pods_per_gang=pods_per_gang, topology_key=topology_key
    )


def node(name: str, gpus: int = 8, **labels: str) -> NodeCapacity:
    return NodeCapacity(
        name=name,
        free={"nvidia.com/gpu": gpus, "cpu": 96_000, "memory": 1024 * GIB},
        labels=labels,
    )


def exclusive_node(name: str, namespace: str, gpus: int = 8, **labels: str) -> NodeCapacity:
    """A node running a gang of `namespace` placed exclusively by zone, with `gpus` free."""
    return replace(
        node(name, gpus=gpus, **labels),
        lws_namespaces=frozenset({namespace}),
        exclusive_lws=frozenset({(namespace, "zone")}),
    )


def policy(**fields: Any) -> Policy:
    """A Policy from annotation-style keyword names (min_replicas=2 -> min-replicas: "2")."""
    annotations = {PREFIX + "enabled": "true"}
    for name, value in fields.items():
        annotations[PREFIX + name.replace("_", "-")] = str(value)
    return parse_policy(annotations, lws_name="unused")


def ready_gangs(n: int, pods_per_gang: int = 2) -> tuple[GangStatus, ...]:
    return tuple(GangStatus(i, pods_per_gang, pods_per_gang, pods_per_gang) for i in range(n))


def obs(
    lws: str = "llm",
    *,
    ready: int = 2,
    spec: int | None = None,
    waiting: float | None = 0.0,
    kv: float | None = 0.5,
    demand: float | None = None,
    gangs: tuple[GangStatus, ...] | None = None,
    gang_shape: GangShape | None = None,
    namespace: str = "serving",
    balloons: int = 0,
) -> ComponentObservation:
    return ComponentObservation(
        key=ComponentKey(namespace, lws),
        spec_gangs=ready if spec is None else spec,
        gangs=ready_gangs(ready) if gangs is None else gangs,
        signals=Signals(waiting_requests=waiting, kv_usage_fraction=kv, demand=demand),
        shape=gang_shape or shape(),
        balloon_gangs=balloons,
    )


def observations(
    *components: ComponentObservation, nodes: tuple[NodeCapacity, ...] = (), can_grow: bool = True
) -> Observations:
    return Observations(
        components={c.key: c for c in components},
        cluster=ClusterObservation(nodes=nodes, can_grow=can_grow),
    )


def forecast(point: float, upper: float | None = None, horizon_s: float = 300) -> Forecast:
    return Forecast(point=point, upper=point if upper is None else upper, horizon_s=horizon_s)
