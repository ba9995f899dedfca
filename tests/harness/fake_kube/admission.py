"""Defaulting, validation and admission of the built-in types the fake serves.

Only what a client of the autoscaler would notice: pod defaults (scheduler name, requests
defaulted from limits, priority resolved from the PriorityClass by the Priority admission
plugin), the pod-spec immutability rule, PriorityClass value rules, namespace status.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from tests.harness.fake_kube import errors
from tests.harness.fake_kube.errors import ApiError
from tests.harness.fake_kube.quantity import parse_quantity
from tests.harness.fake_kube.resources import ResourceType

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster

Obj = dict[str, Any]


def admit_builtin(cluster: Cluster, rtype: ResourceType, obj: Obj, *, old: Obj | None) -> Obj:
    if rtype.key == "/pods":
        return _admit_pod(cluster, obj, old=old)
    if rtype.key == "scheduling.k8s.io/priorityclasses":
        return _admit_priority_class(cluster, obj, old=old)
    if rtype.key == "/events":
        involved_ns = (obj.get("involvedObject") or {}).get("namespace")
        if involved_ns and involved_ns != obj["metadata"].get("namespace"):
            raise errors.invalid(
                "Event",
                obj["metadata"]["name"],
                [
                    (
                        "involvedObject.namespace",
                        f'Invalid value: "{involved_ns}": does not match event.namespace',
                    )
                ],
            )
    if rtype.key == "/namespaces":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
    return obj


_QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ANNOTATIONS_MAX_BYTES = 256 * 1024


def _key_problem(key: str) -> str | None:
    """apimachinery's IsQualifiedName: optional DNS-subdomain prefix, a name of <= 63."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix or (key.count("/") == 1 and not prefix):
        return "a qualified name must have at most one '/' and a non-empty prefix before it"
    if prefix and (len(prefix) > 253 or not _PREFIX_RE.match(prefix)):
        return "prefix part must be a lowercase RFC 1123 subdomain"
    if not name or len(name) > 63 or not _QUALIFIED_NAME_RE.match(name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', must start "
            "and end with an alphanumeric character, and be at most 63 characters"
        )
    return None


def metadata_problems(meta: Obj) -> list[tuple[str, str]]:
    """ObjectMeta validation shared by every type: labels, annotations, owner references."""
    problems: list[tuple[str, str]] = []
    for key, value in (meta.get("labels") or {}).items():
        key_problem = _key_problem(key)
        if key_problem:
            problems.append(("metadata.labels", f'Invalid value: "{key}": {key_problem}'))
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE_RE.match(value):
            problems.append(
                (
                    "metadata.labels",
                    f'Invalid value: "{value}": a valid label must be an empty string or '
                    "consist of alphanumeric characters, '-', '_' or '.', and must start and "
                    "end with an alphanumeric character (at most 63 characters)",
                )
            )
    annotations = meta.get("annotations") or {}
    for key, value in annotations.items():
        key_problem = _key_problem(key)
        if key_problem:
            problems.append(("metadata.annotations", f'Invalid value: "{key}": {key_problem}'))
        if not isinstance(value, str):
            problems.append(("metadata.annotations", f"Invalid value: {key}: must be a string"))
    size = sum(len(k) + len(str(v)) for k, v in annotations.items())
    if size > _ANNOTATIONS_MAX_BYTES:
        problems.append(("metadata.annotations", "Too long: must have at most 262144 bytes"))
    for index, ref in enumerate(meta.get("ownerReferences") or []):
        for field in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(field):
                problems.append((f"metadata.ownerReferences[{index}].{field}", "Required value"))
    controllers = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
    if len(controllers) > 1:
        problems.append(
            (
                "metadata.ownerReferences",
                "Invalid value: Only one reference can have Controller set to true",
            )
        )
    return problems


def _forbidden(plural: str, name: str, message: str) -> ApiError:
    return ApiError(
        403,
        reason="Forbidden",
        message=f'{plural} "{name}" is forbidden: {message}',
        details={"name": name, "kind": plural},
    )


_OVERCOMMITTABLE = ("cpu", "memory", "ephemeral-storage")


def _request_limit_problems(
    index: int, requests: dict[str, Any], limits: dict[str, Any]
) -> list[tuple[str, str]]:
    """The API server's checks of one container's requests against its limits."""

    def amount(text: Any) -> float | None:
        if text is None:
            return None
        try:
            return float(parse_quantity(text))
        except (ValueError, TypeError):
            return None  # reported as a bad quantity already

    problems = []
    where = f"spec.containers[{index}].resources"
    for resource, request in requests.items():
        wanted, limit = amount(request), amount(limits.get(resource))
        if resource not in _OVERCOMMITTABLE and resource not in limits:
            problems.append(
                (
                    f"{where}.limits[{resource}]",
                    "Required value: Limit must be set for non overcommitable resources",
                )
            )
        elif wanted is None or limit is None:
            continue
        elif resource not in _OVERCOMMITTABLE and wanted != limit:
            problems.append(
                (
                    f"{where}.requests[{resource}]",
                    f'Invalid value: "{request}": must be equal to {resource} limit of '
                    f"{limits[resource]}",
                )
            )
        elif wanted > limit:
            problems.append(
                (
                    f"{where}.requests[{resource}]",
                    f'Invalid value: "{request}": must be less than or equal to {resource} '
                    f"limit of {limits[resource]}",
                )
            )
    return problems


