"""Discovery: opted-in LWS objects -> components with their policy (or its problems), grouped
into deployments and checked together.

An LWS is scaled through its own `/scale`, unless another controller owns it. An LWS that
a DisaggregatedSet role makes is scaled through the role's DisaggregatedSetRoleScaler
(`scaling.mode: External`); any other controller's LWS holds.

Pure: LWS (and RoleScaler) dicts in, `DiscoveredComponent` values out. A bad annotation
never raises; the component carries its problems, the service holds it and a Warning Event
names each problem.
A `ParseCache` may carry each LWS's parsed policy and gang shape from one call to the next:
the service discovers on every tick, and an LWS changes only with its resourceVersion.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.adapters.kube_objects import (
    DS_KIND,
    DS_ROLE_LABEL,
    LWS_KIND,
    Obj,
    ScaleTarget,
    annotations_of,
    labels,
    meta,
)
from autoscaler.core.model import ComponentKey, DeploymentKey
from autoscaler.core.policy import (
    PREFIX,
    Policy,
    PolicyError,
    PolicyProblem,
    annotation_count,
    deployment_key,
    is_enabled,
    parse_policy,
    validate_deployment,
)
from autoscaler.core.shape import GangShape, QuantityError, gang_shape_from_lws


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
        # read as the parser reads them: `"0.0"` is 0 to both (`int("0.0")` failed, so an
        # LWS's `max-buffer: "0.0"` under a default `min-buffer` of 1 was refused)
        low, high = annotation_count(merged[lower]), annotation_count(merged[upper])
        if low is None or high is None:  # a YAML null or list under the key
            continue  # the LWS's own value is bad; parsing names it
        if min(low, high) < 0:
            continue  # likewise: no default is moved to match a value parsing refuses
        if low > high:
            if set_upper:
                merged[lower] = str(high)
            else:
                merged[upper] = str(low)
    return merged


@dataclass(frozen=True, slots=True)
class Controller:
    """The owner reference marked `controller: true` on an object."""

    kind: str
    name: str
    uid: str | None


def controller_of(obj: Mapping[str, Any]) -> Controller | None:
    metadata = obj.get("metadata")
    owners = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    if not isinstance(owners, list):  # absent, or a manifest's mistake read by `check`
        return None
    owner = next(
        (o for o in owners if isinstance(o, Mapping) and o.get("controller") is True), None
    )
    if owner is None:
        return None
    uid = owner.get("uid")
    return Controller(str(owner.get("kind", "?")), str(owner.get("name", "?")), uid and str(uid))


def role_of(lws: Obj, owner: Controller | None) -> str | None:
    """The DisaggregatedSet role an LWS was made for, or None if it is not a role's LWS."""
    if owner is None or owner.kind != DS_KIND:
        return None
    role = labels(lws).get(DS_ROLE_LABEL)
    return str(role) if role else None


def role_scaler_name(set_name: str, role: str) -> str:
    """The RoleScaler the DisaggregatedSet controller creates for an External role."""
    return f"{set_name}-{role}"


def owner_defaults(lws: Obj) -> dict[str, str]:
    """Annotation defaults an LWS takes from its owner: a DisaggregatedSet role's LWS
    defaults its deployment to the DisaggregatedSet's name, since the role LWS names carry
    a revision and change at every rollout."""
    owner = controller_of(lws)
    if owner is not None and owner.kind == DS_KIND:
        return {PREFIX + "deployment": owner.name}
    return {}


def controller_problem(obj: Mapping[str, Any]) -> PolicyProblem | None:
    """The problem of an LWS that a controller other than a DisaggregatedSet owns, or None.

    A controller that creates an LWS writes its `spec.replicas` from its own spec on every
    reconcile. Writes to the LWS's `/scale` would be reverted within seconds, and each write
    and revert starts or deletes a gang. The scaler's foreign-writer hold would only slow
    that cycle down, so such an LWS is never scaled. A DisaggregatedSet's LWS is resolved
    against the role's RoleScaler in `discover`.
    """
    owner = controller_of(obj)
    if owner is None or owner.kind == DS_KIND:
        return None
    return controlled_by(owner.kind, owner.name)


