"""LWS pod names resolve to (LWS, group, worker) against the known LWS names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


_NAME_PART = st.from_regex(r"[a-z0-9]{1,4}", fullmatch=True)
_LWS_NAME = st.lists(_NAME_PART, min_size=1, max_size=4).map("-".join)


@given(
    names=st.lists(_LWS_NAME, min_size=1, max_size=6, unique=True),
    pick=st.integers(min_value=0),
    group=st.integers(min_value=0, max_value=500),
    worker=st.integers(min_value=0, max_value=16),
)
def test_resolved_identity_names_the_same_pod(
    names: list[str], pick: int, group: int, worker: int
) -> None:
    """Whatever LWS names exist, a resolved pod's identity spells the same pod name, and a
    leader of a known LWS always resolves (as a leader)."""
    lws = names[pick % len(names)]
    pod = f"{lws}-{group}" if worker == 0 else f"{lws}-{group}-{worker}"
    who = PodNameIndex(("ns", n) for n in names).resolve("ns", pod)
    if worker == 0:
        assert who is not None and who.is_leader
    if who is not None:
        spelled = f"{who.lws}-{who.group_index}"
        if not who.is_leader:
            spelled += f"-{who.worker_index}"
        assert spelled == pod
        assert who.lws in names
