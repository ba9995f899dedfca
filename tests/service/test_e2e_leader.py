"""End to end: two instances, one Lease. Only the leader writes; when it dies without
releasing the Lease, the standby takes over once the Lease has expired."""

from __future__ import annotations

import time

import pytest
from kubernetes_asyncio import client

from autoscaler.adapters.lws_scaler import ScaleResult
from tests.harness.fake_kube import FakeKube
from tests.service.conftest import Live
from tests.service.stack import (
    DECODE,
    LWS_API,
    NO_BUFFER,
    PREFILL,
    Running,
    balloon_pods,
    pd_manifests,
    settings_for,
    spec_gangs,
    start_service,
    wait_until,
)

pytestmark = pytest.mark.prometheus

NS = "leader"
LEASE_S = 3.0


def event_instances(kube: FakeKube) -> set[str]:
    """Instances that recorded the autoscaler's Events (the scheduler records its own)."""
    return {
        e.get("reportingInstance", "")
        for e in kube.objects("events", NS)
        if e.get("reportingComponent") == "gang-autoscaler"
    }


async def scale_writes(running: Running) -> float:
    total = 0.0
    for direction in ("up", "down"):
        for component in ("prefill", "decode"):
            value = await running.metric(
                "gang_autoscaler_scale_writes_total",
                namespace=NS,
                deployment="llama",
                component=component,
                direction=direction,
            )
            total += value or 0.0
    return total


async def test_only_the_leader_writes_and_the_standby_takes_over(
    kube: FakeKube, live: Live
) -> None:
    kube.add_namespace(NS)
    for manifest in pd_manifests(NS, {DECODE: {"gang-autoscaler.io/forecast": "off"}}):
        kube.apply(manifest)
    live.exporter.set_lws(namespace=NS, lws=PREFILL, waiting=0, kv_usage_fraction=0.5)
    live.exporter.set_lws(namespace=NS, lws=DECODE, waiting=3, kv_usage_fraction=0.6)
    lease = f"{LEASE_S:g}s"
    alpha = await start_service(
        kube, settings_for(live.prometheus.url, lease_duration=lease), identity="alpha"
    )
    beta: Running | None = None
    try:
        await wait_until(alpha.service.is_leader, timeout_s=10, what="alpha to lead")
        beta = await start_service(
            kube, settings_for(live.prometheus.url, lease_duration=lease), identity="beta"
        )
        # alpha acts: decode grows and gets its balloon buffer.
        await wait_until(
            lambda: spec_gangs(kube, NS, DECODE) >= 3 and bool(balloon_pods(kube, NS)),
            timeout_s=20,
            what="alpha to scale decode and create balloons",
        )
        # Exactly at target from now on: decode holds (and is far below its maximum).
        live.exporter.set_lws(namespace=NS, lws=DECODE, waiting=2, kv_usage_fraction=0.6)
        ticks = beta.service.loop.ticks
        await wait_until(lambda: beta.service.loop.ticks >= ticks + 3, timeout_s=10, what="ticks")
        assert not beta.service.is_leader()
        assert event_instances(kube) == {"alpha"}
        assert await scale_writes(alpha) >= 1
        assert await scale_writes(beta) == 0
        assert beta.service.loop.last is not None and beta.service.loop.last.applied is None
        assert beta.service.loop.last.plan is not None  # the standby decides, warm
        assert await beta.metric("gang_autoscaler_leader") == 0
        assert await alpha.metric("gang_autoscaler_leader") == 1
        # Per-component state is reported by the leader only.
        labels = {"namespace": NS, "deployment": "llama", "component": "decode"}
        assert await beta.metric("gang_autoscaler_desired_gangs", **labels) is None
        assert await alpha.metric("gang_autoscaler_desired_gangs", **labels) is not None
        status, ready = await beta.get("/readyz")
        assert status == 200 and ready["role"] == "standby"

        # alpha dies without handing the Lease back.
        await alpha.close(release_lease=False)
        died = time.monotonic()
        await wait_until(beta.service.is_leader, timeout_s=LEASE_S + 10, what="beta to lead")
        took_over_s = time.monotonic() - died
        # The Lease was renewed at most one retry period (1 s) before alpha died.
        assert took_over_s >= LEASE_S - 1.5, took_over_s
        before = spec_gangs(kube, NS, PREFILL)
        live.exporter.set_lws(namespace=NS, lws=PREFILL, waiting=12, kv_usage_fraction=0.9)
        await wait_until(
            lambda: spec_gangs(kube, NS, PREFILL) > before,
            timeout_s=20,
            what="beta to scale prefill",
        )
        # The Event is written right after the /scale patch, so it may land a moment later.
        await wait_until(
            lambda: "beta" in event_instances(kube), timeout_s=5, what="beta's scaling Event"
        )
        assert await scale_writes(beta) >= 1
        assert await beta.metric("gang_autoscaler_leader") == 1
    finally:
        if beta is not None:
            await beta.close()
        if alpha.task is not None and not alpha.task.done():
            await alpha.close()


