"""The chart's RBAC: least privilege, read from the rendered objects.

Fails on any wildcard, any access to secrets, any verb beyond the list DESIGN and issue 8
allow, and on Leases granted anywhere but a Role in the release namespace.

The DisaggregatedSetRoleScaler grants mirror the LWS ones: a DisaggregatedSet role with
`scaling.mode: External` is scaled through its RoleScaler's /scale, not its LWS's. Two
read-only grants go beyond issue 8's list because the Kubernetes adapter makes these
calls: `list` on HorizontalPodAutoscalers (before each /scale write it refuses to fight an
HPA that targets the same LWS) and `get` on the one PriorityClass `gang-autoscaler-balloon`
(checked for its value when an instance becomes leader). Neither can change anything.

Reads are bound cluster-wide; writes cluster-wide only when the service watches every
namespace, else by a RoleBinding in each namespace it watches, the only ones it writes to.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from tests.charts.conftest import NAMESPACE, NON_DEFAULT_VALUES, render_objects
from tests.harness.helm_chart import service_rbac

# (apiGroup, resource) -> verbs the service holds, each one it calls (the service tests run
# under the rendered rules, tests/service/stack.py `installed_cluster`); nothing else may
# appear.
CLUSTER_ALLOWED: dict[tuple[str, str], set[str]] = {
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"list", "watch"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets/scale"): {"get", "patch"},
    ("disaggregatedset.x-k8s.io", "disaggregatedsetrolescalers"): {"list", "watch"},
    ("disaggregatedset.x-k8s.io", "disaggregatedsetrolescalers/scale"): {"get", "patch"},
    ("", "pods"): {"list", "watch", "create", "delete"},
    ("", "nodes"): {"list", "watch"},
    ("", "events"): {"create", "patch"},
    ("autoscaling", "horizontalpodautoscalers"): {"list"},
    ("scheduling.k8s.io", "priorityclasses"): {"get"},
}
# Grants that must name their objects.
NAMED_ONLY = {("scheduling.k8s.io", "priorityclasses"): ["gang-autoscaler-balloon"]}
LEASE_ALLOWED: dict[tuple[str, str], set[str]] = {
    ("coordination.k8s.io", "leases"): {"get", "create", "update"},
}
# What the service writes, in the namespaces of the LWS objects it scales; everything else
# in CLUSTER_ALLOWED it reads.
WRITES: dict[tuple[str, str], set[str]] = {
    ("leaderworkerset.x-k8s.io", "leaderworkersets/scale"): {"get", "patch"},
    ("disaggregatedset.x-k8s.io", "disaggregatedsetrolescalers/scale"): {"get", "patch"},
    ("", "pods"): {"create", "delete"},
    ("", "events"): {"create", "patch"},
    ("autoscaling", "horizontalpodautoscalers"): {"list"},
}
READS: dict[tuple[str, str], set[str]] = {
    key: verbs - WRITES.get(key, set())
    for key, verbs in CLUSTER_ALLOWED.items()
    if verbs - WRITES.get(key, set())
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


def watched_namespaces(rendered: list[dict[str, Any]]) -> list[str]:
    (deployment,) = rbac(rendered, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [arg.split("=", 1)[1] for arg in container["args"] if arg.startswith("--namespace=")]


def effective_grants(
    rendered: list[dict[str, Any]],
) -> dict[str | None, dict[tuple[str, str], set[str]]]:
    """What the bindings give the service's account, by where: None is cluster-wide, else a
    RoleBinding's namespace."""
    scopes: dict[str | None, dict[tuple[str, str], set[str]]] = {}
    for scope, rules in service_rbac(rendered).bound:
        for key, verbs in grants(rules).items():
            scopes.setdefault(scope, {}).setdefault(key, set()).update(verbs)
    return scopes


def test_cluster_roles_are_least_privilege(rendered: list[dict[str, Any]]) -> None:
    cluster_roles = rbac(rendered, "ClusterRole")
    assert len(cluster_roles) == 2, "one for reading, one for writing"
    for cluster_role in cluster_roles:
        check_rules(cluster_role["rules"], CLUSTER_ALLOWED)


