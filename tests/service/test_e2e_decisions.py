"""End to end: `/decisions` explains every number it reports; dry-run writes nothing."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import yaml

from autoscaler.core.gang_plan import Reason
from tests.harness.fake_kube import FakeKube
from tests.harness.fake_kube.disaggregatedset_controller import (
    reconcile_disaggregatedsets,
    role_lws,
)
from tests.harness.helm_chart import render
from tests.harness.shared_data import shared_data_path
from tests.service.conftest import Live
from tests.service.stack import (
    DECODE,
    PREFILL,
    balloon_pods,
    installed_cluster,
    pd_manifests,
    settings_for,
    spec_gangs,
    start_service,
    wait_until,
    writes,
)

pytestmark = pytest.mark.prometheus

REASONS = {r.value for r in Reason}
SIGNALS = ("waiting_requests", "running_requests", "kv_usage_fraction", "demand")


def check_explained(entry: dict[str, Any], *, spec: int) -> None:
    """Every number of one component's plan is traced to a step with a reason, and every
    input the core used is shown (a missing one with why it is missing)."""
    plan = entry["plan"]
    steps = plan["steps"]
    assert steps, "a plan without steps explains nothing"
    assert all(s["reason"] in REASONS for s in steps)
    gang_steps = [s for s in steps if s["stage"] != "buffer"]
    buffer_steps = [s for s in steps if s["stage"] == "buffer"]
    # The last stage that set the gangs gives the desired count, with the plan's reason.
    assert gang_steps[-1]["gangs"] == plan["desired_gangs"]
    assert plan["reason"] in {s["reason"] for s in gang_steps}
    if not plan["hold"]:
        assert buffer_steps[-1]["gangs"] == plan["balloon_gangs"]
        assert buffer_steps[-1]["reason"] == plan["balloon_reason"]
    assert plan["current_gangs"] == spec == entry["inputs"]["spec_gangs"]
    inputs = entry["inputs"]
    assert len(inputs["gangs"]) == spec
    assert all(g["state"] in ("ready", "starting", "partial", "pending") for g in inputs["gangs"])
    for name in SIGNALS:
        value = inputs["signals"][name]
        assert value is not None or name in inputs["signals"]["missing_reasons"], name
    assert entry["policy"] is not None and entry["policy_problems"] == []


async def test_decisions_explain_every_number(
    kube: FakeKube, live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    ns = "decisions"
    kube.add_namespace(ns)
    # valid, but under the example's 6m lead time: shown, not held on
    for manifest in pd_manifests(ns, {DECODE: {"gang-autoscaler.io/gang-timeout": "5m"}}):
        kube.apply(manifest)
    live.exporter.set_lws(
        namespace=ns, lws=PREFILL, waiting=1, kv_usage_fraction=0.5, prompt_tokens_per_s=4000
    )
    live.exporter.set_lws(
        namespace=ns, lws=DECODE, waiting=3, kv_usage_fraction=0.6, generation_tokens_per_s=900
    )
    caplog.set_level(logging.INFO, logger="autoscaler.service.control_loop")
    running = await start_service(kube, settings_for(live.prometheus.url))
    try:

        async def planned_with_forecast() -> bool:
            _, body = await running.get("/decisions")
            comps = body["components"]
            return len(comps) == 2 and all(
                c["plan"] and c["forecast"]["point"] is not None and c["applied"]
                for c in comps.values()
            )

        await wait_until(planned_with_forecast, timeout_s=30, what="plans with forecasts")
        status, body = await running.get("/decisions")
        assert status == 200
        assert body["role"] == "leader" and body["outcome"] == "ok"
        for lws in (PREFILL, DECODE):
            entry = body["components"][f"{ns}/{lws}"]
            check_explained(entry, spec=entry["inputs"]["spec_gangs"])
            forecast = entry["forecast"]
            assert forecast["upper"] >= forecast["point"] >= 0
            assert forecast["horizon_s"] == 360.0  # the example's lead-time: 6m
            assert forecast["model"]["backfilled"] is True
        decode = body["components"][f"{ns}/{DECODE}"]
        assert decode["component"] == "decode" and decode["deployment"] == "llama"
        assert body["components"][f"{ns}/{PREFILL}"]["policy_cautions"] == []
        (caution,) = decode["policy_cautions"]
        assert caution.startswith(
            "gang-autoscaler.io/gang-timeout: 300s is shorter than lead-time (360s)"
        )
        assert decode["policy"]["target_waiting"] == 2.0
        # Sums over the leaders of ready gangs: each exporter leader reports 3 waiting.
        ready = decode["inputs"]["ready_gangs"]
        assert decode["inputs"]["signals"]["waiting_requests"] == pytest.approx(3 * ready)
        # rate() over 5 s is still ramping up from the load's start: at most 900 per leader.
        assert 0 < decode["inputs"]["signals"]["demand"] <= 900 * ready * 1.1
        # Every decision logs its reason, with the numbers as structured fields.
        logged = {r.component_key: r for r in caplog.records if hasattr(r, "component_key")}
        for lws in (PREFILL, DECODE):
            record = logged[f"{ns}/{lws}"]
            assert record.reason in REASONS  # type: ignore[attr-defined]
            assert record.desired_gangs >= 1  # type: ignore[attr-defined]
    finally:
        await running.close()


async def test_dry_run_decides_everything_and_writes_nothing(live: Live) -> None:
    # under what a `dryRun` release grants: reads only, no Lease
    async with installed_cluster(render({"dryRun": True})) as kube:
        await _dry_run_decides_everything_and_writes_nothing(kube, live)


async def _dry_run_decides_everything_and_writes_nothing(kube: FakeKube, live: Live) -> None:
    ns = "dry"
    kube.add_namespace(ns)
    for manifest in pd_manifests(ns, {}):
        kube.apply(manifest)
    live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.3)
    live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=20, kv_usage_fraction=0.9)
    before = len(writes(kube))
    running = await start_service(kube, settings_for(live.prometheus.url, dry_run=True))
    try:

        async def wants_changes() -> bool:
            _, body = await running.get("/decisions")
            decode = body["components"].get(f"{ns}/{DECODE}")
            return bool(decode and decode["plan"] and decode["plan"]["changes_replicas"])

        await wait_until(wants_changes, timeout_s=20, what="a plan that changes replicas")
        ticks = running.service.loop.ticks
        await wait_until(
            lambda: running.service.loop.ticks >= ticks + 3, timeout_s=10, what="ticks"
        )
        _, body = await running.get("/decisions")
        assert body["role"] == "dry-run"
        decode = body["components"][f"{ns}/{DECODE}"]
        assert decode["plan"]["desired_gangs"] > decode["plan"]["current_gangs"] == 2
        assert decode["plan"]["balloon_gangs"] >= 1  # the example's decode min-buffer
        assert decode["applied"]["dry_run"] is True
        check_explained(decode, spec=2)
        # Nothing was written: no /scale, no balloon pod, no Event, not even a Lease.
        assert writes(kube)[before:] == []
        assert kube.requests(path_contains="/leases") == []
        assert spec_gangs(kube, ns, DECODE) == 2
        assert balloon_pods(kube, ns) == []
        status, ready = await running.get("/readyz")
        assert status == 200 and ready["role"] == "dry-run"
        # It leads nothing, yet reports the per-component gauges as a leader does.
        assert await running.metric("gang_autoscaler_leader") == 0
        labels = {"namespace": ns, "deployment": "llama", "component": "decode"}
        assert await running.metric("gang_autoscaler_current_gangs", **labels) == 2
        desired = await running.metric("gang_autoscaler_desired_gangs", **labels)
        assert desired is not None and desired > 2
    finally:
        await running.close()


async def test_dry_run_annotation_spares_only_that_lws(kube: FakeKube, live: Live) -> None:
    ns = "dry"
    kube.add_namespace(ns)
    for manifest in pd_manifests(ns, {DECODE: {"gang-autoscaler.io/dry-run": "true"}}):
        kube.apply(manifest)
    live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.3)
    live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=20, kv_usage_fraction=0.9)
    running = await start_service(kube, settings_for(live.prometheus.url))
    try:

        async def decided() -> bool:
            _, body = await running.get("/decisions")
            decode = body["components"].get(f"{ns}/{DECODE}")
            return bool(decode and decode["applied"] and decode["plan"]["changes_replicas"])

        await wait_until(decided, timeout_s=20, what="a decode plan acted on")
        _, body = await running.get("/decisions")
        decode = body["components"][f"{ns}/{DECODE}"]
        prefill = body["components"][f"{ns}/{PREFILL}"]
        assert decode["applied"]["dry_run"] is True and prefill["applied"]["dry_run"] is False
        assert decode["applied"]["scale"] is None
        decode_writes = [w for w in writes(kube) if DECODE in w[1]]
        assert decode_writes == []
        assert spec_gangs(kube, ns, DECODE) == 2
        assert balloon_pods(kube, ns, DECODE) == []
    finally:
        await running.close()


async def test_a_bad_annotation_is_reported_while_it_lasts(kube: FakeKube, live: Live) -> None:
    ns = "badpolicy"
    annotation = "gang-autoscaler.io/max-replicas"
    kube.add_namespace(ns)
    for manifest in pd_manifests(ns, {DECODE: {annotation: "ten"}}):
        kube.apply(manifest)
    live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.5)
    live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=20, kv_usage_fraction=0.9)
    running = await start_service(kube, settings_for(live.prometheus.url))
    labels = {"namespace": ns, "lws": DECODE, "annotation": annotation}
    try:

        async def ticks() -> int:
            value = await running.metric("gang_autoscaler_tick_duration_seconds_count")
            return int(value or 0)

        first = await ticks()

        async def ticked_thrice() -> bool:
            return await ticks() >= first + 3

        await wait_until(ticked_thrice, timeout_s=20, what="three ticks")
        # Counted once (one finding), reported on every tick while the annotation is bad.
        assert await running.metric("gang_autoscaler_policy_errors_total", **labels) == 1
        assert await running.metric("gang_autoscaler_policy_problems", **labels) == 1
        # The LWS controller's status writes change the resourceVersion, not the problem:
        # each one used to count it (and log it) again.
        rtype = kube.resource("leaderworkersets")
        for generation in range(3):
            lws = copy.deepcopy(kube.object("leaderworkersets", ns, DECODE))
            lws.setdefault("status", {})["observedGeneration"] = 100 + generation
            kube.write_internal(rtype, lws)
            ticked = await ticks()

            async def ticked_after_status(since: int = ticked) -> bool:
                return await ticks() >= since + 2

            await wait_until(ticked_after_status, timeout_s=20, what="ticks after a status write")
        assert await running.metric("gang_autoscaler_policy_errors_total", **labels) == 1
        _, body = await running.get("/decisions")
        assert body["components"][f"{ns}/{DECODE}"]["plan"]["reason"] == "hold_policy_error"
        assert spec_gangs(kube, ns, DECODE) == 2

        kube.patch(
            kube.resource("leaderworkersets"),
            ns,
            DECODE,
            {"metadata": {"annotations": {annotation: "4"}}},
            content_type="application/merge-patch+json",
        )

        async def fixed() -> bool:
            return await running.metric("gang_autoscaler_policy_problems", **labels) is None

        await wait_until(fixed, timeout_s=20, what="the problem series removed")
        assert await running.metric("gang_autoscaler_policy_errors_total", **labels) == 1

        async def planned_again() -> bool:
            _, body = await running.get("/decisions")
            plan = body["components"][f"{ns}/{DECODE}"]["plan"]
            return plan["reason"] != "hold_policy_error" and plan["desired_gangs"] > 2

        await wait_until(planned_again, timeout_s=20, what="decode planned once its policy is good")
        decided = {"namespace": ns, "deployment": "llama", "component": "decode"}

        async def decode_decisions() -> float:
            found = 0.0
            _, text = await running.get("/metrics")
            for line in text.splitlines():
                if line.startswith("gang_autoscaler_decisions_total{") and all(
                    f'{k}="{v}"' in line for k, v in decided.items()
                ):
                    found += float(line.rpartition(" ")[2])
            return found

        assert await decode_decisions() > 0
        # The deployment is deleted: its counters leave /metrics with it.
        for name in (DECODE, PREFILL):
            kube.remove("leaderworkersets", ns, name)

        async def counters_gone() -> bool:
            errors = await running.metric("gang_autoscaler_policy_errors_total", **labels)
            return errors is None and await decode_decisions() == 0

        await wait_until(counters_gone, timeout_s=20, what="the deleted deployment's counters")
    finally:
        await running.close()


async def test_an_lws_a_disaggregated_set_controls_is_never_scaled(
    live: Live, chart_objects: list[dict[str, Any]]
) -> None:
    """The DisaggregatedSet controller writes its LWS's replicas from its own spec: a write
    to the LWS's /scale would be undone, each time starting or deleting a gang."""
    ns = "owned"
    crds = (shared_data_path("crds", "disaggregatedset.x-k8s.io_disaggregatedsets.yaml"),)
    async with installed_cluster(chart_objects, crd_files=crds) as kube:
        kube.add_namespace(ns)
        # The owner exists (the fake's garbage collector deletes an LWS whose owner does
        # not): the upstream sample, renamed. No DisaggregatedSet controller runs here.
        sample = shared_data_path(
            "examples", "lws_config_samples_disaggregatedset_v1_disaggregatedset.yaml"
        )
        owner = yaml.safe_load(sample.read_text())
        owner["metadata"].update(name="llama", namespace=ns)
        created = kube.apply(owner)
        reference = {
            "apiVersion": created["apiVersion"],
            "kind": "DisaggregatedSet",
            "name": "llama",
            "uid": created["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        for manifest in pd_manifests(ns, {}):
            manifest["metadata"]["ownerReferences"] = [reference]
            kube.apply(manifest)
        await _never_scaled_until_released(kube, live, ns)


async def _never_scaled_until_released(kube: FakeKube, live: Live, ns: str) -> None:
    # a load that scales decode up when the LWS is ours (test_e2e_scaling)
    live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.5)
    live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=20, kv_usage_fraction=0.9)
    before = {lws: spec_gangs(kube, ns, lws) for lws in (PREFILL, DECODE)}
    running = await start_service(kube, settings_for(live.prometheus.url))
    try:
        first = running.service.loop.ticks
        await wait_until(
            lambda: running.service.loop.ticks >= first + 3, timeout_s=20, what="three ticks"
        )
        assert [w for w in writes(kube) if "/leaderworkersets/" in w[1]] == []
        assert balloon_pods(kube, ns) == []
        assert {lws: spec_gangs(kube, ns, lws) for lws in (PREFILL, DECODE)} == before
        _, body = await running.get("/decisions")
        for lws in (PREFILL, DECODE):
            entry = body["components"][f"{ns}/{lws}"]
            assert entry["plan"]["reason"] == "hold_policy_error"
            assert "controlled by DisaggregatedSet llama" in entry["policy_problems"][0]
            labels = {"namespace": ns, "lws": lws, "annotation": "gang-autoscaler.io/enabled"}
            assert await running.metric("gang_autoscaler_policy_problems", **labels) == 1
        warned = [e for e in kube.objects("events", ns) if e["reason"] == "InvalidPolicy"]
        assert sorted(e["involvedObject"]["name"] for e in warned) == sorted([PREFILL, DECODE])
        assert all("DisaggregatedSetRoleScaler" in e["message"] for e in warned)

        # Released by its owner (the reference removed): ours to scale again.
        for lws in (PREFILL, DECODE):
            kube.patch(
                kube.resource("leaderworkersets"),
                ns,
                lws,
                {"metadata": {"ownerReferences": None}},
                content_type="application/merge-patch+json",
            )

        async def decode_scaled() -> bool:
            return spec_gangs(kube, ns, DECODE) > before[DECODE]

        await wait_until(decode_scaled, timeout_s=20, what="decode scaled once released")
    finally:
        await running.close()


