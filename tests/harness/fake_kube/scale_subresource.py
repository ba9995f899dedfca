"""The `/scale` subresource of a custom resource, built from its CRD's scale paths.

An `autoscaling/v1 Scale` whose `spec.replicas` is read from and written to the CRD's
`specReplicasPath`, `status.replicas` from `statusReplicasPath` and `status.selector` from
`labelSelectorPath`, with the same conflict rules as the object itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.harness.fake_kube import errors
from tests.harness.fake_kube.patching import MERGE_PATCH, STRATEGIC_MERGE_PATCH, apply_patch
from tests.harness.fake_kube.resources import ResourceType
from tests.harness.fake_kube.store import Obj

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster


def _get_path(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _set_path(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj.setdefault(key, {})
    obj[path[-1]] = value


def get_scale(cluster: Cluster, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
    if rtype.scale is None:
        raise errors.not_found(f"{rtype.plural}/scale", name, group=rtype.group)
    obj = cluster.get(rtype, namespace, name)
    meta = obj["metadata"]
    status: dict[str, Any] = {"replicas": _get_path(obj, rtype.scale.status_replicas) or 0}
    if rtype.scale.label_selector is not None:
        selector = _get_path(obj, rtype.scale.label_selector)
        if selector:
            status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in meta
        },
        "spec": {"replicas": _get_path(obj, rtype.scale.spec_replicas) or 0},
        "status": status,
    }


def replace_scale(
    cluster: Cluster, rtype: ResourceType, namespace: str | None, name: str, body: Any
) -> Obj:
    if rtype.scale is None:
        raise errors.not_found(f"{rtype.plural}/scale", name, group=rtype.group)
    if not isinstance(body, dict):
        raise errors.bad_request("the body of a scale update must be a Scale object")
    current = cluster.get(rtype, namespace, name)
    sent_rv = (body.get("metadata") or {}).get("resourceVersion")
    if sent_rv and str(sent_rv) != current["metadata"]["resourceVersion"]:
        raise errors.conflict(rtype.plural, name, group=rtype.group)
    replicas = (body.get("spec") or {}).get("replicas", 0)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise errors.invalid(
            "Scale",
            name,
            [
                (
                    "spec.replicas",
                    f"Invalid value: {replicas!r}: must be greater than or equal to 0",
                )
            ],
            group="autoscaling",
        )
    _set_path(current, rtype.scale.spec_replicas, replicas)
    cluster.replace(rtype, namespace, name, current, reconcile=False)
    # The answer shows the status as the write left it: controllers react afterwards.
    scale = get_scale(cluster, rtype, namespace, name)
    cluster.after_write()
    return scale


def patch_scale(
    cluster: Cluster,
    rtype: ResourceType,
    namespace: str | None,
    name: str,
    body: Any,
    *,
    content_type: str,
) -> Obj:
    scale = get_scale(cluster, rtype, namespace, name)
    # The Scale kind is built in, so strategic merge patch is accepted on /scale even
    # for a custom resource.
    if content_type == STRATEGIC_MERGE_PATCH:
        content_type = MERGE_PATCH
    patched = apply_patch(scale, body, content_type=content_type, custom=False)
    return replace_scale(cluster, rtype, namespace, name, patched)
