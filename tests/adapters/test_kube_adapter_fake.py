"""The Kubernetes adapter against the fake API server, over HTTP with kubernetes-asyncio.

Nothing is monkeypatched: the adapter's own ApiClient talks to `FakeKube`, whose LWS
controller creates the group pods and whose scheduler binds and preempts them. The LWS
objects are the vLLM LWS guide's example (2 pods per gang, 8 GPUs each), one node per pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime as dt
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client

from autoscaler.adapters.kube_adapter import KubeAdapter
from autoscaler.adapters.kube_cache import WatchCache
from autoscaler.adapters.kube_errors import KubeAdapterError, NotLeader, status_message
from autoscaler.adapters.kube_objects import LWS_GROUP, LWS_PLURAL, LWS_VERSION, PAUSE_IMAGE
from autoscaler.adapters.kube_state import KubeState
from autoscaler.adapters.lws_scaler import ScaleResult
from autoscaler.core.decision import plan as core_plan
from autoscaler.core.gang_plan import ComponentPlan, GangPlan, Memory, Reason
from autoscaler.core.model import (
    ComponentKey,
    ComponentObservation,
    Forecast,
    GangState,
    Signals,
)
from autoscaler.core.shape import pod_shape_from_spec
from tests.adapters.kube_fixtures import vllm_lws
from tests.harness.fake_kube.resources import ResourceType
from tests.harness.fake_kube.server import FakeKube

NS = "default"
RACK = "example.com/rack"
ON = {"gang-autoscaler.io/enabled": "true"}
PREFILL = ComponentKey(NS, "llama-prefill")
DECODE = ComponentKey(NS, "llama-decode")


def add_gpu_nodes(kube: FakeKube, count: int, *, start: int = 0, per_rack: int = 2) -> None:
    for i in range(start, start + count):
        kube.add_node(
            f"gpu-{i}",
            cpu="190",
            memory="1500Gi",
            gpus=8,
            extended={"ephemeral-storage": "3000Gi"},
            labels={RACK: f"r{i // per_rack}"},
        )


async def kubectl_scale(api: client.ApiClient, lws: str, replicas: int) -> None:
    """What `kubectl scale lws <lws> --replicas=N` sends: a merge patch of /scale."""
    await client.CustomObjectsApi(api).patch_namespaced_custom_object_scale(
        LWS_GROUP,
        LWS_VERSION,
        NS,
        LWS_PLURAL,
        lws,
        {"spec": {"replicas": replicas}},
        _content_type="application/merge-patch+json",
    )


def lws_manifest(name: str, *, replicas: int, annotations: dict[str, str]) -> dict[str, Any]:
    lws = vllm_lws(name=name, namespace=NS, annotations=annotations, replicas=replicas)
    for key in ("uid", "resourceVersion"):
        lws["metadata"].pop(key)
    return lws


def add_pd(kube: FakeKube, *, prefill: int = 1, decode: int = 1, extra=None) -> None:
    common = {**ON, "gang-autoscaler.io/deployment": "llama", **(extra or {})}
    kube.apply(
        lws_manifest(
            "llama-prefill",
            replicas=prefill,
            annotations={**common, "gang-autoscaler.io/component": "prefill"},
        )
    )
    kube.apply(
        lws_manifest(
            "llama-decode",
            replicas=decode,
            annotations={**common, "gang-autoscaler.io/component": "decode"},
        )
    )


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    async with FakeKube.start(bookmark_interval_s=0.1) as server:
        yield server


@pytest.fixture
async def api(kube: FakeKube) -> AsyncIterator[client.ApiClient]:
    async with kube.api_client() as api_client:
        yield api_client


@pytest.fixture
async def adapter(api: client.ApiClient) -> AsyncIterator[KubeAdapter]:
    kube_adapter = KubeAdapter(api, watch_timeout_s=30, event_instance="test-0")
    await kube_adapter.start(sync_timeout_s=5)
    await kube_adapter.ensure_priority_class()
    yield kube_adapter
    await kube_adapter.close()


def component_plan(
    key: ComponentKey,
    *,
    current: int,
    desired: int,
    balloons: int = 0,
    reason: Reason = Reason.SCALE_UP_WAITING,
    rolled_back: tuple[int, ...] = (),
) -> ComponentPlan:
    return ComponentPlan(
        key=key,
        current_gangs=current,
        desired_gangs=desired,
        reason=reason,
        balloon_gangs=balloons,
        balloon_reason=Reason.BUFFER_MIN,
        rolled_back_groups=rolled_back,
    )


def lws_pods(kube: FakeKube, name: str) -> list[dict[str, Any]]:
    return kube.objects("pods", NS, label_selector=f"leaderworkerset.sigs.k8s.io/name={name}")


def balloon_pods(kube: FakeKube, name: str) -> list[dict[str, Any]]:
    return kube.objects("pods", NS, label_selector=f"gang-autoscaler.io/balloon-for={name}")


def events(kube: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.objects("events", NS) if e.get("reason") == reason]


def spec_replicas(kube: FakeKube, name: str) -> int:
    return int(kube.object("leaderworkersets", NS, name)["spec"]["replicas"])


async def settle(adapter: KubeAdapter, kube: FakeKube) -> None:
    """Wait until the watch caches have seen every change the fake has made so far (a
    collection whose API the fake does not serve has nothing to see)."""
    target = int(kube.store.resource_version)
    for cache in adapter.caches:
        if cache.unavailable is not None:
            continue
        await cache.wait_for(
            lambda c=cache: c.resource_version is not None and int(c.resource_version) >= target,
            timeout_s=5,
        )


async def scale_decode(
    adapter: KubeAdapter, kube: FakeKube, current: int, desired: int
) -> ScaleResult:
    """One apply that scales the decode LWS from `current` to `desired` gangs."""
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    plan = GangPlan({DECODE: component_plan(DECODE, current=current, desired=desired)})
    report = await adapter.apply(plan, state, dry_run=False)
    return report.components[DECODE].scale.result


# -- scaling ------------------------------------------------------------------------------


async def test_pd_deployment_is_scaled_through_scale_and_lws_creates_whole_gangs(kube, adapter):
    add_gpu_nodes(kube, 10)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    assert set(state.policies) == {PREFILL, DECODE}
    plan = GangPlan(
        {
            PREFILL: component_plan(PREFILL, current=1, desired=2),
            DECODE: component_plan(DECODE, current=1, desired=3),
        }
    )
    report = await adapter.apply(plan, state, dry_run=False)
    assert report.components[PREFILL].scale.result is ScaleResult.SCALED
    assert report.components[DECODE].scale.result is ScaleResult.SCALED

    patches = kube.requests("PATCH", "/scale")
    assert len(patches) == 2
    assert all(
        content_type.startswith("application/merge-patch+json") for *_, content_type in patches
    )
    for name, gangs in (("llama-prefill", 2), ("llama-decode", 3)):
        assert spec_replicas(kube, name) == gangs
        pods = lws_pods(kube, name)
        assert len(pods) == gangs * 2  # replicas x size
        names = sorted(p["metadata"]["name"] for p in pods)
        assert names == sorted(
            [f"{name}-{g}" for g in range(gangs)] + [f"{name}-{g}-1" for g in range(gangs)]
        )
        for pod in pods:
            labels = pod["metadata"]["labels"]
            group, worker = (
                labels["leaderworkerset.sigs.k8s.io/group-index"],
                labels["leaderworkerset.sigs.k8s.io/worker-index"],
            )
            expected = f"{name}-{group}" if worker == "0" else f"{name}-{group}-{worker}"
            assert pod["metadata"]["name"] == expected
    (scaled,) = (
        events(kube, "ScaleUpWaiting")
        if False
        else [
            e
            for e in events(kube, "ScaleUpWaiting")
            if e["involvedObject"]["name"] == "llama-decode"
        ]
    )
    assert scaled["type"] == "Normal" and "1 -> 3 gangs" in scaled["message"]

    # The same plan again, after the caches caught up, writes nothing: apply is idempotent.
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    again = GangPlan(
        {
            PREFILL: component_plan(PREFILL, current=2, desired=2),
            DECODE: component_plan(DECODE, current=3, desired=3),
        }
    )
    await adapter.apply(again, state, dry_run=False)
    assert len(kube.requests("PATCH", "/scale")) == 2
    observed = state.observations({}).components[DECODE]
    assert observed.ready_gangs == 3


async def test_dry_run_writes_nothing(kube, adapter):
    add_gpu_nodes(kube, 4)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2, balloons=1)})
    writes_before = len(kube.requests("POST")) + len(kube.requests("PATCH"))
    await adapter.apply(plan, state, dry_run=True)
    assert len(kube.requests("POST")) + len(kube.requests("PATCH")) == writes_before
    assert spec_replicas(kube, "llama-decode") == 1


async def two_decode_gangs_on(
    kube: FakeKube, adapter: KubeAdapter, *, nodes: int
) -> tuple[KubeState, ComponentObservation]:
    """A PD deployment with two decode gangs (a 1m gang-timeout) on `nodes` GPU nodes:
    the snapshot and decode's observation once the caches have seen it."""
    add_gpu_nodes(kube, nodes)
    add_pd(kube, decode=2, extra={"gang-autoscaler.io/gang-timeout": "1m"})
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    return state, state.observations({}).components[DECODE]


# Load that keeps two decode gangs busy (8 waiting requests, target 4 per gang over 1 ready
# gang), so only the partial-gang rule can take decode down.
TWO_DECODE_GANGS_BUSY = {
    PREFILL: Signals(waiting_requests=4.0, kv_usage_fraction=0.8),
    DECODE: Signals(waiting_requests=8.0, kv_usage_fraction=0.8),
}


async def test_partial_decode_gang_is_scaled_away_after_its_timeout_with_an_event(kube, adapter):
    # 5 nodes: prefill takes 2, decode group 0 takes 2, decode group 1 gets one of its 2 pods.
    state, decode = await two_decode_gangs_on(kube, adapter, nodes=5)
    assert [g.state for g in decode.gangs] == [GangState.READY, GangState.PARTIAL]
    since = decode.gangs[1].not_ready_since_s
    assert since is not None and abs(since - time.time()) < 120

    observations = state.observations(TWO_DECODE_GANGS_BUSY)
    # The loop first sees the partial gang a second after its pod was bound; it ages the gang
    # from the later of the two, and carries that sighting from tick to tick in its memory.
    within, memory = core_plan(observations, state.policies, {}, Memory(), now=since + 1)
    assert within.components[DECODE].desired_gangs == 2  # still within the timeout

    after, _ = core_plan(observations, state.policies, {}, memory, now=since + 62)
    decode_plan = after.components[DECODE]
    assert decode_plan.rolled_back_groups == (1,)
    assert decode_plan.desired_gangs == 1
    report = await adapter.apply(after, state, dry_run=False)
    assert report.components[DECODE].scale.result is ScaleResult.SCALED
    assert spec_replicas(kube, "llama-decode") == 1
    assert len(lws_pods(kube, "llama-decode")) == 2
    (rolled,) = events(kube, "PartialGangRolledBack")
    assert rolled["type"] == "Warning" and "groups [1]" in rolled["message"]
    assert rolled["involvedObject"]["name"] == "llama-decode"
    # a 1m timeout under the default 5m lead time: the Event says so
    assert "gang-timeout 60s is shorter than lead-time (300s)" in rolled["message"]


async def test_a_decode_gang_waiting_for_nodes_is_kept_past_its_timeout_with_an_event(
    kube, adapter
):
    """4 nodes: prefill and decode group 0 take them all, decode group 1 has no pod placed.
    It holds no GPU and the cluster can grow: it was scaled away at the timeout and asked
    for again on the next tick, every timeout, churning the LWS and the node orders."""
    state, decode = await two_decode_gangs_on(kube, adapter, nodes=4)
    assert [g.state for g in decode.gangs] == [GangState.READY, GangState.PENDING]

    observations = state.observations(TWO_DECODE_GANGS_BUSY)
    now = time.time()
    _, memory = core_plan(observations, state.policies, {}, Memory(), now=now)
    after, _ = core_plan(observations, state.policies, {}, memory, now=now + 3600)
    decode_plan = after.components[DECODE]
    assert (decode_plan.desired_gangs, decode_plan.rolled_back_groups) == (2, ())
    assert decode_plan.unplaced_groups == (1,)
    await adapter.apply(after, state, dry_run=False)
    assert spec_replicas(kube, "llama-decode") == 2
    assert events(kube, "PartialGangRolledBack") == []
    (event,) = events(kube, "GangUnplaced")
    assert event["type"] == "Warning"
    assert event["message"].startswith(
        "groups [1] have had no pod placed for longer than gang-timeout; they hold no GPU"
    )

    # the same gang with no node to come: scaled away, as nothing will place it
    fixed = dataclasses.replace(
        observations, cluster=dataclasses.replace(observations.cluster, can_grow=False)
    )
    capped, _ = core_plan(fixed, state.policies, {}, memory, now=now + 3600)
    assert capped.components[DECODE].rolled_back_groups == (1,)