def cached_spec_gangs(running: Running, namespace: str, lws: str) -> int | None:
    """What the service's watch cache holds for the LWS's spec.replicas."""
    state = running.service.kube.snapshot(now_s=time.time())
    for key, component in state.components.items():
        if (key.namespace, key.lws) == (namespace, lws) and component.observation is not None:
            return component.observation.spec_gangs
    return None


async def test_a_lease_lost_and_won_back_between_ticks_is_a_new_term(
    kube: FakeKube, live: Live
) -> None:
    """The Lease is lost and won back between two ticks, and meanwhile the decode LWS is
    scaled by the leader of that gap. The next tick starts a new term from what it observes:
    no 'another writer' hold, no Warning. Before, the loop saw a leader at both ticks and
    kept the earlier term's writes, so it held decode for 10 minutes, blaming a legitimate
    write."""
    ns = "regain"
    kube.add_namespace(ns)
    off = {"gang-autoscaler.io/forecast": "off", **NO_BUFFER}
    for manifest in pd_manifests(ns, {PREFILL: off, DECODE: off}):
        kube.apply(manifest)
    live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.5)
    live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=12, kv_usage_fraction=0.6)
    waiting = f'sum(vllm:num_requests_waiting{{namespace="{ns}",pod=~"{DECODE}-0"}})'
    await wait_until(
        lambda: [float(r["value"][1]) for r in live.prometheus.query(waiting)] == [12.0],  # type: ignore[index]
        timeout_s=10,
        what="decode's queue in Prometheus",
    )
    # An hour's tick: after the first, the test runs the ticks itself, so none falls in the gap.
    settings = settings_for(live.prometheus.url, tick="1h", namespaces=[ns])
    alpha = await start_service(kube, settings, identity="alpha")
    loop, elector = alpha.service.loop, alpha.service.elector
    assert elector is not None
    try:
        await wait_until(lambda: loop.last is not None, timeout_s=10, what="the first tick")
        await wait_until(alpha.service.is_leader, timeout_s=10, what="alpha to lead")
        await loop.tick()
        written = spec_gangs(kube, ns, DECODE)
        assert written > 1, loop.last
        terms = elector.terms
        # five dropped renewals in a row outlast the renew deadline: the term ends...
        kube.inject_fault(code=0, method="GET", path_contains="/leases/", action="disconnect",
                          times=5)  # fmt: skip
        await wait_until(lambda: not alpha.service.is_leader(), timeout_s=10, what="a lost Lease")
        # ...the leader of the gap scales decode, and alpha wins the Lease back
        await client.CustomObjectsApi(alpha.api).patch_namespaced_custom_object_scale(
            *LWS_API[:2], ns, LWS_API[2], DECODE, {"spec": {"replicas": written + 1}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        await wait_until(
            lambda: cached_spec_gangs(alpha, ns, DECODE) == written + 1,
            timeout_s=10,
            what="the watch to see the gap's write",
        )
        await wait_until(
            lambda: elector.terms == terms + 1 and alpha.service.is_leader(),
            timeout_s=15,
            what="alpha to lead again",
        )
        assert loop.ticks == 2  # no tick fell in the gap
        await loop.tick()
        reasons = {e.get("reason") for e in kube.objects("events", ns)}
        assert "AnotherWriter" not in reasons, reasons
        assert loop.last is not None and loop.last.applied is not None
        (decode,) = (c for k, c in loop.last.applied.components.items() if k.lws == DECODE)
        assert decode.scale is not None and decode.scale.result is not ScaleResult.OTHER_WRITER
    finally:
        await alpha.close()


async def test_a_standby_that_may_not_read_the_lease_is_not_ready_and_says_why(
    kube: FakeKube, live: Live
) -> None:
    """A Lease Role missing on one replica: it stayed a ready standby that could never take
    over, its /metrics counted nothing, and only the NoLeader alert noticed, once the other
    replica had died and nothing scaled any more."""
    kube.add_namespace(NS)
    for manifest in pd_manifests(NS, {}):
        kube.apply(manifest)
    kube.inject_fault(code=403, method="GET", path_contains="/leases/", times=100_000)
    running = await start_service(
        kube,
        settings_for(live.prometheus.url, watch_staleness_limit="2s"),
        identity="gamma",
    )
    try:
        await wait_until(
            lambda: running.service.loop.ticks >= 2, timeout_s=10, what="the first ticks"
        )
        status, ready = await running.get("/readyz")
        if status == 200:  # the limit had not passed yet
            await wait_until(
                lambda: running.service.readiness().ok is False, timeout_s=10, what="not ready"
            )
            status, ready = await running.get("/readyz")
        assert status == 503 and ready["role"] == "standby"
        assert "403 Forbidden" in ready["lease"] and "leases" in ready["lease"]
        assert (await running.metric("gang_autoscaler_errors_total", kind="lease") or 0) >= 2
        assert not running.service.is_leader()

        kube.faults.clear()  # the Role is granted: it leads, and is ready
        await wait_until(running.service.is_leader, timeout_s=10, what="gamma to lead")
        status, _ = await running.get("/readyz")
        assert status == 200
    finally:
        kube.faults.clear()
        await running.close()
