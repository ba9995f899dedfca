"""Gang shape: what one LWS replica needs from the cluster, pod by pod.

Resources are integers in base units so that packing arithmetic is exact: CPU in
millicores, memory and storage in bytes, extended resources (``nvidia.com/gpu``) in units.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, DecimalException
from typing import Any

Resources = Mapping[str, int]

EXCLUSIVE_TOPOLOGY_ANNOTATION = "leaderworkerset.sigs.k8s.io/exclusive-topology"

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)


_MAX_QUANTITY = Decimal(2**63 - 1)


class QuantityError(ValueError):
    """A Kubernetes resource quantity that cannot be parsed."""


def parse_quantity(resource: str, text: str | int | float) -> int:
    """Parse a Kubernetes quantity into the base unit used for `resource`.

    CPU becomes millicores (rounded up, as the scheduler does); everything else becomes
    whole base units (rounded up).
    """
    raw = str(text).strip()
    match = _QUANTITY.match(raw)
    if not match:
        raise QuantityError(f"{resource}: {raw!r} is not a Kubernetes quantity")
    try:
        number = Decimal(match.group(1)) * _SUFFIXES[match.group(2) or ""]
        if resource == "cpu":
            number *= 1000
    except DecimalException as err:  # InvalidOperation, and Overflow for "1e999999"
        raise QuantityError(f"{resource}: {raw!r} is not a Kubernetes quantity") from err
    if number < 0:
        raise QuantityError(f"{resource}: {raw!r} is negative")
    # The API server stores quantities as int64 (milli-units for CPU); anything larger is no
    # real request, and converting "1e999990" to an int would take a million-digit integer.
    if number > _MAX_QUANTITY:
        raise QuantityError(f"{resource}: {raw!r} is larger than Kubernetes allows")
    return int(number.to_integral_value(rounding="ROUND_CEILING"))


def add_resources(a: Resources, b: Resources) -> dict[str, int]:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, 0) + amount
    return out


def subtract_resources(a: Resources, b: Resources) -> dict[str, int]:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, 0) - amount
    return out


def fits(request: Resources, free: Resources) -> bool:
    """True when every requested resource is available (a resource absent from `free` is 0)."""
    return all(amount <= 0 or free.get(name, 0) >= amount for name, amount in request.items())


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str | None = None
    operator: str = "Equal"  # Equal | Exists
    value: str | None = None
    effect: str | None = None  # None matches every effect

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        if self.effect and self.effect != effect:
            return False
        if self.operator == "Exists":
            return self.key is None or self.key == key
        return self.key == key and (self.value or "") == value


@dataclass(frozen=True, slots=True)
class PodShape:
    """One member pod of a gang: its requests, limits and placement constraints."""

    requests: Resources
    limits: Resources = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    # Required node affinity, kept as the raw Kubernetes object so balloon pods can copy it.
    affinity: Mapping[str, Any] | None = None
    # Raw tolerations, for balloon pods to copy verbatim.
    raw_tolerations: tuple[Mapping[str, Any], ...] = ()
    # Kept for balloon pods to copy, so a placeholder lands where the real pod would: the same
    # scheduler, the same RuntimeClass (whose admission adds its overhead and node selector),
    # the same spread; and its image is pulled with the same credentials.
    runtime_class_name: str | None = None
    scheduler_name: str | None = None
    topology_spread_constraints: tuple[Mapping[str, Any], ...] = ()
    image_pull_secrets: tuple[Mapping[str, Any], ...] = ()
    # The template's own `overhead`, already counted in `requests` and `limits`.
    overhead: Resources = field(default_factory=dict)
    # Names of the template's `resourceClaims` (Dynamic Resource Allocation): devices that
    # are not in `requests`, so a placeholder copying the requests would hold none of them.
    resource_claims: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GangShape:
    """A leader plus `pods_per_gang - 1` identical workers."""

    leader: PodShape
    worker: PodShape
    pods_per_gang: int
    topology_key: str | None = None  # every pod of one gang in one domain of this label

    @property
    def pods(self) -> tuple[PodShape, ...]:
        return (self.leader,) + (self.worker,) * (self.pods_per_gang - 1)

    def total(self, resource: str) -> int:
        return sum(p.requests.get(resource, 0) for p in self.pods)


# Resources Kubernetes lets a container request without a limit. Every other one (GPUs and
# other extended resources, hugepages) must have a limit equal to its request.
_OVERCOMMITTABLE = frozenset({"cpu", "memory", "ephemeral-storage"})


def _container_amounts(container: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """One container's (requests, limits); a missing request defaults to its limit."""
    res = container.get("resources") or {}
    limits = {k: parse_quantity(k, v) for k, v in (res.get("limits") or {}).items()}
    requests = {k: parse_quantity(k, v) for k, v in (res.get("requests") or {}).items()}
    return {**limits, **requests}, limits


