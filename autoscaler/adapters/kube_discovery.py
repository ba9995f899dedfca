"""Discovery: opted-in LWS objects -> components with their policy (or its problems), grouped
into deployments and checked together.

Pure: LWS dicts in, `DiscoveredComponent` values out. A bad annotation never raises; the
component carries its problems, the service holds it and a Warning Event names each problem.
A `ParseCache` may carry each LWS's parsed policy and gang shape from one call to the next:
the service discovers on every tick, and an LWS changes only with its resourceVersion.
"""

from __future__ import annotations

import hashlib
import json
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

DISAGGREGATED_SET_KIND = "DisaggregatedSet"


@dataclass(frozen=True, slots=True)
class ParsedLws:
    """What one LWS object version's own annotations and templates say."""

    policy: Policy | None
    problems: tuple[PolicyProblem, ...]
    shape: GangShape | None
    template: str


def template_digest(lws: Obj) -> str:
    """A short digest of `spec.leaderWorkerTemplate`: what every gang runs (images,
    arguments, resources, pods per gang). `replicas` and the annotations on the LWS itself
    are outside it, so scaling or retuning the policy keeps it; an edit that rolls the gangs
    changes it."""
    template = (lws.get("spec") or {}).get("leaderWorkerTemplate")
    text = json.dumps(template, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# Bounds that come in pairs, (lower, upper): a default for one side yields to the other side
# when the LWS sets only that one.
_BOUND_PAIRS = ((PREFIX + "min-buffer", PREFIX + "max-buffer"),)


def with_defaults(own: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
    """The LWS's annotations over the operator's defaults. A default never makes the LWS's
    own annotations invalid: with a default `min-buffer` of 1, an LWS that sets only
    `max-buffer: "0"` (no balloons) gets a minimum of 0, not a min-over-max problem."""
    merged = {**defaults, **own}
    for lower, upper in _BOUND_PAIRS:
        set_lower, set_upper = lower in own, upper in own
        if set_lower == set_upper or lower not in merged or upper not in merged:
            continue
        try:
            low, high = int(merged[lower]), int(merged[upper])
        except ValueError:
            continue  # the LWS's own value is bad; parsing names it
        if min(low, high) < 0:
            continue  # likewise: no default is moved to match a value parsing refuses
        if low > high:
            if set_upper:
                merged[lower] = str(high)
            else:
                merged[upper] = str(low)
    return merged


def controller_problem(obj: Mapping[str, Any]) -> PolicyProblem | None:
    """The problem of an LWS that another controller owns, or None.

    A controller that creates an LWS (a DisaggregatedSet role, or another operator) writes
    the LWS's `spec.replicas` from its own spec on every reconcile. Writes to the LWS's
    `/scale` would be reverted within seconds, and each write and revert starts or deletes a
    gang. The scaler's foreign-writer hold would only slow that cycle down, so such an LWS
    is never scaled.
    """
    owners = (obj.get("metadata") or {}).get("ownerReferences") or ()
    owner = next(
        (o for o in owners if isinstance(o, Mapping) and o.get("controller") is True), None
    )
    if owner is None:
        return None
    return controlled_by(str(owner.get("kind", "?")), str(owner.get("name", "?")))


def controlled_by(kind: str, name: str) -> PolicyProblem:
    """An opted-in LWS whose replicas `kind` `name` sets (`controller_problem`)."""
    message = (
        f"this LWS is controlled by {kind} {name}, which sets its spec.replicas: scaling it "
        "here would fight that controller, so the component holds"
    )
    if kind == DISAGGREGATED_SET_KIND:
        message += (
            "; a DisaggregatedSet role is scaled through its DisaggregatedSetRoleScaler "
            "(scaling.mode: External), which gang-autoscaler does not write"
        )
    return PolicyProblem(PREFIX + "enabled", None, message)


def parse_lws(
    lws: Obj, *, key: ComponentKey, default_annotations: Mapping[str, str] | None = None
) -> ParsedLws:
    problems: list[PolicyProblem] = []
    policy: Policy | None = None
    owned = controller_problem(lws)
    if owned is not None:
        # Not ours to scale, whatever the annotations say: without a policy the component
        # and its deployment hold, as for annotations that do not parse.
        problems.append(owned)
    else:
        try:
            policy = parse_policy(
                with_defaults(annotations_of(lws), default_annotations or {}), lws_name=key.lws
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
    return ParsedLws(policy, tuple(problems), shape, template_digest(lws))


class ParseCache:
    """`ParsedLws` by (uid, resourceVersion, default annotations), kept between calls of
    `discover` for the objects the last call saw. Parsing every LWS on every tick was about
    half of a tick's CPU at a thousand deployments (docs/performance.md)."""

    def __init__(self) -> None:
        self._parsed: dict[tuple[object, ...], ParsedLws] = {}
        self.hits = 0
        self.misses = 0

    def parse(
        self, lws: Obj, *, key: ComponentKey, default_annotations: Mapping[str, str] | None
    ) -> tuple[ParsedLws, tuple[object, ...] | None]:
        """The parsed LWS and its cache key (None: the object has no uid or version)."""
        metadata = meta(lws)
        uid, version = metadata.get("uid"), metadata.get("resourceVersion")
        if not uid or not version:
            return parse_lws(lws, key=key, default_annotations=default_annotations), None
        cache_key = (uid, version, tuple(sorted((default_annotations or {}).items())))
        found = self._parsed.get(cache_key)
        if found is None:
            self.misses += 1
            found = parse_lws(lws, key=key, default_annotations=default_annotations)
            self._parsed[cache_key] = found
        else:
            self.hits += 1
        return found, cache_key

    def keep_only(self, cache_keys: Collection[tuple[object, ...]]) -> None:
        """Forget the versions the last call did not see (updated or deleted objects)."""
        self._parsed = {k: v for k, v in self._parsed.items() if k in cache_keys}

    def __len__(self) -> int:
        return len(self._parsed)


@dataclass(frozen=True, slots=True)
class DiscoveredComponent:
    """One opted-in LWS as the autoscaler understands it."""

    key: ComponentKey
    lws: Mapping[str, Any]  # the object as last seen, for owner references and Events
    policy: Policy | None  # None: its annotations are invalid, or another controller owns it
    problems: tuple[PolicyProblem, ...]  # its own and its deployment's; empty when usable
    shape: GangShape | None  # None when the templates' resources cannot be read
    template: str  # `template_digest`; a learned capacity per gang holds for one template
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
    cache: ParseCache | None = None,
) -> dict[ComponentKey, DiscoveredComponent]:
    """Every LWS with `gang-autoscaler.io/enabled: "true"` in `namespaces` (None: all).

    `default_annotations` (the operator's defaults, e.g. the chart's buffer bounds) apply
    where the LWS does not set the annotation itself.
    """
    found: dict[ComponentKey, dict[str, Any]] = {}
    seen: set[tuple[object, ...]] = set()
    for lws in lws_objects:
        metadata = meta(lws)
        key = ComponentKey(str(metadata.get("namespace", "")), str(metadata.get("name", "")))
        if namespaces is not None and key.namespace not in namespaces:
            continue
        if not is_enabled(annotations_of(lws)):
            continue
        if cache is None:
            parsed = parse_lws(lws, key=key, default_annotations=default_annotations)
        else:
            parsed, cache_key = cache.parse(lws, key=key, default_annotations=default_annotations)
            if cache_key is not None:
                seen.add(cache_key)
        policy = parsed.policy
        found[key] = {
            "key": key,
            "lws": lws,
            "policy": policy,
            "problems": list(parsed.problems),  # the deployment's own problems are added below
            "shape": parsed.shape,
            "template": parsed.template,
            "deployment": deployment_key(key, policy) if policy else None,
            "spec_gangs": _spec_gangs(lws),
            "resource_version": metadata.get("resourceVersion"),
            "uid": metadata.get("uid"),
        }

    if cache is not None:
        cache.keep_only(seen)

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