async def test_a_roll_back_event_names_the_waiting_gangs_that_go_with_it(kube, adapter):
    add_gpu_nodes(kube, 6)
    add_pd(kube, decode=3)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    rolled = component_plan(
        DECODE, current=3, desired=1, reason=Reason.PARTIAL_GANG_ROLLED_BACK, rolled_back=(1,)
    )
    await adapter.apply(GangPlan({DECODE: rolled}), state, dry_run=False)
    (event,) = events(kube, "PartialGangRolledBack")
    assert event["message"] == (
        "groups [1] stayed partially scheduled past gang-timeout and were scaled away, with "
        "groups [2] above them (3 -> 1 gangs)"
    )


async def test_a_roll_back_event_names_no_gang_below_the_one_rolled_back(kube, adapter):
    """The load took decode 3 -> 1 while group 2 had timed out: the Event named the ready
    groups below it as gangs "above them"."""
    add_gpu_nodes(kube, 6)
    add_pd(kube, decode=3)
    await settle(adapter, kube)
    rolled = component_plan(
        DECODE, current=3, desired=1, reason=Reason.SCALE_DOWN_WAITING, rolled_back=(2,)
    )
    await adapter.apply(
        GangPlan({DECODE: rolled}), adapter.snapshot(now_s=time.time()), dry_run=False
    )
    (event,) = events(kube, "PartialGangRolledBack")
    assert event["message"] == (
        "groups [2] stayed partially scheduled past gang-timeout and were scaled away "
        "(3 -> 1 gangs)"
    )


async def test_a_roll_back_event_says_how_long_the_gangs_are_waited_for(kube, adapter):
    add_gpu_nodes(kube, 6)
    add_pd(kube, decode=2)
    await settle(adapter, kube)
    rolled = dataclasses.replace(
        component_plan(
            DECODE, current=2, desired=1, reason=Reason.PARTIAL_GANG_ROLLED_BACK, rolled_back=(1,)
        ),
        retry_wait_s=1200.0,
    )
    await adapter.apply(
        GangPlan({DECODE: rolled}), adapter.snapshot(now_s=time.time()), dry_run=False
    )
    (event,) = events(kube, "PartialGangRolledBack")
    assert (
        "; rolled back again in a row, they are asked for again in 1200s at the earliest"
        in (event["message"])
    )


async def test_a_stuck_gang_event_says_when_the_timeout_is_shorter_than_the_lead_time(
    kube, adapter
):
    add_gpu_nodes(kube, 6)
    add_pd(kube, decode=2, extra={"gang-autoscaler.io/gang-timeout": "1m"})
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    stuck = dataclasses.replace(
        component_plan(DECODE, current=2, desired=2, reason=Reason.WITHIN_TOLERANCE),
        stuck_groups=(0,),
    )
    await adapter.apply(GangPlan({DECODE: stuck}), state, dry_run=False)
    (event,) = events(kube, "PartialGangStuck")
    assert event["message"] == (
        "groups [0] stay partially scheduled past gang-timeout; they are below the desired "
        "count and are kept; gang-timeout 60s is shorter than lead-time (300s): a new gang "
        "not ready by then is scaled away as a partial gang; set it above lead-time"
    )


async def test_a_gang_that_served_for_days_and_fails_a_probe_is_not_rolled_back_at_once():
    clock = [dt.datetime(2026, 11, 22, 1, 0, tzinfo=dt.UTC)]
    async with (
        FakeKube.start(bookmark_interval_s=0.1, clock=lambda: clock[0]) as kube,
        kube.api_client() as api,
    ):
        adapter = KubeAdapter(api, watch_timeout_s=30, event_instance="test-0")
        await adapter.start(sync_timeout_s=5)
        try:
            add_gpu_nodes(kube, 6)
            add_pd(kube, decode=2, extra={"gang-autoscaler.io/gang-timeout": "1m"})
            await settle(adapter, kube)
            clock[0] += dt.timedelta(days=2)
            kube.set_pod_ready(NS, "llama-decode-1-1", ready=False)  # a readiness probe fails
            await settle(adapter, kube)
            lost_at = clock[0].timestamp()
            state = adapter.snapshot(now_s=lost_at)
            decode = state.observations({}).components[DECODE]
            assert [g.state for g in decode.gangs] == [GangState.READY, GangState.STARTING]
            assert decode.gangs[1].not_ready_since_s == lost_at  # not the pod's creation

            signals = {
                PREFILL: Signals(waiting_requests=4.0, kv_usage_fraction=0.8),
                DECODE: Signals(waiting_requests=8.0, kv_usage_fraction=0.8),
            }
            observations = state.observations(signals)
            moment, memory = core_plan(observations, state.policies, {}, Memory(), now=lost_at + 5)
            assert moment.components[DECODE].desired_gangs == 2
            assert moment.components[DECODE].rolled_back_groups == ()
            # Not ready for longer than its timeout, it is rolled back as any other.
            later, _ = core_plan(observations, state.policies, {}, memory, now=lost_at + 66)
            assert later.components[DECODE].rolled_back_groups == (1,)
        finally:
            await adapter.close()


# -- conflicts and other writers ---------------------------------------------------------


async def test_a_stale_write_gets_409_and_converges(kube, adapter, api):
    add_gpu_nodes(kube, 6)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    # Someone labels the LWS after our observation: its resourceVersion moves, replicas don't.
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        LWS_GROUP,
        LWS_VERSION,
        NS,
        LWS_PLURAL,
        "llama-decode",
        {"metadata": {"labels": {"team": "inference"}}},
        _content_type="application/merge-patch+json",
    )
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)})
    report = await adapter.apply(plan, state, dry_run=False)
    outcome = report.components[DECODE].scale
    assert outcome.result is ScaleResult.SCALED
    assert outcome.conflicts == 1
    assert len(kube.requests("PATCH", "llama-decode/scale")) == 2
    assert spec_replicas(kube, "llama-decode") == 2


async def test_a_dropped_connection_fails_one_component_and_the_others_are_still_written(
    kube, adapter
):
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    kube.inject_fault(
        code=0, method="PATCH", path_contains="llama-decode/scale", action="disconnect"
    )
    kube.inject_fault(code=0, method="POST", path_contains="/pods", action="disconnect")
    plan = GangPlan(
        {
            DECODE: component_plan(DECODE, current=1, desired=2),
            PREFILL: component_plan(PREFILL, current=1, desired=2, balloons=1),
        }
    )
    report = await adapter.apply(plan, state, dry_run=False)

    decode = report.components[DECODE].scale
    assert decode.result is ScaleResult.FAILED
    assert "no answer" in decode.detail
    assert spec_replicas(kube, "llama-decode") == 1
    # prefill, after decode in the pass, is still scaled; its balloon gang's first member
    # was cut off, and no half gang is left behind
    assert report.components[PREFILL].scale.result is ScaleResult.SCALED
    assert spec_replicas(kube, "llama-prefill") == 2
    assert any("no answer" in f for f in report.components[PREFILL].balloons.failed)
    assert balloon_pods(kube, "llama-prefill") == []


@contextlib.asynccontextmanager
async def timed_adapter(api: client.ApiClient, request_timeout_s: float) -> AsyncIterator[Any]:
    """A started adapter whose API calls time out after `request_timeout_s`, with the
    balloon PriorityClass in place."""
    adapter = KubeAdapter(
        api, watch_timeout_s=30, event_instance="test-0", request_timeout_s=request_timeout_s
    )
    await adapter.start(sync_timeout_s=5)
    try:
        await adapter.ensure_priority_class()
        yield adapter
    finally:
        await adapter.close()


async def apply_against_silence(
    kube: FakeKube,
    api: client.ApiClient,
    plan: GangPlan,
    *,
    request_timeout_s: float,
    silent: Sequence[tuple[str, str]],
) -> Any:
    """Apply `plan` to a PD deployment while the API server accepts each (method, path
    fragment) in `silent` and never answers it (for a minute, far past every timeout)."""
    async with timed_adapter(api, request_timeout_s) as adapter:
        add_gpu_nodes(kube, 8)
        add_pd(kube)
        await settle(adapter, kube)
        state = adapter.snapshot(now_s=time.time())
        for method, path in silent:
            kube.inject_fault(code=0, method=method, path_contains=path, action="stall", stall_s=60)
        return await asyncio.wait_for(adapter.apply(plan, state, dry_run=False), timeout=30)


async def test_a_write_with_no_answer_times_out_and_the_pass_goes_on(kube, api):
    # Without a timeout of its own, the write would hold its component (and the pass) until
    # the tick's deadline.
    plan = GangPlan(
        {
            DECODE: component_plan(DECODE, current=1, desired=2),
            PREFILL: component_plan(PREFILL, current=1, desired=2, balloons=1),
        }
    )
    report = await apply_against_silence(
        kube,
        api,
        plan,
        request_timeout_s=2,
        silent=[("PATCH", "llama-decode/scale"), ("POST", "/pods")],
    )
    decode = report.components[DECODE].scale
    assert decode.result is ScaleResult.FAILED
    assert "no answer (TimeoutError" in decode.detail
    assert "may have landed" in decode.detail
    assert report.components[PREFILL].scale.result is ScaleResult.SCALED
    assert spec_replicas(kube, "llama-prefill") == 2
    # the members are created at once: whichever reached the server first got no answer,
    # and the other was taken back
    (failed,) = report.components[PREFILL].balloons.failed
    assert re.match(rf"create {NS}/llama-prefill-balloon-0-[01]: no answer \(TimeoutError", failed)
    assert balloon_pods(kube, "llama-prefill") == []


async def test_an_hpa_list_with_no_answer_writes_nothing(kube, api):
    # No answer cannot say there is no HPA on the LWS; writing anyway would fight one.
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)})
    report = await apply_against_silence(
        kube, api, plan, request_timeout_s=1, silent=[("GET", "horizontalpodautoscalers")]
    )
    outcome = report.components[DECODE].scale
    assert outcome.result is ScaleResult.FAILED
    assert "cannot tell whether one targets" in outcome.detail
    assert kube.requests("PATCH", "/scale") == []
    assert spec_replicas(kube, "llama-decode") == 1


@pytest.mark.parametrize(
    ("code", "writes"),
    [
        pytest.param(503, False, id="unavailable-says-nothing-of-hpas"),
        pytest.param(429, False, id="throttled-says-nothing-of-hpas"),
        pytest.param(500, False, id="server-error-says-nothing-of-hpas"),
        pytest.param(403, True, id="rbac-without-the-hpa-list-writes"),
    ],
)
async def test_an_hpa_list_answered_with_an_error_writes_only_when_rbac_refused_it(
    kube, adapter, code, writes
):
    """A 429 or 5xx was taken for "no HPA": the write went over an HPA's target, which the
    HPA reverted, and the next tick held 10 minutes on "another writer"."""
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    await settle(adapter, kube)
    kube.inject_fault(code=code, method="GET", path_contains="horizontalpodautoscalers")
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)})
    report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    outcome = report.components[DECODE].scale
    if writes:
        assert outcome.result is ScaleResult.SCALED
        assert spec_replicas(kube, "llama-decode") == 2
    else:
        assert outcome.result is ScaleResult.FAILED
        assert f"{code}" in outcome.detail and "cannot tell whether one targets" in outcome.detail
        assert kube.requests("PATCH", "/scale") == []