def _admit_pod(cluster: Cluster, obj: Obj, *, old: Obj | None) -> Obj:
    name = obj["metadata"]["name"]
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not spec.get("containers"):
        raise errors.invalid("Pod", name, [("spec.containers", "Required value")])
    if old is not None:
        _check_pod_update(name, old_spec=old.get("spec") or {}, new_spec=spec)
        return obj
    problems: list[tuple[str, str]] = []
    for index, container in enumerate(spec["containers"]):
        for field in ("name", "image"):
            if not container.get(field):
                problems.append((f"spec.containers[{index}].{field}", "Required value"))
        resources = container.setdefault("resources", {})
        limits = resources.get("limits") or {}
        requests = resources.setdefault("requests", {})
        for resource, limit in limits.items():
            # Defaulting copies a limit into a missing request, as the API server does.
            requests.setdefault(resource, limit)
        for kind, amounts in (("requests", requests), ("limits", limits)):
            for resource, amount in amounts.items():
                field = f"spec.containers[{index}].resources.{kind}[{resource}]"
                if isinstance(amount, bool) or not isinstance(amount, str | int | float):
                    problems.append((field, f"Invalid value: {amount!r}: not a quantity"))
                    continue
                try:
                    parse_quantity(amount)
                except ValueError as err:
                    problems.append((field, f"Invalid value: {err}"))
                    continue
                if not isinstance(amount, str):
                    # JSON numbers are accepted and stored as quantity strings.
                    amounts[resource] = format(amount, "g")
        problems += _request_limit_problems(index, requests, limits)
        if not requests:
            resources.pop("requests")
    if problems:
        raise errors.invalid("Pod", name, problems)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    _resolve_priority(cluster, name, spec)
    obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}
    return obj


def _resolve_priority(cluster: Cluster, pod_name: str, spec: Obj) -> None:
    """The Priority admission plugin: priority and preemptionPolicy come from the class."""
    classes = cluster.store.items("scheduling.k8s.io/priorityclasses")
    class_name = spec.get("priorityClassName")
    if class_name:
        chosen = next((c for c in classes if c["metadata"]["name"] == class_name), None)
        if chosen is None:
            raise _forbidden("pods", pod_name, f"no PriorityClass with name {class_name} was found")
    else:
        chosen = next((c for c in classes if c.get("globalDefault")), None)
    value = chosen["value"] if chosen is not None else 0
    if "priority" in spec and spec["priority"] != value:
        raise _forbidden(
            "pods",
            pod_name,
            f"the integer value of priority ({spec['priority']}) must not be provided in pod "
            f"spec; priority admission controller computed {value} from the given "
            "PriorityClass name",
        )
    spec["priority"] = value
    if chosen is not None:
        spec["priorityClassName"] = chosen["metadata"]["name"]
        spec.setdefault("preemptionPolicy", chosen.get("preemptionPolicy", "PreemptLowerPriority"))
    else:
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")


def _qos_class(spec: Obj) -> str:
    containers = spec.get("containers") or []
    all_resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in all_resources):
        return "BestEffort"
    guaranteed = all(
        {"cpu", "memory"} <= set(r.get("limits") or {})
        and all(
            parse_quantity(r["requests"].get(k, r["limits"][k])) == parse_quantity(r["limits"][k])
            for k in ("cpu", "memory")
        )
        for r in all_resources
    )
    return "Guaranteed" if guaranteed else "Burstable"


def _mutable_view(spec: Obj) -> Obj:
    view = copy.deepcopy(spec)
    for key in ("activeDeadlineSeconds", "tolerations", "schedulingGates"):
        view.pop(key, None)
    for group in ("containers", "initContainers"):
        for container in view.get(group) or []:
            container.pop("image", None)
    return view


def _check_pod_update(name: str, *, old_spec: Obj, new_spec: Obj) -> None:
    if _mutable_view(old_spec) != _mutable_view(new_spec):
        raise errors.invalid(
            "Pod",
            name,
            [
                (
                    "spec",
                    "Forbidden: pod updates may not change fields other than "
                    "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                    "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to "
                    "existing tolerations), `spec.schedulingGates`",
                )
            ],
        )


def _admit_priority_class(cluster: Cluster, obj: Obj, *, old: Obj | None) -> Obj:
    name = obj["metadata"]["name"]
    value = obj.get("value")
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.invalid(
            "PriorityClass", name, [("value", "Required value")], group="scheduling.k8s.io"
        )
    if old is not None and old.get("value") != value:
        raise errors.invalid(
            "PriorityClass",
            name,
            [("value", "Invalid value: field is immutable")],
            group="scheduling.k8s.io",
        )
    if value > 1_000_000_000 and not name.startswith("system-"):
        raise errors.invalid(
            "PriorityClass",
            name,
            [("value", "Invalid value: must be no greater than 1000000000")],
            group="scheduling.k8s.io",
        )
    if obj.get("globalDefault"):
        others = [
            c["metadata"]["name"]
            for c in cluster.store.items("scheduling.k8s.io/priorityclasses")
            if c.get("globalDefault") and c["metadata"]["name"] != name
        ]
        if others:
            raise errors.invalid(
                "PriorityClass",
                name,
                [
                    (
                        "globalDefault",
                        f"Invalid value: PriorityClass {others[0]} is already "
                        "marked as default. Only one default can exist",
                    )
                ],
                group="scheduling.k8s.io",
            )
    obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
    return obj
