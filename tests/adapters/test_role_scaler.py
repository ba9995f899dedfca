"""DisaggregatedSet roles through the adapter and the fake API server: the RoleScaler watch is
optional, and the other-writer checks look at the RoleScaler, not the LWS.

The DisaggregatedSet is the upstream sample (shared data) with External roles; its LWS are
the test LWS of `test_kube_adapter_fake`, made the set's children as its controller makes
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import yaml

from autoscaler.adapters.kube_adapter import KubeAdapter
from autoscaler.adapters.lws_scaler import ScaleResult
from autoscaler.core.gang_plan import GangPlan
from autoscaler.core.model import ComponentKey
from tests.adapters.test_kube_adapter_fake import (
    DECODE,
    NS,
    ON,
    add_gpu_nodes,
    component_plan,
    events,
    lws_manifest,
    settle,
    spec_replicas,
)
from tests.harness.fake_kube.disaggregatedset_controller import (
    reconcile_disaggregatedsets,
    role_lws,
)
from tests.harness.fake_kube.server import FakeKube
from tests.harness.shared_data import shared_data_path

DS_CRDS = tuple(
    shared_data_path("crds", f"disaggregatedset.x-k8s.io_{plural}.yaml")
    for plural in ("disaggregatedsets", "disaggregatedsetrolescalers")
)


def add_role_set(kube: FakeKube, *, external: bool = True) -> None:
    sample = shared_data_path(
        "examples", "lws_config_samples_disaggregatedset_v1_disaggregatedset.yaml"
    )
    ds = yaml.safe_load(sample.read_text())
    ds["metadata"].update(name="llama", namespace=NS)
    ds["spec"]["slices"] = 1
    for role in ds["spec"]["roles"]:
        if external:
            role["scaling"] = {"mode": "External"}
    created = kube.apply(ds)
    for role in ("prefill", "decode"):
        annotations = {**ON, "gang-autoscaler.io/component": role}
        lws = lws_manifest(f"llama-{role}", replicas=1, annotations=annotations)
        kube.apply(role_lws(lws, ds=created, role=role))


def scaler_replicas(kube: FakeKube, name: str) -> int:
    return int(kube.object("disaggregatedsetrolescalers", NS, name)["spec"]["replicas"])


@pytest.fixture
async def role_kube() -> AsyncIterator[FakeKube]:
    async with FakeKube.start(bookmark_interval_s=0.1, crd_files=DS_CRDS) as server:
        server.add_controller(reconcile_disaggregatedsets)
        yield server


@contextlib.asynccontextmanager
async def started_adapter(kube: FakeKube) -> AsyncIterator[KubeAdapter]:
    async with kube.api_client() as api:
        adapter = KubeAdapter(api, watch_timeout_s=30, event_instance="test-0")
        await adapter.start(sync_timeout_s=5)
        try:
            yield adapter
        finally:
            await adapter.close()


@pytest.fixture
async def adapter(role_kube: FakeKube) -> AsyncIterator[KubeAdapter]:
    async with started_adapter(role_kube) as started:
        yield started


async def test_without_the_crd_the_role_scalers_are_none_and_the_view_is_not_stale() -> None:
    # a cluster with LWS before v0.10: the RoleScaler API is not served (404)
    async with FakeKube.start(bookmark_interval_s=0.1) as kube, started_adapter(kube) as adapter:
        assert adapter.role_scalers.unavailable is not None
        assert adapter.role_scalers.unavailable.startswith("HTTP 404")
        assert adapter.role_scalers.items() == []
        assert adapter.stale_view() is None
        assert adapter.role_scalers.failing_for_s() == 0.0


async def test_a_role_scaler_is_written_and_its_set_drives_the_lws(role_kube, adapter) -> None:
    add_gpu_nodes(role_kube, 4)
    add_role_set(role_kube)
    await settle(adapter, role_kube)
    assert adapter.role_scalers.unavailable is None
    state = adapter.snapshot(now_s=time.time())
    assert state.components[DECODE].discovered.usable, state.problems
    report = await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)}), state, dry_run=False
    )
    assert report.components[DECODE].scale.result is ScaleResult.SCALED
    assert scaler_replicas(role_kube, "llama-decode") == 2
    assert spec_replicas(role_kube, "llama-decode") == 2  # the set's controller copied it
    assert [r[1] for r in role_kube.requests("PATCH", "/scale")] == [
        f"/apis/disaggregatedset.x-k8s.io/v1/namespaces/{NS}"
        "/disaggregatedsetrolescalers/llama-decode/scale"
    ]

    # Someone scales the role by hand: that is another writer, as on an LWS.
    scalers = role_kube.resource("disaggregatedsetrolescalers")
    role_kube.patch_scale(
        scalers,
        NS,
        "llama-decode",
        {"spec": {"replicas": 4}},
        content_type="application/merge-patch+json",
    )
    await settle(adapter, role_kube)
    state = adapter.snapshot(now_s=time.time())
    assert state.components[DECODE].discovered.spec_gangs == 4
    report = await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=4, desired=3)}), state, dry_run=False
    )
    assert report.components[DECODE].scale.result is ScaleResult.OTHER_WRITER
    assert scaler_replicas(role_kube, "llama-decode") == 4
    (warning,) = events(role_kube, "AnotherWriter")
    assert "from 2 (our last write) to 4" in warning["message"]


async def test_an_hpa_on_the_role_scaler_is_reported_and_nothing_is_written(
    role_kube, adapter
) -> None:
    add_gpu_nodes(role_kube, 4)
    add_role_set(role_kube)
    # upstream's own example: an HPA whose target is the role's RoleScaler
    hpa = next(
        d
        for d in yaml.safe_load_all(
            shared_data_path("examples", "lws_site_docs_examples_disaggregatedset.yaml").read_text()
        )
        if d and d.get("kind") == "HorizontalPodAutoscaler"
    )
    hpa["metadata"].update(name="decode-cpu", namespace=NS)
    hpa["spec"]["scaleTargetRef"]["name"] = "llama-decode"
    hpa["spec"]["minReplicas"] = 1
    role_kube.apply(hpa)
    await settle(adapter, role_kube)
    state = adapter.snapshot(now_s=time.time())
    report = await adapter.apply(
        GangPlan({DECODE: component_plan(DECODE, current=1, desired=2)}), state, dry_run=False
    )
    assert report.components[DECODE].scale.result is ScaleResult.OTHER_WRITER
    assert role_kube.requests("PATCH", "/scale") == []
    (warning,) = events(role_kube, "AnotherWriter")
    assert (
        f"HorizontalPodAutoscaler {NS}/decode-cpu targets DisaggregatedSetRoleScaler "
        "llama-decode" in warning["message"]
    )


async def test_a_static_role_is_held_with_an_event_that_says_how_to_scale_it(
    role_kube, adapter
) -> None:
    add_gpu_nodes(role_kube, 4)
    add_role_set(role_kube, external=False)
    await settle(adapter, role_kube)
    state = adapter.snapshot(now_s=time.time())
    assert state.policies == {}
    await adapter.apply(GangPlan({}), state, dry_run=False)
    assert role_kube.objects("disaggregatedsetrolescalers", NS) == []
    warned = events(role_kube, "InvalidPolicy")
    assert sorted(e["involvedObject"]["name"] for e in warned) == [
        "llama-decode",
        "llama-prefill",
    ]
    assert all("set `scaling.mode: External`" in e["message"] for e in warned)


async def test_a_failing_role_scaler_api_holds_the_roles_only(role_kube) -> None:
    """A 503 from the RoleScaler API (a CRD being installed, a broken conversion webhook)
    made the whole view stale: every LWS of the cluster held, and /readyz failed."""
    add_gpu_nodes(role_kube, 6)
    add_role_set(role_kube)
    role_kube.apply(lws_manifest("plain", replicas=1, annotations=ON))
    async with role_kube.api_client() as api:
        adapter = KubeAdapter(
            api, watch_timeout_s=2, watch_staleness_limit_s=3, event_instance="test-0"
        )
        await adapter.start(sync_timeout_s=5)
        try:
            await settle(adapter, role_kube)
            role_kube.inject_fault(
                code=503, path_contains="disaggregatedsetrolescalers", times=10_000
            )
            role_kube.expire_watches()
            async with asyncio.timeout(15):
                while adapter.role_scalers.failing_for_s() <= 3:
                    await asyncio.sleep(0.2)
            assert adapter.stale_view() is None
            state = adapter.snapshot(now_s=time.time())
            assert state.components[ComponentKey(NS, "plain")].discovered.usable
            (problem,) = state.problems[DECODE]
            assert "scaled through its DisaggregatedSetRoleScaler, whose view is stale" in str(
                problem
            )
            assert "503" in str(problem)
        finally:
            role_kube.faults.clear()
            await adapter.close()
