"""Discovery: opted-in LWS objects -> components with their policy (or its problems), grouped
into deployments and checked together.

Pure: LWS dicts in, `DiscoveredComponent` values out. A bad annotation never raises; the
component carries its problems, the service holds it and a Warning Event names each problem.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.adapters.kube_objects import Obj, annotations_of, meta
from autoscaler.core.model import ComponentKey, DeploymentKey
from autoscaler.core.policy import (
    PREFIX,
    Policy,
    PolicyError,
    PolicyProblem,
    deployment_key,
    is_enabled,
    parse_policy,
    validate_deployment,
)
from autoscaler.core.shape import GangShape, QuantityError, gang_shape_from_lws


@dataclass(frozen=True, slots=True)
class DiscoveredComponent:
    """One opted-in LWS as the autoscaler understands it."""

    key: ComponentKey
    lws: Mapping[str, Any]  # the object as last seen, for owner references and Events
    policy: Policy | None  # None when its own annotations are invalid
    problems: tuple[PolicyProblem, ...]  # its own and its deployment's; empty when usable
    shape: GangShape | None  # None when the templates' resources cannot be read
    deployment: DeploymentKey | None
    spec_gangs: int
    resource_version: str | None
    uid: str | None

    @property
    def usable(self) -> bool:
        return self.policy is not None and self.shape is not None and not self.problems


def _spec_gangs(lws: Obj) -> int:
    # Kubernetes defaults spec.replicas to 1 when unset.
    replicas = (lws.get("spec") or {}).get("replicas")
    return 1 if replicas is None else int(replicas)


def _deployment_of(key: ComponentKey, item: Mapping[str, Any]) -> DeploymentKey:
    """The deployment a component belongs to, read directly from the annotation when its
    policy did not parse, so a broken component still holds its partners."""
    if item["deployment"] is not None:
        deployment: DeploymentKey = item["deployment"]
        return deployment
    raw = annotations_of(item["lws"]).get(PREFIX + "deployment")
    name = raw.strip() if isinstance(raw, str) and raw.strip() else key.lws
    return DeploymentKey(key.namespace, name)


def discover(
    lws_objects: Iterable[Obj],
    *,
    namespaces: Collection[str] | None = None,
    default_annotations: Mapping[str, str] | None = None,
) -> dict[ComponentKey, DiscoveredComponent]:
    """Every LWS with `gang-autoscaler.io/enabled: "true"` in `namespaces` (None: all).

    `default_annotations` (the operator's defaults, e.g. the chart's buffer bounds) apply
    where the LWS does not set the annotation itself.
    """
    found: dict[ComponentKey, dict[str, Any]] = {}
    for lws in lws_objects:
        metadata = meta(lws)
        key = ComponentKey(str(metadata.get("namespace", "")), str(metadata.get("name", "")))
        if namespaces is not None and key.namespace not in namespaces:
            continue
        if not is_enabled(annotations_of(lws)):
            continue
        problems: list[PolicyProblem] = []
        policy: Policy | None = None
        try:
            policy = parse_policy(
                {**(default_annotations or {}), **annotations_of(lws)}, lws_name=key.lws
            )
        except PolicyError as err:
            problems.extend(err.problems)
        shape: GangShape | None = None
        try:
            shape = gang_shape_from_lws(lws)
        except (QuantityError, ValueError, TypeError) as err:
            problems.append(
                PolicyProblem("spec.leaderWorkerTemplate", None, f"cannot read gang shape: {err}")
            )
        found[key] = {
            "key": key,
            "lws": lws,
            "policy": policy,
            "problems": problems,
            "shape": shape,
            "deployment": deployment_key(key, policy) if policy else None,
            "spec_gangs": _spec_gangs(lws),
            "resource_version": metadata.get("resourceVersion"),
            "uid": metadata.get("uid"),
        }

    by_deployment: dict[DeploymentKey, dict[ComponentKey, Policy | None]] = {}
    for key, item in found.items():
        by_deployment.setdefault(_deployment_of(key, item), {})[key] = item["policy"]
    for dep, members in by_deployment.items():
        broken = sorted(k.lws for k, policy in members.items() if policy is None)
        if broken:
            # The deployment holds as a whole; say why, rather than "no decode component".
            for key, policy in members.items():
                if policy is not None:
                    found[key]["problems"].append(
                        PolicyProblem(
                            PREFIX + "deployment",
                            dep.name,
                            f"component {', '.join(broken)} of this deployment has a policy "
                            "problem; the whole deployment holds",
                        )
                    )
            continue
        valid = {k: p for k, p in members.items() if p is not None}
        for key, cross in validate_deployment(valid).items():
            found[key]["problems"].extend(cross)

    return {
        key: DiscoveredComponent(**{**item, "problems": tuple(item["problems"])})
        for key, item in sorted(found.items())
    }
