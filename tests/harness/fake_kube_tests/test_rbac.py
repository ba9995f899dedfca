"""The fake's RBAC authorizer applies rules as the API server does, over HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.harness.fake_kube import FakeKube
from tests.harness.fake_kube.rbac import Access, Rbac
from tests.harness.fake_kube_tests.conftest import GROUP, PLURAL, VERSION, lws_manifest

ACCOUNT = {"kind": "ServiceAccount", "name": "robot", "namespace": "ops"}


def _role(kind: str, name: str, rules: list[dict[str, Any]], namespace: str | None = None) -> Any:
    metadata = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"kind": kind, "metadata": metadata, "rules": rules}


def _binding(kind: str, role_kind: str, role: str, *, namespace: str | None = None) -> Any:
    metadata = {"name": f"{role}-binding"} | ({"namespace": namespace} if namespace else {})
    return {
        "kind": kind,
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [ACCOUNT],
    }


OBJECTS = [
    _role(
        "ClusterRole",
        "reader",
        [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
            {
                "apiGroups": ["scheduling.k8s.io"],
                "resources": ["priorityclasses"],
                "resourceNames": ["balloon"],
                "verbs": ["get", "list", "create"],
            },
        ],
    ),
    _binding("ClusterRoleBinding", "ClusterRole", "reader"),
    _role(
        "ClusterRole",
        "writer",
        [{"apiGroups": [GROUP], "resources": [f"{PLURAL}/scale"], "verbs": ["get", "patch"]}],
    ),
    _binding("RoleBinding", "ClusterRole", "writer", namespace="serving"),
    _role(
        "Role",
        "leases",
        [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}],
        namespace="ops",
    ),
    _binding("RoleBinding", "Role", "leases", namespace="ops"),
    # Bound to another account: grants the robot nothing.
    _role("ClusterRole", "admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    {
        **_binding("ClusterRoleBinding", "ClusterRole", "admin"),
        "subjects": [{**ACCOUNT, "name": "someone-else"}],
    },
]
RBAC = Rbac(OBJECTS, service_account="robot", namespace="ops")


@pytest.mark.parametrize(
    ("access", "allowed"),
    [
        pytest.param(Access("list", "", "pods", None, None), True, id="cluster-list"),
        pytest.param(Access("watch", "", "pods", "serving", None), True, id="namespaced-watch"),
        pytest.param(Access("get", "", "pods", "serving", "p"), False, id="get-is-not-list"),
        pytest.param(Access("delete", "", "pods", "serving", "p"), False, id="other-verb"),
        pytest.param(
            Access("get", "scheduling.k8s.io", "priorityclasses", None, "balloon"),
            True,
            id="named-get",
        ),
        pytest.param(
            Access("get", "scheduling.k8s.io", "priorityclasses", None, "other"),
            False,
            id="named-get-of-another-name",
        ),
        pytest.param(
            Access("list", "scheduling.k8s.io", "priorityclasses", None, None),
            False,
            id="resource-names-never-cover-a-list",
        ),
        pytest.param(
            Access("create", "scheduling.k8s.io", "priorityclasses", None, None),
            False,
            id="resource-names-never-cover-a-create",
        ),
        pytest.param(Access("patch", GROUP, f"{PLURAL}/scale", "serving", "d"), True, id="sub"),
        pytest.param(
            Access("patch", GROUP, PLURAL, "serving", "d"),
            False,
            id="subresource-grant-is-not-the-object",
        ),
        pytest.param(
            Access("patch", GROUP, f"{PLURAL}/scale", "batch", "d"),
            False,
            id="role-binding-reaches-only-its-namespace",
        ),
        pytest.param(
            Access("patch", GROUP, f"{PLURAL}/scale", None, "d"),
            False,
            id="role-binding-never-reaches-the-cluster-scope",
        ),
        pytest.param(
            Access("update", "coordination.k8s.io", "leases", "ops", "l"), True, id="wildcard"
        ),
        pytest.param(
            Access("update", "coordination.k8s.io", "leases", "kube-system", "l"),
            False,
            id="role-only-in-its-namespace",
        ),
        pytest.param(Access("list", "", "secrets", "ops", None), False, id="other-subject"),
    ],
)
def test_rules_cover_what_they_name_where_they_are_bound(access: Access, allowed: bool) -> None:
    assert RBAC.allows(access) is allowed


async def test_a_refused_request_gets_the_api_servers_403(kube: FakeKube) -> None:
    kube.add_namespace("serving")
    manifest = lws_manifest("decode")
    manifest["metadata"]["namespace"] = "serving"
    kube.apply(manifest)
    kube.enforce_rbac(RBAC)
    async with kube.api_client() as api:
        custom = client.CustomObjectsApi(api)
        scale = await custom.get_namespaced_custom_object_scale(
            GROUP, VERSION, "serving", PLURAL, "decode"
        )
        assert scale["spec"]["replicas"] == 1
        pods = await client.CoreV1Api(api).list_pod_for_all_namespaces()
        assert pods.items is not None
        with pytest.raises(ApiException) as refused:
            await custom.patch_namespaced_custom_object(
                GROUP, VERSION, "serving", PLURAL, "decode", {"spec": {"replicas": 3}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
    assert refused.value.status == 403
    status = json.loads(refused.value.body)
    assert (status["reason"], status["message"]) == (
        "Forbidden",
        f'{PLURAL}.{GROUP} "decode" is forbidden: User "system:serviceaccount:ops:robot" '
        f'cannot patch resource "{PLURAL}" in API group "{GROUP}" in the namespace "serving"',
    )
    assert kube.denied() == [Access("patch", GROUP, PLURAL, "serving", "decode")]
    assert kube.object(PLURAL, "serving", "decode")["spec"]["replicas"] == 1
