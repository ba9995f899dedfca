"""Discovery of opted-in LWS objects and the snapshot built from them (no server needed)."""

from __future__ import annotations

import copy

import pytest

from autoscaler.adapters.kube_discovery import ParseCache, discover, template_digest
from autoscaler.adapters.kube_objects import ScaleTarget
from autoscaler.adapters.kube_state import build_state
from autoscaler.core.model import ComponentKey, DeploymentKey, GangState
from tests.adapters.kube_fixtures import gpu_node, lws_pod, vllm_lws

ON = {"gang-autoscaler.io/enabled": "true"}


def _pd(prefill_extra=None, decode_extra=None):
    common = {**ON, "gang-autoscaler.io/deployment": "llama"}
    prefill = {**common, "gang-autoscaler.io/component": "prefill", **(prefill_extra or {})}
    decode = {**common, "gang-autoscaler.io/component": "decode", **(decode_extra or {})}
    return [
        vllm_lws(name="llama-prefill", annotations=prefill),
        vllm_lws(name="llama-decode", annotations=decode),
    ]


def test_only_opted_in_lws_are_discovered_and_pd_pairs_are_usable():
    found = discover([*_pd(), vllm_lws(name="plain")])
    assert set(found) == {
        ComponentKey("serving", "llama-prefill"),
        ComponentKey("serving", "llama-decode"),
    }
    assert all(c.usable for c in found.values())
    assert found[ComponentKey("serving", "llama-decode")].shape.pods_per_gang == 2


