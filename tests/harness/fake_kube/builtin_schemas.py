"""Schema validation of built-in objects with the Kubernetes OpenAPI schemas.

The schemas are those shipped by `kubernetes-validate` (already a dev dependency, for the
chart tests), for the Kubernetes version the fake reports at `/version`. Types and required
fields are checked, as the API server's decoding and validation would reject them. Unknown
fields are dropped, as the real server does by default (`fieldValidation=Warn`), or refused
with 400 under `fieldValidation=Strict`; the strict schemas (`additionalProperties: false`)
say which fields are known.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema

KUBERNETES_VERSION = "1.33.0"


def _schema_dir(*, strict: bool = False) -> Any:
    suffix = "-strict" if strict else ""
    return resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema", f"v{KUBERNETES_VERSION}-local{suffix}"
    )


def _file_name(api_version: str, kind: str) -> str:
    # rbac.authorization.k8s.io/v1 -> rbac-v1, as kubernetes-validate names its files
    short = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    return f"{kind.lower()}-{short}.json"


@functools.cache
def _strict_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    path = _schema_dir(strict=True).joinpath(_file_name(api_version, kind))
    return json.loads(path.read_text()) if path.is_file() else None


@functools.cache
def _strict_definitions() -> dict[str, Any]:
    text = _schema_dir(strict=True).joinpath("_definitions.json").read_text()
    return dict(json.loads(text)["$defs"])


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = _strict_definitions()[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def drop_unknown_fields(obj: dict[str, Any], *, api_version: str, kind: str) -> list[str]:
    """Remove the fields the type does not define, in place; return their paths."""
    schema = _strict_schema(api_version, kind)
    if schema is None:
        return []
    dropped: list[str] = []
    _prune(obj, schema, [], dropped)
    return dropped


def _prune(value: Any, schema: dict[str, Any], path: list[Any], dropped: list[str]) -> None:
    schema = _resolve(schema)
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if properties is not None:
            for key in list(value):
                if key in properties:
                    _prune(value[key], properties[key], [*path, key], dropped)
                elif additional is False:
                    del value[key]
                    dropped.append(field_path([*path, key]))
        elif isinstance(additional, dict):
            for key, item in value.items():
                _prune(item, additional, [*path, key], dropped)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _prune(item, schema["items"], [*path, index], dropped)


@functools.cache
def _definitions() -> referencing.Resource[Any]:
    text = _schema_dir().joinpath("_definitions.json").read_text()
    return referencing.Resource.from_contents(
        json.loads(text), default_specification=referencing.jsonschema.DRAFT202012
    )


@functools.cache
def validator_for(api_version: str, kind: str) -> Any | None:
    """A compiled validator for this kind, or None when no schema ships for it."""
    path = _schema_dir().joinpath(_file_name(api_version, kind))
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    resource = referencing.Resource.from_contents(
        schema, default_specification=referencing.jsonschema.DRAFT202012
    )
    registry: referencing.Registry[Any] = _definitions() @ (resource @ referencing.Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def schema_problems(
    obj: dict[str, Any], *, api_version: str, kind: str
) -> tuple[list[str], list[tuple[str, str]]]:
    """(decoding errors, validation problems) of a built-in object.

    A value of the wrong type cannot be decoded into the Go struct, which the real server
    answers with 400 BadRequest; a missing required field fails validation, a 422.
    """
    validator = validator_for(api_version, kind)
    if validator is None:
        return [], []
    document = {**obj, "apiVersion": api_version, "kind": kind}
    decoding: list[str] = []
    invalid: list[tuple[str, str]] = []
    for error in sorted(validator.iter_errors(document), key=lambda e: str(list(e.path))):
        field = field_path(error.absolute_path)
        if error.validator == "required":
            invalid.append((field, f"Required value: {error.message}"))
        else:
            decoding.append(
                f'{kind} in version "{api_version}" cannot be handled: {field}: {error.message}'
            )
    return decoding, invalid


def field_path(parts: Any) -> str:
    """["spec", "containers", 0, "name"] -> "spec.containers[0].name", as the server says."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".") or "<root>"
