"""The `reactive` baseline against the HPA's replica calculation, computed by hand."""

from __future__ import annotations

import pytest

from autoscaler.core.model import GangStatus, Signals
from autoscaler.sim.baselines import HPA_SCALE_DOWN_WINDOW_S, ReactiveController, _hpa_replicas
from autoscaler.sim.controller import ComponentSnapshot, Snapshot


@pytest.mark.parametrize(
    ("ratio", "ready", "missing", "pending", "expected"),
    [
        pytest.param(1.05, 4, 0, 0, 4, id="within-tolerance-holds"),
        pytest.param(2.0, 4, 0, 0, 8, id="double-load-doubles"),
        pytest.param(0.5, 4, 0, 0, 2, id="half-load-halves"),
        # missing leaders (placed, no metrics yet) count as idle on scale-up ...
        pytest.param(2.0, 2, 2, 0, 4, id="missing-idle-on-scale-up-lands-on-target"),
        pytest.param(3.0, 2, 2, 0, 6, id="missing-idle-still-scales-up"),
        # ... and as on target on scale-down: (0.5 * 2 + 2) / 4 = 0.75 -> ceil(0.75 * 4) = 3
        pytest.param(0.5, 2, 2, 0, 3, id="missing-on-target-damp-scale-down"),
        # (0.8 + 3) / 4 = 0.95: within tolerance once the missing ones are filled in
        pytest.param(0.8, 1, 3, 0, 4, id="missing-on-target-brings-ratio-within-tolerance"),
        # Pending leaders count as idle on scale-up: (2 * 2 + 0 + 0) / 4 = 1.0 -> hold
        pytest.param(2.0, 2, 0, 2, 4, id="pending-idle-on-scale-up-lands-on-target"),
        pytest.param(3.0, 2, 0, 2, 6, id="pending-idle-still-scales-up"),
        # ... and are dropped on scale-down: ceil(0.5 * 2) = 1, not 3
        pytest.param(0.5, 2, 0, 2, 1, id="pending-dropped-on-scale-down"),
        # missing on target, pending dropped: (0.5 * 2 + 1) / 3 -> ceil(0.667 * 3) = 2
        pytest.param(0.5, 2, 1, 1, 2, id="missing-on-target-pending-dropped"),
        # scale-up with both: (3 * 1 + 0 + 0) / 3 = 1.0 -> hold
        pytest.param(3.0, 1, 1, 1, 3, id="missing-and-pending-idle-on-scale-up"),
    ],
)
def test_hpa_replica_calculation(
    ratio: float, ready: int, missing: int, pending: int, expected: int
) -> None:
    spec = ready + missing + pending
    got = _hpa_replicas(
        ratio, ready_gangs=ready, missing_gangs=missing, pending_gangs=pending, spec_gangs=spec
    )
    assert got == expected


def _gang(index: int, *, scheduled: int, ready: bool) -> GangStatus:
    return GangStatus(
        group_index=index,
        pods_expected=2,
        pods_scheduled=scheduled,
        pods_ready=2 if ready else 0,
        not_ready_since_s=None if ready else 0.0,
    )


def test_reactive_tells_pending_leaders_from_placed_ones() -> None:
    # 2 ready gangs, 1 partial (leader placed first, worker Pending: no metrics yet), 1 with no
    # pod placed (leader Pending). Waiting 4 over 2 ready leaders against a target of 4 per
    # gang: ratio 0.5. HPA: (0.5 * 2 + 1 on target) / 3 leaders -> ceil(2) = 2 gangs. Counting
    # both not-ready gangs as missing would give 3; both as Pending, 1.
    gangs = (
        _gang(0, scheduled=2, ready=True),
        _gang(1, scheduled=2, ready=True),
        _gang(2, scheduled=1, ready=False),
        _gang(3, scheduled=0, ready=False),
    )
    component = ComponentSnapshot(
        name="prefill",
        spec_gangs=4,
        ready_gangs=2,
        gangs=gangs,
        signals=Signals(waiting_requests=4.0),
        balloon_gangs=0,
    )
    controller = ReactiveController(
        {"prefill": 4},
        target_waiting={"prefill": 4.0},
        target_kv_usage=0.8,
        max_gangs={"prefill": 8},
    )
    now = HPA_SCALE_DOWN_WINDOW_S  # the t=0 recommendation of 4 has left the window
    snapshot = Snapshot(
        now_s=now,
        step=1,
        components={"prefill": component},
        free_slots_per_node=(),
        can_grow=True,
        demand_history={},
    )
    assert controller.decide(snapshot)["prefill"].desired_gangs == 2