def test_the_template_digest_follows_what_the_gangs_run_not_replicas_or_policy():
    base = vllm_lws(name="llama-prefill", annotations=ON)
    digest = template_digest(base)
    # scaling and retuning the policy leave it alone
    assert template_digest(vllm_lws(name="llama-prefill", replicas=7)) == digest
    assert template_digest(vllm_lws(annotations={**ON, "x": "y"})) == digest
    # what the gangs run changes it: the image, the pods per gang
    image = copy.deepcopy(base)
    image["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["image"] = "v2"
    size = copy.deepcopy(base)
    size["spec"]["leaderWorkerTemplate"]["size"] = 4
    assert len({digest, template_digest(image), template_digest(size)}) == 3
    # and discovery hands it to the observation the core sees
    state = build_state(lws_objects=_pd(), pods=[], nodes=[], now_s=0.0)
    prefill = state.components[ComponentKey("serving", "llama-prefill")]
    assert prefill.discovered.template == digest
    assert prefill.observation is not None and prefill.observation.template == digest


def test_a_bad_annotation_is_a_problem_not_an_exception():
    found = discover(_pd(decode_extra={"gang-autoscaler.io/max-replicas": "lots"}))
    decode = found[ComponentKey("serving", "llama-decode")]
    prefill = found[ComponentKey("serving", "llama-prefill")]
    assert decode.policy is None and not decode.usable
    assert decode.problems[0].annotation == "gang-autoscaler.io/max-replicas"
    # its partner is held too: a PD deployment works only with both components
    assert not prefill.usable
    assert "component llama-decode of this deployment has a policy problem" in str(
        prefill.problems[0]
    )


def _with_cpu(lws, cpu):
    container = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = cpu
    return lws


def test_an_unreadable_quantity_holds_its_deployment_and_no_other():
    # "1e999999" passes the LWS schema; Decimal's Overflow escaped parsing and stopped
    # discovery, so no LWS in the cluster was scaled.
    prefill, decode = _pd()
    other = vllm_lws(name="other", annotations=ON)
    found = discover([_with_cpu(prefill, "1e999999"), decode, other])
    broken = found[ComponentKey("serving", "llama-prefill")]
    assert broken.shape is None and not broken.usable
    assert "cannot read gang shape" in broken.problems[0].detail
    assert not found[ComponentKey("serving", "llama-decode")].usable
    assert found[ComponentKey("serving", "other")].usable


def test_a_duplicate_component_with_an_unreadable_shape_holds_the_whole_deployment():
    # Two prefill LWS, one of them with a negative CPU request: the core never sees the
    # broken one, so unless the deployment holds it plans the other prefill and the decode
    # as a valid pair and scales them.
    prefill, decode = _pd()
    twin = vllm_lws(
        name="llama-prefill-2",
        annotations={**ON, "gang-autoscaler.io/deployment": "llama",
                     "gang-autoscaler.io/component": "prefill"},
    )  # fmt: skip
    found = discover([prefill, _with_cpu(twin, "-1"), decode])
    assert not any(c.usable for c in found.values())
    assert "component llama-prefill-2 of this deployment has a policy problem" in str(
        found[ComponentKey("serving", "llama-decode")].problems
    )


def _owned_by(lws, kind, *, controller, uid="0b6f"):
    lws["metadata"]["ownerReferences"] = [
        {"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": kind, "name": "llama",
         "uid": uid, "controller": controller},
    ]  # fmt: skip
    return lws


def _role_lws(role, *, revision="7c9d", annotations=None):
    """An LWS as the DisaggregatedSet controller makes it for `role` of set `llama`: the
    role's metadata annotations, the set's labels, the set as controller."""
    lws = vllm_lws(
        name=f"llama-0-{revision}-{role}",
        annotations={**ON, "gang-autoscaler.io/component": role, **(annotations or {})},
        replicas=2,
    )
    lws["metadata"]["labels"] = {
        "disaggregatedset.x-k8s.io/name": "llama",
        "disaggregatedset.x-k8s.io/role": role,
        "disaggregatedset.x-k8s.io/revision": revision,
        "disaggregatedset.x-k8s.io/slice": "0",
    }
    return _owned_by(lws, "DisaggregatedSet", controller=True)


def _role_scaler(role, *, replicas=3, owner_uid="0b6f"):
    """A DisaggregatedSetRoleScaler as the DisaggregatedSet controller creates it."""
    scaler = {
        "apiVersion": "disaggregatedset.x-k8s.io/v1",
        "kind": "DisaggregatedSetRoleScaler",
        "metadata": {
            "name": f"llama-{role}", "namespace": "serving", "resourceVersion": "41",
            "labels": {"disaggregatedset.x-k8s.io/name": "llama",
                       "disaggregatedset.x-k8s.io/role": role},
        },
        "spec": {"replicas": replicas},
    }  # fmt: skip
    return _owned_by(scaler, "DisaggregatedSet", controller=True, uid=owner_uid)


def test_an_lws_another_controller_scales_is_held_with_its_deployment():
    prefill, decode = _pd()
    found = discover([_owned_by(prefill, "ModelServer", controller=True), decode])
    owned = found[ComponentKey("serving", "llama-prefill")]
    partner = found[ComponentKey("serving", "llama-decode")]
    assert owned.policy is None and not owned.usable
    assert owned.shape is not None  # still observed, so /decisions shows its gangs
    (problem,) = owned.problems
    assert problem.annotation == "gang-autoscaler.io/enabled"
    assert "controlled by ModelServer llama, which sets its spec.replicas" in problem.message
    assert not partner.usable
    assert "component llama-prefill of this deployment has a policy problem" in str(
        partner.problems[0]
    )
    state = build_state(lws_objects=[prefill, decode], pods=[], nodes=[], now_s=0.0)
    assert set(state.policies) == {ComponentKey("serving", "llama-decode")}  # core holds both


def test_an_owner_that_is_not_the_controller_leaves_the_lws_ours():
    prefill, decode = _pd()
    found = discover([_owned_by(prefill, "DisaggregatedSet", controller=False), decode])
    assert all(c.usable for c in found.values())


def test_an_external_role_is_scaled_through_its_role_scaler():
    lws = [_role_lws("prefill"), _role_lws("decode")]
    scalers = [_role_scaler("prefill", replicas=3), _role_scaler("decode", replicas=1)]
    found = discover(lws, role_scalers=scalers)
    assert all(c.usable for c in found.values()), [c.problems for c in found.values()]
    prefill = found[ComponentKey("serving", "llama-0-7c9d-prefill")]
    assert prefill.scale_target == ScaleTarget.role_scaler("llama-prefill")
    # the count and version the write is conditional on are the RoleScaler's, not the LWS's
    assert (prefill.spec_gangs, prefill.resource_version) == (3, "41")
    assert prefill.uid == "uid-llama-0-7c9d-prefill"  # Events still go to the LWS
    # the roles pair up under the set's name: the LWS names change at every rollout
    assert prefill.deployment == DeploymentKey("serving", "llama")
    plain = discover(_pd())[ComponentKey("serving", "llama-prefill")]
    assert plain.scale_target == ScaleTarget.lws("llama-prefill")


def test_a_static_role_holds_and_says_how_to_make_it_external():
    lws = [_role_lws("prefill"), _role_lws("decode")]
    found = discover(lws, role_scalers=[_role_scaler("decode")])
    prefill = found[ComponentKey("serving", "llama-0-7c9d-prefill")]
    decode = found[ComponentKey("serving", "llama-0-7c9d-decode")]
    assert prefill.policy is None and decode.policy is not None
    assert "no DisaggregatedSetRoleScaler llama-prefill" in prefill.problems[0].message
    assert "set `scaling.mode: External` on the role" in prefill.problems[0].message
    assert not decode.usable  # its deployment holds with it
    assert "component llama-0-7c9d-prefill of this deployment" in decode.problems[0].message
    unreadable = discover(lws, role_scalers_error="403 Forbidden")
    assert "(DisaggregatedSetRoleScalers cannot be read: 403 Forbidden)" in str(
        unreadable[ComponentKey("serving", "llama-0-7c9d-decode")].problems[0]
    )


def test_a_role_scaler_of_another_set_of_the_same_name_is_not_used():
    # left over from a deleted set of the same name: its uid is not the LWS owner's
    lws = [_role_lws("prefill"), _role_lws("decode")]
    scalers = [_role_scaler("prefill", owner_uid="old"), _role_scaler("decode")]
    found = discover(lws, role_scalers=scalers)
    assert found[ComponentKey("serving", "llama-0-7c9d-prefill")].policy is None


def test_a_role_with_two_lws_holds_until_one_remains():
    # mid-rollout: the old and the new revision's LWS both exist for each role
    lws = [_role_lws(r, revision=v) for r in ("prefill", "decode") for v in ("7c9d", "e51a")]
    found = discover(lws, role_scalers=[_role_scaler("prefill"), _role_scaler("decode")])
    assert not any(c.usable or c.policy for c in found.values())
    message = found[ComponentKey("serving", "llama-0-e51a-decode")].problems[0].message
    assert message.startswith(
        "2 LWS share DisaggregatedSetRoleScaler llama-decode "
        "(llama-0-7c9d-decode, llama-0-e51a-decode)"
    )
    done = discover(lws[::2], role_scalers=[_role_scaler("prefill"), _role_scaler("decode")])
    assert all(c.usable for c in done.values())


def test_namespaces_filter():
    assert discover(_pd(), namespaces={"other"}) == {}


def test_state_observes_gangs_and_excludes_invalid_components_from_policies():
    lws = _pd(decode_extra={"gang-autoscaler.io/min-replicas": "-1"})
    pods = [lws_pod("llama-prefill", g, w) for g in (0, 1) for w in (0, 1)]
    pods[-1] = lws_pod("llama-prefill", 1, 1, node=None)
    state = build_state(lws_objects=lws, pods=pods, nodes=[gpu_node("node-a")], now_s=0.0)
    prefill = ComponentKey("serving", "llama-prefill")
    decode = ComponentKey("serving", "llama-decode")
    obs = state.observations({})
    assert [g.state for g in obs.components[prefill].gangs] == [
        GangState.READY,
        GangState.PARTIAL,
    ]
    assert obs.components[prefill].signals.waiting_requests is None
    assert set(state.policies) == {prefill}
    assert set(state.problems) == {prefill, decode}
    assert state.leader_pod_index() == {("serving", "llama-prefill-0"): (prefill, 0)}


def test_operator_defaults_apply_where_the_lws_sets_nothing():
    defaults = {"gang-autoscaler.io/min-buffer": "1", "gang-autoscaler.io/max-buffer": "4"}
    found = discover(
        _pd(decode_extra={"gang-autoscaler.io/max-buffer": "3"}), default_annotations=defaults
    )
    prefill = found[ComponentKey("serving", "llama-prefill")].policy
    decode = found[ComponentKey("serving", "llama-decode")].policy
    assert (prefill.min_buffer, prefill.max_buffer) == (1, 4)
    assert (decode.min_buffer, decode.max_buffer) == (1, 3)  # the annotation wins


PREFILL = ComponentKey("serving", "llama-prefill")
DECODE = ComponentKey("serving", "llama-decode")


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        pytest.param({"gang-autoscaler.io/max-buffer": "0"}, (0, 0), id="lws-opts-out-of-balloons"),
        # the parser reads "0.0" and " 0.0 " as 0; the defaults' adjustment read neither
        pytest.param({"gang-autoscaler.io/max-buffer": "0.0"}, (0, 0), id="opts-out-with-0.0"),
        pytest.param({"gang-autoscaler.io/max-buffer": " 0.0 "}, (0, 0), id="opts-out-spaced"),
        pytest.param({"gang-autoscaler.io/min-buffer": "5"}, (5, 5), id="lws-raises-the-minimum"),
        pytest.param(
            {"gang-autoscaler.io/min-buffer": "3", "gang-autoscaler.io/max-buffer": "2"},
            ["gang-autoscaler.io/min-buffer"],
            id="the-lws-own-contradiction-is-still-a-problem",
        ),
        pytest.param(
            {"gang-autoscaler.io/max-buffer": "-1"},
            ["gang-autoscaler.io/max-buffer"],
            id="a-bad-bound-is-named-alone-not-with-the-default-moved-to-match",
        ),
    ],
)
def test_an_operator_default_yields_to_the_other_bound_the_lws_sets(own, expected):
    defaults = {"gang-autoscaler.io/min-buffer": "1", "gang-autoscaler.io/max-buffer": "4"}
    found = discover(_pd(decode_extra=own), default_annotations=defaults)[DECODE]
    if isinstance(expected, list):
        assert found.policy is None
        assert [p.annotation for p in found.problems] == expected
    else:
        assert found.problems == ()
        assert (found.policy.min_buffer, found.policy.max_buffer) == expected