def controlled_by(kind: str, name: str) -> PolicyProblem:
    """An opted-in LWS whose replicas `kind` `name` sets (`controller_problem`)."""
    message = (
        f"this LWS is controlled by {kind} {name}, which sets its spec.replicas: scaling it "
        "here would fight that controller, so the component holds"
    )
    return PolicyProblem(PREFIX + "enabled", None, message)


def static_role(
    ds_name: str, role: str | None, *, scalers_error: str | None = None
) -> PolicyProblem:
    """An opted-in LWS of a DisaggregatedSet role that has no RoleScaler to write."""
    if role is None:
        message = (
            f"this LWS is controlled by DisaggregatedSet {ds_name} but has no "
            f"{DS_ROLE_LABEL} label, so its DisaggregatedSetRoleScaler is unknown; the "
            "component holds"
        )
    else:
        message = (
            f"this LWS is role {role} of DisaggregatedSet {ds_name}, which sets its "
            "spec.replicas, and there is no DisaggregatedSetRoleScaler "
            f"{role_scaler_name(ds_name, role)} to scale it through: set "
            "`scaling.mode: External` on the role; until then the component holds"
        )
    if scalers_error:
        message += f" (DisaggregatedSetRoleScalers cannot be read: {scalers_error})"
    return PolicyProblem(PREFIX + "enabled", None, message)


def stale_role_scalers(ds_name: str, role: str | None, *, why: str) -> PolicyProblem:
    """An opted-in LWS of a DisaggregatedSet role while the RoleScalers' view is stale."""
    return PolicyProblem(
        PREFIX + "enabled",
        None,
        f"this LWS is role {role or '(unlabelled)'} of DisaggregatedSet {ds_name}, scaled "
        f"through its DisaggregatedSetRoleScaler, whose view is stale ({why}): its count "
        "may no longer be true; the component holds until they are listed again",
    )


def _controls(owner: Controller, obj: Obj) -> bool:
    """`obj` (a RoleScaler) is controlled by the same DisaggregatedSet as the LWS."""
    its = controller_of(obj)
    if its is None or its.kind != owner.kind or its.name != owner.name:
        return False
    return owner.uid is None or its.uid is None or its.uid == owner.uid


def parse_lws(
    lws: Obj, *, key: ComponentKey, default_annotations: Mapping[str, str] | None = None
) -> ParsedLws:
    """What the LWS's own annotations and templates say, over the operator's defaults and
    its owner's (`owner_defaults`)."""
    problems: list[PolicyProblem] = []
    policy: Policy | None = None
    defaults = {**(default_annotations or {}), **owner_defaults(lws)}
    try:
        policy = parse_policy(with_defaults(annotations_of(lws), defaults), lws_name=key.lws)
    except PolicyError as err:
        problems.extend(err.problems)
    shape: GangShape | None = None
    try:
        shape = gang_shape_from_lws(lws)
    except (QuantityError, ValueError, TypeError, ArithmeticError) as err:
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
    spec_gangs: int  # the scale target's spec.replicas
    resource_version: str | None  # the scale target's, for a conditional write
    uid: str | None  # the LWS's
    scale_target: ScaleTarget

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
    owner = controller_of(item["lws"])
    fallback = owner.name if owner is not None and owner.kind == DS_KIND else key.lws
    name = raw.strip() if isinstance(raw, str) and raw.strip() else fallback
    return DeploymentKey(key.namespace, name)