def _role_set(ns: str) -> dict[str, Any]:
    """The upstream DisaggregatedSet sample (shared data) as `llama`, one slice, its roles
    External and carrying the example's LWS specs and gang-autoscaler annotations."""
    sample = shared_data_path(
        "examples", "lws_config_samples_disaggregatedset_v1_disaggregatedset.yaml"
    )
    ds = yaml.safe_load(sample.read_text())
    ds["metadata"].update(name="llama", namespace=ns)
    ds["spec"]["slices"] = 1
    lws = {
        m["metadata"]["annotations"]["gang-autoscaler.io/component"]: m
        for m in pd_manifests(ns, {})
    }
    for role in ds["spec"]["roles"]:
        role["scaling"] = {"mode": "External"}
        role["metadata"] = {"annotations": lws[role["name"]]["metadata"]["annotations"]}
        role["spec"] = lws[role["name"]]["spec"]
    return ds


async def test_an_external_disaggregated_set_role_is_scaled_through_its_role_scaler(
    live: Live, chart_objects: list[dict[str, Any]]
) -> None:
    ns = "roles"
    crds = tuple(
        shared_data_path("crds", f"disaggregatedset.x-k8s.io_{plural}.yaml")
        for plural in ("disaggregatedsets", "disaggregatedsetrolescalers")
    )
    async with installed_cluster(chart_objects, crd_files=crds) as kube:
        kube.add_controller(reconcile_disaggregatedsets)
        kube.add_namespace(ns)
        created = kube.apply(_role_set(ns))
        # Each role's LWS as the DisaggregatedSet controller makes it: the role's metadata
        # and spec, the set's labels, the set as controller.
        for manifest in pd_manifests(ns, {}):
            role = manifest["metadata"]["annotations"]["gang-autoscaler.io/component"]
            kube.apply(role_lws(manifest, ds=created, role=role))
        before = {lws: spec_gangs(kube, ns, lws) for lws in (PREFILL, DECODE)}
        assert {r: kube.object("disaggregatedsetrolescalers", ns, f"llama-{r}")["spec"]["replicas"]
                for r in ("prefill", "decode")} == {"prefill": 1, "decode": 1}  # fmt: skip
        assert before == {PREFILL: 1, DECODE: 1}  # driven by the RoleScalers' seed

        live.exporter.set_lws(namespace=ns, lws=PREFILL, waiting=0, kv_usage_fraction=0.5)
        live.exporter.set_lws(namespace=ns, lws=DECODE, waiting=20, kv_usage_fraction=0.9)
        running = await start_service(kube, settings_for(live.prometheus.url))
        try:

            async def decode_scaled() -> bool:
                return spec_gangs(kube, ns, DECODE) > before[DECODE]

            await wait_until(decode_scaled, timeout_s=20, what="decode scaled up")
            scale_writes = [w[1] for w in writes(kube) if w[1].endswith("/scale")]
            assert scale_writes and all(
                w.endswith(f"/namespaces/{ns}/disaggregatedsetrolescalers/llama-decode/scale")
                for w in scale_writes
            ), scale_writes  # never the LWS's own /scale, which the set would revert
            scaler = kube.object("disaggregatedsetrolescalers", ns, "llama-decode")
            assert scaler["spec"]["replicas"] == spec_gangs(kube, ns, DECODE)
            _, body = await running.get("/decisions")
            entry = body["components"][f"{ns}/{DECODE}"]
            assert entry["inputs"]["scale_target"] == "DisaggregatedSetRoleScaler llama-decode"
            assert entry["policy_problems"] == []
            assert [e for e in kube.objects("events", ns) if e["reason"] == "InvalidPolicy"] == []

        finally:
            await running.close()