def _bump(lws, version, **annotations):
    lws = copy.deepcopy(lws)
    lws["metadata"]["resourceVersion"] = version
    lws["metadata"]["annotations"].update(annotations)
    return lws


def test_the_parse_cache_parses_each_object_version_once():
    cache = ParseCache()
    objects = _pd()
    first = discover(objects, cache=cache)
    again = discover(objects, cache=cache)
    assert (cache.misses, cache.hits, len(cache)) == (2, 2, 2)
    assert again == first

    # a new version is parsed again and the old one forgotten
    prefill, decode = objects
    bigger = _bump(prefill, "11", **{"gang-autoscaler.io/max-replicas": "9"})
    found = discover([bigger, decode], cache=cache)
    assert found[PREFILL].policy.max_replicas == 9
    assert (cache.misses, len(cache)) == (3, 2)

    # a deleted object leaves the cache
    discover([bigger], cache=cache)
    assert len(cache) == 1


def test_the_parse_cache_keeps_no_deployment_problem_of_an_earlier_call():
    cache = ParseCache()
    prefill, decode = _pd()
    broken = _bump(decode, "11", **{"gang-autoscaler.io/max-replicas": "lots"})
    held = discover([prefill, broken], cache=cache)
    assert not held[PREFILL].usable  # held for its partner's sake
    fixed = _bump(decode, "12")
    found = discover([prefill, fixed], cache=cache)
    assert cache.hits == 1  # prefill's own parse was reused...
    assert found[PREFILL].usable and found[PREFILL].problems == ()  # ...without the problem


def test_objects_without_a_version_are_parsed_every_time():
    cache = ParseCache()
    objects = _pd()
    for lws in objects:
        del lws["metadata"]["resourceVersion"]
    discover(objects, cache=cache)
    discover(objects, cache=cache)
    assert (cache.hits, cache.misses, len(cache)) == (0, 0, 0)


def test_operator_defaults_are_part_of_the_cache_key():
    cache = ParseCache()
    objects = _pd()
    discover(objects, cache=cache, default_annotations={"gang-autoscaler.io/max-buffer": "4"})
    found = discover(
        objects, cache=cache, default_annotations={"gang-autoscaler.io/max-buffer": "2"}
    )
    assert found[PREFILL].policy.max_buffer == 2
