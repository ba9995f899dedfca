"""End to end: the service scales a PD deployment in whole gangs from real Prometheus data."""

from __future__ import annotations

import asyncio

import pytest

from tests.harness.fake_kube import FakeKube
from tests.service.conftest import Live
from tests.service.stack import (
    DECODE,
    NO_BUFFER,
    PREFILL,
    TEST_QUERIES,
    lws_pods,
    pd_manifests,
    settings_for,
    spec_gangs,
    start_service,
    wait_until,
)

pytestmark = pytest.mark.prometheus


async def test_rising_decode_queue_scales_decode_by_whole_gangs_and_keeps_prefill(
    kube: FakeKube, live: Live
) -> None:
    ns = "up"
    kube.add_namespace(ns)
    for manifest in pd_manifests(
        ns, {PREFILL: NO_BUFFER, DECODE: {**NO_BUFFER, "gang-autoscaler.io/forecast": "off"}}
    ):
        kube.apply(manifest)
    # Decode starts at 2 gangs (the example), prefill at 1; both idle.
    live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.1)
    live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=0, kv_usage_fraction=0.1)
    running = await start_service(kube, settings_for(live.prometheus.url))
    try:
        await wait_until(lambda: running.service.loop.ticks >= 2, timeout_s=10, what="ticks")
        assert spec_gangs(kube, ns, DECODE) == 2
        # The decode queue builds up: 6 waiting per leader, target 2 per gang.
        live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=6)
        seen_prefill = []

        def decode_grew() -> bool:
            seen_prefill.append(spec_gangs(kube, ns, PREFILL))
            return spec_gangs(kube, ns, DECODE) >= 4

        await wait_until(decode_grew, timeout_s=20, what="decode to scale up")
        assert min(seen_prefill) >= 1
        # Whole gangs: once the new groups are up, every group has both pods, all Ready.
        await wait_until(
            lambda: len(lws_pods(kube, ns, DECODE)) == 2 * spec_gangs(kube, ns, DECODE),
            timeout_s=10,
            what="decode pods",
        )
        groups: dict[str, int] = {}
        for pod in lws_pods(kube, ns, DECODE):
            group = pod["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
            groups[group] = groups.get(group, 0) + 1
        assert set(groups.values()) == {2}
        # The plans that grew decode said why; the newest plan may already be a later tick's
        # hold (its window keeps the gangs), so count every plan by reason. A tick writes the
        # scale before it counts its decisions: the count follows.
        labels = {"namespace": ns, "deployment": "llama", "component": "decode"}

        async def growth_counted() -> bool:
            grew = [
                await running.metric("gang_autoscaler_decisions_total", **labels, reason=reason)
                for reason in ("scale_up_waiting", "scale_up_rate_limited")
            ]
            return sum(n or 0 for n in grew) >= 1

        await wait_until(growth_counted, timeout_s=10, what="the scale-ups counted by reason")
        assert spec_gangs(kube, ns, PREFILL) >= 1
        scaled_up = await running.metric(
            "gang_autoscaler_scale_writes_total",
            namespace=ns,
            deployment="llama",
            component="decode",
            direction="up",
        )
        assert scaled_up is not None and scaled_up >= 1
        await asyncio.sleep(0)
    finally:
        await running.close()


async def test_a_deployment_at_zero_is_woken_by_the_wake_query(kube: FakeKube, live: Live) -> None:
    """At zero gangs the deployment's pods serve no metric, and with the forecast off nothing
    else could bring it back. The `wake` query reads what waits in front of it: here a
    constant row for (namespace, deployment), as a gateway's queue would give."""
    ns = "wake"
    kube.add_namespace(ns)
    at_zero = {**NO_BUFFER, "gang-autoscaler.io/min-replicas": "0",
               "gang-autoscaler.io/forecast": "off"}  # fmt: skip
    for manifest in pd_manifests(ns, {PREFILL: at_zero, DECODE: at_zero}):
        manifest["spec"]["replicas"] = 0
        kube.apply(manifest)
    wake = (
        'label_replace(label_replace(vector(3), "namespace", "wake", "", ""), '
        '"deployment", "llama", "", "")'
    )
    queries = TEST_QUERIES.model_copy(update={"wake": wake})
    running = await start_service(kube, settings_for(live.prometheus.url, queries=queries))
    try:
        await wait_until(
            lambda: spec_gangs(kube, ns, PREFILL) == 1 and spec_gangs(kube, ns, DECODE) == 1,
            timeout_s=20,
            what="both components woken",
        )

        # the tick writes the scale before it counts its decisions: the count follows
        async def counted() -> bool:
            woke = await running.metric(
                "gang_autoscaler_decisions_total",
                namespace=ns, deployment="llama", component="prefill", reason="scale_from_zero",
            )  # fmt: skip
            return woke is not None and woke >= 1

        await wait_until(counted, timeout_s=10, what="the wake counted as scale_from_zero")
    finally:
        await running.close()


async def test_a_gang_waiting_for_nodes_is_kept_and_reported_not_rolled_back(
    kube: FakeKube, live: Live
) -> None:
    """Every node cordoned once the example's gangs run: the gangs a rising queue asks for
    have no pod placed. They hold no GPU; scaled away at gang-timeout and asked for again
    on the next tick, their nodes would never come. Kept, they are reported."""
    ns = "nonodes"
    kube.add_namespace(ns)
    decode = {
        **NO_BUFFER,
        "gang-autoscaler.io/forecast": "off",
        "gang-autoscaler.io/gang-timeout": "2s",
    }
    for manifest in pd_manifests(ns, {PREFILL: NO_BUFFER, DECODE: decode}):
        kube.apply(manifest)
    live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.1)
    live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=0, kv_usage_fraction=0.1)
    await wait_until(
        lambda: (
            all(p["spec"].get("nodeName") for p in lws_pods(kube, ns, DECODE))
            and len(lws_pods(kube, ns, DECODE)) == 4
        ),
        timeout_s=10,
        what="the example's decode gangs placed",
    )
    nodes = kube.resource("nodes")
    for node in kube.objects("nodes"):
        kube.patch(
            nodes,
            None,
            node["metadata"]["name"],
            {"spec": {"unschedulable": True}},
            content_type="application/merge-patch+json",
        )
    running = await start_service(kube, settings_for(live.prometheus.url))
    labels = {"namespace": ns, "deployment": "llama", "component": "decode"}
    try:
        live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=6)
        await wait_until(
            lambda: spec_gangs(kube, ns, DECODE) >= 3, timeout_s=20, what="decode to scale up"
        )
        grown = spec_gangs(kube, ns, DECODE)
        # past the 2 s gang-timeout several times over, at a 0.5 s tick
        ticks, seen = running.service.loop.ticks, []

        def waited() -> bool:
            seen.append(spec_gangs(kube, ns, DECODE))
            return running.service.loop.ticks >= ticks + 12

        await wait_until(waited, timeout_s=30, what="twelve ticks")
        assert min(seen) >= grown  # never scaled away
        reasons = {e["reason"] for e in kube.objects("events", ns)}
        assert "PartialGangRolledBack" not in reasons

        async def reported() -> bool:
            return (await running.metric("gang_autoscaler_unplaced_gangs", **labels) or 0) >= 1

        await wait_until(reported, timeout_s=20, what="the unplaced gangs reported")
        assert "GangUnplaced" in {e["reason"] for e in kube.objects("events", ns)}
        _, body = await running.get("/decisions")
        assert body["components"][f"{ns}/{DECODE}"]["plan"]["unplaced_groups"]
    finally:
        await running.close()
