"""The chart's RBAC: least privilege, read from the rendered objects.

Fails on any wildcard, any access to secrets, any verb beyond the list DESIGN and issue 8
allow, and on Leases granted anywhere but a Role in the release namespace.

The DisaggregatedSetRoleScaler grants mirror the LWS ones: a DisaggregatedSet role with
`scaling.mode: External` is scaled through its RoleScaler's /scale, not its LWS's. Two
read-only grants go beyond issue 8's list because the Kubernetes adapter makes these
calls: `list` on HorizontalPodAutoscalers (before each /scale write it refuses to fight an
HPA that targets the same LWS) and `get` on the one PriorityClass `gang-autoscaler-balloon`
(checked for its value when an instance becomes leader). Neither can change anything.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.charts.conftest import NAMESPACE

# (apiGroup, resource) -> verbs the service may hold; nothing else may appear.
CLUSTER_ALLOWED: dict[tuple[str, str], set[str]] = {
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"get", "list", "watch"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets/scale"): {"get", "update", "patch"},
    ("disaggregatedset.x-k8s.io", "disaggregatedsetrolescalers"): {"get", "list", "watch"},
    ("disaggregatedset.x-k8s.io", "disaggregatedsetrolescalers/scale"): {"get", "update", "patch"},
    ("", "pods"): {"get", "list", "watch", "create", "delete"},
    ("", "nodes"): {"get", "list", "watch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("autoscaling", "horizontalpodautoscalers"): {"list"},
    ("scheduling.k8s.io", "priorityclasses"): {"get"},
}
# Grants that must name their objects.
NAMED_ONLY = {("scheduling.k8s.io", "priorityclasses"): ["gang-autoscaler-balloon"]}
LEASE_ALLOWED: dict[tuple[str, str], set[str]] = {
    ("coordination.k8s.io", "leases"): {"get", "create", "update", "patch"},
}
# What the service cannot work without: every rule above except the second events API.
REQUIRED = {
    key: verbs
    for key, verbs in {**CLUSTER_ALLOWED, **LEASE_ALLOWED}.items()
    if key != ("events.k8s.io", "events")
}


def grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert "nonResourceURLs" not in rule, rule
        assert "resourceNames" not in rule or rule["resourceNames"], rule
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                granted.setdefault((group, resource), set()).update(rule.get("verbs", []))
    return granted


def check_rules(rules: list[dict[str, Any]], allowed: dict[tuple[str, str], set[str]]) -> None:
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert not any("*" in item for item in rule.get(field, [])), f"wildcard in {rule}"
        assert not any(r.split("/")[0] == "secrets" for r in rule.get("resources", [])), rule
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                if (group, resource) in NAMED_ONLY:
                    assert rule.get("resourceNames") == NAMED_ONLY[group, resource], rule
    for key, verbs in grants(rules).items():
        assert key in allowed, f"unexpected access to {key}"
        extra = verbs - allowed[key]
        assert not extra, f"verbs {sorted(extra)} on {key} are beyond the allowed list"


def rbac(rendered: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in rendered if o["kind"] == kind]


def test_cluster_role_is_least_privilege(rendered: list[dict[str, Any]]) -> None:
    (cluster_role,) = rbac(rendered, "ClusterRole")
    check_rules(cluster_role["rules"], CLUSTER_ALLOWED)


def test_leases_only_in_the_release_namespace(rendered: list[dict[str, Any]]) -> None:
    roles = rbac(rendered, "Role")
    assert roles, "leader election needs a Role for Leases"
    for role in roles:
        assert role["metadata"]["namespace"] == NAMESPACE
        check_rules(role["rules"], LEASE_ALLOWED)
    for binding in rbac(rendered, "RoleBinding"):
        assert binding["metadata"]["namespace"] == NAMESPACE
        assert binding["roleRef"]["kind"] == "Role"


def test_service_gets_every_permission_it_needs(rendered: list[dict[str, Any]]) -> None:
    granted: dict[tuple[str, str], set[str]] = {}
    for obj in rbac(rendered, "ClusterRole") + rbac(rendered, "Role"):
        for key, verbs in grants(obj["rules"]).items():
            granted.setdefault(key, set()).update(verbs)
    for key, verbs in REQUIRED.items():
        assert verbs <= granted.get(key, set()), f"missing {sorted(verbs)} on {key}"


def _rule(group: str, resource: str, verb: str) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": [resource], "verbs": [verb]}


@pytest.mark.parametrize(
    "bad_rule",
    [
        pytest.param(_rule("", "secrets", "get"), id="secrets"),
        pytest.param(_rule("*", "pods", "get"), id="group-wildcard"),
        pytest.param(_rule("", "pods", "*"), id="verb-wildcard"),
        pytest.param(_rule("", "pods", "patch"), id="extra-verb"),
        pytest.param(
            _rule("disaggregatedset.x-k8s.io", "disaggregatedsets", "update"), id="set-write"
        ),
        pytest.param(_rule("autoscaling", "horizontalpodautoscalers", "update"), id="hpa-write"),
        pytest.param(_rule("scheduling.k8s.io", "priorityclasses", "get"), id="any-priorityclass"),
        pytest.param(
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]},
            id="cluster-wide-leases",
        ),
    ],
)
def test_the_checks_catch_what_they_are_for(
    rendered: list[dict[str, Any]], bad_rule: dict[str, Any]
) -> None:
    (cluster_role,) = rbac(rendered, "ClusterRole")
    with pytest.raises(AssertionError):
        check_rules([*cluster_role["rules"], bad_rule], CLUSTER_ALLOWED)
