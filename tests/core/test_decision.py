"""Table tests for each step of the decision pipeline (DESIGN section 4)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoscaler.core.capacity import STALL_GRACE_S
from autoscaler.core.decision import hold_every_component, plan
from autoscaler.core.gang_plan import ComponentMemory, Memory, Reason, SaturatedStretch
from autoscaler.core.model import (
    ComponentKey,
    ComponentObservation,
    Forecast,
    GangState,
    GangStatus,
    NodeCapacity,
    Signals,
)
from autoscaler.core.partial_gangs import RollBack, Sighting, roll_back_wait_s
from autoscaler.core.policy import Policy
from autoscaler.core.shape import GangShape, PodShape
from tests.core.builders import (
    exclusive_node,
    forecast,
    node,
    obs,
    observations,
    policy,
    ready_gangs,
    shape,
)

NOW = 10_000.0
KEY = ComponentKey("serving", "llm")


def decide(
    component, pol: Policy, *, fc=None, memory=None, nodes=(), can_grow=True, now=NOW, **kwargs
):
    the_plan, new_memory = plan(
        observations(component, nodes=nodes, can_grow=can_grow),
        {component.key: pol},
        {component.key: fc} if fc else {},
        Memory({component.key: memory}) if memory else Memory(),
        now=now,
        **kwargs,
    )
    return the_plan.components[component.key], new_memory.of(component.key)


def saturate(component, pol: Policy, *, for_s: float = 60.0, memory=None, tick_s: float = 15.0):
    """`component` observed every `tick_s` over the `for_s` up to NOW; the last memory."""
    memory = memory or ComponentMemory()
    for i in range(round(for_s / tick_s) + 1):
        _, memory = decide(component, pol, memory=memory, now=NOW - for_s + i * tick_s)
    return memory


@pytest.mark.parametrize(
    ("component", "pol", "expected_gangs", "expected_reason"),
    [
        pytest.param(
            obs(ready=2, waiting=18, kv=0.5),
            policy(max_scale_up=5),
            5,
            Reason.SCALE_UP_WAITING,
            id="queue-over-target-scales-up-by-whole-gangs",
        ),
        pytest.param(
            obs(ready=2, waiting=8.4, kv=0.5),
            policy(),
            2,
            Reason.WITHIN_TOLERANCE,
            id="queue-within-tolerance-holds",
        ),
        pytest.param(
            obs(ready=2, waiting=0, kv=0.96),
            policy(),
            3,
            Reason.SCALE_UP_KV_CACHE,
            id="kv-cache-over-target-scales-up",
        ),
        pytest.param(
            obs(ready=2, waiting=17, kv=0.99),
            policy(max_scale_up=5),
            5,
            Reason.SCALE_UP_WAITING,
            id="largest-signal-wins",
        ),
        pytest.param(
            obs(ready=3, waiting=None, kv=None),
            policy(),
            3,
            Reason.HOLD_MISSING_DATA,
            id="no-data-holds",
        ),
        pytest.param(
            obs(ready=4, waiting=0, kv=None),
            policy(scale_down_window="0s"),
            4,
            Reason.HOLD_MISSING_DATA,
            id="one-signal-missing-never-scales-down",
        ),
        pytest.param(
            obs(ready=2, waiting=40, kv=None),
            policy(max_scale_up=5),
            7,
            Reason.SCALE_UP_RATE_LIMITED,
            id="one-signal-missing-may-still-scale-up",
        ),
        pytest.param(
            obs(ready=1, waiting=40, kv=0.5),
            policy(),
            3,
            Reason.SCALE_UP_RATE_LIMITED,
            id="rate-limit-caps-a-jump",
        ),
        pytest.param(
            obs(ready=2, waiting=100, kv=0.5),
            policy(max_scale_up=50, max_replicas=6),
            6,
            Reason.MAX_REPLICAS,
            id="max-replicas-caps",
        ),
        pytest.param(
            obs(ready=2, spec=2, waiting=0, kv=0.1),
            policy(min_replicas=3, max_replicas=5),
            3,
            Reason.MIN_REPLICAS,
            id="min-replicas-raises",
        ),
        pytest.param(
            obs(ready=0, spec=0, waiting=9, kv=None),
            policy(min_replicas=0, max_scale_up=5),
            3,
            Reason.SCALE_UP_WAITING,
            id="from-zero-sizes-from-total-queue",
        ),
        pytest.param(
            obs(ready=4, waiting=0, kv=0.2),
            policy(scale_down_window="0s"),
            1,
            Reason.SCALE_DOWN_KV_CACHE,
            id="no-window-scales-down-at-once",
        ),
    ],
)
def test_reactive_bounds_and_limits(component, pol, expected_gangs, expected_reason):
    result, _ = decide(component, pol)
    assert result.desired_gangs == expected_gangs
    assert result.reason is expected_reason
    assert not result.hold


def test_a_forecast_gone_nan_holds_the_gangs_its_floor_held():
    """The floor held 5 gangs for a forecast surge; then the forecaster answers NaN. That is
    missing data: past the scale-down window the queue alone scaled to 2."""
    pol = policy(capacity_per_replica=1000, max_replicas=10)
    component = obs(ready=5, waiting=0, kv=0.2, demand=900)
    result, memory = decide(component, pol, fc=forecast(4_800), now=NOW)
    assert result.desired_gangs == 5
    now = NOW
    for _ in range(21):
        now += 15
        result, memory = decide(
            component, pol, fc=Forecast(math.nan, math.nan, 300), memory=memory, now=now
        )
    assert (result.desired_gangs, result.reason) == (5, Reason.HOLD_MISSING_DATA)
    assert result.detail == "the forecast is not a number: not scaling down without it"
    # the holds fill the window: a forecast back to a number does not drop 3 gangs at once
    result, _ = decide(component, pol, fc=forecast(900), memory=memory, now=now + 15)
    assert result.desired_gangs == 5


@pytest.mark.parametrize(
    ("waiting", "kv"),
    [
        pytest.param(6, 0.5, id="a-queue-for-fewer-gangs-than-are-starting"),
        pytest.param(0, 0.0, id="idle-readings"),
    ],
)
def test_no_ready_gang_never_proposes_fewer_gangs(waiting, kv):
    """Four gangs, none ready yet: what they serve once ready is not known, so readings
    without a ready gang to average over never scale them down (6 waiting at 4 per gang
    proposed 2)."""
    component = obs(ready=0, spec=4, waiting=waiting, kv=kv)
    result, _ = decide(component, policy(scale_down_window="0s"))
    assert result.desired_gangs == 4


@pytest.mark.parametrize("demand", [-1e306, -5.0, math.inf])
def test_a_demand_reading_that_cannot_be_a_rate_is_no_reading(demand):
    component = obs(ready=2, waiting=8, kv=0.8, demand=demand)
    result, _ = decide(component, policy(capacity_per_replica=0.001))
    assert result.desired_gangs == 2
    assert "demand" not in [s.stage for s in result.steps]


def test_scale_down_waits_for_its_window_then_takes_the_windows_highest_proposal():
    component = obs(ready=4, waiting=0, kv=0.2)  # proposes 1 gang
    pol = policy(scale_down_window="5m")

    inside = ComponentMemory(proposals=((NOW - 100, 4),))
    result, memory = decide(component, pol, memory=inside)
    assert result.desired_gangs == 4
    assert result.reason is Reason.SCALE_DOWN_STABILIZED
    assert memory.proposals == ((NOW - 100, 4), (NOW, 1))

    aged = ComponentMemory(proposals=((NOW - 400, 4), (NOW - 200, 3), (NOW - 100, 2)))
    result, memory = decide(component, pol, memory=aged)
    assert result.desired_gangs == 3
    assert result.reason is Reason.SCALE_DOWN_STABILIZED
    assert (NOW - 400, 4) not in memory.proposals

    gone = ComponentMemory(proposals=((NOW - 301, 4),))
    result, _ = decide(component, pol, memory=gone)
    assert result.desired_gangs == 1
    assert result.reason is Reason.SCALE_DOWN_KV_CACHE


def test_a_proposal_stamped_after_a_clock_step_back_is_held_one_window_from_now():
    """The wall clock went back a day: the day-old peak of 4 counted as a proposal of the
    future, held every gang for a day. Now it counts from the tick that first sees it."""
    component = obs(ready=4, waiting=0, kv=0.2)  # proposes 1 gang
    pol = policy(scale_down_window="5m")
    ahead = ComponentMemory(proposals=((NOW + 86_400, 4),))
    result, memory = decide(component, pol, memory=ahead)
    assert (result.desired_gangs, result.reason) == (4, Reason.SCALE_DOWN_STABILIZED)
    assert memory.proposals == ((NOW, 4), (NOW, 1))
    result, _ = decide(component, pol, memory=memory, now=NOW + 301)
    assert result.desired_gangs == 1


def test_a_partial_gang_first_seen_after_a_clock_step_back_ages_from_now():
    """A first sighting stamped a day ahead kept a gang partial by its pods for an hour
    from ever timing out; now it times out one gang-timeout after the step."""
    component = third_gang_partial(since=NOW - 3600)
    ahead = ComponentMemory(not_ready_first_seen=(held(2, NOW + 86_400),))
    result, memory = decide(component, policy(gang_timeout="10m"), memory=ahead)
    assert result.rolled_back_groups == ()
    assert memory.not_ready_first_seen == (held(2, NOW),)
    result, _ = decide(component, policy(gang_timeout="10m"), memory=memory, now=NOW + 601)
    assert result.rolled_back_groups == (2,)


@pytest.mark.parametrize(
    "readings",
    [
        pytest.param({"waiting": math.nan, "kv": 0.5}, id="nan-queue-was-a-valueerror"),
        pytest.param({"waiting": -math.inf, "kv": 0.5}, id="minus-inf-queue-was-an-overflowerror"),
        pytest.param({"waiting": 4, "kv": -0.5}, id="negative-kv-scaled-down-to-one"),
        pytest.param({"waiting": 16, "kv": 0.8, "demand": math.nan},
                     id="nan-demand-was-a-valueerror"),
    ],
)  # fmt: skip
def test_a_reading_that_is_no_number_holds_instead_of_failing_the_plan(readings):
    """The adapters turn NaN and Inf into None; one that slipped through raised in `plan`
    (every deployment of the tick was then planned again alone), and a negative KV fraction
    scaled a component down."""
    component = obs(ready=4, **readings)
    result, _ = decide(component, policy(capacity_per_replica=1000), fc=forecast(1000))
    assert result.desired_gangs == 4
    reasons = component.signals.missing_reasons
    assert all(reasons[name].startswith("not a reading") for name in reasons)


def test_missing_data_is_remembered_as_holding_the_current_count():
    _, memory = decide(obs(ready=3, waiting=None, kv=None), policy())
    assert memory.proposals == ((NOW, 3),)


def test_first_reading_after_an_outage_longer_than_the_window_does_not_drop_every_gang():
    pol = policy(scale_down_window="5m")
    before = ComponentMemory(proposals=((NOW - 900, 5),))  # last reading 15 minutes ago
    memory = before
    # 10 minutes of ticks with Prometheus down, every 15 s
    for tick in range(40):
        at = NOW - 600 + 15 * tick
        the_plan, new_memory = plan(
            observations(obs(ready=5, waiting=None, kv=None)),
            {KEY: pol},
            {},
            Memory({KEY: memory}),
            now=at,
        )
        assert the_plan.components[KEY].desired_gangs == 5
        memory = new_memory.of(KEY)
    # Prometheus is back and reads a quiet moment (1 gang's worth)
    result, _ = decide(obs(ready=5, waiting=0, kv=0.15), pol, memory=memory)
    assert result.desired_gangs == 5
    assert result.reason is Reason.SCALE_DOWN_STABILIZED


def test_a_stale_cluster_view_holds_everything_and_is_remembered_in_the_window():
    pol = policy(scale_down_window="5m")
    loaded = replace(obs(ready=5, waiting=40, kv=0.99), balloon_gangs=2)  # wants more
    other = replace(obs(ready=1, waiting=0, kv=0.1), key=ComponentKey("serving", "no-policy"))
    memory = Memory({KEY: ComponentMemory(proposals=((NOW - 900, 5),))})
    # 10 minutes of ticks on a stale view, every 15 s
    for tick in range(40):
        the_plan, memory = hold_every_component(
            observations(loaded, other),
            {KEY: pol},
            memory,
            now=NOW - 600 + 15 * tick,
            reason=Reason.HOLD_STALE_VIEW,
            detail="pods: list and watch failing",
        )
        held = the_plan.components[KEY]
        assert (held.desired_gangs, held.balloon_gangs, held.hold) == (5, 2, True)
        assert held.reason is held.balloon_reason is Reason.HOLD_STALE_VIEW
        assert held.detail == "pods: list and watch failing"
        assert the_plan.components[other.key].hold
    assert memory.of(other.key) == ComponentMemory()  # no policy, no window to keep
    assert (NOW - 900, 5) not in memory.of(KEY).proposals  # pruned as any window is
    # the view is current again and reads a quiet moment (1 gang's worth)
    result, _ = decide(obs(ready=5, waiting=0, kv=0.15), pol, memory=memory.of(KEY))
    assert result.desired_gangs == 5
    assert result.reason is Reason.SCALE_DOWN_STABILIZED


@pytest.mark.parametrize(
    ("fc", "pol", "expected_gangs", "expected_reason"),
    [
        pytest.param(
            forecast(4_500),
            policy(capacity_per_replica=1000, max_scale_up=5),
            5,
            Reason.FORECAST_FLOOR,
            id="forecast-floor-raises-ahead-of-load",
        ),
        pytest.param(
            forecast(1_500),
            policy(capacity_per_replica=1000),
            2,
            Reason.WITHIN_TOLERANCE,
            id="forecast-below-current-does-not-lower",
        ),
        pytest.param(
            forecast(9_000),
            policy(capacity_per_replica=1000, forecast="off"),
            2,
            Reason.WITHIN_TOLERANCE,
            id="forecast-off-is-ignored",
        ),
        pytest.param(
            forecast(9_000),
            policy(),
            2,
            Reason.WITHIN_TOLERANCE,
            id="no-capacity-known-no-floor",
        ),
    ],
)
def test_forecast_floor(fc, pol, expected_gangs, expected_reason):
    result, _ = decide(obs(ready=2, waiting=8, kv=0.78), pol, fc=fc)
    assert result.desired_gangs == expected_gangs
    assert result.reason is expected_reason


@pytest.mark.parametrize(
    ("component", "pol", "expected_gangs", "expected_reason"),
    [
        pytest.param(
            # the queue is at target and the KV cache below it; the arrivals need 5 gangs
            obs(ready=2, waiting=8, kv=0.78, demand=4_500),
            policy(capacity_per_replica=1000, max_scale_up=5),
            5,
            Reason.SCALE_UP_DEMAND,
            id="demand-says-how-many-more",
        ),
        pytest.param(
            obs(ready=2, waiting=8, kv=0.78, demand=2_150),
            policy(capacity_per_replica=1000),
            2,
            Reason.WITHIN_TOLERANCE,
            id="demand-within-tolerance-holds",
        ),
        pytest.param(
            obs(ready=4, waiting=0, kv=0.1, demand=500, spec=4),
            policy(capacity_per_replica=1000, scale_down_window="0s"),
            1,
            Reason.SCALE_DOWN_KV_CACHE,
            id="low-demand-does-not-hold-a-scale-down",
        ),
        pytest.param(
            obs(ready=2, waiting=8, kv=0.78, demand=9_000),
            policy(),
            2,
            Reason.WITHIN_TOLERANCE,
            id="no-capacity-known-no-demand-step",
        ),
        pytest.param(
            obs(ready=2, waiting=None, kv=None, demand=9_000),
            policy(capacity_per_replica=1000),
            2,
            Reason.HOLD_MISSING_DATA,
            id="no-load-signal-holds-whatever-the-demand",
        ),
    ],
)
def test_demand_step(component, pol, expected_gangs, expected_reason):
    result, _ = decide(component, pol)
    assert result.desired_gangs == expected_gangs
    assert result.reason is expected_reason


def test_capacity_is_learned_while_saturated_and_used_for_the_floor():
    # 2 ready gangs with the queue at 1.5x its target while 2500 tokens/s arrive. A gang runs
    # at most 1 / 0.8 = 1.25x its target (a full KV cache), so one gang serves about
    # 2500 / 2 / 1.25 = 1000 tokens/s at target.
    saturated = obs(ready=2, waiting=12, kv=0.5, demand=2500)
    memory = saturate(saturated, policy())
    assert memory.learned_capacity_per_gang == pytest.approx(1000)

    calm = obs(ready=2, waiting=4, kv=0.6, demand=1900)
    result, memory2 = decide(calm, policy(max_scale_up=5), fc=forecast(4_200), memory=memory)
    assert result.desired_gangs == 5
    assert result.reason is Reason.FORECAST_FLOOR
    assert memory2.learned_capacity_per_gang == pytest.approx(1000)  # not saturated: unchanged


def test_a_growing_queue_does_not_collapse_the_learned_capacity():
    """The queue's ratio to its target grows with the backlog: dividing by it learned 3,000
    tokens/s per gang as a few hundred in minutes, and the forecast floor then ordered four
    times the gangs, for good (learning needs saturation, which the floor then prevents)."""
    memory = ComponentMemory()
    for minute, waiting in enumerate((40, 80, 160, 320, 640, 1280)):  # a backlog building
        _, memory = decide(obs(ready=2, waiting=waiting, kv=0.95, demand=6000), policy(),
                           memory=memory, now=NOW + 60 * minute)  # fmt: skip
    assert memory.learned_capacity_per_gang == pytest.approx(6000 / 2 / 1.25)


def test_a_stalled_gang_does_not_collapse_the_learned_capacity():
    """Five minutes of full queues served at a trickle (a hung NCCL ring) were learned:
    2,800 tokens/s per gang fell to 33, and the floor then held 5x the gangs for good. A
    fall to a third is still followed."""
    memory = ComponentMemory()
    pol = policy(max_replicas=100, max_scale_up=100)
    healthy = obs(ready=2, waiting=8, kv=0.85, demand=6000)
    for tick in range(30):
        _, memory = decide(healthy, pol, memory=memory, now=NOW + 15 * tick)
    learned = memory.learned_capacity_per_gang
    assert learned == pytest.approx(6000 / 2 / 1.0625, rel=1e-3)
    stalled = obs(ready=2, waiting=40, kv=0.99, demand=1.0)
    for tick in range(30, 50):
        _, memory = decide(stalled, pol, memory=memory, now=NOW + 15 * tick)
    assert memory.learned_capacity_per_gang == pytest.approx(learned)
    result, _ = decide(obs(ready=2, waiting=8, kv=0.85, demand=6000), pol, fc=forecast(6000),
                       memory=memory, now=NOW + 15 * 50)  # fmt: skip
    # 6000 over ~2,800 a gang (times the burst factor the stall's readings leave), not
    # 6000 / 33
    assert result.desired_gangs <= 4
    slower = obs(ready=2, waiting=8, kv=0.85, demand=2000)  # a third: followed
    for tick in range(51, 120):
        _, memory = decide(slower, pol, memory=memory, now=NOW + 15 * tick)
    assert memory.learned_capacity_per_gang == pytest.approx(2000 / 2 / 1.0625, rel=0.01)


def test_a_deep_fall_that_lasts_past_the_stall_grace_is_followed():
    """A fifth of the learned value, at target for more than half an hour (traffic moved to
    far longer contexts), is a capacity, not a stall: kept at the old value, the floor would
    have stayed five times too low for good."""
    pol = policy(max_replicas=100, max_scale_up=100)
    memory = saturate(obs(ready=2, waiting=8, kv=0.85, demand=6000), pol)
    learned = memory.learned_capacity_per_gang
    deep = obs(ready=2, waiting=8, kv=0.85, demand=1200)
    within = int(STALL_GRACE_S // 15) - 10  # the stretch at target began a minute earlier
    for tick in range(1, within):
        _, memory = decide(deep, pol, memory=memory, now=NOW + 15 * tick)
    assert memory.learned_capacity_per_gang == pytest.approx(learned)  # still in the grace
    for tick in range(within, within + 80):
        _, memory = decide(deep, pol, memory=memory, now=NOW + 15 * tick)
    assert memory.learned_capacity_per_gang == pytest.approx(1200 / 2 / 1.0625, rel=0.01)


SATURATED = obs(ready=2, waiting=12, kv=0.5, demand=2500)  # 1000 per gang at target
BELOW = obs(ready=2, waiting=4, kv=0.6, demand=2500)  # the same demand, under the target
# three ready gangs, also 1000 each at target: a window that began with two is no sample
SATURATED_3 = obs(ready=3, waiting=18, kv=0.5, demand=3750)


@pytest.mark.parametrize(
    ("readings", "learned"),
    [
        pytest.param([SATURATED] * 4, None, id="45s-of-a-60s-window-learns-nothing"),
        pytest.param([SATURATED] * 5, 1000, id="the-whole-window-learns"),
        pytest.param(
            [SATURATED, SATURATED, SATURATED, BELOW, SATURATED, SATURATED],
            None,
            id="a-tick-under-target-starts-the-stretch-again",
        ),
        pytest.param(
            [SATURATED, SATURATED, SATURATED, BELOW, *[SATURATED] * 5],
            1000,
            id="a-new-stretch-learns-after-its-own-window",
        ),
        pytest.param(
            [*[SATURATED] * 2, replace(SATURATED, gangs=()), *[SATURATED] * 3],
            None,
            id="no-ready-gang-ends-the-stretch",
        ),
        pytest.param(
            [*[SATURATED] * 3, *[SATURATED_3] * 2],
            None,
            id="a-change-of-ready-gangs-starts-the-stretch-again",
        ),
        pytest.param(
            [*[SATURATED] * 3, *[SATURATED_3] * 5],
            1000,
            id="the-new-gang-count-learns-after-its-own-window",
        ),
    ],
)
def test_a_capacity_is_learned_only_after_a_whole_demand_window_at_target(readings, learned):
    """A burst of seconds fills the queue while the demand signal, a one-minute rate, still
    reads the quiet seconds around it: the Azure code hour learned a third of what a gang
    serves, and the floor ordered three times the gangs."""
    memory = ComponentMemory()
    for i, reading in enumerate(readings):
        _, memory = decide(reading, policy(), memory=memory, now=NOW + 15 * i)
    assert memory.learned_capacity_per_gang == (None if learned is None else pytest.approx(learned))


def test_readings_more_than_two_windows_apart_start_the_stretch_again():
    """Between two readings 135 s apart nothing was seen (ticks never planned, say): they do
    not make a saturated minute. A tick as long as the window still learns."""
    memory = ComponentMemory()
    for t in (0, 15, 150, 165):
        _, memory = decide(SATURATED, policy(), memory=memory, now=NOW + t)
    assert memory.saturated is not None and memory.saturated.since == NOW + 150
    assert memory.learned_capacity_per_gang is None
    memory = ComponentMemory()
    for t in (0, 60):  # a 60 s tick
        _, memory = decide(SATURATED, policy(), memory=memory, now=NOW + t)
    assert memory.learned_capacity_per_gang == pytest.approx(1000)


def test_the_demand_window_is_the_one_the_caller_gives():
    memory = ComponentMemory()
    for i in range(2):  # 5 s apart: a 5 s window is covered on the second reading
        _, memory = decide(SATURATED, policy(), memory=memory, now=NOW + 5 * i, demand_window_s=5.0)
    assert memory.learned_capacity_per_gang == pytest.approx(1000)
    _, longer = decide(SATURATED, policy(), memory=ComponentMemory(saturated=memory.saturated),
                       now=NOW + 10, demand_window_s=15.0)  # fmt: skip
    assert longer.learned_capacity_per_gang is None


def test_a_hold_ends_a_saturated_stretch():
    """Ticks that read nothing cannot count toward the window: after a hold the stretch
    starts again from the next reading."""
    memory = saturate(SATURATED, policy(), for_s=45.0)
    assert memory.saturated is not None and memory.saturated.since == NOW - 45.0
    for policies in ({SATURATED.key: policy()}, {}):  # with a policy, and without a valid one
        _, held = hold_every_component(
            observations(SATURATED), policies, Memory({SATURATED.key: memory}),
            now=NOW + 15, reason=Reason.HOLD_STALE_VIEW, detail="stale",
        )  # fmt: skip
        assert held.of(SATURATED.key).saturated is None
    _, after = decide(SATURATED, policy(), memory=held.of(SATURATED.key), now=NOW + 30)
    assert after.saturated is not None and after.saturated.since == NOW + 30
    assert after.learned_capacity_per_gang is None
    # held for want of a valid policy: the same
    _, unparsed = plan(observations(SATURATED), {}, {}, Memory({SATURATED.key: memory}),
                       now=NOW + 15)  # fmt: skip
    assert unparsed.of(SATURATED.key).saturated is None


def test_a_stretch_stamped_in_the_future_starts_again_now():
    """A clock stepped back must not leave a start after `now` that makes the window look
    covered (or never covered)."""
    ahead = SaturatedStretch(since=NOW + 600, last=NOW + 600, ready_gangs=2)
    _, memory = decide(SATURATED, policy(), memory=ComponentMemory(saturated=ahead))
    assert memory.saturated == SaturatedStretch(since=NOW, last=NOW, ready_gangs=2)
    assert memory.learned_capacity_per_gang is None


def test_a_new_gang_template_starts_the_stretch_again():
    """Readings under the old template (or demand query, or LWS object) say nothing of what
    the new gangs serve: a stretch that ran through the change learns nothing at once."""
    old, new = replace(SATURATED, template="a"), replace(SATURATED, template="b")
    memory = saturate(old, policy(), for_s=45.0)
    _, memory = decide(new, policy(), memory=memory, now=NOW + 15)
    assert memory.learned_capacity_per_gang is None
    assert memory.saturated is not None and memory.saturated.since == NOW + 15


def test_a_new_gang_template_forgets_the_capacity_learned_for_the_old_one():
    # Learned at 1000 tokens/s per gang under template "a"; the forecast then asks for 5.
    saturated = replace(obs(ready=2, waiting=12, kv=0.5, demand=2500), template="a")
    memory = saturate(saturated, policy())
    assert (memory.learned_capacity_per_gang, memory.learned_template) == (pytest.approx(1000), "a")
    calm = obs(ready=2, waiting=4, kv=0.6, demand=1900)
    same, kept = decide(replace(calm, template="a"), policy(max_scale_up=5), fc=forecast(4_200),
                        memory=memory)  # fmt: skip
    assert (same.desired_gangs, same.reason) == (5, Reason.FORECAST_FLOOR)
    assert kept.learned_capacity_per_gang == pytest.approx(1000)
    assert same.forgotten_capacity_per_gang is None

    # Template "b" (a new image, say): the old value is dropped, so no floor until it is
    # learned again, and the memory says which template the (absent) value belongs to.
    changed, forgot = decide(replace(calm, template="b"), policy(max_scale_up=5),
                             fc=forecast(4_200), memory=memory)  # fmt: skip
    assert changed.capacity_per_gang is None
    assert changed.forgotten_capacity_per_gang == pytest.approx(1000)  # for the Event
    assert changed.desired_gangs == 2
    assert (forgot.learned_capacity_per_gang, forgot.learned_template) == (None, "b")


def test_buffer_covers_the_upper_bound_within_min_and_max():
    pol = policy(capacity_per_replica=1000, min_buffer=1, max_buffer=3)
    component = obs(ready=2, waiting=8, kv=0.78)
    result, _ = decide(component, pol, fc=forecast(1_800, upper=4_100))
    assert (result.balloon_gangs, result.balloon_reason) == (3, Reason.BUFFER_FORECAST)
    result, _ = decide(component, pol, fc=forecast(1_800, upper=9_000))
    assert (result.balloon_gangs, result.balloon_reason) == (3, Reason.BUFFER_MAX)
    result, _ = decide(component, pol, fc=forecast(1_000, upper=1_000))
    assert (result.balloon_gangs, result.balloon_reason) == (1, Reason.BUFFER_MIN)
    result, _ = decide(component, pol)
    assert (result.balloon_gangs, result.balloon_reason) == (1, Reason.BUFFER_NO_FORECAST)


@pytest.mark.parametrize(
    ("held", "upper", "expected"),
    [
        pytest.param(1, 2_999, 1, id="held-one-needs-one"),
        pytest.param(1, 3_001, 2, id="growth-is-not-damped"),
        pytest.param(2, 2_999, 2, id="just-under-the-boundary-keeps-two"),
        pytest.param(2, 2_950, 2, id="a-tenth-of-a-gang-under-keeps-two"),
        pytest.param(2, 2_850, 1, id="more-than-a-tenth-under-gives-one-back"),
        pytest.param(2, 900, 0, id="a-fall-gives-all-back"),
    ],
)
def test_a_buffer_shrinks_only_past_the_tolerance(held, upper, expected):
    """An upper bound wavering around a gang's boundary (2,999 and 3,001 at 1,000 a gang)
    deleted and created a whole balloon gang on alternate ticks; with a node autoscaler
    every Pending re-creation can order a GPU node."""
    pol = policy(capacity_per_replica=1000, max_buffer=3)
    component = replace(obs(ready=2, waiting=8, kv=0.78), balloon_gangs=held)
    result, _ = decide(component, pol, fc=forecast(1_800, upper=upper))
    assert result.desired_gangs == 2
    assert result.balloon_gangs == expected


def test_the_buffer_band_is_a_fraction_of_one_gang_however_large_the_bound():
    """10 % of a large deployment's upper bound is many gangs: 20 balloon gangs held and an
    upper bound fallen to 11 gangs over what is desired kept all 20, and one just under a
    boundary kept a gang more for good."""
    pol = policy(capacity_per_replica=1000, max_replicas=200, max_buffer=30)
    component = replace(obs(ready=90, waiting=360, kv=0.78), balloon_gangs=20)
    result, _ = decide(component, pol, fc=forecast(90_000, upper=100_500))
    assert (result.desired_gangs, result.balloon_gangs) == (90, 11)
    component = replace(component, balloon_gangs=6)
    result, _ = decide(component, pol, fc=forecast(90_000, upper=94_500))
    assert result.balloon_gangs == 5  # half a gang under the boundary: given back


@pytest.mark.parametrize(
    ("max_replicas", "min_buffer", "expected"),
    [
        pytest.param(4, 0, (0, Reason.MAX_REPLICAS), id="at-max-none"),
        pytest.param(4, 2, (0, Reason.MAX_REPLICAS), id="at-max-not-even-min-buffer"),
        pytest.param(5, 0, (1, Reason.MAX_REPLICAS), id="room-for-one"),
        pytest.param(10, 0, (3, Reason.BUFFER_MAX), id="room-for-all"),
    ],
)
def test_balloon_gangs_stop_where_max_replicas_does(max_replicas, min_buffer, expected):
    """At max-replicas a component can never use a balloon gang: 3 were held, and Pending
    they made the cluster add nodes for nothing."""
    pol = policy(max_replicas=max_replicas, capacity_per_replica=1000, min_buffer=min_buffer,
                 max_buffer=3)  # fmt: skip
    result, _ = decide(obs(ready=4, waiting=16, kv=0.8), pol, fc=forecast(4_000, upper=12_000))
    assert result.desired_gangs == 4
    assert (result.balloon_gangs, result.balloon_reason) == expected


# --- partial and starting gangs -------------------------------------------------------


def held(group: int, since: float) -> Sighting:
    """A not-ready group first seen holding GPUs (a pod placed) at `since`."""
    return Sighting(group, since, holding=True)


def unplaced(group: int, since: float) -> Sighting:
    """A not-ready group first seen with no pod placed at `since`."""
    return Sighting(group, since, holding=False)


def gangs_with(*states: tuple[int, int, float | None]) -> tuple[GangStatus, ...]:
    """(pods_scheduled, pods_ready, not_ready_since) per group of 2 pods."""
    return tuple(GangStatus(i, 2, s, r, since) for i, (s, r, since) in enumerate(states))


def third_gang_partial(*, since: float | None) -> ComponentObservation:
    """Two ready gangs and a third with one of its two pods placed since `since` (by its
    pods' own timestamps), at target."""
    return obs(
        ready=2,
        spec=3,
        waiting=8,
        kv=0.78,
        gangs=gangs_with((2, 2, None), (2, 2, None), (1, 0, since)),
    )


def test_partial_gang_past_its_timeout_is_scaled_away_with_its_reason():
    component = third_gang_partial(since=NOW - 700)
    seen = ComponentMemory(not_ready_first_seen=(held(2, NOW - 690),))
    result, _ = decide(component, policy(gang_timeout="10m"), memory=seen)
    assert result.desired_gangs == 2
    assert result.reason is Reason.PARTIAL_GANG_ROLLED_BACK
    assert result.rolled_back_groups == (2,)


@pytest.mark.parametrize(
    ("lead_time", "cautioned"),
    [
        pytest.param("5m", False, id="timeout-above-lead-time"),
        pytest.param("15m", True, id="timeout-under-lead-time-says-so"),
    ],
)
def test_a_roll_back_says_when_the_timeout_is_shorter_than_the_lead_time(lead_time, cautioned):
    component = third_gang_partial(since=NOW - 700)
    seen = ComponentMemory(not_ready_first_seen=(held(2, NOW - 690),))
    result, _ = decide(component, policy(gang_timeout="10m", lead_time=lead_time), memory=seen)
    assert result.reason is Reason.PARTIAL_GANG_ROLLED_BACK
    assert result.detail.startswith("groups [2] not ready after 600s")
    caution = "gang-timeout 600s is shorter than lead-time (900s)"
    assert (caution in result.detail) is cautioned


def test_partial_gang_within_its_timeout_stays():
    component = third_gang_partial(since=NOW - 100)
    result, _ = decide(component, policy(gang_timeout="10m"))
    assert result.desired_gangs == 3
    assert result.rolled_back_groups == ()


@pytest.mark.parametrize(
    ("group_0", "max_replicas", "expected_gangs"),
    [
        pytest.param(GangStatus(0, 2, 1, 0, NOW - 1200), 10, 2, id="partial-timed-out"),
        pytest.param(GangStatus(0, 2, 2, 0, NOW - 60), 10, 2, id="restarting"),
        pytest.param(GangStatus(0, 2, 2, 2), 10, 1, id="ready-nothing-to-keep"),
        pytest.param(GangStatus(0, 2, 1, 0, NOW - 1200), 1, 1, id="never-past-max-replicas"),
    ],
)
def test_a_scale_down_keeps_the_ready_gangs_the_count_asks_for(
    group_0, max_replicas, expected_gangs
):
    """One ready gang's load on three gangs whose group 0 is not ready: 3 -> 1 would keep
    group 0 alone (LWS removes the highest groups) and leave no ready gang."""
    gangs = (group_0, GangStatus(1, 2, 2, 2), GangStatus(2, 2, 2, 2))
    ready = sum(g.state is GangState.READY for g in gangs)
    component = obs(ready=ready, spec=3, waiting=0, kv=0.3 * 2 / ready, gangs=gangs)
    memory = ComponentMemory(
        proposals=((NOW - 301, 3),), not_ready_first_seen=(held(0, NOW - 1200),)
    )
    result, _ = decide(
        component, policy(gang_timeout="10m", max_replicas=max_replicas), memory=memory
    )
    assert result.desired_gangs == expected_gangs
    if expected_gangs == 2:
        assert result.reason is Reason.KEEP_READY_GANGS
        assert result.detail == (
            "groups [0] not ready: keeping 2 gangs so that 1 ready gang stays (LWS removes "
            "the highest groups)"
        )


def test_keeping_ready_gangs_stops_at_max_replicas_when_that_keeps_none_more():
    """max-replicas lowered to 3 under 4 gangs, only group 3 ready: keeping 3 keeps no ready
    gang more than keeping 1 does, and was said as "so that 1 ready gang stays"."""
    gangs = (
        GangStatus(0, 2, 2, 0, NOW - 60),
        GangStatus(1, 2, 2, 0, NOW - 60),
        GangStatus(2, 2, 2, 0, NOW - 60),
        GangStatus(3, 2, 2, 2),
    )
    component = obs(ready=1, spec=4, waiting=0, kv=0.3, gangs=gangs)
    memory = ComponentMemory(proposals=((NOW - 301, 4),))
    result, _ = decide(component, policy(max_replicas=3), memory=memory)
    assert result.reason is not Reason.KEEP_READY_GANGS
    assert result.desired_gangs == 1  # what the load asks, as without the rule


def test_ready_gangs_kept_on_one_side_keep_the_ratio_band():
    """Prefill keeps 3 gangs for its one ready gang (group 2): coupling, after it, keeps
    decode at 3 for the exact 1:1 band (it came out 3:1)."""
    band = {"deployment": "chat", "prefill_decode_ratio": "1:1"}
    p_gangs = (
        GangStatus(0, 2, 2, 0, NOW - 60),
        GangStatus(1, 2, 2, 0, NOW - 60),
        GangStatus(2, 2, 2, 2),
    )
    memory = Memory(
        {
            ComponentKey("serving", name): ComponentMemory(proposals=((NOW - 301, 3),))
            for name in ("chat-p", "chat-d")
        }
    )
    p, d = pd(
        obs("chat-p", ready=1, spec=3, waiting=0, kv=0.2, gangs=p_gangs),
        obs("chat-d", ready=3, spec=3, waiting=0, kv=0.2),
        prefill_policy=policy(component="prefill", **band),
        decode_policy=policy(component="decode", **band),
        memory=memory,
    )
    assert (p.desired_gangs, p.reason) == (3, Reason.KEEP_READY_GANGS)
    assert (d.desired_gangs, d.reason) == (3, Reason.RATIO_BAND)


def _restarting(index: int) -> GangStatus:
    return GangStatus(index, 2, 2, 0, NOW - 60)


def test_a_minimum_raised_by_coupling_keeps_a_ready_gang():
    """Idle decode at min 0 proposes 0; coupling raises it to the deployment's 1, which is
    group 0, restarting: both ready gangs (1, 2) were scaled away."""
    zero_ok = {"deployment": "chat", "min_replicas": 0, "scale_down_window": "0s"}
    gangs = (_restarting(0), GangStatus(1, 2, 2, 2), GangStatus(2, 2, 2, 2))
    _, d = pd(
        obs("chat-p", ready=2, waiting=8, kv=0.78),
        obs("chat-d", ready=2, spec=3, waiting=0, kv=0.0, gangs=gangs),
        prefill_policy=policy(component="prefill", **zero_ok),
        decode_policy=policy(component="decode", **zero_ok),
    )
    assert (d.desired_gangs, d.reason) == (2, Reason.KEEP_READY_GANGS)


def test_a_count_raised_for_a_ratio_band_keeps_its_ready_gangs():
    """Decode's 1 is raised to 2 by the 1:1 band around prefill's 2, but groups 0 and 1
    keep one ready gang: group 3, ready, is kept too, and prefill follows the band."""
    band = {"deployment": "chat", "prefill_decode_ratio": "1:1", "scale_down_window": "0s"}
    gangs = (GangStatus(0, 2, 2, 2), _restarting(1), _restarting(2), GangStatus(3, 2, 2, 2))
    p, d = pd(
        obs("chat-p", ready=2, waiting=8, kv=0.78),
        obs("chat-d", ready=2, spec=4, waiting=0, kv=0.1, gangs=gangs),
        prefill_policy=policy(component="prefill", **band),
        decode_policy=policy(component="decode", **band),
    )
    assert d.desired_gangs == 4 and p.desired_gangs == 4


def test_timed_out_gang_below_the_desired_count_is_reported_stuck_not_removed():
    component = obs(
        ready=2,
        spec=3,
        waiting=8,
        kv=0.78,
        gangs=gangs_with((1, 0, NOW - 900), (2, 2, None), (2, 2, None)),
    )
    seen = ComponentMemory(not_ready_first_seen=(held(0, NOW - 900),))
    result, _ = decide(component, policy(gang_timeout="10m"), memory=seen)
    assert result.desired_gangs == 3
    assert result.stuck_groups == (0,)
    assert result.rolled_back_groups == ()


def test_a_group_with_no_pod_placed_waits_for_the_nodes_while_the_cluster_can_grow():
    """Group 2 has no pod placed (its nodes are still coming, or a quota refuses its pods).
    It holds no GPU: scaling it away frees nothing and would cancel the node order, and
    requesting it again would start the wait over. It was scaled away after gang-timeout,
    then requested again on the next tick, every gang-timeout."""
    component = obs(ready=2, spec=3, waiting=8, kv=0.78, gangs=ready_gangs(2))
    pol = policy(gang_timeout="10m")
    first, memory = decide(component, pol)
    assert (first.desired_gangs, first.rolled_back_groups, first.unplaced_groups) == (3, (), ())
    assert memory.not_ready_first_seen == (unplaced(2, NOW),)

    later, after = decide(component, pol, memory=memory, now=NOW + 3600)
    assert later.desired_gangs == 3
    assert (later.rolled_back_groups, later.stuck_groups) == ((), ())
    assert later.unplaced_groups == (2,)  # reported, for an Event
    assert after.not_ready_first_seen == (unplaced(2, NOW),)  # kept until it is placed

    # within its timeout it is starting: a need no larger does not stack another gang on
    # it; past it, waiting no longer holds a new need back (a gang whose node died and is
    # not coming back would hold it for good)
    busier = obs(ready=2, spec=3, waiting=14, kv=0.78, gangs=ready_gangs(2))  # wants 4
    ordered = replace(memory, last_scale_up_need=3)
    stacked, _ = decide(busier, pol, memory=ordered, now=NOW + 60)
    assert (stacked.desired_gangs, stacked.reason) == (3, Reason.HOLD_GANGS_STARTING)
    stacked, _ = decide(busier, pol, memory=ordered, now=NOW + 3600)
    assert stacked.desired_gangs == 4


def test_a_group_with_no_pod_placed_times_out_when_the_cluster_cannot_grow():
    component = obs(ready=2, spec=3, waiting=8, kv=0.78, gangs=ready_gangs(2))
    pol = policy(gang_timeout="10m")
    earlier = ComponentMemory(not_ready_first_seen=(unplaced(2, NOW - 601),))
    result, after = decide(component, pol, memory=earlier, can_grow=False)
    assert result.rolled_back_groups == (2,)
    assert result.reason is Reason.PARTIAL_GANG_ROLLED_BACK
    assert result.unplaced_groups == ()
    assert after.not_ready_first_seen == (unplaced(2, NOW - 601),)


def test_a_gang_is_timed_out_from_when_it_first_holds_gpus_not_from_its_request():
    """A gang that waited an hour for its nodes has held GPUs only since its first pod was
    placed: timing it from its request scaled it away as soon as it started loading."""
    waited = third_gang_partial(since=NOW - 3600)  # one pod placed, pods an hour old
    pol = policy(gang_timeout="10m")
    memory = ComponentMemory(not_ready_first_seen=(unplaced(2, NOW - 3600),))
    result, after = decide(waited, pol, memory=memory)
    assert result.rolled_back_groups == ()
    assert after.not_ready_first_seen == (held(2, NOW),)
    result, _ = decide(waited, pol, memory=after, now=NOW + 601)
    assert result.rolled_back_groups == (2,)


def test_a_gang_whose_pods_are_evicted_keeps_the_time_it_held_gpus():
    """Its only placed pod evicted (a spot node reclaimed), a partial gang holds nothing and
    waits for a node like a new gang; placed again, it goes on from the time it had held
    GPUs. Starting over on each placement, a gang evicted more often than once per
    gang-timeout was never scaled away."""
    pol = policy(gang_timeout="10m")

    def third(scheduled: int) -> ComponentObservation:
        states = ((2, 2, None), (2, 2, None), (scheduled, 0, NOW - 3600))
        return obs(ready=2, spec=3, waiting=8, kv=0.78, gangs=gangs_with(*states))

    memory = ComponentMemory(not_ready_first_seen=(held(2, NOW - 540),))
    evicted, memory = decide(third(0), pol, memory=memory)
    assert (evicted.rolled_back_groups, evicted.unplaced_groups) == ((), ())
    assert memory.not_ready_first_seen == (Sighting(2, NOW, holding=False, held_before_s=540),)
    placed, memory = decide(third(1), pol, memory=memory, now=NOW + 30)
    assert placed.rolled_back_groups == ()
    assert memory.not_ready_first_seen == (Sighting(2, NOW + 30, True, held_before_s=540),)
    later, _ = decide(third(1), pol, memory=memory, now=NOW + 91)  # 540 + 61 s held
    assert later.rolled_back_groups == (2,)


def test_a_gang_waiting_for_nodes_above_a_timed_out_one_goes_with_it():
    """Group 2 holds GPUs past its timeout; group 3, above it, has no pod placed. LWS
    removes the highest groups, so group 2 goes only with group 3: a waiting gang at the
    top kept the gang below it, holding GPUs, for good."""
    gangs = gangs_with((2, 2, None), (2, 2, None), (1, 0, NOW - 900))
    component = obs(ready=2, spec=4, waiting=12, kv=0.78, gangs=gangs)
    seen = ComponentMemory(not_ready_first_seen=(held(2, NOW - 900), unplaced(3, NOW - 60)))
    result, _ = decide(component, policy(gang_timeout="10m"), memory=seen)
    assert (result.desired_gangs, result.reason) == (2, Reason.PARTIAL_GANG_ROLLED_BACK)
    assert (result.rolled_back_groups, result.stuck_groups) == ((2,), ())
    assert result.detail.startswith(
        "groups [2] not ready after 600s (with groups [3] waiting for nodes above them)"
    )


def test_a_gang_waiting_for_nodes_that_a_scale_down_removes_is_not_reported_kept():
    component = obs(ready=2, spec=3, waiting=0, kv=0.1, gangs=ready_gangs(2))
    seen = ComponentMemory(not_ready_first_seen=(unplaced(2, NOW - 3600),))
    result, _ = decide(component, policy(gang_timeout="10m", scale_down_window="0s"), memory=seen)
    assert result.desired_gangs < 3
    assert result.unplaced_groups == ()


def test_a_floor_that_cuts_the_run_never_takes_only_the_waiting_gangs():
    """Group 0 holds GPUs past its timeout, group 1 (a scale-up) waits for nodes, and
    min-replicas is 1: removing group 1 alone freed nothing and, group 0 being timed out
    and so not starting, the next tick asked for it again, every other tick."""
    gangs = gangs_with((1, 0, NOW - 900))
    component = obs(ready=0, spec=2, waiting=None, kv=None, gangs=gangs)
    seen = ComponentMemory(not_ready_first_seen=(held(0, NOW - 900), unplaced(1, NOW - 30)))
    result, _ = decide(component, policy(min_replicas=1, gang_timeout="10m"), memory=seen)
    assert result.desired_gangs == 2
    assert (result.rolled_back_groups, result.stuck_groups) == ((), (0,))


@pytest.mark.parametrize(
    ("can_grow", "timed_out"),
    [
        pytest.param(True, False, id="can-grow-only-the-time-held-counts"),
        pytest.param(False, True, id="cannot-grow-every-phase-counts"),
    ],
)
def test_when_the_cluster_cannot_grow_the_time_waiting_counts_too(can_grow, timed_out):
    """590 s with no pod placed, then one pod placed: with no node to come, the gang has
    been not ready for 590 s and gets the 10 s left, not a new gang-timeout."""
    component = third_gang_partial(since=NOW - 590)
    seen = ComponentMemory(not_ready_first_seen=(unplaced(2, NOW - 590),))
    pol = policy(gang_timeout="10m")
    result, after = decide(component, pol, memory=seen, can_grow=can_grow)
    assert result.rolled_back_groups == ()
    later, _ = decide(component, pol, memory=after, can_grow=can_grow, now=NOW + 15)
    assert later.rolled_back_groups == ((2,) if timed_out else ())


def test_a_pod_time_ahead_of_this_clock_takes_nothing_from_the_time_held_before():
    component = third_gang_partial(since=NOW + 120)  # the API server's clock 2 min ahead
    seen = ComponentMemory(not_ready_first_seen=(Sighting(2, NOW - 30, True, 575.0),))
    result, after = decide(component, policy(gang_timeout="10m"), memory=seen)
    assert result.rolled_back_groups == ()
    assert after.not_ready_first_seen == (Sighting(2, NOW, True, 575.0),)
    # from the pods' start once this clock reaches it: 575 + 26 s held
    later, _ = decide(component, policy(gang_timeout="10m"), memory=after, now=NOW + 146)
    assert later.rolled_back_groups == (2,)


def test_gangs_rolled_back_twice_in_a_row_wait_before_they_are_asked_for_again():
    """A gang that never becomes ready (a crash loop, an image that cannot be pulled) was
    rolled back and asked for again every gang-timeout, its GPUs held for nothing all
    along. The first retry is at once; from the second roll-back in a row, a wait of one
    gang-timeout, doubling."""
    pol = policy(gang_timeout="10m")
    wants_three = obs(ready=2, spec=2, waiting=12, kv=0.78, gangs=ready_gangs(2))

    def rolled_back_at(t: float, memory: ComponentMemory) -> ComponentMemory:
        """Asked for at `t`, group 2 is seen placed and is rolled back 601 s later."""
        result, memory = decide(wants_three, pol, memory=memory, now=t)
        assert result.desired_gangs == 3
        placed = third_gang_partial(since=t)
        _, memory = decide(placed, pol, memory=memory, now=t + 15)
        result, memory = decide(placed, pol, memory=memory, now=t + 616)
        assert result.rolled_back_groups == (2,)
        return memory

    def streak(memory: ComponentMemory) -> tuple[float, int, int]:
        assert memory.roll_back is not None
        return memory.roll_back.at_s, memory.roll_back.kept_gangs, memory.roll_back.in_a_row

    memory = rolled_back_at(NOW, ComponentMemory())
    assert streak(memory) == (NOW + 616, 2, 1)
    memory = rolled_back_at(NOW + 631, memory)  # the first retry: at once
    assert streak(memory) == (NOW + 1247, 2, 2)

    held_back, _ = decide(wants_three, pol, memory=memory, now=NOW + 1262)
    assert (held_back.desired_gangs, held_back.reason) == (2, Reason.HOLD_ROLL_BACK_BACKOFF)
    assert held_back.detail.endswith("asked for again in 585s")
    memory = rolled_back_at(NOW + 1848, memory)  # 601 s after: asked for again
    held_back, _ = decide(wants_three, pol, memory=memory, now=NOW + 1848 + 616 + 1199)
    assert held_back.reason is Reason.HOLD_ROLL_BACK_BACKOFF  # the third waits 1200 s


def test_a_roll_back_streak_ends_when_asking_again_works():
    memory = ComponentMemory(roll_back=RollBack(NOW - 700, 2, 600.0, in_a_row=3, landed=True))
    result, after = decide(obs(ready=3, waiting=12, kv=0.78), policy(), memory=memory)
    assert after.roll_back is None
    assert result.reason is not Reason.HOLD_ROLL_BACK_BACKOFF


def test_a_roll_back_planned_again_before_it_takes_place_counts_once():
    """In a dry run, on a standby or with a refused write, the same timed-out gang is there
    on the next tick and its roll-back is planned again: each counted, the wait reached its
    hour cap within a few ticks (and the doubling overflowed after 1,026)."""
    pol = policy(gang_timeout="10m")
    component = third_gang_partial(since=NOW - 700)
    memory = ComponentMemory(not_ready_first_seen=(held(2, NOW - 700),))
    for tick in range(5):
        result, memory = decide(component, pol, memory=memory, now=NOW + 15 * tick)
        assert result.rolled_back_groups == (2,)
        assert result.retry_wait_s is None
    assert memory.roll_back is not None and memory.roll_back.in_a_row == 1


def test_a_long_streak_waits_at_most_the_cap():
    huge = RollBack(NOW, 2, 600.0, in_a_row=5000, landed=True)
    assert roll_back_wait_s(huge) == 3600.0
    wants_three = obs(ready=2, spec=2, waiting=12, kv=0.78, gangs=ready_gangs(2))
    result, _ = decide(wants_three, policy(gang_timeout="10m"), memory=ComponentMemory(
        roll_back=huge
    ), now=NOW + 60)  # fmt: skip
    assert result.reason is Reason.HOLD_ROLL_BACK_BACKOFF


def test_the_wait_is_read_from_the_gang_timeout_of_the_roll_back_and_ends_with_a_new_template():
    """Raising gang-timeout (the fix of a slow load) turned a 10-minute wait into an hour;
    a new template (the fix of a crash loop) did not end it."""
    wants_three = obs(ready=2, spec=2, waiting=12, kv=0.78, gangs=ready_gangs(2))
    waiting = ComponentMemory(roll_back=RollBack(NOW - 60, 2, 600.0, in_a_row=2, landed=True))
    result, _ = decide(wants_three, policy(gang_timeout="1h"), memory=waiting)
    assert result.reason is Reason.HOLD_ROLL_BACK_BACKOFF
    assert result.detail.endswith("asked for again in 540s")
    fixed = replace(wants_three, template="new-image")
    result, after = decide(fixed, policy(gang_timeout="1h"), memory=waiting)
    assert result.desired_gangs == 3 and after.roll_back is None


def test_a_timed_out_gang_the_load_takes_away_starts_no_streak():
    """Group 3 timed out while the load fell to one gang: the streak remembered the final
    count, 1, and held the next surge at 1 though groups 1 and 2 were sound (and a scale to
    zero held the wake at 0). The load took the gang away, not a roll-back."""
    gangs = gangs_with((2, 2, None), (2, 2, None), (2, 2, None), (1, 0, NOW - 900))
    component = obs(ready=3, spec=4, waiting=0, kv=0.1, gangs=gangs)
    seen = ComponentMemory(not_ready_first_seen=(held(3, NOW - 900),))
    result, after = decide(
        component, policy(gang_timeout="10m", scale_down_window="0s"), memory=seen
    )
    assert result.desired_gangs == 1 and result.rolled_back_groups == (3,)
    assert after.roll_back is None


def test_a_roll_back_wait_never_holds_a_component_below_the_deployment_minimum():
    """Prefill waits for gangs rolled back; the deployment wakes and a 1:1 band raises both
    sides: the wait held prefill at 0 while decode came up, and the deployment could not
    serve."""
    band = {
        "deployment": "chat",
        "prefill_decode_ratio": "1:1",
        "min_replicas": 0,
        "capacity_per_replica": 1000.0,
    }
    waiting = RollBack(NOW - 60, 0, 600.0, in_a_row=2, landed=True)
    prefill_key, decode_key = ComponentKey("serving", "chat-p"), ComponentKey("serving", "chat-d")
    the_plan, _ = plan(
        observations(
            obs("chat-p", ready=0, waiting=None, kv=None),
            obs("chat-d", ready=0, waiting=None, kv=None),
        ),
        {
            prefill_key: policy(component="prefill", **band),
            decode_key: policy(component="decode", **band),
        },
        {prefill_key: forecast(5000.0), decode_key: forecast(5000.0)},
        Memory(components={prefill_key: ComponentMemory(roll_back=waiting)}),
        now=NOW,
    )
    assert the_plan.components[decode_key].desired_gangs >= 1
    assert the_plan.components[prefill_key].desired_gangs >= 1


def test_a_roll_back_stamped_ahead_of_the_clock_waits_from_now():
    ahead = ComponentMemory(roll_back=RollBack(NOW + 86_400, 2, 600.0, in_a_row=2, landed=True))
    wants_three = obs(ready=2, spec=2, waiting=12, kv=0.78, gangs=ready_gangs(2))
    result, after = decide(wants_three, policy(gang_timeout="10m"), memory=ahead)
    assert result.detail.endswith("asked for again in 600s")
    assert after.roll_back is not None and after.roll_back.at_s == NOW


def test_a_ratio_band_does_not_ask_again_for_gangs_rolled_back_during_the_wait():
    band = {"deployment": "chat", "prefill_decode_ratio": "1:1", "max_scale_up": 10}
    waiting = RollBack(NOW - 60, 1, 600.0, in_a_row=2, landed=True)
    the_plan, _ = plan(
        observations(
            obs("chat-p", ready=1, waiting=4, kv=0.8), obs("chat-d", ready=3, waiting=12, kv=0.8)
        ),
        {
            ComponentKey("serving", "chat-p"): policy(component="prefill", **band),
            ComponentKey("serving", "chat-d"): policy(component="decode", **band),
        },
        {},
        Memory(components={ComponentKey("serving", "chat-p"): ComponentMemory(roll_back=waiting)}),
        now=NOW,
    )
    prefill = the_plan.components[ComponentKey("serving", "chat-p")]
    assert prefill.desired_gangs == 1
    (coupling,) = [s for s in prefill.steps if s.stage == "coupling"]
    assert coupling.detail.endswith("held at 1: gangs rolled back are waited for")


@pytest.mark.parametrize(
    ("pods_since", "first_seen", "timed_out"),
    [
        # this process's clock an hour ahead of the API server's: the pods look an hour
        # old at first sight, and the gang (still loading its weights) must not go
        pytest.param(NOW - 3600, NOW, False, id="clock-ahead-first-sight-starting"),
        pytest.param(NOW - 3600, NOW - 601, True, id="clock-ahead-past-timeout-by-own-record"),
        # the pods' start is later than the record (the gang lost readiness again since, or
        # the API server's clock is ahead): the pods say
        pytest.param(NOW - 100, NOW - 700, False, id="pods-later-than-record"),
        pytest.param(NOW - 700, NOW - 601, True, id="both-past-timeout"),
    ],
)
def test_a_gang_is_aged_from_the_later_of_its_pods_start_and_its_first_sighting(
    pods_since, first_seen, timed_out
):
    component = third_gang_partial(since=pods_since)
    seen = ComponentMemory(not_ready_first_seen=(held(2, first_seen),))
    result, after = decide(component, policy(gang_timeout="10m"), memory=seen)
    assert result.rolled_back_groups == ((2,) if timed_out else ())
    # the start counted from is what is remembered
    assert after.not_ready_first_seen == (held(2, max(pods_since, first_seen)),)


def test_a_gang_first_seen_not_ready_is_remembered_from_now():
    component = third_gang_partial(since=NOW - 3600)
    result, after = decide(component, policy(gang_timeout="10m"))
    assert result.rolled_back_groups == ()
    assert after.not_ready_first_seen == (held(2, NOW),)


def test_a_group_once_ready_is_forgotten_by_the_first_seen_memory():
    memory = ComponentMemory(not_ready_first_seen=(held(2, NOW - 601),))
    _, after = decide(obs(ready=3, waiting=8, kv=0.78), policy(), memory=memory)
    assert after.not_ready_first_seen == ()


@pytest.mark.parametrize(
    ("waiting", "expected_gangs", "expected_reason"),
    [
        pytest.param(16, 3, Reason.HOLD_GANGS_STARTING, id="same-need-does-not-stack"),
        pytest.param(24, 5, Reason.SCALE_UP_RATE_LIMITED, id="need-grew-scales-up"),
    ],
)
def test_no_scale_up_stacks_on_starting_gangs_unless_the_need_grew(
    waiting, expected_gangs, expected_reason
):
    component = obs(
        ready=2,
        spec=3,
        waiting=waiting,
        kv=0.5,
        gangs=gangs_with((2, 2, None), (2, 2, None), (2, 0, NOW - 60)),
    )
    memory = ComponentMemory(last_scale_up_need=3)
    result, _ = decide(component, policy(), memory=memory)
    assert result.desired_gangs == expected_gangs
    assert result.reason is expected_reason


def test_a_need_past_the_tolerance_is_growth_whatever_the_float_rounding():
    """50 * 1.1 is 55.00000000000001 in floats: a ceiling of it read 56, and a need of 56
    was held as not grown past 50."""
    gangs = tuple(GangStatus(i, 2, 2, 2) for i in range(48)) + tuple(
        GangStatus(i, 2, 2, 0, NOW - 60) for i in (48, 49)
    )
    component = obs(ready=48, spec=50, waiting=0, kv=0.8 * 56 / 48, gangs=gangs)
    memory = ComponentMemory(last_scale_up_need=50)
    result, _ = decide(component, policy(max_replicas=200, max_scale_up=10), memory=memory)
    assert (result.desired_gangs, result.reason) == (56, Reason.SCALE_UP_KV_CACHE)


def test_a_scale_up_to_the_need_already_ordered_is_not_called_a_hold():
    """Rate-limited to 4 of a need of 6, with 2 gangs starting: 4 -> 6 is a scale-up, and
    its Events and metrics must not count it as a hold."""
    component = obs(
        ready=2,
        spec=4,
        waiting=28,
        kv=0.5,
        gangs=gangs_with((2, 2, None), (2, 2, None), (2, 0, NOW - 30), (2, 0, NOW - 30)),
    )
    memory = ComponentMemory(last_scale_up_need=6)
    result, _ = decide(component, policy(max_scale_up=2), memory=memory)
    assert (result.desired_gangs, result.reason) == (6, Reason.SCALE_UP_WAITING)
    assert result.detail.startswith("2 gangs still starting; need 7 has not grown past 6")


def test_a_need_held_for_starting_gangs_does_not_creep_up_tick_after_tick():
    """Need 7 was held to 6 for the gangs still starting, yet 7 was remembered as the need
    ordered: the next tick, same load, added a 7th gang."""
    pol = policy(max_scale_up=2, max_replicas=20)

    def starting(spec: int, ready: int) -> tuple[GangStatus, ...]:
        return tuple(
            GangStatus(i, 2, 2, 2 if i < ready else 0, None if i < ready else NOW - 30)
            for i in range(spec)
        )

    first = obs(ready=2, spec=4, waiting=28, kv=0.5, gangs=starting(4, 2))
    result, memory = decide(first, pol, memory=ComponentMemory(last_scale_up_need=6))
    assert result.desired_gangs == 6 and memory.last_scale_up_need == 6
    then = obs(ready=2, spec=6, waiting=28, kv=0.5, gangs=starting(6, 2))
    result, _ = decide(then, pol, memory=memory, now=NOW + 15)
    assert (result.desired_gangs, result.reason) == (6, Reason.HOLD_GANGS_STARTING)


# --- fit ---------------------------------------------------------------------------------


def test_a_pending_gang_keeps_the_room_it_needs_from_new_gangs():
    """Group 1 waits for the one gang of room two empty nodes hold; a cluster that cannot
    grow has none for a group 2."""
    gangs = (GangStatus(0, 2, 2, 2), GangStatus(1, 2, 0, 0, NOW - 30))
    component = obs(ready=1, spec=2, waiting=16, kv=0.5, gangs=gangs)
    result, _ = decide(
        component,
        policy(max_scale_up=5),
        nodes=(node("a", gpus=8), node("b", gpus=8)),
        can_grow=False,
        memory=ComponentMemory(last_scale_up_need=2),
    )
    assert (result.desired_gangs, result.reason) == (2, Reason.CAPACITY_SHORT)
    assert result.detail == "0 of 2 more gangs fit on the nodes now"


@pytest.mark.parametrize(
    ("nodes", "gang_shape", "expected_gangs"),
    [
        pytest.param(
            (node("a", gpus=4), node("b", gpus=4)),
            shape(pods_per_gang=2, gpus=8),
            1,
            id="two-8-gpu-pods-do-not-fit-two-nodes-with-4-free-each",
        ),
        pytest.param(
            (node("a", gpus=8), node("b", gpus=8)),
            shape(pods_per_gang=2, gpus=8),
            2,
            id="two-8-gpu-pods-fit-two-empty-nodes",
        ),
        pytest.param(
            (node("a", gpus=8, zone="z1"), node("b", gpus=8, zone="z2")),
            shape(pods_per_gang=2, gpus=8, topology_key="zone"),
            1,
            id="one-gang-needs-one-topology-domain",
        ),
        pytest.param(
            (node("a", gpus=8, zone="z1"), node("b", gpus=8, zone="z1")),
            shape(pods_per_gang=2, gpus=8, topology_key="zone"),
            2,
            id="same-domain-fits",
        ),
        pytest.param(
            tuple(node(n, gpus=8, zone="z1") for n in "abcd"),
            shape(pods_per_gang=2, gpus=8, topology_key="zone"),
            2,
            id="an-exclusive-domain-holds-one-new-gang-however-large",
        ),
        pytest.param(
            (
                replace(node("a", gpus=8, zone="z1"), lws_namespaces=frozenset({"serving"})),
                node("b", gpus=8, zone="z1"),
                node("c", gpus=8, zone="z1"),
                node("d", gpus=8, zone="z2"),
                node("e", gpus=8, zone="z2"),
            ),
            shape(pods_per_gang=2, gpus=8, topology_key="zone"),
            2,
            id="a-domain-with-a-gang-of-the-namespace-is-taken",
        ),
        pytest.param(
            (
                replace(node("a", gpus=8, zone="z1"), lws_namespaces=frozenset({"batch"})),
                node("b", gpus=8, zone="z1"),
                node("c", gpus=8, zone="z1"),
            ),
            shape(pods_per_gang=2, gpus=8, topology_key="zone"),
            2,
            id="another-namespace-does-not-take-the-domain",
        ),
        pytest.param(
            (
                replace(node("a", gpus=8, zone="z1"), lws_namespaces=frozenset({"serving"})),
                node("b", gpus=8, zone="z1"),
                node("c", gpus=8, zone="z1"),
            ),
            shape(pods_per_gang=2, gpus=8, topology_key="zone"),
            1,
            id="no-free-domain-no-gang",
        ),
        pytest.param(
            (
                exclusive_node("a", "serving", zone="z1"),
                node("b", gpus=8, zone="z1"),
                node("c", gpus=8, zone="z2"),
                node("d", gpus=8, zone="z2"),
            ),
            shape(pods_per_gang=2, gpus=8),
            2,
            id="a-gang-without-exclusive-topology-stays-out-of-an-exclusive-gangs-domain",
        ),
        pytest.param(
            (
                exclusive_node("a", "batch", zone="z1"),
                node("b", gpus=8, zone="z1"),
                node("c", gpus=8, zone="z2"),
                node("d", gpus=8, zone="z2"),
            ),
            shape(pods_per_gang=2, gpus=8),
            3,
            id="another-namespaces-exclusive-gang-keeps-no-one-out",
        ),
    ],
)
def test_scale_up_is_capped_at_what_fits_when_the_cluster_cannot_grow(
    nodes, gang_shape, expected_gangs
):
    component = obs(ready=1, waiting=40, kv=0.5, gang_shape=gang_shape)
    result, _ = decide(component, policy(), nodes=nodes, can_grow=False)
    assert result.desired_gangs == expected_gangs
    if expected_gangs == 1:
        assert result.reason is Reason.CAPACITY_SHORT


def test_a_gang_fits_when_only_its_workers_can_go_first():
    """The leader needs CPU, the worker memory: best fit leader-first put the leader on the
    only node with the worker's memory and found no room, though worker-first fits."""
    gib = 2**30
    leader = PodShape(requests={"nvidia.com/gpu": 4, "cpu": 10_000, "memory": 1 * gib})
    worker = PodShape(requests={"nvidia.com/gpu": 4, "cpu": 5_000, "memory": 100 * gib})
    gang = GangShape(leader=leader, worker=worker, pods_per_gang=2)
    nodes = (
        NodeCapacity("a", free={"nvidia.com/gpu": 4, "cpu": 10_000, "memory": 200 * gib}),
        NodeCapacity("b", free={"nvidia.com/gpu": 4, "cpu": 50_000, "memory": 1 * gib}),
    )
    component = obs(ready=1, waiting=40, kv=0.5, gang_shape=gang)
    result, _ = decide(component, policy(), nodes=nodes, can_grow=False)
    assert result.desired_gangs == 2


def test_scale_up_beyond_fit_is_still_requested_when_the_cluster_can_grow():
    component = obs(ready=1, waiting=40, kv=0.5)
    result, _ = decide(component, policy(), nodes=(node("a", gpus=4),), can_grow=True)
    assert result.desired_gangs == 3
    assert any("wait for nodes" in s.detail for s in result.steps if s.stage == "fit")
    # the plan says why the count is 3 (Events, /decisions), then what waits for nodes
    assert result.reason is Reason.SCALE_UP_RATE_LIMITED
    assert result.detail == (
        "at most 2 gangs added per tick; 0 of 2 more gangs fit now; the rest wait for nodes"
    )


# --- deployment coupling -------------------------------------------------------------------


def pd(prefill, decode, *, prefill_policy=None, decode_policy=None, **kw):
    """Plan a PD deployment `chat` from two observations (lws names chat-p / chat-d)."""
    p_pol = prefill_policy or policy(deployment="chat", component="prefill")
    d_pol = decode_policy or policy(deployment="chat", component="decode")
    the_plan, _ = plan(
        observations(prefill, decode, nodes=kw.get("nodes", ()), can_grow=kw.get("can_grow", True)),
        {prefill.key: p_pol, decode.key: d_pol},
        {},
        kw.get("memory", Memory()),
        now=NOW,
    )
    return the_plan.components[prefill.key], the_plan.components[decode.key]


def test_pd_deployment_never_keeps_prefill_without_decode():
    zero_ok = {"deployment": "chat", "min_replicas": 0, "scale_down_window": "0s"}
    p, d = pd(
        obs("chat-p", ready=2, waiting=8, kv=0.78),
        obs("chat-d", ready=1, waiting=0, kv=0.0),
        prefill_policy=policy(component="prefill", **zero_ok),
        decode_policy=policy(component="decode", **zero_ok),
    )
    assert p.desired_gangs == 2
    assert d.desired_gangs == 1
    assert d.reason is Reason.DEPLOYMENT_MINIMUM


def test_pd_deployment_goes_to_zero_only_as_a_whole():
    zero_ok = {"deployment": "chat", "min_replicas": 0, "scale_down_window": "0s"}
    p, d = pd(
        obs("chat-p", ready=1, waiting=0, kv=0.0),
        obs("chat-d", ready=1, waiting=0, kv=0.0),
        prefill_policy=policy(component="prefill", **zero_ok),
        decode_policy=policy(component="decode", **zero_ok),
    )
    assert (p.desired_gangs, d.desired_gangs) == (0, 0)
    assert ("coupling", Reason.DEPLOYMENT_AT_ZERO) in [(s.stage, s.reason) for s in p.steps]


def test_a_deployment_at_zero_is_woken_by_its_forecast_as_a_whole():
    # At zero gangs there is no vLLM metric to read; the prefill forecast (demand seen at
    # this time on earlier days) is what brings the deployment back, decode included.
    at_zero = {"deployment": "chat", "min_replicas": 0, "capacity_per_replica": 1000}
    p_obs = obs("chat-p", ready=0, spec=0, waiting=None, kv=None, gangs=())
    d_obs = obs("chat-d", ready=0, spec=0, waiting=None, kv=None, gangs=())
    the_plan, _ = plan(
        observations(p_obs, d_obs),
        {
            p_obs.key: policy(component="prefill", **at_zero),
            d_obs.key: policy(component="decode", **at_zero),
        },
        {p_obs.key: forecast(1_500)},
        Memory(),
        now=NOW,
    )
    p, d = the_plan.components[p_obs.key], the_plan.components[d_obs.key]
    assert (p.desired_gangs, p.reason) == (2, Reason.FORECAST_FLOOR)
    assert (d.desired_gangs, d.reason) == (1, Reason.DEPLOYMENT_MINIMUM)


@pytest.mark.parametrize(
    ("waiting", "spec", "forecast_on", "expected"),
    [
        pytest.param(3.0, 0, False, (1, 1, Reason.SCALE_FROM_ZERO), id="requests-wake-it"),
        pytest.param(0.0, 0, False, (0, 0, Reason.HOLD_MISSING_DATA), id="no-request-stays"),
        pytest.param(None, 0, False, (0, 0, Reason.HOLD_MISSING_DATA), id="no-reading-stays"),
        pytest.param(float("nan"), 0, False, (0, 0, Reason.HOLD_MISSING_DATA), id="nan-stays"),
    ],
)
def test_requests_waiting_in_front_of_a_deployment_at_zero_wake_it(
    waiting, spec, forecast_on, expected
):
    """With the forecast off (or no history yet), nothing read from the deployment's own
    pods can bring it back from zero: it has none. The gateway's queue can."""
    at_zero = {"deployment": "chat", "min_replicas": 0, "forecast": "on" if forecast_on else "off"}
    signals = Signals(wake_requests=waiting)
    p_obs = replace(obs("chat-p", ready=0, spec=spec, gangs=()), signals=signals)
    d_obs = replace(obs("chat-d", ready=0, spec=spec, gangs=()), signals=signals)
    the_plan, _ = plan(
        observations(p_obs, d_obs),
        {p_obs.key: policy(component="prefill", **at_zero),
         d_obs.key: policy(component="decode", **at_zero)},
        {},
        Memory(),
        now=NOW,
    )  # fmt: skip
    p, d = the_plan.components[p_obs.key], the_plan.components[d_obs.key]
    assert (p.desired_gangs, d.desired_gangs, p.reason) == expected


def test_requests_waiting_at_the_gateway_do_not_move_a_deployment_that_has_gangs():
    component = replace(obs(ready=2, waiting=0, kv=0.5), signals=Signals(
        waiting_requests=0.0, kv_usage_fraction=0.5, wake_requests=500.0))  # fmt: skip
    result, _ = decide(component, policy(min_replicas=0))
    assert result.desired_gangs < 3 and result.reason is not Reason.SCALE_FROM_ZERO


def test_a_component_with_gangs_and_no_data_still_ignores_its_forecast():
    result, _ = decide(
        obs(ready=2, waiting=None, kv=None),
        policy(capacity_per_replica=1000),
        fc=forecast(9_000),
    )
    assert (result.desired_gangs, result.reason) == (2, Reason.HOLD_MISSING_DATA)


def test_short_cluster_gives_one_of_each_before_a_second_of_either():
    # Only 2 more gangs fit (two 2x8-GPU gangs on four 8-GPU nodes); both components want 2.
    nodes = tuple(node(f"n{i}") for i in range(4))
    p, d = pd(
        obs("chat-p", ready=0, spec=0, waiting=20, kv=None, gangs=()),
        obs("chat-d", ready=0, spec=0, waiting=20, kv=None, gangs=()),
        nodes=nodes,
        can_grow=False,
    )
    assert (p.desired_gangs, d.desired_gangs) == (1, 1)
    assert p.reason is Reason.CAPACITY_SHORT


def test_short_cluster_never_starts_half_a_deployment():
    nodes = (node("n0"), node("n1"))  # room for one 2x8-GPU gang only
    p, d = pd(
        obs("chat-p", ready=0, spec=0, waiting=20, kv=None, gangs=()),
        obs("chat-d", ready=0, spec=0, waiting=20, kv=None, gangs=()),
        nodes=nodes,
        can_grow=False,
    )
    assert (p.desired_gangs, d.desired_gangs) == (0, 0)


def test_ratio_band_raises_the_short_side():
    band = {"deployment": "chat", "prefill_decode_ratio": "1:2-1:4", "max_scale_up": 10}
    p, d = pd(
        obs("chat-p", ready=1, waiting=4, kv=0.8),
        obs("chat-d", ready=2, waiting=40, kv=0.5),
        prefill_policy=policy(component="prefill", **band),
        decode_policy=policy(component="decode", **band),
    )
    assert d.desired_gangs == 10
    assert p.desired_gangs == 3  # 3 / 10 is inside [1/4, 1/2]
    assert p.reason is Reason.RATIO_BAND


def test_a_ratio_raise_is_held_to_max_scale_up():
    # One prefill gang for ten decode gangs under a 1:2-1:4 band needs three prefill gangs;
    # with max-scale-up 1 the band is reached one gang a tick.
    band = {"deployment": "chat", "prefill_decode_ratio": "1:2-1:4", "max_scale_up": 1}
    p, d = pd(
        obs("chat-p", ready=1, waiting=4, kv=0.8),
        obs("chat-d", ready=10, waiting=40, kv=0.8),
        prefill_policy=policy(component="prefill", **band),
        decode_policy=policy(component="decode", **band),
    )
    assert d.desired_gangs == 10
    assert (p.desired_gangs, p.reason) == (2, Reason.RATIO_BAND)
    assert "; 2 of 3 this tick, at most 1 gang added per tick" in p.detail


@pytest.mark.parametrize(
    ("band", "prefill", "decode", "expected"),
    [
        pytest.param("1:3", 1, 4, (2, 6), id="exact-band-raises-both-sides"),
        pytest.param("2:3", 1, 1, (2, 3), id="exact-band-from-one-each"),
        pytest.param("1:2-1:4", 1, 8, (2, 8), id="wide-band-raises-the-short-side"),
    ],
)
def test_a_ratio_band_is_reached_with_the_fewest_gangs(band, prefill, decode, expected):
    """Raising only the short side cannot reach a narrow band: 1:4 raised to 2:4 is 1:2,
    still outside 1:3."""
    fixed = {"deployment": "chat", "prefill_decode_ratio": band, "max_scale_up": 10}
    p, d = pd(
        obs("chat-p", ready=prefill, waiting=4 * prefill, kv=0.8),
        obs("chat-d", ready=decode, waiting=4 * decode, kv=0.8),
        prefill_policy=policy(component="prefill", **fixed),
        decode_policy=policy(component="decode", **fixed),
    )
    assert (p.desired_gangs, d.desired_gangs) == expected


def test_a_band_out_of_reach_holds_while_data_is_missing():
    """3:4 within 6 prefill and 7 decode gangs is out of reach from 4 and 5 (3:4 and 6:8
    lower a side). Prefill at 4 is already the nearest below 5 * 0.75, so nothing moves;
    raising prefill to 4 past the edge of 3.75 made the next tick raise decode, and so on,
    to both maximums with every signal missing."""
    band = {"deployment": "chat", "prefill_decode_ratio": "3:4", "max_scale_up": 2}
    p_pol = policy(component="prefill", max_replicas=6, **band)
    d_pol = policy(component="decode", max_replicas=7, **band)
    spec, memory = (4, 5), Memory()
    for tick in range(4):
        p_obs = obs("chat-p", ready=spec[0], waiting=None, kv=None)
        d_obs = obs("chat-d", ready=spec[1], waiting=None, kv=None)
        the_plan, memory = plan(
            observations(p_obs, d_obs),
            {p_obs.key: p_pol, d_obs.key: d_pol},
            {},
            memory,
            now=NOW + 15 * tick,
        )
        p, d = the_plan.components[p_obs.key], the_plan.components[d_obs.key]
        assert (p.desired_gangs, d.desired_gangs) == (4, 5), tick
        assert p.reason is d.reason is Reason.HOLD_MISSING_DATA
        spec = (p.desired_gangs, d.desired_gangs)


def test_a_component_without_a_valid_policy_holds():
    component = obs(ready=2, waiting=100, kv=0.99)
    the_plan, _ = plan(observations(component), {}, {}, Memory(), now=NOW)
    result = the_plan.components[component.key]
    assert result.hold
    assert result.desired_gangs == 2
    assert result.reason is Reason.HOLD_POLICY_ERROR


def test_a_deployment_with_two_prefill_components_holds_all_of_them():
    a = obs("chat-a", ready=1, waiting=100, kv=0.9)
    b = obs("chat-b", ready=1, waiting=100, kv=0.9)
    pol = policy(deployment="chat", component="prefill")
    the_plan, _ = plan(observations(a, b), {a.key: pol, b.key: pol}, {}, Memory(), now=NOW)
    for key in (a.key, b.key):
        assert the_plan.components[key].hold
        assert "2 LWS claim it" in the_plan.components[key].detail


def test_every_step_is_recorded_with_a_reason():
    result, _ = decide(obs(ready=1, waiting=40, kv=0.5), policy())
    stages = [s.stage for s in result.steps]
    assert stages[0] == "reactive"
    assert "rate_limit" in stages
    assert stages[-1] == "buffer"
    assert all(isinstance(s.reason, Reason) for s in result.steps)


def test_memory_is_a_new_value_and_the_input_is_untouched():
    memory = Memory({KEY: ComponentMemory(proposals=((NOW - 10, 2),))})
    before = replace(memory.of(KEY))
    plan(observations(obs(ready=2, waiting=30)), {KEY: policy()}, {}, memory, now=NOW)
    assert memory.of(KEY) == before


# --- holding what exists on missing or broken input ---------------------------------------


@pytest.mark.parametrize(
    ("waiting", "kv"),
    [
        pytest.param(0, 0.96, id="kv-over-target"),
        pytest.param(12, 0.5, id="queue-over-target"),
    ],
)
def test_gangs_still_starting_are_kept_while_the_ready_ones_are_over_target(waiting, kv):
    """2 ready gangs over target and 2 still loading their weights: HPA counts unready pods
    as idle on a scale-up and holds when that reverses the direction. Proposing
    ceil(2 x 1.2) = 3 from the ready gangs alone scaled a starting gang away."""
    component = obs(
        ready=2,
        spec=4,
        waiting=waiting,
        kv=kv,
        gangs=gangs_with((2, 2, None), (2, 2, None), (2, 0, NOW - 60), (2, 0, NOW - 60)),
    )
    result, _ = decide(component, policy(target_waiting=4, scale_down_window="0s"))
    assert result.desired_gangs == 4


def test_every_gang_timed_out_still_rolls_back_down_to_the_minimum():
    component = obs(
        ready=0,
        spec=3,
        waiting=None,
        kv=None,
        gangs=gangs_with((1, 0, NOW - 900), (1, 0, NOW - 900), (1, 0, NOW - 900)),
    )
    seen = ComponentMemory(not_ready_first_seen=tuple(held(i, NOW - 900) for i in range(3)))
    result, _ = decide(component, policy(min_replicas=1, gang_timeout="10m"), memory=seen)
    assert result.desired_gangs == 1
    assert result.rolled_back_groups == (1, 2)
    assert result.stuck_groups == (0,)
    assert result.reason is Reason.PARTIAL_GANG_ROLLED_BACK


@pytest.mark.parametrize(
    ("fc", "why"),
    [
        pytest.param(None, "no forecast yet", id="no-forecast"),
        pytest.param(forecast(float("nan")), "no forecast yet", id="nan-forecast"),
        pytest.param(forecast(1_000, upper=float("inf")), "no forecast yet", id="inf-bound"),
    ],
)
def test_balloon_gangs_are_kept_while_there_is_no_usable_forecast(fc, why):
    """A forecaster's error or a restart before back-fill must not give capacity back: the
    buffer is missing data too (it used to drop to min-buffer at once)."""
    component = obs(ready=2, waiting=8, kv=0.78, balloons=2)
    pol = policy(capacity_per_replica=1000, min_buffer=0, max_buffer=3)
    result, _ = decide(component, pol, fc=fc)
    assert (result.balloon_gangs, result.balloon_reason) == (2, Reason.BUFFER_NO_FORECAST)
    assert why in next(s.detail for s in result.steps if s.stage == "buffer")
    assert result.desired_gangs == 2  # no floor from a NaN either


def test_a_balloon_count_above_max_buffer_is_brought_within_it_without_a_forecast():
    component = obs(ready=2, waiting=8, kv=0.78, balloons=5)
    result, _ = decide(component, policy(capacity_per_replica=1000, max_buffer=3))
    assert result.balloon_gangs == 3


def test_fixing_a_policy_does_not_drop_the_gangs_its_window_would_have_kept():
    """Ten minutes held on a bad annotation, then fixed with the load gone: the scale-down
    window still holds the gangs, as after a tick without data."""
    busy = obs(ready=6, waiting=8, kv=0.78)
    memory = Memory()
    for tick in range(40):  # 10 minutes of 15 s ticks on a bad policy
        _, memory = plan(observations(busy), {}, {}, memory, now=NOW - 600 + 15 * tick)
    idle = obs(ready=6, waiting=0, kv=0.1)
    result, _ = decide(idle, policy(scale_down_window="5m"), memory=memory.of(idle.key))
    assert result.desired_gangs == 6
    assert result.reason is Reason.SCALE_DOWN_STABILIZED
    assert len(memory.of(idle.key).proposals) == 1  # a long hold keeps the history short


def test_a_denormal_demand_is_not_learned_as_a_capacity_of_zero():
    """5e-324 tokens/s over a saturated component learned 0.0 per gang, and the next tick's
    forecast floor divided by it."""
    _, memory = decide(obs(ready=2, waiting=12, kv=0.5, demand=5e-324), policy())
    assert memory.learned_capacity_per_gang is None
    result, _ = decide(obs(ready=2, waiting=4, kv=0.6), policy(), fc=forecast(100), memory=memory)
    assert result.desired_gangs == 2


@pytest.mark.parametrize(
    "pol",
    [
        pytest.param(policy(target_waiting=1e-308, max_scale_up=100), id="target-waiting-1e-308"),
        pytest.param(policy(target_kv_cache=1e-308, max_scale_up=100), id="target-kv-1e-308"),
        pytest.param(policy(capacity_per_replica=1e-308, max_scale_up=100), id="capacity-1e-308"),
    ],
)
def test_an_absurd_but_valid_setting_scales_to_the_maximum_instead_of_failing(pol):
    """Annotations the schema accepts made `ceil` of an infinite quotient raise
    OverflowError, and the deployment was held as "planning failed" with no Event naming
    the annotation."""
    result, _ = decide(obs(ready=2, waiting=2, kv=0.5, demand=1000), pol, fc=forecast(1000))
    assert result.desired_gangs == pol.max_replicas


def test_a_long_window_keeps_the_falling_steps_not_every_tick():
    """`scale-down-window: 720h` kept one history entry per tick (20,000 after 3.5 days of
    15 s ticks), and every tick scanned them all. Entries a newer, higher or equal proposal
    outranks never decide a window, so they go; the window still holds the highest."""
    pol = policy(scale_down_window="720h")
    key = obs(ready=2, waiting=8, kv=0.8).key
    memory = Memory()
    loads = [(6, 24), (4, 16), (2, 8)]  # a day each at 6, 4, then 2 gangs' worth of queue
    now = 0.0
    for ready, waiting in loads:
        for _ in range(5_760):
            now += 15.0
            component = obs(ready=ready, waiting=waiting, kv=0.8)
            _, memory = plan(observations(component), {key: pol}, {}, memory, now=now)
    history = memory.of(key).proposals
    assert len(history) <= 3
    idle = obs(ready=6, waiting=0, kv=0.1)
    result, _ = plan(observations(idle), {key: pol}, {}, memory, now=now + 15)
    assert result.components[key].desired_gangs == 6  # the first day's 6 is in the window


def test_a_floor_skipped_for_want_of_a_capacity_says_so():
    """Without `capacity-per-replica` and before one is learned, the forecast can set no
    floor: the steps say why, so `/decisions` does not show a forecast ignored silently."""
    result, _ = decide(obs(ready=2, waiting=4, kv=0.6, demand=1900), policy(), fc=forecast(9_000))
    skipped = [s for s in result.steps if s.stage == "no_floor"]
    assert len(skipped) == 1
    assert skipped[0].gangs == 2 and "no capacity per gang yet" in skipped[0].detail
    assert "60s" in skipped[0].detail
    short, _ = decide(obs(ready=2, waiting=4, kv=0.6, demand=1900), policy(),
                      fc=forecast(9_000), demand_window_s=5.0)  # fmt: skip
    assert [s.detail.endswith("for 5s") for s in short.steps if s.stage == "no_floor"] == [True]
    # a note, not the reason: the plan's detail (Events, logs) still says why the count is
    queue, _ = decide(obs(ready=2, waiting=12, kv=0.6), policy(), fc=forecast(9_000))
    assert queue.reason is Reason.SCALE_UP_WAITING
    assert "no capacity" not in queue.detail and "waiting" in queue.detail
    pinned, _ = decide(
        obs(ready=2, waiting=4, kv=0.6, demand=1900),
        policy(capacity_per_replica=1000),
        fc=forecast(9_000),
    )
    assert [s.gangs for s in pinned.steps if s.stage == "forecast"] == [9]


@pytest.mark.parametrize("window_s", [0.0, float("nan")])
def test_no_window_learns_nothing_from_one_reading(window_s):
    """The service refuses a window under 1 ms; a caller that passes none must not have a
    single reading taken for a whole saturated window."""
    _, memory = decide(SATURATED, policy(), demand_window_s=window_s)
    assert memory.learned_capacity_per_gang is None


@pytest.mark.parametrize(
    ("prefill", "decode", "learned"),
    [
        pytest.param(
            dict(waiting=2, kv=1.0),
            dict(waiting=40, kv=0.5),
            {"prefill": None, "decode": 1000},
            id="prefill-cache-full-behind-decode-learns-nothing",
        ),
        pytest.param(
            dict(waiting=12, kv=0.3),
            dict(waiting=2, kv=1.0),
            {"prefill": 1000, "decode": 1000},
            id="prefill-queue-and-decode-cache-learn",
        ),
    ],
)
def test_prefill_learns_at_its_queue_not_its_kv_cache(prefill, decode, learned):
    """A prefill gang's KV cache also holds prompts that decode has not taken yet. On
    ServeGen m-small, with decode 200,000 requests behind, prefill's full cache taught it
    18,800 prompt tokens/s per gang (32,000 at target), and it kept that value for eleven
    days, while its queue stayed under target. Decode's full cache is its own."""
    parts = {
        "prefill": obs("chat-p", ready=2, demand=2500, **prefill),
        "decode": obs("chat-d", ready=2, demand=2500, **decode),
    }
    policies = {
        parts[c].key: policy(deployment="chat", component=c, target_waiting=4) for c in parts
    }
    memory = Memory()
    for i in range(5):  # a whole minute of 15 s ticks
        _, memory = plan(observations(*parts.values()), policies, {}, memory, now=NOW + 15 * i)
    got = {c: memory.of(parts[c].key).learned_capacity_per_gang for c in parts}
    assert got == {c: (None if v is None else pytest.approx(v)) for c, v in learned.items()}
