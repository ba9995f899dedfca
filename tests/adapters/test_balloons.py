"""Balloon gang manifests and the create/delete plan, on the real vLLM LWS example."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import kubernetes_validate
import pytest

from autoscaler.adapters.balloons import (
    PAUSE_IMAGE,
    PRIORITY_CLASS_NAME,
    balloon_gang_manifests,
    balloon_name_clashes,
    balloons_by_lws,
    plan_balloons,
    shape_digest,
    stranded_balloons,
)
from autoscaler.adapters.kube_errors import BalloonShapeError
from autoscaler.core.shape import gang_shape_from_lws, parse_quantity, pod_shape_from_spec
from tests.adapters.kube_fixtures import vllm_lws

TOPOLOGY = "cloud.google.com/gke-nodepool"


def _lws(**kwargs):
    lws = vllm_lws(**kwargs)
    lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] = TOPOLOGY
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    for tpl in ("leaderTemplate", "workerTemplate"):
        spec = lws["spec"]["leaderWorkerTemplate"][tpl]["spec"]
        spec["nodeSelector"] = {"gpu": "h100"}
        spec["tolerations"] = tolerations
    return lws


def test_members_copy_the_lws_templates_exact_resources_and_placement():
    lws = _lws()
    shape = gang_shape_from_lws(lws)
    pods = balloon_gang_manifests(lws, shape=shape, gang_index=1, image=PAUSE_IMAGE)
    assert [p["metadata"]["name"] for p in pods] == ["vllm-balloon-1-0", "vllm-balloon-1-1"]
    templates = lws["spec"]["leaderWorkerTemplate"]
    for pod, tpl in zip(pods, ("leaderTemplate", "workerTemplate"), strict=True):
        real = pod_shape_from_spec(templates[tpl]["spec"])
        mine = pod_shape_from_spec(pod["spec"])
        assert mine.requests == real.requests  # 8 GPUs, 125 CPU, 1124Gi, 800Gi scratch
        assert mine.limits == real.limits
        assert mine.requests["nvidia.com/gpu"] == 8
        assert mine.requests["memory"] == parse_quantity("memory", "1124Gi")
        spec = pod["spec"]
        assert spec["containers"][0]["image"] == PAUSE_IMAGE
        assert spec["priorityClassName"] == PRIORITY_CLASS_NAME
        assert spec["terminationGracePeriodSeconds"] == 0
        assert spec["automountServiceAccountToken"] is False
        assert spec["nodeSelector"] == {"gpu": "h100"}
        assert spec["tolerations"] == templates[tpl]["spec"]["tolerations"]
        (term,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == TOPOLOGY
        assert term["labelSelector"]["matchLabels"] == {
            "gang-autoscaler.io/balloon-for": "vllm",
            "gang-autoscaler.io/balloon-gang": "1",
        }
        meta = pod["metadata"]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "gang-autoscaler"
        # the affinity selects exactly this gang's members, including the pod itself
        assert term["labelSelector"]["matchLabels"].items() <= meta["labels"].items()
        (owner,) = meta["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "LeaderWorkerSet",
            "vllm",
            "uid-vllm",
        )


def test_no_topology_key_means_no_pod_affinity_and_template_affinity_is_kept():
    lws = vllm_lws()
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
            ]
        }
    }
    for tpl in ("leaderTemplate", "workerTemplate"):
        lws["spec"]["leaderWorkerTemplate"][tpl]["spec"]["affinity"] = {
            "nodeAffinity": node_affinity
        }
    pods = balloon_gang_manifests(
        lws, shape=gang_shape_from_lws(lws), gang_index=0, image=PAUSE_IMAGE
    )
    for pod in pods:
        assert pod["spec"]["affinity"] == {"nodeAffinity": node_affinity}


def test_a_name_too_long_for_a_label_is_refused_clearly():
    lws = vllm_lws(name="x" * 64)
    with pytest.raises(BalloonShapeError, match="longer than 63"):
        balloon_gang_manifests(lws, shape=gang_shape_from_lws(lws), gang_index=0, image=PAUSE_IMAGE)


def test_a_template_whose_devices_come_from_resource_claims_gets_no_balloons():
    """With Dynamic Resource Allocation the GPUs are claimed, not requested: a pause pod
    copying the requests held none of them, and the buffer counted it as held."""
    lws = _lws()
    for tpl in ("leaderTemplate", "workerTemplate"):
        spec = lws["spec"]["leaderWorkerTemplate"][tpl]["spec"]
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "eight-h100"}]
        del spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    with pytest.raises(BalloonShapeError, match=r"resourceClaims \['gpus'\]"):
        balloon_gang_manifests(lws, shape=gang_shape_from_lws(lws), gang_index=0, image=PAUSE_IMAGE)
    # balloons made before such templates were refused are outdated, and go, even where the
    # claims came beside unchanged requests
    claims_only = _lws()
    for tpl in ("leaderTemplate", "workerTemplate"):
        spec = claims_only["spec"]["leaderWorkerTemplate"][tpl]["spec"]
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "eight-h100"}]
    plan = _plan(claims_only, _existing(_lws(), [0]), 1)
    assert plan.broken_gangs == (0,) and len(plan.delete_pods) == 2


def _existing(lws, gangs, *, drop=(), terminating=(), digest_of=None, image=PAUSE_IMAGE):
    shape = gang_shape_from_lws(digest_of or lws)
    pods = []
    for gang in gangs:
        for pod in balloon_gang_manifests(lws, shape=shape, gang_index=gang, image=image):
            name = pod["metadata"]["name"]
            if name in drop:
                continue
            if name in terminating:
                pod["metadata"]["deletionTimestamp"] = "2026-11-22T01:00:00Z"
            pods.append(pod)
    return pods


def _plan(lws, pods, desired, *, image=PAUSE_IMAGE, **timing):
    """`timing`: plan_balloons's now_s, split_timeout_s and split_seen."""
    shape = gang_shape_from_lws(lws)
    return plan_balloons(
        pods,
        lws_name="vllm",
        desired_gangs=desired,
        pods_per_gang=shape.pods_per_gang,
        digest=shape_digest(shape, image=image),
        **timing,
    )


