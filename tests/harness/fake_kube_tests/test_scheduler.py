"""The scheduler: resource fit, selectors, taints, affinity, unschedulable status, preemption."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from tests.harness.fake_kube import FakeKube
from tests.harness.fake_kube_tests.conftest import GROUP, PLURAL, VERSION, lws_manifest


def pod(
    name: str,
    *,
    gpus: int = 0,
    cpu: str = "1",
    priority_class: str | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "resources": {"limits": limits, "requests": {"cpu": cpu}},
                }
            ],
            **spec,
        },
    }
    if priority_class:
        body["spec"]["priorityClassName"] = priority_class
    return body


async def placement(core: client.CoreV1Api) -> dict[str, str | None]:
    pods = await core.list_namespaced_pod("default")
    return {p.metadata.name: p.spec.node_name for p in pods.items}


async def test_two_8_gpu_pods_do_not_fit_two_nodes_with_4_free_each(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    kube.add_node("n1", gpus=8)
    kube.add_node("n2", gpus=8)
    await core.create_namespaced_pod("default", pod("fill-1", gpus=4))
    await core.create_namespaced_pod("default", pod("fill-2", gpus=4))
    assert set((await placement(core)).values()) == {"n1", "n2"}
    await core.create_namespaced_pod("default", pod("big-1", gpus=8))
    await core.create_namespaced_pod("default", pod("big-2", gpus=8))
    placed = await placement(core)
    assert placed["big-1"] is None and placed["big-2"] is None
    big = await core.read_namespaced_pod("big-1", "default")
    assert big.status.phase == "Pending"
    scheduled = next(c for c in big.status.conditions if c.type == "PodScheduled")
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    assert scheduled.message == (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
        "available: 2 No preemption victims found for incoming pod."
    )
    # Freeing one node lets exactly one of them in.
    await core.delete_namespaced_pod("fill-1", "default")
    placed = await placement(core)
    assert sorted(n for name, n in placed.items() if name.startswith("big") if n) == ["n1"]


async def test_bound_pod_looks_like_a_running_ready_pod(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    kube.add_node("n1")
    await core.create_namespaced_pod("default", pod("p"))
    bound = await core.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "n1"
    assert bound.status.phase == "Running"
    assert {c.type: c.status for c in bound.status.conditions} == {
        "PodReadyToStartContainers": "True",
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }
    assert bound.status.pod_ip and bound.status.host_ip


async def test_manual_readiness() -> None:
    async with FakeKube.start(pod_ready_delay_s=None) as kube:
        kube.add_node("n1")
        kube.apply({"apiVersion": "v1", "kind": "Pod", **pod("p")})
        ready = {
            c["type"]: c["status"]
            for c in kube.object("pods", "default", "p")["status"]["conditions"]
        }
        assert ready["Ready"] == "False"
        kube.set_pod_ready("default", "p")
        ready = {
            c["type"]: c["status"]
            for c in kube.object("pods", "default", "p")["status"]["conditions"]
        }
        assert ready["Ready"] == "True"


async def test_node_selector_taints_and_node_affinity(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    kube.add_node("plain", labels={"pool": "cpu"})
    kube.add_node(
        "gpu",
        gpus=8,
        labels={"pool": "gpu", "gpu.product": "H100"},
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    )
    await core.create_namespaced_pod("default", pod("no-toleration", gpus=1))
    await core.create_namespaced_pod(
        "default",
        pod(
            "tolerated",
            gpus=1,
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        ),
    )
    await core.create_namespaced_pod("default", pod("selector", nodeSelector={"pool": "gpu"}))
    await core.create_namespaced_pod(
        "default",
        pod(
            "affinity",
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}],
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "gpu.product",
                                        "operator": "In",
                                        "values": ["H100", "A100"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        ),
    )
    await core.create_namespaced_pod(
        "default",
        pod(
            "anti-gpu",
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "gpu.product", "operator": "DoesNotExist"}
                                ]
                            }
                        ]
                    }
                }
            },
        ),
    )
    assert await placement(core) == {
        "no-toleration": None,
        "tolerated": "gpu",
        "selector": None,
        "affinity": "gpu",
        "anti-gpu": "plain",
    }
    message = next(
        c.message
        for c in (await core.read_namespaced_pod("selector", "default")).status.conditions
        if c.type == "PodScheduled"
    )
    assert "1 node(s) didn't match Pod's node affinity/selector" in message
    assert "1 node(s) had untolerated taint {nvidia.com/gpu: present}" in message


async def test_exclusive_topology_keeps_a_group_in_one_domain(
    kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    # Two racks of two 4-GPU nodes; a 2x4-GPU group must stay within one rack, and two
    # groups must not share a rack.
    for rack in ("r1", "r2"):
        for index in range(2):
            kube.add_node(f"{rack}-{index}", gpus=4, labels={"rack": rack})
    await custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        lws_manifest(
            "d",
            replicas=3,
            size=2,
            gpus=4,
            annotations={"leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"},
        ),
    )
    placed = await placement(core)

    def rack_of(name: str) -> str | None:
        node = placed[name]
        return node.split("-")[0] if node else None

    assert rack_of("d-0") == rack_of("d-0-1") is not None
    assert rack_of("d-1") == rack_of("d-1-1") is not None
    assert rack_of("d-0") != rack_of("d-1")
    assert placed["d-2"] is None and placed["d-2-1"] is None


async def test_required_pod_affinity_follows_the_first_member(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    for zone in ("a", "b"):
        kube.add_node(f"node-{zone}", cpu="4", labels={"zone": zone})
    term = {"labelSelector": {"matchLabels": {"gang": "g1"}}, "topologyKey": "zone"}
    for index in range(3):
        await core.create_namespaced_pod(
            "default",
            pod(
                f"g1-{index}",
                cpu="1",
                labels={"gang": "g1"},
                affinity={
                    "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
                },
            ),
        )
    nodes = set((await placement(core)).values())
    assert len(nodes) == 1 and None not in nodes
    # A fifth CPU in that zone does not exist: the next member stays Pending, never crossing.
    for index in (3, 4):
        await core.create_namespaced_pod(
            "default",
            pod(
                f"g1-{index}",
                cpu="1",
                labels={"gang": "g1"},
                affinity={
                    "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
                },
            ),
        )
    placed = await placement(core)
    assert placed["g1-3"] in nodes and placed["g1-4"] is None


@pytest.fixture
def priorities(kube: FakeKube) -> None:
    kube.add_priority_class("balloon", -5, preemption_policy="Never")
    kube.add_priority_class("low", 100)
    kube.add_priority_class("mid", 500)
    kube.add_priority_class("high", 1000)


async def test_priority_is_resolved_from_the_priority_class(
    kube: FakeKube, priorities: None, core: client.CoreV1Api
) -> None:
    created = await core.create_namespaced_pod("default", pod("p", priority_class="mid"))
    assert created.spec.priority == 500
    assert created.spec.preemption_policy == "PreemptLowerPriority"


async def test_preemption_evicts_the_lowest_priority_victims_first(
    kube: FakeKube, priorities: None, core: client.CoreV1Api
) -> None:
    kube.add_node("n1", gpus=8)
    await core.create_namespaced_pod("default", pod("mid-4", gpus=4, priority_class="mid"))
    await core.create_namespaced_pod("default", pod("balloon-2", gpus=2, priority_class="balloon"))
    await core.create_namespaced_pod("default", pod("low-2", gpus=2, priority_class="low"))
    await core.create_namespaced_pod("default", pod("high-4", gpus=4, priority_class="high"))
    placed = await placement(core)
    # Both lower pods together free exactly 4 GPUs; the mid pod is reprieved.
    assert placed == {"mid-4": "n1", "high-4": "n1"}
    assert kube.preemptions == [
        ("default/balloon-2", "default/high-4"),
        ("default/low-2", "default/high-4"),
    ]


async def test_preemption_prefers_one_lowest_priority_victim_over_two_higher(
    kube: FakeKube, priorities: None, core: client.CoreV1Api
) -> None:
    kube.add_node("n1", gpus=8)
    await core.create_namespaced_pod("default", pod("low-2", gpus=2, priority_class="low"))
    await core.create_namespaced_pod("default", pod("mid-2", gpus=2, priority_class="mid"))
    await core.create_namespaced_pod("default", pod("balloon-4", gpus=4, priority_class="balloon"))
    await core.create_namespaced_pod("default", pod("high-4", gpus=4, priority_class="high"))
    assert await placement(core) == {"low-2": "n1", "mid-2": "n1", "high-4": "n1"}
    assert kube.preemptions == [("default/balloon-4", "default/high-4")]


async def test_preemption_takes_the_fewest_and_least_important_victims(
    kube: FakeKube, priorities: None, core: client.CoreV1Api
) -> None:
    kube.add_node("n1", gpus=8)
    kube.add_node("n2", gpus=8)
    await core.create_namespaced_pod(
        "default", pod("n1-low-a", gpus=4, priority_class="low", nodeName="n1")
    )
    await core.create_namespaced_pod(
        "default", pod("n1-low-b", gpus=4, priority_class="low", nodeName="n1")
    )
    await core.create_namespaced_pod(
        "default", pod("n2-balloon", gpus=8, priority_class="balloon", nodeName="n2")
    )
    await core.create_namespaced_pod("default", pod("high", gpus=8, priority_class="high"))
    placed = await placement(core)
    assert placed["high"] == "n2"
    assert "n2-balloon" not in placed
    assert placed["n1-low-a"] == placed["n1-low-b"] == "n1"


async def test_a_prebound_pod_that_does_not_fit_is_rejected_by_the_kubelet(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    kube.add_node("n1", gpus=4)
    await core.create_namespaced_pod("default", pod("fits", gpus=4, nodeName="n1"))
    await core.create_namespaced_pod("default", pod("extra", gpus=1, nodeName="n1"))
    fits = await core.read_namespaced_pod("fits", "default")
    extra = await core.read_namespaced_pod("extra", "default")
    assert fits.status.phase == "Running"
    assert (extra.status.phase, extra.status.reason) == ("Failed", "OutOfnvidia.com/gpu")


async def test_no_preemption_of_equal_or_higher_priority_or_by_never_policy(
    kube: FakeKube, priorities: None, core: client.CoreV1Api
) -> None:
    kube.add_node("n1", gpus=4)
    await core.create_namespaced_pod("default", pod("mid", gpus=4, priority_class="mid"))
    await core.create_namespaced_pod("default", pod("mid-2", gpus=4, priority_class="mid"))
    await core.create_namespaced_pod("default", pod("balloon", gpus=4, priority_class="balloon"))
    placed = await placement(core)
    assert placed == {"mid": "n1", "mid-2": None, "balloon": None}
    assert kube.preemptions == []


async def test_lws_scale_up_preempts_a_whole_balloon_gang_when_it_needs_all_of_it(
    kube: FakeKube, priorities: None, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    kube.add_node("n1", gpus=8)
    kube.add_node("n2", gpus=8)
    for member in range(2):
        await core.create_namespaced_pod(
            "default",
            pod(
                f"balloon-0-{member}",
                gpus=8,
                priority_class="balloon",
                labels={"gang-autoscaler.io/balloon-for": "d"},
            ),
        )
    await custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        lws_manifest("d", replicas=1, size=2, gpus=8, priority_class="high"),
    )
    placed = await placement(core)
    assert placed == {"d-0": placed["d-0"], "d-0-1": placed["d-0-1"]}
    assert {placed["d-0"], placed["d-0-1"]} == {"n1", "n2"}
    # The victims' last state, as watchers saw it deleted, says why it went.
    last_states = [
        c.obj
        for c in kube.store.changes_since(0)
        if c.type == "DELETED" and c.obj["metadata"]["name"].startswith("balloon")
    ]
    assert len(last_states) == 2
    for state in last_states:
        target = next(c for c in state["status"]["conditions"] if c["type"] == "DisruptionTarget")
        assert target["reason"] == "PreemptionByScheduler"
    events = await core.list_namespaced_event("default", field_selector="reason=Preempted")
    assert sorted(e.involved_object.name for e in events.items) == ["balloon-0-0", "balloon-0-1"]


async def test_a_large_cluster_stays_fast_enough_for_adapter_tests(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    # 40 nodes, 20 exclusive-rack groups of 8 pods: 10 groups fit, 80 pods stay Pending and
    # must not be re-scheduled on every unrelated write (this took 18 s before the scheduler
    # skipped passes without pod/node changes; it takes about 1 s now).
    import time

    for index in range(40):
        kube.add_node(f"n{index}", gpus=8, labels={"rack": f"r{index // 4}"})
    started = time.perf_counter()
    kube.apply(
        lws_manifest(
            "big",
            replicas=20,
            size=8,
            gpus=2,
            annotations={"leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"},
        )
    )
    for index in range(50):
        await core.create_namespaced_config_map("default", {"metadata": {"name": f"c{index}"}})
    elapsed_s = time.perf_counter() - started
    pods = kube.objects("pods")
    assert len(pods) == 160
    assert sum(1 for p in pods if p["spec"].get("nodeName")) == 80
    assert elapsed_s < 8, elapsed_s


async def test_anti_affinity_across_namespaces_by_namespace_selector(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    kube.add_node("a", labels={"zone": "a"})
    kube.add_node("b", labels={"zone": "b"})
    await core.create_namespace({"metadata": {"name": "team", "labels": {"tier": "gpu"}}})
    await core.create_namespaced_pod(
        "team", pod("other", labels={"app": "x"}, nodeSelector={"zone": "a"})
    )
    anti = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "zone"}
    # Same namespace only (the default): the pod in "team" is not seen.
    await core.create_namespaced_pod(
        "default",
        pod(
            "local",
            nodeSelector={"zone": "a"},
            affinity={
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [anti]}
            },
        ),
    )
    # Namespaces labelled tier=gpu: it is.
    await core.create_namespaced_pod(
        "default",
        pod(
            "selected",
            nodeSelector={"zone": "a"},
            affinity={
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {**anti, "namespaceSelector": {"matchLabels": {"tier": "gpu"}}}
                    ]
                }
            },
        ),
    )
    placed = await placement(core)
    assert placed == {"local": "a", "selected": None}


async def test_topology_spread_do_not_schedule_limits_the_skew(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    kube.add_node("a-0", cpu="8", labels={"zone": "a"})
    kube.add_node("b-0", cpu="1", labels={"zone": "b"})
    kube.add_node("no-zone", cpu="8")
    await core.create_namespaced_pod("default", pod("filler", cpu="1", nodeName="b-0"))
    spread = {
        "maxSkew": 1,
        "topologyKey": "zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
    }
    for index in range(2):
        await core.create_namespaced_pod(
            "default",
            pod(f"web-{index}", labels={"app": "web"}, topologySpreadConstraints=[spread]),
        )
    placed = await placement(core)
    # Zone b is full, so a second pod in zone a would make the skew 2: it stays Pending,
    # and the node without a zone label is never a candidate.
    assert (placed["web-0"], placed["web-1"]) == ("a-0", None)
    message = next(
        c.message
        for c in (await core.read_namespaced_pod("web-1", "default")).status.conditions
        if c.type == "PodScheduled"
    )
    assert message.startswith(
        "0/3 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match pod topology "
        "spread constraints, 1 node(s) didn't match pod topology spread constraints (missing "
        "required label)."
    )
    # nodeAffinityPolicy Honor: pods that select zone a only count zone a as a domain.
    for index in range(2):
        await core.create_namespaced_pod(
            "default",
            pod(
                f"pinned-{index}",
                labels={"app": "pinned"},
                nodeSelector={"zone": "a"},
                topologySpreadConstraints=[
                    {**spread, "labelSelector": {"matchLabels": {"app": "pinned"}}}
                ],
            ),
        )
    placed = await placement(core)
    assert (placed["pinned-0"], placed["pinned-1"]) == ("a-0", "a-0")