async def test_a_refused_scale_write_is_an_error_as_well_as_an_event(kube, adapter):
    """A 403 on `/scale` (RBAC without patch, a webhook) was only a ScaleFailed Event: no
    error for the loop to count in `errors_total` or log, and the same RBAC mistake can keep
    the Event from being written."""
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    await settle(adapter, kube)
    kube.inject_fault(code=403, method="PATCH", path_contains="/scale")
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)})
    report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)

    applied = report.components[DECODE]
    assert applied.scale.result is ScaleResult.FAILED
    # the API server's message comes through: it names what to fix
    assert applied.errors == (
        "scaling 1 -> 2 gangs failed: 403 Forbidden: injected fault: Forbidden",
    )
    (event,) = events(kube, "ScaleFailed")
    assert (
        event["message"] == "scaling 1 -> 2 gangs failed: 403 Forbidden: injected fault: Forbidden"
    )
    assert spec_replicas(kube, "llama-decode") == 1


async def test_a_refused_balloon_gang_is_a_warning_event_on_its_lws(kube, adapter):
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    await settle(adapter, kube)
    # as a namespace enforcing a Pod Security level stricter than the balloons meet answers
    # (both members: they are created at once)
    kube.inject_fault(code=403, method="POST", path_contains="/pods", times=2)
    plan = GangPlan({PREFILL: component_plan(PREFILL, current=1, desired=1, balloons=1)})
    report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)

    assert report.components[PREFILL].balloons.created_gangs == ()
    (event,) = events(kube, "BalloonWriteFailed")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "llama-prefill"
    assert event["message"] == (
        "balloon gang writes failed; the buffer is short: "
        f"create {NS}/llama-prefill-balloon-0-0: 403 Forbidden: injected fault: Forbidden"
    )
    # the next pass, within 15 s, tries nothing and says so (a quota that admits part of a
    # gang made every pass create a member, fail the next and delete the first)
    posts = len(kube.requests("POST", "/pods"))
    await settle(adapter, kube)
    report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    assert len(kube.requests("POST", "/pods")) == posts
    assert report.components[PREFILL].balloons.failed == (
        "no balloon gang created: the last attempt failed "
        f"(create {NS}/llama-prefill-balloon-0-0: 403 Forbidden: injected fault: Forbidden); "
        "trying again 15s after it",
    )
    # past it, the gang is created, and nothing more is said
    writer = adapter.actuator._balloons
    writer._clock = lambda: time.monotonic() + 16.0
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    assert len(balloon_pods(kube, "llama-prefill")) == 2
    assert len(events(kube, "BalloonWriteFailed")) == 2
    writer._clock = lambda: time.monotonic() + 17.0
    await settle(adapter, kube)
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    assert len(events(kube, "BalloonWriteFailed")) == 2


async def test_balloons_give_way_to_an_lws_whose_pods_take_their_names(kube, adapter):
    """Balloon pods of `llama-prefill` are named as the workers of an LWS `llama-prefill-balloon`
    are (`llama-prefill-balloon-0-1`). A balloon there first kept the real worker from being
    created; there first, the worker made every balloon create fail."""
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    await settle(adapter, kube)
    plan = GangPlan({PREFILL: component_plan(PREFILL, current=1, desired=1, balloons=1)})
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    assert len(balloon_pods(kube, "llama-prefill")) == 2

    # a plain LWS, not opted in: its pods need the names all the same
    kube.apply(lws_manifest("llama-prefill-balloon", replicas=1, annotations={}))
    await settle(adapter, kube)
    report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    applied = report.components[PREFILL]
    message = (
        "no balloon gang is made: balloon pods (llama-prefill-balloon-<n>-<member>) would take "
        "the names of LWS llama-prefill-balloon's pods and keep them from being created; "
        "rename one of the two LWS"
    )
    assert applied.errors == ()  # a naming problem: said on the LWS, not counted as an error
    assert applied.balloons is not None and applied.balloons.created_gangs == ()
    assert balloon_pods(kube, "llama-prefill") == []
    (event,) = events(kube, "BalloonNameClash")
    assert (event["type"], event["message"]) == ("Warning", message)
    # and the other LWS's worker gets its name
    await settle(adapter, kube)
    kube.reconcile()
    assert [p["metadata"]["name"] for p in lws_pods(kube, "llama-prefill-balloon")] == [
        "llama-prefill-balloon-0",
        "llama-prefill-balloon-0-1",
    ]
    # the decode component's balloons, named apart, are not concerned
    decode = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=1)})
    report = await adapter.apply(decode, adapter.snapshot(now_s=time.time()), dry_run=False)
    assert report.components[DECODE].errors == ()
    assert len(balloon_pods(kube, "llama-decode")) == 2


async def test_a_balloon_create_backoff_starts_short_again_once_nothing_is_asked(kube, adapter):
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    await settle(adapter, kube)
    writer = adapter.actuator._balloons
    wanted = GangPlan({PREFILL: component_plan(PREFILL, current=1, desired=1, balloons=1)})
    none = GangPlan({PREFILL: component_plan(PREFILL, current=1, desired=1, balloons=0)})

    async def refused_at(offset_s: float, plan: GangPlan) -> tuple[str, ...]:
        writer._clock = lambda: time.monotonic() + offset_s
        kube.inject_fault(code=403, method="POST", path_contains="/pods")
        report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
        kube.faults.clear()
        result = report.components[PREFILL].balloons
        return () if result is None else result.failed

    await refused_at(0.0, wanted)  # backoff 15 s
    await refused_at(16.0, wanted)  # failed again past it: 30 s
    assert "trying again 30s after it" in (await refused_at(17.0, wanted))[0]
    await refused_at(18.0, none)  # nothing asked: the backoff is dropped
    await refused_at(19.0, wanted)  # tried at once, failed: 15 s again, not 60
    assert "trying again 15s after it" in (await refused_at(20.0, wanted))[0]


async def test_components_are_written_concurrently_so_a_slow_write_holds_up_no_other(kube, adapter):
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    # decode comes first in the pass; its /scale gets no answer for 5 s, then the connection
    # drops
    kube.inject_fault(
        code=0, method="PATCH", path_contains="llama-decode/scale", action="stall", stall_s=5
    )
    plan = GangPlan(
        {
            DECODE: component_plan(DECODE, current=1, desired=2),
            PREFILL: component_plan(PREFILL, current=1, desired=2),
        }
    )
    passing = asyncio.create_task(adapter.apply(plan, state, dry_run=False))
    deadline = time.monotonic() + 3
    while spec_replicas(kube, "llama-prefill") != 2:
        assert time.monotonic() < deadline, "prefill waited for decode's stalled write"
        await asyncio.sleep(0.05)
    assert not passing.done()
    report = await passing
    assert report.components[PREFILL].scale.result is ScaleResult.SCALED
    assert report.components[DECODE].scale.result is ScaleResult.FAILED
    assert list(report.components) == [
        DECODE,
        PREFILL,
    ]  # reported in order, whatever finished first


async def test_stale_view_holds_are_told_concurrently_so_a_slow_event_holds_up_no_other(
    kube, adapter
):
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    # the first Event of the pass gets no answer for 5 s, then its connection drops
    kube.inject_fault(code=0, method="POST", path_contains="/events", action="stall", stall_s=5)
    plans = [
        component_plan(key, current=1, desired=1, reason=Reason.HOLD_STALE_VIEW)
        for key in (DECODE, PREFILL)
    ]
    told: dict[ComponentKey, Any] = {}
    passing = asyncio.create_task(adapter.report_holds(plans, state, dry_run=False, told=told))
    deadline = time.monotonic() + 3
    while not told:
        assert time.monotonic() < deadline, "one component's Event waited for the other's"
        await asyncio.sleep(0.05)
    assert not passing.done()
    (first,) = told
    held = [e for e in kube.objects("events", first.namespace) if e["reason"] == "HoldStaleView"]
    assert [e["involvedObject"]["name"] for e in held] == [first.lws]
    await passing
    assert set(told) == {DECODE, PREFILL}


async def apply_until_the_lease_is_lost(
    kube: FakeKube, api: client.ApiClient, plan: GangPlan, may_write: Callable[[], bool]
) -> None:
    """One apply by an adapter whose `may_write` turns False during it: it raises NotLeader."""
    adapter = KubeAdapter(api, watch_timeout_s=30, event_instance="test-0", may_write=may_write)
    await adapter.start(sync_timeout_s=5)
    await adapter.ensure_priority_class()
    try:
        await settle(adapter, kube)
        with pytest.raises(NotLeader):
            await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    finally:
        await adapter.close()


async def test_a_lease_lost_mid_pass_stops_every_component_before_its_next_write(kube, api):
    add_gpu_nodes(kube, 8)
    add_pd(kube)

    def may_write() -> bool:  # the lease is lost as soon as the first /scale is served
        return not kube.requests("PATCH", "/scale")

    plan = GangPlan(
        {
            DECODE: component_plan(DECODE, current=1, desired=2, balloons=1),
            PREFILL: component_plan(PREFILL, current=1, desired=2, balloons=1),
        }
    )
    await apply_until_the_lease_is_lost(kube, api, plan, may_write)
    # each component checked the lease before its /scale; none went on to its balloon gang
    assert 1 <= len(kube.requests("PATCH", "/scale")) <= 2
    assert kube.requests("POST", "/pods") == []


async def test_a_lease_lost_during_the_calls_before_a_patch_sends_no_patch(kube, api):
    """The Lease was checked once before `scale`, whose HPA list and re-reads take up to a
    request timeout each: an old leader's patch was sent after the standby had taken over."""
    add_gpu_nodes(kube, 8)
    add_pd(kube)

    def may_write() -> bool:  # the lease is lost while the HPAs are being listed
        return not kube.requests("GET", "horizontalpodautoscalers")

    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)})
    await apply_until_the_lease_is_lost(kube, api, plan, may_write)
    assert kube.requests("GET", "horizontalpodautoscalers")
    assert kube.requests("PATCH", "/scale") == []
    assert spec_replicas(kube, "llama-decode") == 1


async def test_a_lease_lost_between_balloon_members_leaves_no_half_gang(kube, api):
    add_gpu_nodes(kube, 8)
    add_pd(kube)

    def may_write() -> bool:  # the lease is lost once the members are sent
        return not kube.requests("POST", "/pods")

    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=1)})
    await apply_until_the_lease_is_lost(kube, api, plan, may_write)
    assert len(kube.requests("POST", "/pods")) == 2  # both members are made at once
    assert balloon_pods(kube, "llama-decode") == []  # and taken back


async def test_the_take_back_after_a_lost_lease_spares_the_next_leaders_pod(kube, api):
    """The Lease is lost while the members are made; before the take-back, the next leader
    has already replaced one (same name, new pod). The take-back deletes only the pods this
    pass created: by name alone it deleted the new leader's."""
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    replaced: list[str] = []

    def may_write() -> bool:
        posted = kube.requests("POST", "/pods")
        if posted and not replaced:  # the next leader deletes and recreates the member
            ours = balloon_pods(kube, "llama-decode")[0]
            kube.remove("pods", NS, ours["metadata"]["name"])
            theirs = copy.deepcopy(ours)
            for field in ("uid", "resourceVersion", "creationTimestamp"):
                theirs["metadata"].pop(field, None)
            replaced.append(kube.apply(theirs)["metadata"]["uid"])
        return not posted

    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=1)})
    await apply_until_the_lease_is_lost(kube, api, plan, may_write)
    assert [p["metadata"]["uid"] for p in balloon_pods(kube, "llama-decode")] == replaced


async def test_a_balloon_member_created_without_an_answer_is_not_left_behind(kube, adapter):
    add_gpu_nodes(kube, 6)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    # The first member is created; its answer never arrives.
    kube.inject_fault(code=0, method="POST", path_contains="/pods", action="drop_answer")
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=1)})
    report = await adapter.apply(plan, state, dry_run=False)
    assert report.components[DECODE].balloons.created_gangs == ()
    assert balloon_pods(kube, "llama-decode") == []


async def test_a_scale_whose_answer_is_lost_is_still_ours_and_not_another_writers(kube, adapter):
    add_gpu_nodes(kube, 10)
    add_pd(kube)
    await settle(adapter, kube)

    assert await scale_decode(adapter, kube, 1, 2) is ScaleResult.SCALED  # our last write: 2
    # The server applies the next patch; its answer never arrives.
    kube.inject_fault(
        code=0, method="PATCH", path_contains="llama-decode/scale", action="drop_answer"
    )
    assert await scale_decode(adapter, kube, 2, 3) is ScaleResult.FAILED
    assert spec_replicas(kube, "llama-decode") == 3  # it did land

    # The next tick sees 3 gangs, which is our own write: scaling goes on, nobody is blamed.
    assert await scale_decode(adapter, kube, 3, 4) is ScaleResult.SCALED
    assert spec_replicas(kube, "llama-decode") == 4
    assert events(kube, "AnotherWriter") == []