def test_leases_only_in_the_release_namespace(rendered: list[dict[str, Any]]) -> None:
    roles = rbac(rendered, "Role")
    assert roles, "leader election needs a Role for Leases"
    for role in roles:
        assert role["metadata"]["namespace"] == NAMESPACE
        check_rules(role["rules"], LEASE_ALLOWED)
    for binding in rbac(rendered, "RoleBinding"):
        if binding["roleRef"]["kind"] == "Role":
            assert binding["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize(
    ("values", "lease"),
    [
        pytest.param(None, "gang-autoscaler", id="default"),
        pytest.param(NON_DEFAULT_VALUES, "autoscaler-leader", id="non-default"),
    ],
)
def test_only_the_service_lease_can_be_read_or_renewed(
    chart: helm.Chart, values: dict[str, Any] | None, lease: str
) -> None:
    (role,) = rbac(render_objects(chart, values), "Role")
    for rule in role["rules"]:
        if set(rule["verbs"]) - {"create"}:  # RBAC cannot limit `create` to a name
            assert rule.get("resourceNames") == [lease], rule
    assert {v for rule in role["rules"] for v in rule["verbs"]} == {"get", "create", "update"}


def test_service_gets_every_permission_it_needs(rendered: list[dict[str, Any]]) -> None:
    scopes = effective_grants(rendered)
    namespaces = watched_namespaces(rendered)
    needed = {None: READS} if namespaces else {None: {**READS, **WRITES}}
    needed.update({namespace: WRITES for namespace in namespaces})
    needed.setdefault(NAMESPACE, {}).update(LEASE_ALLOWED)
    for scope, required in needed.items():
        granted = {**scopes.get(scope, {})}
        if scope is not None:  # what is granted cluster-wide holds in every namespace too
            for key, verbs in scopes.get(None, {}).items():
                granted[key] = granted.get(key, set()) | verbs
        for key, verbs in required.items():
            assert verbs <= granted.get(key, set()), f"missing {sorted(verbs)} on {key} in {scope}"


def test_writes_only_in_the_watched_namespaces(chart: helm.Chart) -> None:
    """With `namespaces` set the service writes nowhere else, so nothing else is granted: a
    stolen token cannot create pods in kube-system."""
    rendered = render_objects(chart, NON_DEFAULT_VALUES)
    scopes = effective_grants(rendered)
    assert watched_namespaces(rendered) == ["serving", "batch-inference"]
    assert set(scopes) == {None, NAMESPACE, "serving", "batch-inference"}
    for key, verbs in scopes[None].items():
        assert not verbs & WRITES.get(key, set()), f"{sorted(verbs)} on {key} cluster-wide"
    assert scopes["serving"] == scopes["batch-inference"] == WRITES


def test_writes_everywhere_without_namespaces(chart: helm.Chart) -> None:
    scopes = effective_grants(render_objects(chart, None))
    assert set(scopes) == {None, NAMESPACE}
    for key, verbs in WRITES.items():
        assert verbs <= scopes[None][key], key


@pytest.mark.parametrize("namespaces", [[], ["serving"]], ids=["everywhere", "namespaced"])
def test_a_dry_run_release_is_granted_reads_only(chart: helm.Chart, namespaces: list) -> None:
    """A shadow install writes nothing and takes no Lease; the service tests run one under
    these grants."""
    scopes = effective_grants(render_objects(chart, {"dryRun": True, "namespaces": namespaces}))
    assert set(scopes) == {None}
    for key, verbs in scopes[None].items():
        assert verbs <= {"get", "list", "watch"}, f"{sorted(verbs)} on {key}"


def test_an_existing_service_account_must_be_named(chart: helm.Chart) -> None:
    """Binding the namespace's `default` account would hand these grants to its every pod."""
    values = {"serviceAccount": {"create": False, "name": "", "annotations": {}}}
    with pytest.raises(helm.HelmError, match=r"set serviceAccount\.name"):
        render_objects(chart, values)


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
    for cluster_role in rbac(rendered, "ClusterRole"):
        with pytest.raises(AssertionError):
            check_rules([*cluster_role["rules"], bad_rule], CLUSTER_ALLOWED)