def _max_resources(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in {*a, *b}}


def pod_resources(pod_spec: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """Effective pod (requests, limits), as the scheduler and the API server count them.

    Per container a missing request defaults to its limit. The pod needs the sum over its
    containers and sidecars (init containers that keep running), at least what any other
    init container needs with the sidecars started before it, plus the runtime overhead.
    It is limited on CPU, memory or storage only when every container limits it (one
    unlimited sidecar leaves the pod unlimited); any other resource (GPUs, hugepages) is
    limited at its request, as Kubernetes requires.
    """
    limited_in_all: set[str] | None = None
    # Init containers run in order; a sidecar (restartPolicy Always) keeps running beside
    # every later one and the app, so a plain init container needs itself plus the sidecars
    # started before it.
    sidecar_req: dict[str, int] = {}
    sidecar_lim: dict[str, int] = {}
    init_req: dict[str, int] = {}
    init_lim: dict[str, int] = {}
    for container in pod_spec.get("initContainers") or []:
        req, lim = _container_amounts(container)
        limited_in_all = set(lim) if limited_in_all is None else limited_in_all & set(lim)
        if container.get("restartPolicy") == "Always":
            sidecar_req = add_resources(sidecar_req, req)
            sidecar_lim = add_resources(sidecar_lim, lim)
            continue
        init_req = _max_resources(init_req, add_resources(req, sidecar_req))
        init_lim = _max_resources(init_lim, add_resources(lim, sidecar_lim))
    requests, limits = sidecar_req, sidecar_lim
    for container in pod_spec.get("containers") or []:
        req, lim = _container_amounts(container)
        limited_in_all = set(lim) if limited_in_all is None else limited_in_all & set(lim)
        requests = add_resources(requests, req)
        limits = add_resources(limits, lim)
    requests = _max_resources(requests, init_req)
    limits = _max_resources(limits, init_lim)
    for k, v in (pod_spec.get("overhead") or {}).items():
        amount = parse_quantity(k, v)
        requests[k] = requests.get(k, 0) + amount
        limits[k] = limits.get(k, 0) + amount
    limits = {k: v for k, v in limits.items() if k in (limited_in_all or ())}
    for k, amount in requests.items():
        if k not in _OVERCOMMITTABLE:
            limits[k] = amount
    return requests, limits


def parse_tolerations(raw: Iterable[Mapping[str, Any]]) -> tuple[Toleration, ...]:
    """A pod spec's `tolerations`, as the scheduler reads them."""
    return tuple(
        Toleration(
            key=t.get("key"),
            operator=t.get("operator", "Equal"),
            value=t.get("value"),
            effect=t.get("effect") or None,
        )
        for t in raw
    )


def pod_shape_from_spec(pod_spec: Mapping[str, Any]) -> PodShape:
    requests, limits = pod_resources(pod_spec)
    raw_tolerations = tuple(pod_spec.get("tolerations") or ())
    affinity = pod_spec.get("affinity")
    return PodShape(
        requests=requests,
        limits=limits,
        node_selector=dict(pod_spec.get("nodeSelector") or {}),
        tolerations=parse_tolerations(raw_tolerations),
        affinity=dict(affinity) if affinity else None,
        raw_tolerations=raw_tolerations,
        runtime_class_name=pod_spec.get("runtimeClassName") or None,
        scheduler_name=pod_spec.get("schedulerName") or None,
        topology_spread_constraints=tuple(pod_spec.get("topologySpreadConstraints") or ()),
        image_pull_secrets=tuple(pod_spec.get("imagePullSecrets") or ()),
        overhead={k: parse_quantity(k, v) for k, v in (pod_spec.get("overhead") or {}).items()},
        resource_claims=tuple(
            str(claim.get("name", "")) for claim in pod_spec.get("resourceClaims") or ()
        ),
    )


def gang_shape_from_lws(lws: Mapping[str, Any]) -> GangShape:
    """Compute one gang's shape from a LeaderWorkerSet object (as a plain dict)."""
    spec = lws.get("spec") or {}
    template = spec.get("leaderWorkerTemplate") or {}
    size = int(template.get("size", 1))
    worker_tpl = template.get("workerTemplate") or {}
    leader_tpl = template.get("leaderTemplate") or worker_tpl  # LWS: leader defaults to worker
    annotations = (lws.get("metadata") or {}).get("annotations") or {}
    return GangShape(
        leader=pod_shape_from_spec(leader_tpl.get("spec") or {}),
        worker=pod_shape_from_spec(worker_tpl.get("spec") or {}),
        pods_per_gang=max(size, 1),
        topology_key=annotations.get(EXCLUSIVE_TOPOLOGY_ANNOTATION) or None,
    )