async def test_a_scale_cut_off_by_the_tick_deadline_is_ours_if_it_lands(kube, adapter):
    """The tick's deadline cancels a patch the server has already applied: the next tick's
    observation is our own write, not another writer's (which would hold the component for
    10 minutes with a Warning)."""
    add_gpu_nodes(kube, 10)
    add_pd(kube)

    assert await scale_decode(adapter, kube, 1, 2) is ScaleResult.SCALED
    kube.inject_fault(
        code=0, method="PATCH", path_contains="llama-decode/scale", action="slow_answer",
        stall_s=1.0,
    )  # fmt: skip
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(scale_decode(adapter, kube, 2, 3), timeout=0.5)
    assert spec_replicas(kube, "llama-decode") == 3  # it landed
    assert await scale_decode(adapter, kube, 3, 4) is ScaleResult.SCALED
    assert spec_replicas(kube, "llama-decode") == 4
    assert events(kube, "AnotherWriter") == []


async def decode_at(kube: FakeKube, adapter: KubeAdapter, *, earlier_write: bool) -> int:
    """A PD deployment with decode at 1 gang, or at 2 by an earlier write of this term;
    returns decode's count."""
    add_gpu_nodes(kube, 10)
    add_pd(kube)
    if not earlier_write:
        return 1
    assert await scale_decode(adapter, kube, 1, 2) is ScaleResult.SCALED
    return 2


@pytest.mark.parametrize("earlier_write", [False, True], ids=["first-write", "after-a-write"])
async def test_a_scale_whose_answer_is_lost_and_never_landed_is_tried_again(
    kube, adapter, earlier_write
):
    """The first write of a term gets no answer and never lands: the next tick observes the
    count it was written over. That was taken for another writer's change, and the
    component held for 10 minutes with a Warning about a writer that does not exist."""
    start = await decode_at(kube, adapter, earlier_write=earlier_write)
    kube.inject_fault(
        code=0, method="PATCH", path_contains="llama-decode/scale", action="disconnect"
    )
    assert await scale_decode(adapter, kube, start, start + 1) is ScaleResult.FAILED
    assert spec_replicas(kube, "llama-decode") == start  # it did not land

    assert await scale_decode(adapter, kube, start, start + 1) is ScaleResult.SCALED
    assert spec_replicas(kube, "llama-decode") == start + 1
    assert events(kube, "AnotherWriter") == []


@pytest.mark.parametrize("earlier_write", [False, True], ids=["first-write", "after-a-write"])
async def test_a_lost_write_that_landed_behind_a_lagging_observation_is_ours(
    kube, adapter, earlier_write
):
    start = await decode_at(kube, adapter, earlier_write=earlier_write)
    await settle(adapter, kube)
    before = adapter.snapshot(now_s=time.time())
    kube.inject_fault(
        code=0, method="PATCH", path_contains="llama-decode/scale", action="drop_answer"
    )
    plan = GangPlan({DECODE: component_plan(DECODE, current=start, desired=start + 1)})
    report = await adapter.apply(plan, before, dry_run=False)
    assert report.components[DECODE].scale.result is ScaleResult.FAILED
    assert spec_replicas(kube, "llama-decode") == start + 1  # it landed

    # the next decision still reads the old count (the watch lags): nothing written, nobody
    # blamed, and the count on the server is our last write from now on
    report = await adapter.apply(plan, before, dry_run=False)
    assert report.components[DECODE].scale.result is ScaleResult.STALE
    assert await scale_decode(adapter, kube, start + 1, start + 2) is ScaleResult.SCALED
    assert events(kube, "AnotherWriter") == []


async def test_a_lagging_observation_after_a_lost_write_that_never_landed_decides_again(
    kube, adapter, api
):
    """The server is back at the count the lost write was written over, but the decision
    read a third one (a stale view): nothing is written on it, and nobody is blamed."""
    add_gpu_nodes(kube, 10)
    add_pd(kube, decode=2)
    await settle(adapter, kube)
    stale = adapter.snapshot(now_s=time.time())  # 2 gangs
    await kubectl_scale(api, "llama-decode", 1)
    kube.inject_fault(
        code=0, method="PATCH", path_contains="llama-decode/scale", action="disconnect"
    )
    assert await scale_decode(adapter, kube, 1, 3) is ScaleResult.FAILED
    assert spec_replicas(kube, "llama-decode") == 1  # it did not land

    plan = GangPlan({DECODE: component_plan(DECODE, current=2, desired=3)})
    report = await adapter.apply(plan, stale, dry_run=False)
    assert report.components[DECODE].scale.result is ScaleResult.STALE
    assert spec_replicas(kube, "llama-decode") == 1
    assert events(kube, "AnotherWriter") == []
    assert await scale_decode(adapter, kube, 1, 3) is ScaleResult.SCALED


async def test_a_third_count_after_a_lost_write_is_another_writers(kube, adapter, api):
    add_gpu_nodes(kube, 10)
    add_pd(kube)
    kube.inject_fault(
        code=0, method="PATCH", path_contains="llama-decode/scale", action="disconnect"
    )
    assert await scale_decode(adapter, kube, 1, 2) is ScaleResult.FAILED
    # An operator runs `kubectl scale lws llama-decode --replicas=4` meanwhile.
    await kubectl_scale(api, "llama-decode", 4)
    assert await scale_decode(adapter, kube, 4, 2) is ScaleResult.OTHER_WRITER
    assert spec_replicas(kube, "llama-decode") == 4
    (warning,) = events(kube, "AnotherWriter")
    assert "from 1 (our write of 2 got no answer) to 4" in warning["message"]


async def test_a_new_term_starts_from_what_it_observes(kube, api):
    """Leadership goes a -> b -> a: b's writes are legitimate, so once a forgets its earlier
    term's writes (as the service does on every new term) it scales on, blaming nobody."""
    add_gpu_nodes(kube, 10)
    add_pd(kube)
    async with kube.api_client() as api_b:
        a, b = KubeAdapter(api, event_instance="a"), KubeAdapter(api_b, event_instance="b")
        await a.start(sync_timeout_s=5)
        await b.start(sync_timeout_s=5)
        try:
            assert await scale_decode(a, kube, 1, 2) is ScaleResult.SCALED  # a's first term
            assert await scale_decode(b, kube, 2, 3) is ScaleResult.SCALED  # b's term
            a.scaler.forget_writes()  # a's second term begins
            assert await scale_decode(a, kube, 3, 4) is ScaleResult.SCALED
            assert spec_replicas(kube, "llama-decode") == 4
            assert events(kube, "AnotherWriter") == []
        finally:
            await a.close()
            await b.close()


async def test_a_manual_scale_is_reported_not_fought(kube, adapter, api):
    add_gpu_nodes(kube, 10)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)}), state, dry_run=False
    )
    # An operator runs `kubectl scale lws llama-decode --replicas=4`.
    await kubectl_scale(api, "llama-decode", 4)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    for _ in range(2):
        report = await adapter.apply(
            GangPlan({DECODE: component_plan(DECODE, current=4, desired=2)}), state, dry_run=False
        )
        assert report.components[DECODE].scale.result is ScaleResult.OTHER_WRITER
    assert spec_replicas(kube, "llama-decode") == 4
    (warning,) = events(kube, "AnotherWriter")
    assert warning["type"] == "Warning" and "from 2 (our last write) to 4" in warning["message"]
    # the held second pass is the same Event, its repeat waiting out 5 minutes (kube_events)
    assert warning["count"] == 1 and kube.requests("PATCH", "/events/") == []
    # A new leadership term (after an API server blip, say) keeps respecting the operator.
    adapter.scaler.forget_writes()
    report = await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=4, desired=2)}), state, dry_run=False
    )
    assert report.components[DECODE].scale.result is ScaleResult.OTHER_WRITER
    assert spec_replicas(kube, "llama-decode") == 4


async def test_a_conflict_with_the_count_already_written_is_no_other_writer(kube, api, adapter):
    """The count this write wants is already there when re-read after its 409 (an earlier
    write whose answer was lost landed in between): it was taken for another writer's
    change, held for 10 minutes with a Warning."""
    add_gpu_nodes(kube, 12)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())  # spec.replicas 1, and its resourceVersion
    await kubectl_scale(api, "llama-decode", 2)
    report = await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)}), state, dry_run=False
    )
    scale = report.components[DECODE].scale
    assert (scale.result, scale.conflicts) == (ScaleResult.UNCHANGED, 1)
    assert events(kube, "AnotherWriter") == []
    assert spec_replicas(kube, "llama-decode") == 2
    await settle(adapter, kube)  # not held: the next plan is carried out
    report = await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=2, desired=3)}),
        adapter.snapshot(now_s=time.time()),
        dry_run=False,
    )
    assert report.components[DECODE].scale.result is ScaleResult.SCALED


@pytest.mark.parametrize("tick_between", [True, False], ids=["tick-without-it", "between-ticks"])
async def test_an_lws_deleted_and_made_again_is_scaled_as_a_new_object(kube, adapter, tick_between):
    """A redeploy that deletes the LWS and creates it again (Helm, GitOps replace) starts at
    the manifest's count: not another writer's change of our last write, which held the new
    object for 10 minutes with a Warning."""
    add_gpu_nodes(kube, 12)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    report = await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=1, desired=3)}), state, dry_run=False
    )
    assert report.components[DECODE].scale.result is ScaleResult.SCALED
    manifest = kube.object("leaderworkersets", NS, "llama-decode")
    kube.remove("leaderworkersets", NS, "llama-decode")
    if tick_between:
        await settle(adapter, kube)
        gone = adapter.snapshot(now_s=time.time())
        assert DECODE not in gone.components
        await adapter.apply(GangPlan({}), gone, dry_run=False)
    again = {k: v for k, v in manifest.items() if k != "status"}
    again["metadata"] = {
        k: v for k, v in manifest["metadata"].items() if k in ("name", "namespace", "annotations")
    }
    again["spec"] = {**manifest["spec"], "replicas": 1}
    kube.apply(again)
    await settle(adapter, kube)
    assert (
        kube.object("leaderworkersets", NS, "llama-decode")["metadata"]["uid"]
        != (manifest["metadata"]["uid"])
    )
    state = adapter.snapshot(now_s=time.time())
    report = await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)}), state, dry_run=False
    )
    assert report.components[DECODE].scale.result is ScaleResult.SCALED
    assert spec_replicas(kube, "llama-decode") == 2
    assert events(kube, "AnotherWriter") == []


async def test_a_stalled_events_store_delays_reports_never_the_scale_writes(kube, api):
    """Three Event repeats due, every Event PATCH stalled: the repeats were flushed first,
    one request timeout each, and the tick's deadline ran out before any /scale write, tick
    after tick. Now the writes go first, and one unanswered repeat ends the flush."""
    async with timed_adapter(api, 1) as adapter:
        add_gpu_nodes(kube, 12)
        add_pd(kube, extra={"gang-autoscaler.io/min-replicas": "abc"})
        kube.apply(
            lws_manifest(
                "other", replicas=1, annotations={**ON, "gang-autoscaler.io/max-replicas": "x"}
            )
        )
        kube.apply(lws_manifest("solo", replicas=1, annotations=ON))
        solo = ComponentKey(NS, "solo")
        await settle(adapter, kube)

        def plan(desired: int) -> GangPlan:
            return GangPlan({solo: component_plan(solo, current=1, desired=desired)})

        for _ in range(2):  # the InvalidPolicy Events, then a repeat of each
            await adapter.apply(plan(1), adapter.snapshot(now_s=time.time()), dry_run=False)
        later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=301)
        adapter.events._clock = lambda: later  # five minutes on: the repeats are due
        kube.inject_fault(
            code=0, method="PATCH", path_contains="/events/", action="stall", stall_s=60, times=9
        )
        started = time.monotonic()
        async with asyncio.timeout(3):  # the tick's deadline, three request timeouts
            await adapter.apply(plan(2), adapter.snapshot(now_s=time.time()), dry_run=False)
        assert spec_replicas(kube, "solo") == 2
        # one repeat per held LWS, written as it is recorded, and one by the flush, which the
        # first unanswered request ends
        assert len(kube.requests("PATCH", "/events/")) == 4
        assert time.monotonic() - started < 2.5