def test_plan_creates_missing_gangs_whole():
    lws = _lws()
    plan = _plan(lws, _existing(lws, [0]), 3)
    assert plan.create_gangs == (1, 2) and plan.delete_pods == () and plan.held_gangs == 1


def test_resize_down_removes_the_highest_numbered_gangs_first():
    lws = _lws()
    plan = _plan(lws, _existing(lws, [0, 1, 2]), 1)
    assert plan.delete_pods == tuple(f"vllm-balloon-{g}-{m}" for g in (1, 2) for m in (0, 1))
    assert plan.create_gangs == () and plan.held_gangs == 1


def test_a_preempted_member_deletes_the_rest_of_its_gang_and_a_new_gang_replaces_it():
    lws = _lws()
    pods = _existing(lws, [0, 1], drop={"vllm-balloon-0-1"})
    plan = _plan(lws, pods, 2)
    assert plan.delete_pods == ("vllm-balloon-0-0",)
    assert plan.broken_gangs == (0,)
    assert plan.create_gangs == (2,)  # at once, under a number no pod holds
    after = [p for p in pods if p["metadata"]["name"] != "vllm-balloon-0-0"]
    assert _plan(lws, after, 2).create_gangs == (0,)  # a number is free once its pods are gone


def _bind(pods, *names):
    for pod in pods:
        if pod["metadata"]["name"] in names:
            pod["spec"]["nodeName"] = "gpu-" + pod["metadata"]["name"]
    return pods


