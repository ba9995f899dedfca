"""The resource types the fake serves, with what discovery and the handlers need to know."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScalePaths:
    """The CRD's `subresources.scale`: where replicas and the selector live in the object."""

    spec_replicas: tuple[str, ...]
    status_replicas: tuple[str, ...]
    label_selector: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    has_status: bool = False
    scale: ScalePaths | None = None
    custom: bool = False  # custom resources refuse strategic merge patch

    @property
    def key(self) -> str:
        return f"{self.group}/{self.plural}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

BUILTIN_TYPES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "pods", "pod", "Pod", True, ("po",), has_status=True),
    ResourceType("", "v1", "nodes", "node", "Node", False, ("no",), has_status=True),
    ResourceType("", "v1", "namespaces", "namespace", "Namespace", False, ("ns",), True),
    ResourceType("", "v1", "events", "event", "Event", True, ("ev",)),
    ResourceType("", "v1", "configmaps", "configmap", "ConfigMap", True, ("cm",)),
    ResourceType("", "v1", "services", "service", "Service", True, ("svc",), has_status=True),
    ResourceType("events.k8s.io", "v1", "events", "event", "Event", True, ("ev",)),
    ResourceType("coordination.k8s.io", "v1", "leases", "lease", "Lease", True),
    # Its controller only enforces min/max replicas (see hpa_controller.py).
    ResourceType(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        "HorizontalPodAutoscaler",
        True,
        ("hpa",),
        has_status=True,
    ),
    ResourceType(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "priorityclass",
        "PriorityClass",
        False,
        ("pc",),
    ),
)


class Registry:
    """Resource types by (group, version, plural), and the groups for discovery."""

    def __init__(self, types: Iterable[ResourceType]) -> None:
        self._by_path: dict[tuple[str, str, str], ResourceType] = {}
        self._by_kind: dict[tuple[str, str], ResourceType] = {}
        for rtype in types:
            self.add(rtype)

    def add(self, rtype: ResourceType) -> None:
        self._by_path[(rtype.group, rtype.version, rtype.plural)] = rtype
        self._by_kind[(rtype.api_version, rtype.kind)] = rtype

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_path.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self._by_kind.get((api_version, kind))

    def get(self, group: str, plural: str) -> ResourceType:
        for (g, _, p), rtype in self._by_path.items():
            if g == group and p == plural:
                return rtype
        raise KeyError(f"{group}/{plural}")

    def all(self) -> list[ResourceType]:
        return list(self._by_path.values())

    def group_versions(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for group, version, _ in self._by_path:
            versions = groups.setdefault(group, [])
            if version not in versions:
                versions.append(version)
        return groups

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [t for (g, v, _), t in self._by_path.items() if (g, v) == (group, version)]
