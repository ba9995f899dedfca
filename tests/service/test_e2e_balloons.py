"""End to end: the balloon image setting reaches the balloon pods the service creates, and
the pods carry the LWS templates' pull Secrets to pull it."""

from __future__ import annotations

import pytest

from tests.harness.fake_kube import FakeKube
from tests.service.conftest import Live
from tests.service.stack import (
    DECODE,
    NO_BUFFER,
    PREFILL,
    balloon_pods,
    pd_manifests,
    settings_for,
    start_service,
    wait_until,
)

pytestmark = pytest.mark.prometheus

MIRROR = "registry.airgap.example:5000/k8s/pause:3.10"


async def test_balloon_pods_pull_the_configured_mirror_image(kube: FakeKube, live: Live) -> None:
    ns = "mirror"
    kube.add_namespace(ns)
    one_balloon = {"gang-autoscaler.io/min-buffer": "1", "gang-autoscaler.io/max-buffer": "1"}
    for manifest in pd_manifests(ns, {PREFILL: NO_BUFFER, DECODE: one_balloon}):
        templates = manifest["spec"]["leaderWorkerTemplate"]
        for template in (templates.get("leaderTemplate"), templates["workerTemplate"]):
            if template is not None:
                template["spec"]["imagePullSecrets"] = [{"name": "airgap-registry"}]
        kube.apply(manifest)
    live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.5)
    live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=1, kv_usage_fraction=0.6)
    running = await start_service(kube, settings_for(live.prometheus.url, balloon_image=MIRROR))
    try:
        await wait_until(
            lambda: len(balloon_pods(kube, ns, DECODE)) == 2, timeout_s=20, what="a balloon gang"
        )
        for pod in balloon_pods(kube, ns, DECODE):
            assert [c["image"] for c in pod["spec"]["containers"]] == [MIRROR]
            assert pod["spec"]["imagePullSecrets"] == [{"name": "airgap-registry"}]
        labels = {"namespace": ns, "deployment": "llama", "component": "decode"}

        async def held() -> bool:
            # counted as whole and current, so the next ticks keep it instead of rebuilding
            return await running.metric("gang_autoscaler_balloon_gangs", **labels) == 1.0

        await wait_until(held, timeout_s=10, what="the balloon gang counted as held")
        uids = {p["metadata"]["uid"] for p in balloon_pods(kube, ns, DECODE)}
        ticks = running.service.loop.ticks
        await wait_until(
            lambda: running.service.loop.ticks >= ticks + 3, timeout_s=10, what="ticks"
        )
        assert {p["metadata"]["uid"] for p in balloon_pods(kube, ns, DECODE)} == uids
    finally:
        await running.close()