def test_a_smaller_buffer_gives_up_pending_gangs_and_keeps_placed_ones():
    lws = _lws()
    pods = _bind(_existing(lws, [0, 1, 2]), "vllm-balloon-2-0", "vllm-balloon-2-1")
    plan = _plan(lws, pods, 1)
    assert plan.delete_pods == tuple(f"vllm-balloon-{g}-{m}" for g in (0, 1) for m in (0, 1))
    assert plan.held_gangs == 1 and plan.create_gangs == () and plan.broken_gangs == ()


def _scheduled(pods, when, *names):
    for pod in pods:
        if pod["metadata"]["name"] in names:
            pod["spec"]["nodeName"] = "gpu-" + pod["metadata"]["name"]
            pod["status"] = {
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": when}
                ]
            }
    return pods


@pytest.mark.parametrize(
    ("bound", "bound_for_s", "seen_for_s", "replaced"),
    [
        pytest.param(("vllm-balloon-0-0",), 700, 690, True, id="split-past-the-timeout"),
        pytest.param(("vllm-balloon-0-0",), 500, 490, False, id="split-within-the-timeout"),
        pytest.param(("vllm-balloon-0-0",), 5, 0, False, id="waited-for-nodes-then-bound"),
        pytest.param((), 700, None, False, id="all-pending-waits-for-nodes"),
        # this process's clock an hour ahead of the API server's: the binding looks an hour
        # old the first time the split is seen; its own record decides
        pytest.param(("vllm-balloon-0-0",), 3600, None, False, id="clock-ahead-first-sight"),
        pytest.param(("vllm-balloon-0-0",), 3600, 601, True, id="clock-ahead-own-record-past"),
        # bound later than the record says (the API server's clock ahead): the binding decides
        pytest.param(("vllm-balloon-0-0",), 100, 700, False, id="bound-later-than-record"),
    ],
)
def test_a_gang_split_between_a_placed_and_a_pending_member_is_replaced(
    bound, bound_for_s, seen_for_s, replaced
):
    """The leader took the last free node of a full rack; the worker, held to that rack by
    the gang's affinity, waits there for good, and the buffer counted the gang as held. The
    clock starts when the first member was bound: a gang that waited 20 minutes for nodes
    and just got its first one is not split for 20 minutes; and no earlier than this process
    first saw the split, since the binding time is on the API server's clock."""
    lws = _lws()
    start_s = datetime.fromisoformat("2026-11-22T01:00:00+00:00").timestamp()
    now_s = start_s + 4000
    bound_at = datetime.fromtimestamp(now_s - bound_for_s, tz=UTC).isoformat()
    pods = _existing(lws, [0])
    for pod in pods:
        pod["metadata"]["creationTimestamp"] = "2026-11-22T01:00:00Z"
    pods = _scheduled(pods, bound_at.replace("+00:00", "Z"), *bound)
    seen = {} if seen_for_s is None else {0: now_s - seen_for_s}
    plan = _plan(lws, pods, 1, now_s=now_s, split_timeout_s=600, split_seen=seen)
    if replaced:
        assert plan.broken_gangs == (0,) and plan.held_gangs == 0
        assert plan.delete_pods == ("vllm-balloon-0-0", "vllm-balloon-0-1")
        assert plan.create_gangs == (1,)
    else:
        assert not plan.changes and plan.held_gangs == 1
    if bound:  # split now: the sighting is carried to the next pass, the first one from now
        assert plan.split_seen == ((0, seen.get(0, now_s)),)
    else:
        assert plan.split_seen == ()


@pytest.mark.parametrize(("seen_for_s", "replaced"), [(601, True), (599, False)])
def test_a_split_gang_whose_pods_give_no_binding_time_is_timed_from_its_sighting(
    seen_for_s, replaced
):
    lws = _lws()
    pods = _bind(_existing(lws, [0]), "vllm-balloon-0-0")  # bound, no PodScheduled condition
    now_s = 1_800_000_000.0
    plan = _plan(lws, pods, 1, now_s=now_s, split_timeout_s=600, split_seen={0: now_s - seen_for_s})
    assert plan.broken_gangs == ((0,) if replaced else ())


