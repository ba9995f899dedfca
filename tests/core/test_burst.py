"""The forecast floor's burst factor, by hand-computed cases."""

from __future__ import annotations

import math

import pytest

from autoscaler.core.burst import MAX_BURST_FACTOR, burst_factor, remember_demand
from autoscaler.core.gang_plan import ComponentMemory, Reason
from tests.core.builders import forecast, obs, policy
from tests.core.test_decision import NOW, decide


def readings(*values: float) -> tuple[tuple[float, float], ...]:
    """One reading per 15-second tick, the last at NOW."""
    return tuple((NOW - 15 * (len(values) - 1 - i), v) for i, v in enumerate(values))


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # p90 of 100..1000 sits 0.1 of the way from 900 to 1000: 910, over a mean of 550
        pytest.param(tuple(range(100, 1001, 100)), 910 / 550, id="interpolated-p90-over-mean"),
        pytest.param((500.0,) * 8, 1.0, id="flat-readings-no-raise"),
        # mean 300, p90 1000: 3.33, held to the cap
        pytest.param((0.0,) * 7 + (1000.0,) * 3, MAX_BURST_FACTOR, id="held-to-the-cap"),
        # one reading far above the rest lifts the mean past the p90: never below 1
        pytest.param((1.0,) * 10 + (100_000.0,), 1.0, id="never-below-one"),
        pytest.param((0.0,) * 8, 1.0, id="no-demand"),
        pytest.param(tuple(range(100, 701, 100)), 1.0, id="too-few-readings"),
        # What the factor is not: a measure of bursts around a level. Flat demand that
        # doubled 10 minutes ago (80 readings at 500, then 40 at 1,000): p90 1,000 over
        # mean 666.7
        pytest.param((500.0,) * 80 + (1000.0,) * 40, 1.5, id="level-step-counts"),
        # idle for 25 minutes, then 5 minutes of load: p90 1,000 over mean 166.7, held to 3
        pytest.param((0.0,) * 100 + (1000.0,) * 20, MAX_BURST_FACTOR, id="wake-from-idle-caps"),
    ],
)
def test_burst_factor(values, expected):
    assert burst_factor(readings(*values)).value == pytest.approx(expected)


def test_the_window_keeps_half_an_hour_and_skips_unreadable_demand():
    old = ((NOW - 1800, 5.0), (NOW - 1799, 6.0))
    kept = remember_demand(old, 7.0, now=NOW)
    assert kept == ((NOW - 1799, 6.0), (NOW, 7.0))
    assert remember_demand(old, 0.0, now=NOW) == ((NOW - 1799, 6.0), (NOW, 0.0))  # no load
    for unreadable in (None, math.nan, math.inf, -1.0):
        assert remember_demand(old, unreadable, now=NOW) == ((NOW - 1799, 6.0),)


def test_a_fast_tick_keeps_one_reading_per_10_seconds():
    samples: tuple[tuple[float, float], ...] = ()
    for tick in range(3600):  # half an hour of 500 ms ticks
        samples = remember_demand(samples, float(tick), now=NOW + tick * 0.5)
    assert len(samples) == 180
    assert [t - NOW for t, _ in samples[:3]] == [0.0, 10.0, 20.0]


def test_every_default_tick_is_kept_whatever_its_jitter():
    # 15-second ticks that start up to 2 ms early or late in their slot
    samples: tuple[tuple[float, float], ...] = ()
    for tick in range(200):
        jitter = 0.002 * (-1) ** tick
        samples = remember_demand(samples, 1.0, now=NOW + 15 * tick + jitter)
    assert len(samples) == 120


def test_readings_from_before_the_clock_stepped_back_are_dropped():
    future = ((NOW + 60, 5.0),)
    assert remember_demand(future, 7.0, now=NOW) == ((NOW, 7.0),)


def test_the_floor_plans_for_the_spread_of_the_readings():
    # Forecast 1,500 at 1,000 per gang: 2 gangs, which there are. Readings spread to 1.65
    # times their mean raise it to ceil(1,500 * 910 / 550 / 1,000) = 3.
    component = obs(ready=2, waiting=8, kv=0.78)
    pol = policy(capacity_per_replica=1000)
    plain, _ = decide(component, pol, fc=forecast(1_500))
    assert (plain.desired_gangs, plain.reason) == (2, Reason.WITHIN_TOLERANCE)

    spread = ComponentMemory(demand_samples=readings(*range(100, 1001, 100)))
    raised, memory = decide(component, pol, fc=forecast(1_500), memory=spread)
    assert (raised.desired_gangs, raised.reason) == (3, Reason.FORECAST_FLOOR)
    assert raised.burst_factor == pytest.approx(910 / 550)
    assert plain.burst_factor == 1.0
    assert "burst x1.65 (p90 of 10 demand readings over 2 min, over their mean)" in raised.detail
    assert memory.demand_samples == spread.demand_samples  # no demand read this tick


def test_each_tick_adds_its_demand_reading():
    component = obs(ready=2, waiting=8, kv=0.78, demand=640.0)
    earlier = ComponentMemory(demand_samples=((NOW - 15, 1.0),))
    _, memory = decide(component, policy(), memory=earlier)
    assert memory.demand_samples == ((NOW - 15, 1.0), (NOW, 640.0))


def test_the_buffer_still_covers_the_upper_bound_from_the_raised_floor():
    # Floor 3 gangs (as above); the upper bound 5,200 needs 6: 3 balloon gangs.
    spread = ComponentMemory(demand_samples=readings(*range(100, 1001, 100)))
    result, _ = decide(
        obs(ready=2, waiting=8, kv=0.78),
        policy(capacity_per_replica=1000, max_buffer=5),
        fc=forecast(1_500, upper=5_200),
        memory=spread,
    )
    assert (result.desired_gangs, result.balloon_gangs) == (3, 3)


def test_no_factor_is_reported_where_no_floor_was_computed():
    spread = ComponentMemory(demand_samples=readings(*range(100, 1001, 100)))
    component = obs(ready=2, waiting=8, kv=0.78)
    off, _ = decide(
        component, policy(capacity_per_replica=1000, forecast="off"), fc=forecast(1_500),
        memory=spread,
    )  # fmt: skip
    unknown, _ = decide(component, policy(), fc=forecast(1_500), memory=spread)
    assert off.burst_factor is None and unknown.burst_factor is None


def test_a_held_component_keeps_its_readings():
    # no signal could be read: the component holds, and what it had read stays
    spread = ComponentMemory(demand_samples=readings(*range(100, 1001, 100)))
    result, memory = decide(
        obs(ready=2, waiting=None, kv=None), policy(capacity_per_replica=1000),
        fc=forecast(9_000), memory=spread,
    )  # fmt: skip
    assert result.reason is Reason.HOLD_MISSING_DATA
    assert memory.demand_samples == spread.demand_samples