@pytest.mark.parametrize(
    ("deadline_s", "members_left"),
    [
        pytest.param(1.0, 4, id="members-made-at-once-fit-the-tick"),
        pytest.param(0.2, 0, id="cut-off-leaves-no-half-gang"),
    ],
)
async def test_a_balloon_gang_is_made_whole_or_not_at_all_within_the_tick(
    kube, api, deadline_s, members_left
):
    """Each pod create answered 0.4 s late, 1 s left in the tick: four members one after
    another were cut off by the deadline before their clean-up, and every tick deleted the
    half gang and started another (15 creates, 12 deletes, no whole gang in five ticks)."""
    async with timed_adapter(api, 1) as adapter:
        add_gpu_nodes(kube, 16, per_rack=4)
        lws = lws_manifest("llama-decode", replicas=1, annotations=ON)
        lws["spec"]["leaderWorkerTemplate"]["size"] = 4
        kube.apply(lws)
        await settle(adapter, kube)
        kube.inject_fault(
            code=0, method="POST", path_contains="/pods", action="slow_answer", stall_s=0.4,
            times=100,
        )  # fmt: skip
        plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=1)})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(deadline_s):
                await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
        await asyncio.sleep(0.5)  # the answers still on their way arrive
        left = [p for p in balloon_pods(kube, "llama-decode") if "deletionTimestamp" not in p]
        assert len(left) == members_left


async def test_events_of_other_components_wait_for_every_scale_write(kube, api):
    """One component at a time, two held LWS sorted first, every Event create stalled: each
    Warning took its request timeout before the next component's turn, and the third one's
    scale came after the tick's deadline. Now the pass writes its Events last."""
    async with timed_adapter(api, 1) as adapter:
        adapter.actuator.max_concurrent = 1
        add_gpu_nodes(kube, 8)
        for name in ("aaa-bad-1", "aaa-bad-2"):
            bad = {**ON, "gang-autoscaler.io/max-replicas": "x"}
            kube.apply(lws_manifest(name, replicas=1, annotations=bad))
        kube.apply(lws_manifest("zzz", replicas=1, annotations=ON))
        await settle(adapter, kube)
        kube.inject_fault(
            code=0, method="POST", path_contains="/events", action="stall", stall_s=60, times=9
        )
        zzz = ComponentKey(NS, "zzz")
        plan = GangPlan({zzz: component_plan(zzz, current=1, desired=2)})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.5):
                await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
        assert spec_replicas(kube, "zzz") == 2


async def test_a_pass_cut_off_by_the_deadline_still_writes_the_events_it_said(kube, api):
    """aaa scales 1 -> 2 while zzz's balloon create stalls past the deadline: held back to
    the end of the pass, aaa's one-off scale Event was lost with it, and the next pass, the
    plan already met, never said it."""
    async with timed_adapter(api, 5) as adapter:
        add_gpu_nodes(kube, 8)
        kube.apply(lws_manifest("aaa", replicas=1, annotations=ON))
        kube.apply(lws_manifest("zzz", replicas=1, annotations=ON))
        await settle(adapter, kube)
        kube.inject_fault(code=0, method="POST", path_contains="/pods", action="stall", stall_s=60)
        aaa, zzz = ComponentKey(NS, "aaa"), ComponentKey(NS, "zzz")
        plan = GangPlan(
            {
                aaa: component_plan(aaa, current=1, desired=2),
                zzz: component_plan(zzz, current=1, desired=1, balloons=1),
            }
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.5):
                await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
        assert spec_replicas(kube, "aaa") == 2
        await asyncio.sleep(0.3)
        (said,) = events(kube, "ScaleUpWaiting")
        assert said["involvedObject"]["name"] == "aaa"


async def test_a_balloon_gang_cut_off_takes_back_a_member_whose_answer_was_lost(kube, api):
    """One member created with its answer lost (it exists), the other still answering when
    the tick's deadline cuts the pass off: both are taken back. The cut-off path took back
    only the one in flight."""
    async with timed_adapter(api, 5) as adapter:
        add_gpu_nodes(kube, 8)
        add_pd(kube)
        await settle(adapter, kube)
        kube.inject_fault(code=0, method="POST", path_contains="/pods", action="drop_answer")
        kube.inject_fault(
            code=0, method="POST", path_contains="/pods", action="slow_answer", stall_s=3
        )
        plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=1)})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
        assert len(kube.requests("POST", "/pods")) == 2
        left = [p for p in balloon_pods(kube, "llama-decode") if "deletionTimestamp" not in p]
        assert left == []


async def test_an_hpa_on_the_lws_is_reported_and_nothing_is_written(kube, adapter, api):
    # Older versions of the fake serve no HPAs; register the autoscaling/v2 type if needed.
    served = {(t.group, t.plural) for t in kube.registry.all()}
    if ("autoscaling", "horizontalpodautoscalers") not in served:
        kube.registry.add(
            ResourceType(
                "autoscaling",
                "v2",
                "horizontalpodautoscalers",
                "horizontalpodautoscaler",
                "HorizontalPodAutoscaler",
                True,
                ("hpa",),
            )
        )
    add_gpu_nodes(kube, 4)
    add_pd(kube)
    kube.apply(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "decode-cpu", "namespace": NS},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "leaderworkerset.x-k8s.io/v1",
                    "kind": "LeaderWorkerSet",
                    "name": "llama-decode",
                },
                "minReplicas": 1,
                "maxReplicas": 4,
            },
        }
    )
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    report = await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)}), state, dry_run=False
    )
    assert report.components[DECODE].scale.result is ScaleResult.OTHER_WRITER
    assert kube.requests("PATCH", "/scale") == []
    (warning,) = events(kube, "AnotherWriter")
    assert "HorizontalPodAutoscaler default/decode-cpu" in warning["message"]


async def test_a_rejected_annotation_makes_one_warning_event_and_no_scale_change(kube, adapter):
    add_gpu_nodes(kube, 4)
    add_pd(kube, extra={"gang-autoscaler.io/max-replicas": "many"})
    await settle(adapter, kube)
    for tick in range(3):
        state = adapter.snapshot(now_s=time.time())
        assert state.policies == {}
        signals = {k: Signals(waiting_requests=40.0) for k in (PREFILL, DECODE)}
        plan, _ = core_plan(state.observations(signals), state.policies, {}, Memory(), now=tick)
        assert plan.components[DECODE].hold
        await adapter.apply(plan, state, dry_run=False)
    assert kube.requests("PATCH", "/scale") == []
    assert spec_replicas(kube, "llama-decode") == 1
    warnings = [
        e for e in events(kube, "InvalidPolicy") if e["involvedObject"]["name"] == "llama-decode"
    ]
    assert len(warnings) == 1
    (warning,) = warnings
    # three ticks within 5 minutes: one write, the repeats wait (kube_events.py)
    assert warning["type"] == "Warning" and warning["count"] == 1
    assert kube.requests("PATCH", "/events/") == []
    assert "gang-autoscaler.io/max-replicas" in warning["message"]
    assert warning["lastTimestamp"] >= warning["firstTimestamp"]


async def test_a_hold_on_missing_data_is_told_once_a_stretch(kube, adapter):
    add_gpu_nodes(kube, 4)
    add_pd(kube)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    missing = {
        k: Signals(missing_reasons={"waiting_requests": "prometheus: timeout"})
        for k in (PREFILL, DECODE)
    }
    present = {k: Signals(waiting_requests=4.0, kv_usage_fraction=0.5) for k in (PREFILL, DECODE)}

    async def tick(signals: dict[ComponentKey, Signals], now: float) -> tuple[str, ...]:
        plan, _ = core_plan(state.observations(signals), state.policies, {}, Memory(), now=now)
        report = await adapter.apply(plan, state, dry_run=False)
        return report.components[DECODE].events

    told = await tick(missing, 0.0)
    assert told == (
        "Warning HoldMissingData: not scaling down from 1 gangs on missing data: no signal "
        "(waiting_requests: prometheus: timeout; kv_usage_fraction: no data)",
    )
    assert await tick(missing, 15.0) == ()  # the same stretch: told already
    held = {e["involvedObject"]["name"]: e for e in events(kube, "HoldMissingData")}
    assert sorted(held) == ["llama-decode", "llama-prefill"]  # one Event each
    assert held["llama-decode"]["type"] == "Warning" and held["llama-decode"]["count"] == 1
    # the hold comes and goes with the load while a signal stays missing: one stretch
    assert await tick(present, 30.0) == ()
    assert await tick(missing, 45.0) == ()
    # ten minutes without a hold on missing data end the stretch; the next one is told
    quiet = time.monotonic() + 601.0
    adapter.actuator._clock = lambda: quiet
    assert await tick(present, 60.0) == ()
    assert len(await tick(missing, 75.0)) == 1


@pytest.mark.parametrize("marked", ["true", "yes"])  # spelled as the policy reads it
async def test_an_lws_marked_dry_run_gets_no_event_even_with_a_bad_annotation(
    kube, adapter, marked
):
    """`gang-autoscaler.io/dry-run: "true"` means no write to that LWS, Events included; an
    LWS held for a bad annotation still got InvalidPolicy Warnings."""
    add_gpu_nodes(kube, 4)
    add_pd(kube, extra={"gang-autoscaler.io/max-replicas": "many",
                        "gang-autoscaler.io/dry-run": marked})  # fmt: skip
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    signals = {k: Signals(waiting_requests=40.0) for k in (PREFILL, DECODE)}
    plan, _ = core_plan(state.observations(signals), state.policies, {}, Memory(), now=0)
    report = await adapter.apply(plan, state, dry_run=False)
    assert events(kube, "InvalidPolicy") == []
    assert report.components[DECODE].dry_run


# -- balloon gangs ------------------------------------------------------------------------


def decode_exclusive(kube: FakeKube, *, replicas: int) -> None:
    lws = lws_manifest("llama-decode", replicas=replicas, annotations={**ON})
    lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] = RACK
    kube.apply(lws)


@pytest.mark.parametrize(
    "node_change",
    [
        pytest.param({"spec": {"unschedulable": True}}, id="cordoned"),
        pytest.param(
            {"spec": {"taints": [{"key": "nvidia.com/gpu-unhealthy", "effect": "NoSchedule"}]}},
            id="tainted-by-a-gpu-health-check",
        ),
    ],
)
async def test_a_balloon_gang_on_a_node_that_stops_taking_pods_is_replaced(
    kube, api, adapter, node_change
):
    """A node cordoned for a drain, or tainted by a GPU health check, after a balloon gang
    was placed on it: no real pod can be placed there by preempting it, yet the gang stayed
    counted as buffer and was never replaced."""
    add_gpu_nodes(kube, 8)  # 4 for the real gangs, 2 for the balloon gang, 2 to move to
    add_pd(kube)
    await settle(adapter, kube)
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=1)})
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    await settle(adapter, kube)
    first = {
        p["metadata"]["name"]: p["spec"]["nodeName"] for p in balloon_pods(kube, "llama-decode")
    }
    assert len(first) == 2 and all(first.values())
    node = next(iter(first.values()))
    await client.CoreV1Api(api).patch_node(node, node_change)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    assert state.observations({}).components[DECODE].balloon_gangs == 0  # not a buffer
    report = await adapter.apply(plan, state, dry_run=False)
    assert report.components[DECODE].balloon_plan.broken_gangs == (0,)
    await settle(adapter, kube)
    now = {
        p["metadata"]["name"]: p["spec"].get("nodeName") for p in balloon_pods(kube, "llama-decode")
    }
    assert len(now) == 2 and node not in now.values() and all(now.values())
    # placed elsewhere, it holds room again and stays
    state = adapter.snapshot(now_s=time.time())
    assert state.observations({}).components[DECODE].balloon_gangs == 1
    assert (
        not (await adapter.apply(plan, state, dry_run=False))
        .components[DECODE]
        .balloon_plan.changes
    )


async def test_two_balloon_gangs_of_an_exclusive_lws_never_share_a_domain(kube, adapter):
    """A rack of two gangs' nodes took both balloon gangs, and held room for one real gang
    only: LWS keeps a second group out of a domain the first one runs in. A balloon gang
    with no free domain left waits Pending (and makes the cluster grow) instead."""
    for i in range(6):  # r0: gpu-0, gpu-1 (the real gang); r1: gpu-2 to gpu-5
        kube.add_node(
            f"gpu-{i}", cpu="190", memory="1500Gi", gpus=8,
            extended={"ephemeral-storage": "3000Gi"}, labels={RACK: "r0" if i < 2 else "r1"},
        )  # fmt: skip
    decode_exclusive(kube, replicas=1)
    await settle(adapter, kube)
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=2)})
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    await settle(adapter, kube)
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"][RACK] for n in kube.objects("nodes")}
    racks: dict[str, set[str | None]] = {}
    for pod in balloon_pods(kube, "llama-decode"):
        gang = pod["metadata"]["labels"]["gang-autoscaler.io/balloon-gang"]
        racks.setdefault(gang, set()).add(nodes.get(pod["spec"].get("nodeName", "")))
    assert racks == {"0": {"r1"}, "1": {None}}  # the second has no domain of its own


