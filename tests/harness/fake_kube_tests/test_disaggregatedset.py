"""The DisaggregatedSet controller's scaling side in the fake: RoleScalers follow the roles'
scaling modes, and a role's LWS follows its RoleScaler, as upstream's controller does."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator

import pytest
import yaml

from tests.harness.fake_kube import FakeKube
from tests.harness.fake_kube.disaggregatedset_controller import (
    reconcile_disaggregatedsets,
    role_lws,
)
from tests.harness.fake_kube_tests.conftest import lws_manifest
from tests.harness.shared_data import shared_data_path

MERGE = "application/merge-patch+json"
CRDS = tuple(
    shared_data_path("crds", f"disaggregatedset.x-k8s.io_{plural}.yaml")
    for plural in ("disaggregatedsets", "disaggregatedsetrolescalers")
)


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    async with FakeKube.start(crd_files=CRDS) as server:
        server.add_controller(reconcile_disaggregatedsets)
        yield server


def sample_set() -> dict:
    path = shared_data_path(
        "examples", "lws_config_samples_disaggregatedset_v1_disaggregatedset.yaml"
    )
    ds = yaml.safe_load(path.read_text())
    ds["spec"]["slices"] = 1
    return ds


def set_roles(kube: FakeKube, roles: list) -> None:
    kube.patch(
        kube.resource("disaggregatedsets"),
        "default",
        "disaggregatedset-sample",
        {"spec": {"roles": roles}},
        content_type=MERGE,
    )


def replicas(kube: FakeKube, resource: str, name: str) -> int:
    return int(kube.object(resource, "default", name)["spec"]["replicas"])


async def test_an_external_role_gets_a_role_scaler_that_drives_its_lws(kube: FakeKube) -> None:
    ds = sample_set()
    ds["spec"]["roles"][1]["scaling"] = {"mode": "External"}
    created = kube.apply(ds)
    kube.apply(role_lws(lws_manifest("decode", replicas=3), ds=created, role="decode"))
    # Static prefill has none; a Static-to-External flip seeds from the LWS (3), and a role
    # whose LWS came after its RoleScaler starts at 1 and drives the LWS to it.
    (scaler,) = kube.objects("disaggregatedsetrolescalers", "default")
    assert scaler["metadata"]["name"] == "disaggregatedset-sample-decode"
    assert scaler["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert replicas(kube, "disaggregatedsetrolescalers", "disaggregatedset-sample-decode") == 1
    assert replicas(kube, "leaderworkersets", "decode") == 1

    kube.patch_scale(
        kube.resource("disaggregatedsetrolescalers"),
        "default",
        "disaggregatedset-sample-decode",
        {"spec": {"replicas": 4}},
        content_type=MERGE,
    )
    assert replicas(kube, "leaderworkersets", "decode") == 4
    status = kube.object("disaggregatedsetrolescalers", "default", "disaggregatedset-sample-decode")
    assert status["status"]["selector"] == (
        "disaggregatedset.x-k8s.io/name=disaggregatedset-sample,"
        "disaggregatedset.x-k8s.io/role=decode"
    )

    # back to Static: the RoleScaler goes
    roles = copy.deepcopy(created["spec"]["roles"])
    roles[1].pop("scaling")
    set_roles(kube, roles)
    assert kube.objects("disaggregatedsetrolescalers", "default") == []


async def test_a_flip_to_external_seeds_the_role_scaler_from_the_lws(kube: FakeKube) -> None:
    created = kube.apply(sample_set())
    kube.apply(role_lws(lws_manifest("decode", replicas=3), ds=created, role="decode"))
    roles = copy.deepcopy(created["spec"]["roles"])
    roles[1]["scaling"] = {"mode": "External"}
    set_roles(kube, roles)
    assert replicas(kube, "disaggregatedsetrolescalers", "disaggregatedset-sample-decode") == 3
    assert replicas(kube, "leaderworkersets", "decode") == 3
