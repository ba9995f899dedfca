"""RBAC authorization as the API server applies it to one service account.

Built from ClusterRoles, Roles and their bindings (a Helm chart's rendered objects, say): a
request is allowed when a rule of a role bound to the account covers its verb, API group,
resource (with its subresource) and object name, within the binding's reach. A
ClusterRoleBinding reaches every namespace and the cluster-scoped objects; a RoleBinding
only the objects of its own namespace, whether it names a Role or a ClusterRole. A rule
with `resourceNames` covers only requests that name one of them, so never a `list`, a
`watch` or a `create` (the name of an object to be created is not part of the request).
Discovery and health paths are not authorized here: the default `system:discovery` role
opens them to every authenticated user.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tests.harness.fake_kube.errors import ApiError


@dataclass(frozen=True, slots=True)
class Access:
    """What one request asks, in RBAC's terms."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    group: str  # "" for the core group
    resource: str  # "pods", or with its subresource "leaderworkersets/scale"
    namespace: str | None  # None for a cluster-scoped object or an all-namespaces request
    name: str | None


def request_verb(method: str, *, named: bool, watch: bool) -> str:
    """The RBAC verb of an HTTP request, as the API server's request-info resolver names it."""
    if method == "GET":
        return "get" if named else ("watch" if watch else "list")
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _covers(rule: dict[str, Any], access: Access) -> bool:
    def has(field: str, value: str) -> bool:
        items = rule.get(field) or []
        return "*" in items or value in items

    _, _, sub = access.resource.partition("/")
    resources = rule.get("resources") or []
    resource_ok = (
        "*" in resources or access.resource in resources or (bool(sub) and f"*/{sub}" in resources)
    )
    names = rule.get("resourceNames") or []
    name_ok = not names or (access.name is not None and access.name in names)
    return has("verbs", access.verb) and has("apiGroups", access.group) and resource_ok and name_ok


class Rbac:
    """The rules bound to one service account, and the authorizer that applies them."""

    def __init__(
        self, objects: Iterable[dict[str, Any]], *, service_account: str, namespace: str
    ) -> None:
        self.user = f"system:serviceaccount:{namespace}:{service_account}"
        objects = list(objects)
        roles = {
            (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o.get("rules") or []
            for o in objects
            if o.get("kind") in ("ClusterRole", "Role")
        }
        # (namespace the binding reaches, None for everywhere, rules)
        self.bound: list[tuple[str | None, list[dict[str, Any]]]] = []
        for binding in objects:
            if binding.get("kind") not in ("ClusterRoleBinding", "RoleBinding"):
                continue
            subjects = binding.get("subjects") or []
            if not any(
                s.get("kind") == "ServiceAccount"
                and s.get("name") == service_account
                and s.get("namespace") == namespace
                for s in subjects
            ):
                continue
            scope = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else None
            ref = binding["roleRef"]
            role_namespace = scope if ref["kind"] == "Role" else None
            # A binding to a role that does not exist grants nothing, as on a real server.
            self.bound.append((scope, roles.get((ref["kind"], role_namespace, ref["name"]), [])))

    def allows(self, access: Access) -> bool:
        return any(
            (scope is None or scope == access.namespace) and any(_covers(r, access) for r in rules)
            for scope, rules in self.bound
        )

    def forbidden(self, access: Access) -> ApiError:
        """The API server's answer to a request no rule covers."""
        base, _, _ = access.resource.partition("/")
        qualified = f"{base}.{access.group}" if access.group else base
        subject = f'{qualified} "{access.name}"' if access.name else qualified
        where = (
            f'in the namespace "{access.namespace}"'
            if access.namespace is not None
            else "at the cluster scope"
        )
        message = (
            f'{subject} is forbidden: User "{self.user}" cannot {access.verb} resource '
            f'"{access.resource}" in API group "{access.group}" {where}'
        )
        details: dict[str, Any] = {"group": access.group, "kind": base}
        if access.name:
            details["name"] = access.name
        return ApiError(403, reason="Forbidden", message=message, details=details)