async def test_balloon_gangs_of_two_exclusive_lws_of_a_namespace_never_share_a_domain(
    kube, adapter
):
    """LWS keeps every other group of the namespace out of an exclusive gang's domain, a
    decode gang out of a prefill gang's: a prefill and a decode balloon gang in one rack
    held room for one real gang."""
    racks = ["r0", "r0", "r1", "r1", "r2", "r2", "r2", "r2"]  # r2 has room for two gangs
    for i, rack in enumerate(racks):
        kube.add_node(
            f"gpu-{i}", cpu="190", memory="1500Gi", gpus=8,
            extended={"ephemeral-storage": "3000Gi"}, labels={RACK: rack},
        )  # fmt: skip
    add_pd(kube, extra={"leaderworkerset.sigs.k8s.io/exclusive-topology": RACK})
    await settle(adapter, kube)
    plan = GangPlan(
        {key: component_plan(key, current=1, desired=1, balloons=1) for key in (PREFILL, DECODE)}
    )
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    await settle(adapter, kube)
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"][RACK] for n in kube.objects("nodes")}
    placed = {
        lws: {nodes.get(p["spec"].get("nodeName") or "") for p in balloon_pods(kube, lws)}
        for lws in ("llama-prefill", "llama-decode")
    }
    assert sorted(placed.values(), key=str) == sorted([{"r2"}, {None}], key=str)


async def decode_with_two_balloon_gangs(kube: FakeKube, adapter: KubeAdapter) -> None:
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    await settle(adapter, kube)
    grow = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=2)})
    await adapter.apply(grow, adapter.snapshot(now_s=time.time()), dry_run=False)
    await settle(adapter, kube)
    assert len(balloon_pods(kube, "llama-decode")) == 4


def writes_since(kube: FakeKube, first: int) -> list[str]:
    """The writes since request `first`, Events left out: D(elete), S(cale), C(reate)."""
    kinds = []
    for method, path, _ in kube.request_log[first:]:
        if method == "GET" or "/events" in path:
            continue
        kinds.append("D" if method == "DELETE" else "S" if "/scale" in path else "C")
    return kinds


async def test_a_scale_up_deletes_the_balloon_gangs_it_gives_up_before_it_scales(kube, adapter):
    """A ResourceQuota counts balloon pods: the new gang's pods were refused while the
    balloon gang it replaces still stood (deleted after the scale write), and the
    StatefulSet controller backs off before it creates them again. (The fake has no quota
    admission: the order of the writes is what is checked.)"""
    await decode_with_two_balloon_gangs(kube, adapter)
    first = len(kube.request_log)
    swap = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2, balloons=1)})
    report = await adapter.apply(swap, adapter.snapshot(now_s=time.time()), dry_run=False)
    assert writes_since(kube, first) == ["D", "D", "S"]
    applied = report.components[DECODE]
    assert applied.scale is not None and applied.scale.result is ScaleResult.SCALED
    assert applied.balloons is not None and len(applied.balloons.deleted_pods) == 2
    assert spec_replicas(kube, "llama-decode") == 2


async def test_a_broken_balloon_gang_on_a_scale_up_goes_first_and_comes_back_after(kube, adapter):
    await decode_with_two_balloon_gangs(kube, adapter)
    kube.remove("pods", NS, "llama-decode-balloon-1-1")  # gang 1 loses a member
    await settle(adapter, kube)
    first = len(kube.request_log)
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2, balloons=2)})
    report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    assert writes_since(kube, first) == ["D", "S", "C", "C"]  # a gang's members at once
    balloons = report.components[DECODE].balloons
    assert balloons is not None
    assert balloons.deleted_pods == ("llama-decode-balloon-1-0",)
    assert (balloons.created_gangs, balloons.broken_gangs, balloons.failed) == ((2,), (1,), ())
    assert len(events(kube, "BalloonGangRecreated")) == 1


async def test_a_refused_early_balloon_delete_is_reported_with_the_later_writes(kube, adapter):
    await decode_with_two_balloon_gangs(kube, adapter)
    kube.remove("pods", NS, "llama-decode-balloon-1-1")
    await settle(adapter, kube)
    kube.inject_fault(code=403, method="DELETE", path_contains="/pods")
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2, balloons=2)})
    report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    applied = report.components[DECODE]
    assert applied.balloons is not None and applied.balloons.created_gangs == (2,)
    assert [e for e in applied.errors if e.startswith("delete ")] != []
    assert len(events(kube, "BalloonWriteFailed")) == 1


@pytest.mark.parametrize("by_annotation", [False, True], ids=["dry-run", "dry-run-annotation"])
async def test_a_dry_run_scale_up_deletes_no_balloon(kube, api, adapter, by_annotation):
    await decode_with_two_balloon_gangs(kube, adapter)
    if by_annotation:
        await client.CustomObjectsApi(api).patch_namespaced_custom_object(
            LWS_GROUP, LWS_VERSION, NS, LWS_PLURAL, "llama-decode",
            {"metadata": {"annotations": {"gang-autoscaler.io/dry-run": "true"}}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        await settle(adapter, kube)
    first = len(kube.request_log)
    swap = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2, balloons=1)})
    report = await adapter.apply(
        swap, adapter.snapshot(now_s=time.time()), dry_run=not by_annotation
    )
    assert writes_since(kube, first) == []
    assert report.components[DECODE].balloons is None
    assert len(balloon_pods(kube, "llama-decode")) == 4


async def test_slow_balloon_deletes_before_a_scale_up_are_made_at_once(kube, adapter):
    """One round trip after another, two deletes answered a second late held the scale
    write back past a 1.5 s deadline: no scale-up that tick."""
    await decode_with_two_balloon_gangs(kube, adapter)
    kube.inject_fault(
        code=0, method="DELETE", path_contains="/pods", action="slow_answer", stall_s=1.0, times=2
    )
    swap = GangPlan({DECODE: component_plan(DECODE, current=1, desired=2, balloons=1)})
    async with asyncio.timeout(1.5):
        await adapter.apply(swap, adapter.snapshot(now_s=time.time()), dry_run=False)
    assert spec_replicas(kube, "llama-decode") == 2


async def test_balloon_gangs_copy_the_lws_shape_and_hold_one_topology_domain(kube, adapter):
    add_gpu_nodes(kube, 6)
    decode_exclusive(kube, replicas=1)
    key = ComponentKey(NS, "llama-decode")
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    plan = GangPlan({key: component_plan(key, current=1, desired=1, balloons=2)})
    report = await adapter.apply(plan, state, dry_run=False)
    assert report.components[key].balloons.created_gangs == (0, 1)

    real = {
        p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"]: p
        for p in lws_pods(kube, "llama-decode")
    }
    balloons = balloon_pods(kube, "llama-decode")
    assert len(balloons) == 4
    racks_by_gang: dict[str, set[str]] = {}
    nodes = {n["metadata"]["name"]: n for n in kube.objects("nodes")}
    for pod in balloons:
        member = pod["metadata"]["labels"]["gang-autoscaler.io/balloon-member"]
        twin = real[member]
        assert (
            pod_shape_from_spec(pod["spec"]).requests == pod_shape_from_spec(twin["spec"]).requests
        )
        assert pod_shape_from_spec(pod["spec"]).limits == pod_shape_from_spec(twin["spec"]).limits
        assert pod["spec"]["priority"] == -5
        node = pod["spec"]["nodeName"]
        gang = pod["metadata"]["labels"]["gang-autoscaler.io/balloon-gang"]
        racks_by_gang.setdefault(gang, set()).add(nodes[node]["metadata"]["labels"][RACK])
    assert all(len(racks) == 1 for racks in racks_by_gang.values())

    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    assert state.observations({}).components[key].balloon_gangs == 2
    # Balloon pods count as free capacity: every node has 8 GPUs a real gang could take,
    # except the two the real gang runs on.
    free_gpus = sorted(n.free["nvidia.com/gpu"] for n in state.cluster.nodes)
    assert free_gpus == [0, 0, 8, 8, 8, 8]

    # Shrinking the buffer removes the highest-numbered gang first.
    plan = GangPlan({key: component_plan(key, current=1, desired=1, balloons=1)})
    await adapter.apply(plan, state, dry_run=False)
    assert sorted(p["metadata"]["name"] for p in balloon_pods(kube, "llama-decode")) == [
        "llama-decode-balloon-0-0",
        "llama-decode-balloon-0-1",
    ]


async def test_balloons_of_pods_with_an_unlimited_sidecar_are_valid_pods(kube, adapter):
    # A log shipper beside vLLM with requests and no limits: the pod is unlimited on CPU and
    # memory, so a balloon copying only the vLLM container's limits would ask for more than
    # its limit and the API server would refuse it.
    lws = lws_manifest("llama-decode", replicas=1, annotations={**ON})
    templates = lws["spec"]["leaderWorkerTemplate"]
    sidecar = {
        "name": "log-shipper",
        "image": "fluent/fluent-bit:3.2",
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
    }
    for template in (templates["leaderTemplate"], templates["workerTemplate"]):
        template["spec"]["containers"].append(copy.deepcopy(sidecar))
    add_gpu_nodes(kube, 4)
    kube.apply(lws)
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=1)})
    report = await adapter.apply(plan, state, dry_run=False)
    assert report.components[DECODE].balloons.failed == ()
    assert report.components[DECODE].balloons.created_gangs == (0,)

    (real,) = [
        p for p in lws_pods(kube, "llama-decode") if p["metadata"]["name"] == "llama-decode-0"
    ]
    (balloon,) = [
        p for p in balloon_pods(kube, "llama-decode") if p["metadata"]["name"].endswith("-0-0")
    ]
    resources = balloon["spec"]["containers"][0]["resources"]
    assert (
        pod_shape_from_spec(balloon["spec"]).requests == pod_shape_from_spec(real["spec"]).requests
    )
    assert set(resources["limits"]) == {"nvidia.com/gpu"}  # CPU and memory unlimited
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]


MIRROR = "mirror.example.com/k8s/pause:3.10"


async def test_balloons_take_the_configured_image_and_the_templates_pull_secrets(kube, api):
    # An air-gapped cluster: balloons pull a private mirror of the pause image with the LWS
    # templates' pull Secret, and run under the RuntimeClass the GPU nodes need.
    lws = lws_manifest("llama-decode", replicas=1, annotations={**ON})
    templates = lws["spec"]["leaderWorkerTemplate"]
    for template in (templates["leaderTemplate"], templates["workerTemplate"]):
        template["spec"]["imagePullSecrets"] = [{"name": "mirror-pull"}]
        template["spec"]["runtimeClassName"] = "nvidia"
    add_gpu_nodes(kube, 4)
    kube.apply(lws)
    plan = GangPlan({DECODE: component_plan(DECODE, current=1, desired=1, balloons=1)})

    mirrored = KubeAdapter(api, watch_timeout_s=30, event_instance="test-0", balloon_image=MIRROR)
    await mirrored.start(sync_timeout_s=5)
    await mirrored.ensure_priority_class()
    try:
        await settle(mirrored, kube)
        report = await mirrored.apply(plan, mirrored.snapshot(now_s=time.time()), dry_run=False)
        assert report.components[DECODE].balloons.created_gangs == (0,)
        balloons = balloon_pods(kube, "llama-decode")
        assert len(balloons) == 2
        for pod in balloons:
            assert [c["image"] for c in pod["spec"]["containers"]] == [MIRROR]
            assert pod["spec"]["imagePullSecrets"] == [{"name": "mirror-pull"}]
            assert pod["spec"]["runtimeClassName"] == "nvidia"
            assert pod["spec"].get("nodeName")
        # The snapshot counts them with the same image, as whole and current: nothing to redo.
        await settle(mirrored, kube)
        state = mirrored.snapshot(now_s=time.time())
        assert state.observations({}).components[DECODE].balloon_gangs == 1
        report = await mirrored.apply(plan, state, dry_run=False)
        assert not report.components[DECODE].balloon_plan.changes
        assert await mirrored.repair_balloons(now_s=time.time()) == ()  # as after a restart
    finally:
        await mirrored.close()

    # Back to the default image: the mirror's balloons are outdated and replaced whole.
    default = KubeAdapter(api, watch_timeout_s=30, event_instance="test-0")
    await default.start(sync_timeout_s=5)
    try:
        await settle(default, kube)
        state = default.snapshot(now_s=time.time())
        assert state.observations({}).components[DECODE].balloon_gangs == 0
        report = await default.apply(plan, state, dry_run=False)
        assert report.components[DECODE].balloon_plan.broken_gangs == (0,)
        await settle(default, kube)
        await default.apply(plan, default.snapshot(now_s=time.time()), dry_run=False)
        balloons = balloon_pods(kube, "llama-decode")
        assert len(balloons) == 2
        assert {c["image"] for p in balloons for c in p["spec"]["containers"]} == {PAUSE_IMAGE}
    finally:
        await default.close()


