"""The upstream example manifests (shared data) are accepted and behave as on a cluster."""

from __future__ import annotations

import pytest

from tests.harness.fake_kube import FakeKube
from tests.harness.shared_data import shared_data_path

LWS_EXAMPLES = [
    "lws_docs_examples_sample_lws.yaml",
    "lws_docs_examples_sglang_lws.yaml",
    "lws_docs_examples_vllm_GPU_lws.yaml",
    "lws_docs_examples_vllm_TPU_lws.yaml",
    "lws_site_docs_examples_hpa.yaml",
    "vllm_docs_deployment_frameworks_lws.yaml",
]


@pytest.mark.parametrize("name", LWS_EXAMPLES)
async def test_lws_example_creates_replicas_times_size_pods(name: str) -> None:
    async with FakeKube.start() as kube:
        created = kube.apply_file(shared_data_path("examples", name))
        lws_list = [o for o in created if o["kind"] == "LeaderWorkerSet"]
        assert len(lws_list) == 1
        lws = lws_list[0]
        replicas = lws["spec"]["replicas"]
        size = lws["spec"]["leaderWorkerTemplate"]["size"]
        lws_name = lws["metadata"]["name"]
        pods = kube.objects(
            "pods",
            lws["metadata"]["namespace"],
            label_selector=f"leaderworkerset.sigs.k8s.io/name={lws_name}",
        )
        assert len(pods) == replicas * size
        leaders = [
            p
            for p in pods
            if p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
        ]
        assert sorted(p["metadata"]["name"] for p in leaders) == [
            f"{lws_name}-{g}" for g in range(replicas)
        ]
        scale_selector = kube.object("lws", lws["metadata"]["namespace"], lws_name)["status"][
            "hpaPodSelector"
        ]
        assert kube.objects("pods", label_selector=scale_selector) == leaders


async def test_disaggregated_set_examples_validate_against_their_crd() -> None:
    crds = (shared_data_path("crds", "disaggregatedset.x-k8s.io_disaggregatedsets.yaml"),)
    kinds: list[str] = []
    async with FakeKube.start(crd_files=crds) as kube:
        for name in (
            "lws_config_samples_disaggregatedset_v1_3role.yaml",
            "lws_config_samples_disaggregatedset_v1_disaggregatedset.yaml",
            "lws_site_docs_examples_disaggregatedset.yaml",
        ):
            kinds += [obj["kind"] for obj in kube.apply_file(shared_data_path("examples", name))]
        assert len(kube.objects("DisaggregatedSet")) == 4
    assert set(kinds) == {"DisaggregatedSet", "HorizontalPodAutoscaler"}