def test_a_broken_gang_never_costs_a_placed_one():
    """A real pod preempts gang 0 as the buffer drops from 2 to 1: the placed gang 1 stays.
    Keeping gangs by number deleted both and left the buffer Pending, a node lead time."""
    lws = _lws()
    pods = _bind(
        _existing(lws, [0, 1], drop={"vllm-balloon-0-1"}), "vllm-balloon-1-0", "vllm-balloon-1-1"
    )
    plan = _plan(lws, pods, 1)
    assert plan.delete_pods == ("vllm-balloon-0-0",) and plan.broken_gangs == (0,)
    assert plan.held_gangs == 1 and plan.create_gangs == ()


def test_terminating_members_are_not_deleted_twice():
    lws = _lws()
    pods = _existing(lws, [0], terminating={"vllm-balloon-0-0"})
    plan = _plan(lws, pods, 1)
    assert plan.delete_pods == ("vllm-balloon-0-1",) and plan.broken_gangs == (0,)


def test_a_changed_lws_template_replaces_its_balloons():
    old = _lws()
    new = _lws()
    new["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["resources"][
        "limits"
    ]["nvidia.com/gpu"] = "4"
    plan = _plan(new, _existing(old, [0]), 1)
    assert plan.broken_gangs == (0,) and len(plan.delete_pods) == 2


MIRROR = "mirror.example.com/k8s/pause:3.10"


def _set_in_templates(field, value):
    def edit(lws):
        for tpl in ("leaderTemplate", "workerTemplate"):
            lws["spec"]["leaderWorkerTemplate"][tpl]["spec"][field] = copy.deepcopy(value)

    return edit


SPREAD = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "DoNotSchedule",
    "labelSelector": {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": "vllm"}},
}


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(_set_in_templates("runtimeClassName", "nvidia"), id="runtime-class"),
        pytest.param(
            _set_in_templates("imagePullSecrets", [{"name": "mirror-pull"}]), id="pull-secrets"
        ),
        pytest.param(_set_in_templates("schedulerName", "kai-scheduler"), id="scheduler"),
        pytest.param(_set_in_templates("topologySpreadConstraints", [SPREAD]), id="spread"),
    ],
)
def test_a_template_change_in_what_balloons_copy_replaces_them(edit):
    old = _lws()
    new = _lws()
    edit(new)
    assert shape_digest(gang_shape_from_lws(new), image=PAUSE_IMAGE) != shape_digest(
        gang_shape_from_lws(old), image=PAUSE_IMAGE
    )
    plan = _plan(new, _existing(old, [0]), 1)
    assert plan.broken_gangs == (0,) and len(plan.delete_pods) == 2
    assert _plan(new, _existing(new, [0]), 1).changes is False


def test_a_new_balloon_image_replaces_the_balloons():
    lws = _lws()
    pods = _existing(lws, [0, 1])
    plan = _plan(lws, pods, 2, image=MIRROR)
    assert plan.broken_gangs == (0, 1) and len(plan.delete_pods) == 4
    rebuilt = _existing(lws, [0, 1], image=MIRROR)
    assert {p["spec"]["containers"][0]["image"] for p in rebuilt} == {MIRROR}
    assert not _plan(lws, rebuilt, 2, image=MIRROR).changes


def test_an_unchanged_lws_keeps_its_balloons_across_an_upgrade():
    # Every cluster replaces every balloon gang once when this digest changes. The fields
    # balloons copy only when a template sets them, and the default image, leave the digest
    # of the LWS example as it was before they were copied. Change the value deliberately,
    # and say so under "Upgrading" in docs/operators.md.
    # (the example has an exclusive topology: its balloon gangs were replaced once when they
    # began keeping out of each other's domain)
    assert shape_digest(gang_shape_from_lws(_lws()), image=PAUSE_IMAGE) == "e6e47b030c4d19bc"
    assert shape_digest(gang_shape_from_lws(vllm_lws()), image=PAUSE_IMAGE) == "52a33ada241ad748"