async def test_a_real_scale_up_preempts_a_whole_balloon_gang_and_it_is_recreated(kube, adapter):
    add_gpu_nodes(kube, 4)
    decode_exclusive(kube, replicas=1)
    key = ComponentKey(NS, "llama-decode")
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    await adapter.apply(
        GangPlan({key: component_plan(key, current=1, desired=1, balloons=1)}), state, dry_run=False
    )
    assert all(p["spec"].get("nodeName") for p in balloon_pods(kube, "llama-decode"))

    # Demand arrives: the real LWS grows into the capacity the balloon gang held.
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    report = await adapter.apply(
        GangPlan({key: component_plan(key, current=1, desired=2, balloons=1)}), state, dry_run=False
    )
    assert report.components[key].scale.result is ScaleResult.SCALED
    victims = sorted(v for v, _ in kube.preemptions)
    assert victims == [f"{NS}/llama-decode-balloon-0-0", f"{NS}/llama-decode-balloon-0-1"]
    assert all(p["spec"].get("nodeName") for p in lws_pods(kube, "llama-decode"))
    assert len(lws_pods(kube, "llama-decode")) == 4

    # The next pass recreates the balloon gang whole; it waits (Pending) for new nodes, and
    # lands in one rack once the cluster grows.
    await settle(adapter, kube)
    state = adapter.snapshot(now_s=time.time())
    await adapter.apply(
        GangPlan({key: component_plan(key, current=2, desired=2, balloons=1)}), state, dry_run=False
    )
    balloons = balloon_pods(kube, "llama-decode")
    assert len(balloons) == 2 and not any(p["spec"].get("nodeName") for p in balloons)
    add_gpu_nodes(kube, 2, start=4)
    balloons = balloon_pods(kube, "llama-decode")
    assert {p["spec"].get("nodeName") for p in balloons} == {"gpu-4", "gpu-5"}


async def test_a_balloon_gang_missing_one_member_is_deleted_whole_and_recreated(kube, adapter):
    add_gpu_nodes(kube, 6)
    decode_exclusive(kube, replicas=1)
    key = ComponentKey(NS, "llama-decode")
    await settle(adapter, kube)
    plan = GangPlan({key: component_plan(key, current=1, desired=1, balloons=1)})
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    first_uids = {p["metadata"]["uid"] for p in balloon_pods(kube, "llama-decode")}

    # A higher-priority single-pod workload takes one balloon member's node.
    kube.add_priority_class("batch-high", 1000)
    taker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "taker", "namespace": NS},
        "spec": {
            "priorityClassName": "batch-high",
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }
    # Fill the free nodes first so the taker must preempt.
    for i in range(2):
        filler = copy.deepcopy(taker)
        filler["metadata"]["name"] = f"filler-{i}"
        filler["spec"].pop("priorityClassName")
        kube.apply(filler)
    kube.apply(taker)
    assert len(kube.preemptions) == 1
    assert len(balloon_pods(kube, "llama-decode")) == 1

    await settle(adapter, kube)
    report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    applied = report.components[key]
    assert applied.balloon_plan.broken_gangs == (0,)
    (recreated,) = events(kube, "BalloonGangRecreated")
    assert "balloon gangs [0]" in recreated["message"]
    # The survivor was deleted this pass, and a new gang replaces it whole.
    await settle(adapter, kube)
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    balloons = balloon_pods(kube, "llama-decode")
    assert len(balloons) == 2
    assert not first_uids & {p["metadata"]["uid"] for p in balloons}


async def leave_a_partial_balloon_gang(kube: FakeKube, adapter: KubeAdapter) -> None:
    """Two decode balloon gangs, then a crash between two member creations: gang 1 is left
    with its leader only."""
    add_gpu_nodes(kube, 6)
    decode_exclusive(kube, replicas=1)
    key = ComponentKey(NS, "llama-decode")
    await settle(adapter, kube)
    plan = GangPlan({key: component_plan(key, current=1, desired=1, balloons=2)})
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    kube.remove("pods", NS, "llama-decode-balloon-1-1")


async def test_start_up_repair_deletes_a_partial_balloon_gang_left_by_a_crash(kube, adapter, api):
    await leave_a_partial_balloon_gang(kube, adapter)
    await settle(adapter, kube)
    deleted = await adapter.repair_balloons(now_s=time.time())
    assert deleted == (f"{NS}/llama-decode-balloon-1-0",)
    assert sorted(p["metadata"]["name"] for p in balloon_pods(kube, "llama-decode")) == [
        "llama-decode-balloon-0-0",
        "llama-decode-balloon-0-1",
    ]


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param({"gang-autoscaler.io/dry-run": "true"}, id="lws-in-dry-run"),
        pytest.param({"gang-autoscaler.io/min-replicas": "two"}, id="lws-held-on-a-bad-policy"),
    ],
)
async def test_start_up_repair_writes_nothing_for_an_lws_that_gets_no_writes(
    kube, adapter, api, annotation
):
    """An LWS marked dry-run gets no write at all, and one with a bad policy is held; the
    start-of-term repair deleted their partial balloon gangs all the same."""
    await leave_a_partial_balloon_gang(kube, adapter)
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        LWS_GROUP, LWS_VERSION, NS, LWS_PLURAL, "llama-decode",
        {"metadata": {"annotations": annotation}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    await settle(adapter, kube)
    assert await adapter.repair_balloons(now_s=time.time()) == ()
    assert len(balloon_pods(kube, "llama-decode")) == 3


async def test_balloons_of_an_lws_that_opted_out_are_removed(kube, adapter, api):
    add_gpu_nodes(kube, 6)
    decode_exclusive(kube, replicas=1)
    key = ComponentKey(NS, "llama-decode")
    await settle(adapter, kube)
    plan = GangPlan({key: component_plan(key, current=1, desired=1, balloons=1)})
    await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        LWS_GROUP,
        LWS_VERSION,
        NS,
        LWS_PLURAL,
        "llama-decode",
        {"metadata": {"annotations": {"gang-autoscaler.io/enabled": "false"}}},
        _content_type="application/merge-patch+json",
    )
    await settle(adapter, kube)
    report = await adapter.apply(GangPlan({}), adapter.snapshot(now_s=time.time()), dry_run=False)
    assert len(report.orphan_balloons_deleted) == 2
    assert balloon_pods(kube, "llama-decode") == []


# -- caches -------------------------------------------------------------------------------


async def test_caches_relist_after_410_gone_and_see_later_changes(kube, adapter):
    add_gpu_nodes(kube, 6)
    add_pd(kube)
    await settle(adapter, kube)
    lists_before = adapter.pods.lists
    # The watches drop, pods change while they are down, and the history is compacted: the
    # resumed watch gets 410 Gone and the caches must list again. (No await in between, so
    # no watch can resume early.)
    kube.expire_watches()
    kube.remove("pods", NS, "llama-decode-0-1")  # the LWS controller recreates the group
    kube.compact()
    await adapter.pods.wait_for(lambda: adapter.pods.lists > lists_before, timeout_s=5)
    await settle(adapter, kube)
    cached = {
        (p["metadata"]["name"], p["metadata"]["uid"])
        for p in adapter.pods.items()
        if p["metadata"]["namespace"] == NS
    }
    stored = {(p["metadata"]["name"], p["metadata"]["uid"]) for p in kube.objects("pods", NS)}
    assert cached == stored


async def test_a_watch_that_expires_after_every_list_is_listed_again_with_a_backoff(kube, adapter):
    """Every watch answering 410 Gone was a cluster-wide list as fast as the server
    answered (39 node lists in 3 s), and nothing but INFO lines said so."""
    add_gpu_nodes(kube, 2)
    await settle(adapter, kube)
    lists_before = adapter.nodes.lists
    kube.inject_fault(code=410, method="GET", path_contains="watch=", times=100_000)
    kube.expire_watches()
    await asyncio.sleep(3.0)
    kube.faults.clear()
    # one list at once, then after 1 s and 2 s (the cache's base retry delay doubling)
    assert 2 <= adapter.nodes.lists - lists_before <= 3
    assert adapter.stale_view() is None  # each list works: the view is current


async def test_a_410_after_a_quiet_watch_that_ran_its_course_is_listed_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only an event reset the streak of 410s: 410s minutes apart, each after a watch that
    ran its whole timeout without one, waited 1, 2, 4, 8 s... as if they came in a row."""
    caplog.set_level(logging.WARNING, logger="autoscaler.adapters.kube_cache")
    # no bookmarks: a watch with no change hears nothing until the server ends it
    async with FakeKube.start(bookmark_interval_s=3600) as quiet, quiet.api_client() as api:
        add_gpu_nodes(quiet, 1)
        adapter = KubeAdapter(api, watch_timeout_s=1, event_instance="test-0")
        await adapter.start(sync_timeout_s=5)
        try:
            for _ in range(3):
                lists = adapter.nodes.lists
                quiet.inject_fault(code=410, method="GET", path_contains="/nodes?")
                quiet.expire_watches()
                await adapter.nodes.wait_for(
                    lambda before=lists: adapter.nodes.lists > before, timeout_s=5
                )
                await asyncio.sleep(1.5)  # the next watch runs its course, quietly
        finally:
            await adapter.close()
    assert not [r for r in caplog.records if "expired again" in r.getMessage()]


async def _running(cache: WatchCache) -> asyncio.Task[None]:
    task = asyncio.create_task(cache.run())
    await cache.synced.wait()
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_collection_is_listed_in_pages_and_then_watched(kube, api):
    """One answer held every pod of the cluster, parsed on the event loop: on a large
    cluster seconds in which no Lease was renewed. Pages, as client-go's pager reads them."""
    add_gpu_nodes(kube, 5)
    nodes = WatchCache(client.CoreV1Api(api).list_node, name="nodes", page_size=2)
    task = await _running(nodes)
    try:
        assert len(nodes.items()) == 5
        lists = [path for _, path, _ in kube.requests("GET", "/nodes") if "watch=" not in path]
        assert len(lists) == 3 and all("limit=2" in path for path in lists)
        assert sum("continue=" in path for path in lists) == 2
        add_gpu_nodes(kube, 1, start=5)  # and the watch from the list's version sees it
        await nodes.wait_for(lambda: len(nodes.items()) == 6, timeout_s=5)
    finally:
        await _stop(task)


async def test_a_watch_gone_silent_is_given_up_counted_from_the_silence_and_relisted(kube, api):
    # The pods watch connects, then the peer goes silent with no reset (a NAT or a node
    # gone): the cache must notice by itself at the read timeout (1 s watch + 0.5 s here),
    # say it has heard nothing for that long (not since the timeout), and see later changes.
    pods = WatchCache(
        client.CoreV1Api(api).list_pod_for_all_namespaces,
        name="pods",
        watch_timeout_s=1,
        read_grace_s=0.5,
        retry_delay_s=1.0,
    )
    kube.inject_fault(code=0, method="GET", path_contains="watch=", action="stall", stall_s=60)
    task = await _running(pods)
    try:
        lists_before = pods.lists
        kube.add_namespace("late")
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "late", "namespace": "late"},
                "spec": {"containers": [{"name": "c", "image": "pause"}]},
            }
        )
        for _ in range(400):
            if pods.last_error is not None:
                break
            await asyncio.sleep(0.01)
        assert "Timeout" in (pods.last_error or "")
        assert pods.failing_for_s() >= 1.4  # silent since the list, not failing since now
        await pods.wait_for(lambda: pods.get("late", "late") is not None, timeout_s=10)
        assert pods.lists > lists_before  # given up on the silent watch, listed again
        assert pods.failing_for_s() == 0.0
    finally:
        await _stop(task)


