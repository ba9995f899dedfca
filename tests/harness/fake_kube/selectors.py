"""Label and field selectors with the grammar and semantics of k8s.io/apimachinery.

Label selectors: `k=v`, `k==v`, `k!=v` (also matches when the label is absent), `k in (a,b)`,
`k notin (a,b)` (also matches when absent), `k` (exists), `!k` (does not exist), joined by
commas (AND). Field selectors: `f=v`, `f==v`, `f!=v` on the fields each resource supports.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.harness.fake_kube.errors import bad_request

_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_KEY_RE = re.compile(rf"^{_KEY}$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")
_SET_RE = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)$")
_EQ_RE = re.compile(r"^(?P<key>[^!=\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>\S*)$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "exists":
            return present
        if self.operator == "!":
            return not present
        if self.operator in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" also select objects without the label, as in Kubernetes.
        return not present or labels[self.key] not in self.values


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside a `( ... )` value set."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def _check_key(key: str, text: str) -> None:
    if not _KEY_RE.match(key):
        raise bad_request(f"unable to parse requirement: invalid label key {key!r} in {text!r}")


def _check_value(value: str, text: str) -> None:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise bad_request(f"unable to parse requirement: invalid label value {value!r} in {text!r}")


def parse_label_selector(text: str | None) -> tuple[Requirement, ...]:
    """Parse a label selector string; raise a 400 `ApiError` on bad syntax."""
    if not text:
        return ()
    requirements: list[Requirement] = []
    for part in _split_top_level(text):
        if set_match := _SET_RE.match(part):
            key = set_match["key"]
            values = [v.strip() for v in set_match["values"].split(",") if v.strip()]
            _check_key(key, text)
            if not values:
                raise bad_request(f"unable to parse requirement: empty value set in {text!r}")
            for value in values:
                _check_value(value, text)
            requirements.append(Requirement(key, set_match["op"], frozenset(values)))
        elif eq_match := _EQ_RE.match(part):
            key = eq_match["key"]
            _check_key(key, text)
            _check_value(eq_match["value"], text)
            operator = "!=" if eq_match["op"] == "!=" else "="
            requirements.append(Requirement(key, operator, frozenset([eq_match["value"]])))
        elif part.startswith("!"):
            key = part[1:].strip()
            _check_key(key, text)
            requirements.append(Requirement(key, "!", frozenset()))
        else:
            _check_key(part, text)
            requirements.append(Requirement(part, "exists", frozenset()))
    return tuple(requirements)


def labels_match(requirements: tuple[Requirement, ...], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(requirement.matches(labels) for requirement in requirements)


def label_selector_object_matches(
    selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None
) -> bool:
    """Match a `metav1.LabelSelector` (matchLabels + matchExpressions).

    A null selector matches nothing and an empty one matches everything, as in Kubernetes.
    """
    if selector is None:
        return False
    labels = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key = expression["key"]
        operator = expression["operator"]
        values = set(expression.get("values") or [])
        if operator == "In" and not (key in labels and labels[key] in values):
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


# Field selectors: the fields each resource supports, as registered by kube-apiserver.
def _path(*keys: str) -> Callable[[Mapping[str, Any]], str]:
    def read(obj: Mapping[str, Any]) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return read


_COMMON_FIELDS = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}
FIELDS_BY_RESOURCE: dict[str, dict[str, Callable[[Mapping[str, Any]], str]]] = {
    "/pods": {
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    "/nodes": {"spec.unschedulable": _path("spec", "unschedulable")},
    "/events": {
        "involvedObject.kind": _path("involvedObject", "kind"),
        "involvedObject.name": _path("involvedObject", "name"),
        "involvedObject.namespace": _path("involvedObject", "namespace"),
        "involvedObject.uid": _path("involvedObject", "uid"),
        "involvedObject.apiVersion": _path("involvedObject", "apiVersion"),
        "reason": _path("reason"),
        "type": _path("type"),
        "source": _path("source", "component"),
    },
    "events.k8s.io/events": {
        "regarding.kind": _path("regarding", "kind"),
        "regarding.name": _path("regarding", "name"),
        "regarding.namespace": _path("regarding", "namespace"),
        "regarding.uid": _path("regarding", "uid"),
        "reason": _path("reason"),
        "type": _path("type"),
        "reportingController": _path("reportingController"),
    },
    "/namespaces": {"status.phase": _path("status", "phase")},
}


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    equals: bool
    value: str
    read: Callable[[Mapping[str, Any]], str]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (self.read(obj) == self.value) == self.equals


def parse_field_selector(text: str | None, *, resource_key: str) -> tuple[FieldRequirement, ...]:
    """Parse a field selector for one resource; unknown fields are a 400, as in Kubernetes."""
    if not text:
        return ()
    supported = {**_COMMON_FIELDS, **FIELDS_BY_RESOURCE.get(resource_key, {})}
    requirements: list[FieldRequirement] = []
    for part in _split_top_level(text):
        match = re.match(r"^(?P<field>[^!=\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*)$", part)
        if match is None:
            raise bad_request(f"invalid field selector: {part!r}")
        field = match["field"]
        if field not in supported:
            raise bad_request(f'field label not supported: "{field}"')
        requirements.append(
            FieldRequirement(field, match["op"] != "!=", match["value"].strip(), supported[field])
        )
    return tuple(requirements)


def fields_match(requirements: tuple[FieldRequirement, ...], obj: Mapping[str, Any]) -> bool:
    return all(requirement.matches(obj) for requirement in requirements)
