"""The three patch types of the API server, chosen by Content-Type.

JSON merge patch follows RFC 7386; JSON patch (RFC 6902) uses the `jsonpatch` library.
Strategic merge patch is approximated: a merge patch in which the lists Kubernetes declares
with a patch merge key (containers by name, conditions by type, ...) merge item by item and
`$patch: delete` / `$patch: replace` directives apply. Custom resources refuse it with 415,
as the real server does.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from tests.harness.fake_kube.errors import ApiError, bad_request, unsupported_media_type

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# patchMergeKey of the list fields that merge item by item in the built-in types.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "taints": "key",
    "addresses": "type",
    "containerStatuses": "name",
}


def accepted_types(*, custom: bool) -> list[str]:
    if custom:
        return [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
    return [JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, *, field: str | None = None) -> Any:
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        result = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue  # $patch handled above; $setElementOrder and $retainKeys ignored
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value, field=key)
        return result
    if isinstance(patch, list) and field in _MERGE_KEYS and isinstance(target, list):
        merge_key = _MERGE_KEYS[field]
        merged = [copy.deepcopy(item) for item in target]
        for item in patch:
            if not isinstance(item, dict) or merge_key not in item:
                raise bad_request(f"map item in list {field} is missing its merge key {merge_key}")
            index = next(
                (i for i, old in enumerate(merged) if old.get(merge_key) == item[merge_key]), None
            )
            if item.get("$patch") == "delete":
                if index is not None:
                    del merged[index]
            elif index is None:
                merged.append({k: v for k, v in item.items() if k != "$patch"})
            else:
                merged[index] = strategic_merge_patch(merged[index], item)
        return merged
    return copy.deepcopy(patch)


def apply_patch(
    current: dict[str, Any], body: Any, *, content_type: str, custom: bool
) -> dict[str, Any]:
    """Apply a decoded patch body to `current`; raise `ApiError` (400/415/422) on failure."""
    if content_type not in accepted_types(custom=custom) or content_type == APPLY_PATCH:
        # Server-side apply is not emulated; answering 415 keeps a client from believing
        # that it was.
        raise unsupported_media_type(content_type, accepted_types(custom=custom))
    if content_type == JSON_PATCH:
        if not isinstance(body, list):
            raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        try:
            patched = jsonpatch.apply_patch(current, body)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
            raise ApiError(
                422,
                reason="Invalid",
                message=f"the server rejected our request due to an error in our request: {err}",
            ) from err
        if not isinstance(patched, dict):
            raise bad_request("a JSON patch must leave an object")
        return patched
    if not isinstance(body, dict):
        raise bad_request("a merge patch body must be a JSON object")
    if content_type == MERGE_PATCH:
        return merge_patch(current, body)  # type: ignore[no-any-return]
    return strategic_merge_patch(current, body)  # type: ignore[no-any-return]
