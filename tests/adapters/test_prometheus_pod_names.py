"""LWS pod names resolve to (LWS, group, worker) against the known LWS names."""

from __future__ import annotations

import pytest

from autoscaler.adapters.pod_names import PodIdentity, PodNameIndex

KNOWN = [
    ("ns", "llama-3-70b"),
    ("ns", "qwen-2"),
    ("ns", "qwen-2-5"),
    ("ns", "m"),
    ("other", "llama-3-70b-decode"),
]


@pytest.mark.parametrize(
    ("namespace", "pod", "expected"),
    [
        pytest.param("ns", "llama-3-70b-0", PodIdentity("ns", "llama-3-70b", 0, 0), id="leader"),
        pytest.param(
            "ns", "llama-3-70b-12", PodIdentity("ns", "llama-3-70b", 12, 0), id="leader-2-digits"
        ),
        pytest.param("ns", "llama-3-70b-4-3", PodIdentity("ns", "llama-3-70b", 4, 3), id="worker"),
        pytest.param(
            "ns", "qwen-2-5-1", PodIdentity("ns", "qwen-2-5", 1, 0), id="longest-lws-wins"
        ),
        pytest.param("ns", "qwen-2-3", PodIdentity("ns", "qwen-2", 3, 0), id="shorter-lws-leader"),
        pytest.param(
            "ns", "qwen-2-3-1", PodIdentity("ns", "qwen-2", 3, 1), id="shorter-lws-worker"
        ),
        pytest.param("ns", "m-0-0", None, id="worker-index-0-is-not-a-worker-name"),
        pytest.param("ns", "m-01", None, id="leading-zero-is-not-lws"),
        pytest.param("ns", "m", None, id="bare-lws-name"),
        pytest.param("ns", "m-x", None, id="non-numeric-group"),
        pytest.param("ns", "llama-3-70b-decode-0", None, id="other-namespace-lws"),
        pytest.param(
            "other",
            "llama-3-70b-decode-0",
            PodIdentity("other", "llama-3-70b-decode", 0, 0),
            id="namespaced",
        ),
        pytest.param("ns", "unknown-0", None, id="unknown-lws"),
        pytest.param("ns", "m-٣", None, id="non-ascii-digit"),
    ],
)
def test_resolve(namespace: str, pod: str, expected: PodIdentity | None) -> None:
    assert PodNameIndex(KNOWN).resolve(namespace, pod) == expected