def _scale_through_owner(
    item: dict[str, Any],
    *,
    role_scalers: Mapping[tuple[str, str], Obj],
    scalers_error: str | None,
    scalers_stale: str | None = None,
) -> None:
    """Point an owned LWS's scale target at its role's RoleScaler, or give it its problem
    (and no policy: the component and its deployment hold)."""
    lws, key = item["lws"], item["key"]
    owner = controller_of(lws)
    if owner is None:
        return
    if owner.kind != DS_KIND:
        item["problems"].insert(0, controlled_by(owner.kind, owner.name))
        item["policy"] = None
        return
    role = role_of(lws, owner)
    if scalers_stale is not None:
        item["problems"].insert(0, stale_role_scalers(owner.name, role, why=scalers_stale))
        item["policy"] = None
        return
    scaler = None
    if role is not None:
        scaler = role_scalers.get((key.namespace, role_scaler_name(owner.name, role)))
    if scaler is None or not _controls(owner, scaler):
        item["problems"].insert(0, static_role(owner.name, role, scalers_error=scalers_error))
        item["policy"] = None
        return
    scaler_meta = meta(scaler)
    item["scale_target"] = ScaleTarget.role_scaler(str(scaler_meta.get("name")))
    item["spec_gangs"] = int((scaler.get("spec") or {}).get("replicas") or 0)
    item["resource_version"] = scaler_meta.get("resourceVersion")


def _one_lws_per_role_scaler(found: Mapping[ComponentKey, dict[str, Any]]) -> None:
    """Hold every LWS of a role that has more than one (a DisaggregatedSet rolling out a new
    revision, or running several slices): the RoleScaler's count is spread over them by the
    DisaggregatedSet controller, so no one of them is the component."""
    by_target: dict[tuple[str, ScaleTarget], list[ComponentKey]] = {}
    for key, item in found.items():
        if item["scale_target"].kind != LWS_KIND:
            by_target.setdefault((key.namespace, item["scale_target"]), []).append(key)
    for (_, target), keys in by_target.items():
        if len(keys) < 2:
            continue
        names = ", ".join(k.lws for k in sorted(keys))
        for key in keys:
            found[key]["problems"].insert(
                0,
                PolicyProblem(
                    PREFIX + "enabled",
                    None,
                    f"{len(keys)} LWS share {target} ({names}): a DisaggregatedSet rollout or "
                    "more than one slice; the component holds until one LWS remains",
                ),
            )
            found[key]["policy"] = None


def discover(
    lws_objects: Iterable[Obj],
    *,
    namespaces: Collection[str] | None = None,
    default_annotations: Mapping[str, str] | None = None,
    cache: ParseCache | None = None,
    role_scalers: Iterable[Obj] = (),
    role_scalers_error: str | None = None,
    role_scalers_stale: str | None = None,
) -> dict[ComponentKey, DiscoveredComponent]:
    """Every LWS with `gang-autoscaler.io/enabled: "true"` in `namespaces` (None: all).

    `default_annotations` (the operator's defaults, e.g. the chart's buffer bounds) apply
    where the LWS does not set the annotation itself. `role_scalers` are the
    DisaggregatedSetRoleScalers seen; `role_scalers_error` says why there are none to see
    (their API is not served, or not readable), for the problem of a role's LWS;
    `role_scalers_stale` says why what was seen of them can no longer be trusted, and holds
    every role's LWS (and only those).
    """
    scalers = {
        (str(meta(s).get("namespace", "")), str(meta(s).get("name", ""))): s for s in role_scalers
    }
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
            "scale_target": ScaleTarget.lws(key.lws),
        }
        _scale_through_owner(
            found[key],
            role_scalers=scalers,
            scalers_error=role_scalers_error,
            scalers_stale=role_scalers_stale,
        )

    if cache is not None:
        cache.keep_only(seen)
    _one_lws_per_role_scaler(found)

    by_deployment: dict[DeploymentKey, dict[ComponentKey, Policy | None]] = {}
    for key, item in found.items():
        by_deployment.setdefault(_deployment_of(key, item), {})[key] = item["policy"]
    for dep, members in by_deployment.items():
        # A member whose own policy or gang shape cannot be read leaves its partners without
        # it: planning them alone would scale a deployment that is missing a component.
        broken = sorted(
            k.lws
            for k, policy in members.items()
            if policy is None or found[k]["shape"] is None or found[k]["problems"]
        )
        if broken:
            # The deployment holds as a whole; say why, rather than "no decode component".
            for key in members:
                if key.lws not in broken:
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