def test_members_copy_runtime_class_scheduler_spread_and_pull_secrets_of_their_template():
    lws = _lws()
    templates = lws["spec"]["leaderWorkerTemplate"]
    leader, worker = templates["leaderTemplate"]["spec"], templates["workerTemplate"]["spec"]
    for spec in (leader, worker):
        spec["runtimeClassName"] = "nvidia"
        spec["schedulerName"] = "kai-scheduler"
        spec["imagePullSecrets"] = [{"name": "mirror-pull"}]
    leader["topologySpreadConstraints"] = [SPREAD]
    worker["imagePullSecrets"].append({"name": "ngc"})
    pods = balloon_gang_manifests(lws, shape=gang_shape_from_lws(lws), gang_index=0, image=MIRROR)
    for pod, template in zip(pods, (leader, worker), strict=True):
        spec = pod["spec"]
        assert spec["containers"][0]["image"] == MIRROR
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["schedulerName"] == "kai-scheduler"
        assert spec["imagePullSecrets"] == template["imagePullSecrets"]
        assert spec.get("topologySpreadConstraints") == template.get("topologySpreadConstraints")
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    # a copy, not the template's own objects
    assert pods[0]["spec"]["topologySpreadConstraints"][0] is not SPREAD
    plain = _lws()
    for pod in balloon_gang_manifests(
        plain, shape=gang_shape_from_lws(plain), gang_index=0, image=PAUSE_IMAGE
    ):
        for field in (
            "runtimeClassName",
            "schedulerName",
            "imagePullSecrets",
            "topologySpreadConstraints",
        ):
            assert field not in pod["spec"]


def test_a_template_overhead_is_left_to_the_runtime_class_admission():
    # A template may state its RuntimeClass's overhead (admission refuses any other value).
    # The balloon names the same class, so admission adds the overhead to it too: its
    # container must ask only for the rest, or the balloon would hold the overhead twice.
    overhead = {"cpu": "250m", "memory": "160Mi"}
    lws = _lws()
    for tpl in ("leaderTemplate", "workerTemplate"):
        spec = lws["spec"]["leaderWorkerTemplate"][tpl]["spec"]
        spec["runtimeClassName"] = "kata-nvidia"
        spec["overhead"] = dict(overhead)
    templates = lws["spec"]["leaderWorkerTemplate"]
    pods = balloon_gang_manifests(
        lws, shape=gang_shape_from_lws(lws), gang_index=0, image=PAUSE_IMAGE
    )
    for pod, tpl in zip(pods, ("leaderTemplate", "workerTemplate"), strict=True):
        assert "overhead" not in pod["spec"]
        admitted = {**pod["spec"], "overhead": overhead}  # what RuntimeClass admission does
        real = pod_shape_from_spec(templates[tpl]["spec"])
        assert pod_shape_from_spec(admitted).requests == real.requests
        assert pod_shape_from_spec(admitted).limits == real.limits


def test_plan_is_idempotent_once_reached():
    lws = _lws()
    plan = _plan(lws, _existing(lws, [0, 1]), 2)
    assert not plan.changes and plan.held_gangs == 2


def test_balloon_pods_are_grouped_by_the_lws_they_hold_capacity_for():
    a = _existing(_lws(name="a"), [0, 1])
    b = _existing(_lws(name="b"), [0])
    other_ns = _existing(_lws(name="a", namespace="staging"), [0])
    not_ours = _existing(_lws(name="a"), [2])
    for pod in not_ours:
        pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone-else"
    grouped = balloons_by_lws([*a, *b, *other_ns, *not_ours])
    assert {k: len(v) for k, v in grouped.items()} == {
        ("serving", "a"): 4,
        ("serving", "b"): 2,
        ("staging", "a"): 2,
    }
    # the grouped list plans as the whole list does
    shape = gang_shape_from_lws(_lws(name="a"))
    whole, mine = (
        plan_balloons(
            pods,
            lws_name="a",
            desired_gangs=1,
            pods_per_gang=2,
            digest=shape_digest(shape, image=PAUSE_IMAGE),
        )
        for pods in ([*a, *b], grouped[("serving", "a")])
    )
    assert whole == mine and len(mine.delete_pods) == 2