async def test_a_split_balloon_gang_is_timed_by_this_process_not_the_api_servers_clock():
    """The API server's clock is an hour behind this process's: a balloon gang whose worker
    waits for a full rack looks split for an hour the first time it is seen. It is replaced
    only once this process has itself seen it split for longer than gang-timeout."""
    behind = dt.timedelta(hours=1)
    async with (
        FakeKube.start(
            bookmark_interval_s=0.1, clock=lambda: dt.datetime.now(dt.UTC) - behind
        ) as kube,
        kube.api_client() as api,
    ):
        adapter = KubeAdapter(api, watch_timeout_s=30, event_instance="test-0")
        await adapter.start(sync_timeout_s=5)
        await adapter.ensure_priority_class()
        try:
            # racks r0 (gpu-0, gpu-1), r1 (gpu-2, gpu-3), r2 (gpu-4 alone); the real gang
            # takes one whole rack, a balloon gang the other, and a second balloon gang's
            # leader the lone node of r2, where its worker can never follow
            add_gpu_nodes(kube, 5)
            decode_exclusive(kube, replicas=1)
            key = ComponentKey(NS, "llama-decode")
            await settle(adapter, kube)
            plan = GangPlan({key: component_plan(key, current=1, desired=1, balloons=2)})
            first = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
            assert first.components[key].balloons.created_gangs == (0, 1)
            bound = {
                p["metadata"]["name"]: p["spec"].get("nodeName")
                for p in balloon_pods(kube, "llama-decode")
            }
            split = [
                g
                for g in (0, 1)
                if bool(bound[f"llama-decode-balloon-{g}-0"])
                != bool(bound[f"llama-decode-balloon-{g}-1"])
            ]
            assert len(split) == 1, bound

            await settle(adapter, kube)
            now = time.time()
            seen = await adapter.apply(plan, adapter.snapshot(now_s=now), dry_run=False)
            assert seen.components[key].balloons is None  # nothing to change
            assert len(balloon_pods(kube, "llama-decode")) == 4

            # A new leadership term starts from what it observes: the sighting is forgotten
            # and the split is timed again from the next pass.
            adapter.actuator.forget_balloon_sightings()
            await settle(adapter, kube)
            again = await adapter.apply(plan, adapter.snapshot(now_s=now + 601), dry_run=False)
            assert again.components[key].balloons is None
            assert len(balloon_pods(kube, "llama-decode")) == 4

            await settle(adapter, kube)
            later = await adapter.apply(plan, adapter.snapshot(now_s=now + 1202), dry_run=False)
            assert later.components[key].balloons.broken_gangs == tuple(split)
        finally:
            await adapter.close()


async def test_core_plan_drives_buffer_and_scale_up_end_to_end(kube, adapter):
    """snapshot -> core plan -> apply, three ticks: the forecast's upper bound asks for
    balloons, a real scale-up takes their capacity, and the buffer is rebuilt whole."""
    add_gpu_nodes(kube, 6)
    lws = lws_manifest(
        "chat",
        replicas=1,
        annotations={
            **ON,
            "gang-autoscaler.io/capacity-per-replica": "100",
            "gang-autoscaler.io/max-buffer": "2",
            "leaderworkerset.sigs.k8s.io/exclusive-topology": RACK,
        },
    )
    kube.apply(lws)
    key = ComponentKey(NS, "chat")
    forecast = {key: Forecast(point=80.0, upper=250.0, horizon_s=300.0)}
    memory = Memory()

    async def tick(now: float, waiting: float) -> GangPlan:
        nonlocal memory
        await settle(adapter, kube)
        state = adapter.snapshot(now_s=now)
        signals = {key: Signals(waiting_requests=waiting, kv_usage_fraction=0.5, demand=80.0)}
        plan, memory = core_plan(
            state.observations(signals), state.policies, forecast, memory, now=now
        )
        await adapter.apply(plan, state, dry_run=False)
        return plan

    now = time.time()
    first = await tick(now, waiting=2.0)
    assert (first.components[key].desired_gangs, first.components[key].balloon_gangs) == (1, 2)
    assert len(balloon_pods(kube, "chat")) == 4

    second = await tick(now + 15, waiting=8.0)  # 8 waiting on 1 gang, target 4: two gangs
    assert second.components[key].desired_gangs == 2
    assert second.components[key].balloon_gangs == 1
    assert spec_replicas(kube, "chat") == 2
    # the new gang took the nodes of the balloon gang given up, deleted before the scale:
    # nothing left to preempt
    assert kube.preemptions == []
    real = lws_pods(kube, "chat")
    assert len(real) == 4 and all(p["spec"].get("nodeName") for p in real)

    await tick(now + 30, waiting=8.0)
    await tick(now + 45, waiting=8.0)
    balloons = balloon_pods(kube, "chat")
    assert sorted(p["metadata"]["name"] for p in balloons) == [
        "chat-balloon-0-0",
        "chat-balloon-0-1",
    ]
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"][RACK] for n in kube.objects("nodes")}
    assert len({nodes[p["spec"]["nodeName"]] for p in balloons}) == 1
    await settle(adapter, kube)
    assert adapter.snapshot(now_s=now + 60).observations({}).components[key].balloon_gangs == 1


async def test_a_cache_keeps_retrying_a_failing_list_until_it_works(kube, api):
    widgets = ResourceType("example.com", "v1", "widgets", "widget", "Widget", True, custom=True)
    cache = WatchCache(
        functools.partial(
            client.CustomObjectsApi(api).list_cluster_custom_object, "example.com", "v1", "widgets"
        ),
        name="widgets",
        retry_delay_s=0.05,
    )
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.sleep(0.3)
        assert not cache.synced.is_set()
        assert cache.last_error is not None and "404" in cache.last_error
        kube.registry.add(widgets)  # the API appears (e.g. its CRD gets installed)
        await asyncio.wait_for(cache.synced.wait(), 5)
        assert cache.items() == []
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_failing_cache_says_for_how_long_backs_off_and_recovers(kube, api):
    # RBAC for pods withdrawn (403 on list and watch) while the cache holds what it last
    # saw: it must say since when it has heard nothing, stop asking every retry delay, and
    # be current again after the first list that works.
    now = [100.0]
    pods = WatchCache(
        client.CoreV1Api(api).list_pod_for_all_namespaces,
        name="pods",
        retry_delay_s=0.05,
        clock=lambda: now[0],
    )
    task = await _running(pods)
    try:
        assert pods.failing_for_s() == 0.0
        kube.inject_fault(code=403, method="GET", path_contains="/api/v1/pods", times=10**6)
        kube.expire_watches()
        for _ in range(100):
            if pods.failing_for_s() == 0.0:
                await asyncio.sleep(0.01)
        now[0] = 175.0
        assert pods.failing_for_s() == 75.0
        assert "403" in (pods.last_error or "")
        tries_before = len(kube.requests("GET", "/api/v1/pods"))
        await asyncio.sleep(1.0)
        tries = len(kube.requests("GET", "/api/v1/pods")) - tries_before
        # 0.05 s doubling: at most 5 tries in a second, where a fixed delay makes 20
        assert 1 <= tries <= 5, tries
        now[0] = 500.0
        assert pods.failing_for_s() == 400.0  # still nothing heard

        kube.faults.clear()
        lists = pods.lists
        await pods.wait_for(lambda: pods.lists > lists, timeout_s=35)
        assert pods.failing_for_s() == 0.0
    finally:
        await _stop(task)


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        pytest.param(
            {"code": 0, "action": "empty"}, "ended at once with no event", id="watch-closed-at-once"
        ),
        pytest.param({"code": 403}, "403", id="watch-forbidden-list-allowed"),
    ],
)
async def test_a_watch_that_keeps_failing_backs_off_even_when_listing_works(
    kube, api, fault, error
):
    # Listing works, watching does not (a proxy closing streams at once; RBAC without
    # `watch`): the cache must count it as failing and back off, not re-list a cluster's
    # pods in a tight loop while its age stays 0.
    pods = WatchCache(
        client.CoreV1Api(api).list_pod_for_all_namespaces, name="pods", retry_delay_s=0.05
    )
    task = await _running(pods)
    try:
        kube.inject_fault(method="GET", path_contains="watch=", times=10**6, **fault)
        kube.expire_watches()
        await asyncio.sleep(0.2)
        before = len(kube.requests("GET", "/api/v1/pods"))
        await asyncio.sleep(1.0)
        tries = len(kube.requests("GET", "/api/v1/pods")) - before
        # a list and a watch per try, 0.05 s doubling: at most 4 tries in a second (8
        # requests), where a reset back-off or no failure at all makes dozens
        assert 1 <= tries <= 8, tries
        assert error in (pods.last_error or "")
    finally:
        kube.faults.clear()
        await _stop(task)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            b'{"kind": "Status", "message": "pods is forbidden: User \\"x\\" cannot list"}',
            'pods is forbidden: User "x" cannot list',
            id="status-message",
        ),
        pytest.param(b"<html>bad gateway</html>", "b'<html>bad gateway</html>'", id="not-json"),
        pytest.param(b"[1, 2]", "b'[1, 2]'", id="json-not-a-status"),
    ],
)
def test_an_error_answer_reads_as_its_status_message(body: bytes, expected: str) -> None:
    assert status_message(body) == expected


@contextlib.asynccontextmanager
async def refused_for_a_class_of_value_1000(kube, api) -> AsyncIterator[KubeAdapter]:
    """An adapter, started and settled, that found the balloon PriorityClass at 1000."""
    kube.add_priority_class("gang-autoscaler-balloon", 1000)
    add_gpu_nodes(kube, 8)
    add_pd(kube)
    adapter = KubeAdapter(api, watch_timeout_s=30, event_instance="test-0")
    await adapter.start(sync_timeout_s=5)
    try:
        with pytest.raises(KubeAdapterError, match="has value 1000"):
            await adapter.ensure_priority_class()
        await settle(adapter, kube)
        yield adapter
    finally:
        await adapter.close()


async def test_no_balloon_gang_is_made_while_the_priority_class_has_another_value(kube, api):
    """A `gang-autoscaler-balloon` class of value 1000 (made by hand) was reported and then
    used anyway: balloons that real gangs cannot preempt, holding GPUs they need."""
    async with refused_for_a_class_of_value_1000(kube, api) as adapter:
        plan = GangPlan({PREFILL: component_plan(PREFILL, current=1, desired=1, balloons=1)})
        report = await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
        assert balloon_pods(kube, "llama-prefill") == []
        assert report.components[PREFILL].balloons.created_gangs == ()
        (event,) = events(kube, "BalloonWriteFailed")
        assert "PriorityClass gang-autoscaler-balloon has value 1000" in event["message"]
        # The class is deleted by hand; the next check recreates it and balloons follow.
        kube.remove("priorityclasses", None, "gang-autoscaler-balloon")
        adapter._class_checked_mono -= 3600  # the recheck interval has passed
        await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
        assert len(balloon_pods(kube, "llama-prefill")) == 2
        assert kube.object("priorityclasses", None, "gang-autoscaler-balloon")["value"] == -5


async def test_a_priority_class_deleted_but_not_creatable_is_said_as_it_is(kube, api):
    """The chart grants only `get` on the class. Deleted by hand after a wrong value, it
    could not be created, and the Warning kept saying it had value 1000."""
    async with refused_for_a_class_of_value_1000(kube, api) as adapter:
        kube.remove("priorityclasses", None, "gang-autoscaler-balloon")
        kube.inject_fault(code=403, method="POST", path_contains="priorityclasses", times=10)
        adapter._class_checked_mono -= 3600  # the recheck interval has passed
        plan = GangPlan({PREFILL: component_plan(PREFILL, current=1, desired=1, balloons=1)})
        await adapter.apply(plan, adapter.snapshot(now_s=time.time()), dry_run=False)
        assert balloon_pods(kube, "llama-prefill") == []
        (event,) = events(kube, "BalloonWriteFailed")
        assert "has value 1000" not in event["message"]
        assert "creating PriorityClass gang-autoscaler-balloon" in event["message"]
        assert "grant create on priorityclasses" in event["message"]
