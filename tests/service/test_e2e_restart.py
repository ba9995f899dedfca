"""End to end: a restarted service gets back the capacity per gang its predecessor learned,
through Prometheus scraping the predecessor's `/metrics`, while the load is too light to
learn it again; a new gang template (image) then forgets it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from autoscaler.adapters.kube_discovery import template_digest
from autoscaler.core.model import Component
from tests.harness.fake_kube import FakeKube
from tests.harness.prometheus_server import ScrapeTarget
from tests.service.conftest import Live
from tests.service.stack import (
    DECODE,
    NO_BUFFER,
    PREFILL,
    TEST_QUERIES,
    Running,
    pd_manifests,
    settings_for,
    start_service,
    wait_until,
)

pytestmark = pytest.mark.prometheus

NS = "restart"
PREFILL_LABELS = {"namespace": NS, "deployment": "llama", "component": "prefill"}


async def wait_for_light_prefill(live: Live, namespace: str) -> None:
    """Until Prometheus shows every prefill leader of `namespace` at a KV cache of 0.3 or
    less: too light to learn a capacity from."""
    kv_query = TEST_QUERIES.instant_queries()["kv_cache"]

    async def light() -> bool:
        rows = await asyncio.to_thread(live.prometheus.query, kv_query)
        ours = [
            float(row["value"][1])  # type: ignore[index]
            for row in rows
            if row["metric"]["namespace"] == namespace  # type: ignore[index]
            and str(row["metric"]["pod"]).startswith(PREFILL)  # type: ignore[index]
        ]
        return bool(ours) and max(ours) <= 0.3

    await wait_until(light, timeout_s=15, what="Prometheus to see the light load")


async def prefill_capacity(running: Running) -> float | None:
    _, body = await running.get("/decisions")
    plan = body["components"].get(f"{NS}/{PREFILL}", {}).get("plan")
    return plan["capacity_per_gang"] if plan else None


async def test_a_restart_restores_the_learned_capacity(
    kube: FakeKube, live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="autoscaler.service.control_loop")
    kube.add_namespace(NS)
    for manifest in pd_manifests(NS, {PREFILL: NO_BUFFER, DECODE: NO_BUFFER}):
        kube.apply(manifest)
    # The queue at its target (4 per gang): within tolerance, and loaded enough to learn
    # from (prefill learns at its queue; its KV cache may be full of prompts for decode).
    live.exporter.set_lws(
        namespace=NS, lws=PREFILL, waiting=4, kv_usage_fraction=0.76, prompt_tokens_per_s=5000
    )
    live.exporter.set_lws(namespace=NS, lws=DECODE, waiting=1, kv_usage_fraction=0.5)
    vllm_targets = live.exporter.targets()
    first = await start_service(kube, settings_for(live.prometheus.url))
    second: Running | None = None
    try:
        await asyncio.to_thread(
            live.prometheus.set_targets,
            [*vllm_targets, ScrapeTarget(f"127.0.0.1:{first.service.http.port}")],
        )
        series = f'gang_autoscaler_learned_capacity_per_gang{{namespace="{NS}",lws="{PREFILL}"}}'

        async def scraped() -> bool:
            return bool(await asyncio.to_thread(live.prometheus.query, series))

        await wait_until(
            scraped,
            timeout_s=30,
            what="Prometheus to scrape the learned capacity",
        )
        prefill_lws = kube.object("leaderworkersets", NS, PREFILL)
        assert prefill_lws is not None
        learned_labels = {
            **PREFILL_LABELS,
            "lws": PREFILL,
            "lws_uid": prefill_lws["metadata"]["uid"],
            "template": template_digest(prefill_lws),
            "demand_query": first.service.prometheus.demand_fingerprint(Component.PREFILL),
            "dry_run": "false",
        }
        learned = await first.metric("gang_autoscaler_learned_capacity_per_gang", **learned_labels)
        assert learned is not None and learned > 0
        await first.close()

        # Far below the target: nothing can be learned now, only restored.
        live.exporter.set_lws(namespace=NS, lws=PREFILL, waiting=0, kv_usage_fraction=0.3)
        await asyncio.to_thread(live.prometheus.set_targets, vllm_targets)
        await wait_for_light_prefill(live, NS)
        second = await start_service(kube, settings_for(live.prometheus.url))
        await wait_until(
            lambda: second is not None and second.service.loop.ticks >= 2,
            timeout_s=10,
            what="ticks",
        )

        async def restored() -> bool:
            assert second is not None
            return await prefill_capacity(second) is not None

        await wait_until(restored, timeout_s=15, what="the learned capacity to be restored")
        # The value drifts only while learning; the last one exported is what comes back.
        answer = await asyncio.to_thread(live.prometheus.query, f"last_over_time({series}[1h])")
        last_exported = float(answer[0]["value"][1])  # type: ignore[index]
        assert await prefill_capacity(second) == pytest.approx(last_exported)
        await wait_until(second.service.is_leader, timeout_s=10, what="the new instance to lead")
        await wait_until(
            lambda: (
                second is not None
                and second.service.loop.last is not None
                and second.service.loop.last.leader
            ),
            timeout_s=5,
            what="a tick as the leader",
        )
        assert await second.metric(
            "gang_autoscaler_learned_capacity_per_gang", **learned_labels
        ) == pytest.approx(last_exported)
        # Decode never ran near its target: it has nothing to restore and learns nothing.
        _, body = await second.get("/decisions")
        assert body["components"][f"{NS}/{DECODE}"]["plan"]["capacity_per_gang"] is None

        # A new image: what one gang served before says nothing about the new gangs.
        kube.patch(
            kube.resource("leaderworkersets"),
            NS,
            PREFILL,
            [
                {
                    "op": "replace",
                    "path": "/spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/image",
                    "value": "vllm/vllm-openai:v0.11.0",
                }
            ],
            content_type="application/json-patch+json",
        )

        async def forgotten() -> bool:
            assert second is not None
            return await prefill_capacity(second) is None

        await wait_until(forgotten, timeout_s=15, what="the new template to forget the capacity")
        await wait_until(
            lambda: any(
                e.get("reason") == "LearnedCapacityForgotten"
                and e["involvedObject"]["name"] == PREFILL
                for e in kube.objects("events", NS)
            ),
            timeout_s=10,
            what="an Event on the LWS saying the capacity was forgotten",
        )
        assert (
            await second.metric("gang_autoscaler_learned_capacity_per_gang", **learned_labels)
            is None
        )

        async def counted() -> bool:
            assert second is not None
            found = await second.metric(
                "gang_autoscaler_learned_capacity_forgotten_total", **PREFILL_LABELS
            )
            return found == 1.0

        await wait_until(counted, timeout_s=10, what="the forgotten capacity to be counted once")
        new_template = template_digest(kube.object("leaderworkersets", NS, PREFILL) or {})
        assert any(
            r.getMessage().startswith(
                f"{NS}/{PREFILL}: gang template, demand query or LWS object changed "
                f"(now template {new_template}, "
            )
            for r in caplog.records
        )
    finally:
        if live.prometheus.running:
            await asyncio.to_thread(live.prometheus.set_targets, vllm_targets)
        if second is not None:
            await second.close()
        if first.task is not None and not first.task.done():
            await first.close()


async def test_a_component_whose_kind_changes_forgets_its_capacity(
    kube: FakeKube, live: Live
) -> None:
    """Prefill and decode annotations swapped by mistake, then fixed on both LWS: what the
    "prefill" LWS learned while it read generated tokens/s must not divide prompt tokens/s.
    The gang template is unchanged, so only the demand query tells the units apart."""
    ns = "flip"
    kube.add_namespace(ns)
    swapped = {
        PREFILL: {**NO_BUFFER, "gang-autoscaler.io/component": "decode"},
        DECODE: {**NO_BUFFER, "gang-autoscaler.io/component": "prefill"},
    }
    for manifest in pd_manifests(ns, swapped):
        kube.apply(manifest)
    # The LWS named prefill runs near its KV target reading 400 generated tokens/s.
    live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.76,
                          generation_tokens_per_s=400, prompt_tokens_per_s=20_000)  # fmt: skip
    live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=0, kv_usage_fraction=0.3)
    running = await start_service(kube, settings_for(live.prometheus.url))

    async def capacity() -> float | None:
        _, body = await running.get("/decisions")
        plan = body["components"].get(f"{ns}/{PREFILL}", {}).get("plan")
        return plan["capacity_per_gang"] if plan else None

    try:
        await wait_until(lambda: _learned(capacity), timeout_s=20, what="a decode capacity")
        learned = await capacity()
        assert learned is not None and learned < 1000  # generated tokens/s, not prompt
        # Stop it learning again, so only forgetting can clear it: Prometheus must show the
        # light load before the flip, or a tick may learn the prompt-token capacity at once.
        live.exporter.set_lws(namespace=ns, lws=PREFILL, kv_usage_fraction=0.3)
        await wait_for_light_prefill(live, ns)
        await asyncio.sleep(1.0)  # a tick that read the old load has planned by now
        for name, kind in ((PREFILL, "prefill"), (DECODE, "decode")):
            kube.patch(
                kube.resource("leaderworkersets"),
                ns,
                name,
                {"metadata": {"annotations": {"gang-autoscaler.io/component": kind}}},
                content_type="application/merge-patch+json",
            )

        async def forgotten() -> bool:
            _, body = await running.get("/decisions")
            component = body["components"].get(f"{ns}/{PREFILL}", {})
            plan = component.get("plan") or {}
            return component.get("component") == "prefill" and plan.get("capacity_per_gang") is None

        await wait_until(forgotten, timeout_s=15, what="the capacity in the old unit to go")
    finally:
        await running.close()


async def _learned(capacity) -> bool:  # type: ignore[no-untyped-def]
    return await capacity() is not None


async def test_no_capacity_is_learned_before_a_whole_demand_window_at_target(
    kube: FakeKube, live: Live
) -> None:
    """The service passes its `demand_window` to the core: at the load the test above learns
    from within seconds (the test stack's 5 s window), a one-hour window learns nothing, and
    the plan says which window it waits for."""
    namespace = "window"
    kube.add_namespace(namespace)
    for manifest in pd_manifests(namespace, {PREFILL: NO_BUFFER, DECODE: NO_BUFFER}):
        kube.apply(manifest)
    live.exporter.set_lws(
        namespace=namespace, lws=PREFILL, waiting=4, kv_usage_fraction=0.76,
        prompt_tokens_per_s=5000,
    )  # fmt: skip
    live.exporter.set_lws(namespace=namespace, lws=DECODE, waiting=1, kv_usage_fraction=0.5)
    running = await start_service(
        kube, settings_for(live.prometheus.url, namespaces=[namespace], demand_window="1h")
    )
    try:

        async def at_target() -> bool:
            _, body = await running.get("/decisions")
            component = body["components"].get(f"{namespace}/{PREFILL}", {})
            kv = ((component.get("inputs") or {}).get("signals") or {}).get("kv_usage_fraction")
            return component.get("plan") is not None and kv == pytest.approx(0.76)

        await wait_until(at_target, timeout_s=20, what="the prefill KV cache at 0.76")
        ticks = running.service.loop.ticks
        await wait_until(
            lambda: running.service.loop.ticks >= ticks + 20, timeout_s=30, what="20 more ticks"
        )
        _, body = await running.get("/decisions")
        component = body["components"][f"{namespace}/{PREFILL}"]
        assert component["inputs"]["signals"]["kv_usage_fraction"] == pytest.approx(0.76)
        assert component["plan"]["capacity_per_gang"] is None
        # the window the plan names is the service's, not the core's default of 60 s
        notes = [s["detail"] for s in component["plan"]["steps"] if s["stage"] == "no_floor"]
        assert len(notes) == 1 and "for 3600s" in notes[0]
    finally:
        await running.close()