def test_balloon_pods_meet_the_restricted_pod_security_standard():
    # Pod Security Admission's `restricted` level (kubernetes.io/docs/concepts/security/
    # pod-security-standards), which a namespace may enforce: it refuses a pod that falls
    # short at creation (403), and the buffer stays empty.
    lws = _lws()
    for pod in balloon_gang_manifests(
        lws, shape=gang_shape_from_lws(lws), gang_index=0, image=PAUSE_IMAGE
    ):
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "runAsUser" not in spec["securityContext"]  # OpenShift assigns its own
        for key in ("hostNetwork", "hostPID", "hostIPC", "volumes"):
            assert key not in spec
        (container,) = spec["containers"]
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context.get("privileged") is not True
        assert "ports" not in container


@pytest.mark.parametrize(
    ("others", "clash"),
    [
        pytest.param(["llama", "other"], None, id="no-other-lws-named-after-it"),
        pytest.param(["llama-balloon"], "llama-balloon", id="workers-take-member-names"),
        pytest.param(["llama-balloon-3"], "llama-balloon-3", id="leaders-take-member-names"),
        pytest.param(
            ["llama-balloon-03", "llama-balloon-x", "llama-balloons", "llama-balloon-3-1"],
            None,
            id="names-lws-never-gives-a-balloon-pod",
        ),
        pytest.param(["xllama-balloon"], None, id="another-prefix"),
        pytest.param(["llama-balloon-2", "llama-balloon"], "llama-balloon", id="first-by-name"),
    ],
)
def test_lws_whose_pods_are_named_as_balloon_pods(others, clash):
    assert balloon_name_clashes(["llama", *others]).get("llama") == clash


def test_name_clashes_are_found_for_every_lws_in_one_pass():
    names = ["a", "a-balloon", "a-balloon-balloon", "b", "b-balloon-7", "c-balloon-x"]
    assert balloon_name_clashes(names) == {
        "a": "a-balloon",
        "a-balloon": "a-balloon-balloon",
        "b": "b-balloon-7",
    }


def test_a_balloon_pod_is_stranded_only_by_what_it_does_not_tolerate():
    """Judged by the pod's own tolerations, which admission completed: on a GKE GPU node
    (`nvidia.com/gpu=present:NoSchedule`, tolerated by the toleration admission added) a
    balloon pod is not stranded, or every balloon gang there would be replaced each pass. A
    node's passing conditions (not ready, memory pressure: the node lifecycle's taints) do
    not strand it either: replacing a gang on each would order nodes for nothing."""

    def node(name: str, *, taints: tuple[tuple[str, str], ...] = (), cordoned=False):
        spec: dict[str, object] = {"taints": [{"key": k, "effect": e} for k, e in taints]}
        if cordoned:
            spec["unschedulable"] = True
        return {"metadata": {"name": name}, "spec": spec}

    nodes = {
        n["metadata"]["name"]: n
        for n in (
            node("gke", taints=(("nvidia.com/gpu", "NoSchedule"),)),
            node("drained", taints=(("karpenter.sh/disrupted", "NoSchedule"),)),
            node("cordoned", cordoned=True),
            node("pressure", taints=(("node.kubernetes.io/memory-pressure", "NoSchedule"),)),
            node("not-ready", taints=(("node.kubernetes.io/not-ready", "NoExecute"),)),
            node("prefer", taints=(("team", "PreferNoSchedule"),)),
        )
    }
    gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    pods = [
        {"metadata": {"name": name}, "spec": {"nodeName": name, "tolerations": [gpu_toleration]}}
        for name in nodes
    ] + [{"metadata": {"name": "pending"}, "spec": {"tolerations": [gpu_toleration]}}]
    assert stranded_balloons(pods, nodes) == {"drained", "cordoned"}
