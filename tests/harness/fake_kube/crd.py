"""Custom resources from a CRD manifest: type, scale paths, and the apiserver's admission steps.

A real apiserver prunes unknown fields, applies schema defaults and then validates a custom
object against the CRD's structural `openAPIV3Schema`; this module does the same three steps
(with `jsonschema` for the validation). CEL rules (`x-kubernetes-validations`) are not
evaluated.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.harness.fake_kube.builtin_schemas import field_path
from tests.harness.fake_kube.resources import ResourceType, ScalePaths
from tests.harness.shared_data import shared_data_path

LWS_CRD_FILE = ("crds", "leaderworkerset.x-k8s.io_leaderworkersets.yaml")
_ROOT_KEPT = ("apiVersion", "kind", "metadata")


def _json_path(text: str) -> tuple[str, ...]:
    """`.spec.replicas` -> ("spec", "replicas")."""
    return tuple(part for part in text.split(".") if part)


@dataclass(frozen=True, slots=True)
class CustomResource:
    rtype: ResourceType
    schema: dict[str, Any]
    validator: Any  # a jsonschema validator instance, compiled once

    def admit(
        self, obj: dict[str, Any], *, pruned: list[str] | None = None
    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """Prune, default and validate; return the admitted object and (field, problem) pairs.

        The paths of pruned (unknown) fields are appended to `pruned` when given.
        """
        admitted = copy.deepcopy(obj)
        _prune(admitted, self.schema, [], pruned if pruned is not None else [])
        _apply_defaults(admitted, self.schema)
        problems: list[tuple[str, str]] = []
        for error in sorted(self.validator.iter_errors(admitted), key=lambda e: str(list(e.path))):
            problems.append(_problem(error))
        return admitted, problems


def _go_value(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else json.dumps(value)


def _problem(error: Any) -> tuple[str, str]:
    """A jsonschema error in the apiserver's words (k8s.io/kube-openapi validate errors)."""
    field = field_path(error.absolute_path)
    value, bound = error.instance, error.validator_value
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else ""
        return (f"{field}.{missing}" if field != "<root>" else missing, "Required value")
    if error.validator == "minimum":
        return (
            field,
            f"Invalid value: {_go_value(value)}: {field} in body should be greater "
            f"than or equal to {bound}",
        )
    if error.validator == "maximum":
        return (
            field,
            f"Invalid value: {_go_value(value)}: {field} in body should be less "
            f"than or equal to {bound}",
        )
    if error.validator == "enum":
        supported = ", ".join(_go_value(v) for v in bound)
        return (field, f"Unsupported value: {_go_value(value)}: supported values: {supported}")
    if error.validator == "type":
        kind = type(value).__name__.replace("str", "string").replace("dict", "object")
        return (
            field,
            f'Invalid value: "{kind}": {field} in body must be of type {bound}: "{kind}"',
        )
    return (field, f"Invalid value: {_go_value(value)}: {error.message}")


def _prune(obj: Any, schema: dict[str, Any], path: list[Any], pruned: list[str]) -> None:
    if isinstance(obj, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if properties is not None:
            for key in list(obj):
                if not path and key in _ROOT_KEPT:
                    continue
                if key not in properties:
                    del obj[key]
                    pruned.append(field_path([*path, key]))
                else:
                    _prune(obj[key], properties[key], [*path, key], pruned)
        elif isinstance(additional, dict):
            for key, value in obj.items():
                _prune(value, additional, [*path, key], pruned)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            _prune(item, schema["items"], [*path, index], pruned)


def _apply_defaults(obj: Any, schema: dict[str, Any]) -> None:
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                _apply_defaults(obj[key], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for value in obj.values():
                _apply_defaults(value, additional)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            _apply_defaults(item, schema["items"])


def load_crd(path: Path) -> CustomResource:
    """Read a CRD manifest (its storage version) into a `CustomResource`."""
    with path.open() as handle:
        manifest = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    spec = manifest["spec"]
    version = next(v for v in spec["versions"] if v.get("storage"))
    subresources = version.get("subresources") or {}
    scale = None
    if "scale" in subresources:
        raw = subresources["scale"]
        selector = raw.get("labelSelectorPath")
        scale = ScalePaths(
            spec_replicas=_json_path(raw["specReplicasPath"]),
            status_replicas=_json_path(raw["statusReplicasPath"]),
            label_selector=_json_path(selector) if selector else None,
        )
    names = spec["names"]
    rtype = ResourceType(
        group=spec["group"],
        version=version["name"],
        plural=names["plural"],
        singular=names.get("singular", names["kind"].lower()),
        kind=names["kind"],
        namespaced=spec["scope"] == "Namespaced",
        short_names=tuple(names.get("shortNames", ())),
        has_status="status" in subresources,
        scale=scale,
        custom=True,
    )
    schema = version["schema"]["openAPIV3Schema"]
    validator_class = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft7Validator
    )
    return CustomResource(rtype=rtype, schema=schema, validator=validator_class(schema))


@functools.cache
def leaderworkerset_crd() -> CustomResource:
    """The LeaderWorkerSet CRD from the shared data (parsed once per process: it is 1.3 MB)."""
    return load_crd(shared_data_path(*LWS_CRD_FILE))
