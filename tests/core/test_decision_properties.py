"""Properties of `plan` over random observations and policies (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.core.coupling import couple_deployment
from autoscaler.core.decision import plan
from autoscaler.core.gang_plan import ComponentMemory, Memory
from autoscaler.core.model import ComponentKey, Forecast, GangStatus
from tests.core.builders import node, obs, observations, policy

NOW = 50_000.0
maybe_float = st.one_of(st.none(), st.floats(min_value=0, max_value=500, allow_nan=False))
maybe_kv = st.one_of(st.none(), st.floats(min_value=0, max_value=1, allow_nan=False))


@st.composite
def components(draw, lws: str):
    spec = draw(st.integers(0, 12))
    states = draw(
        st.lists(
            st.tuples(
                st.integers(0, 2),  # pods scheduled of 2
                st.booleans(),  # ready when scheduled
                st.floats(min_value=0, max_value=2_000),  # not-ready age
            ),
            min_size=spec,
            max_size=spec,
        )
    )
    gangs = tuple(
        GangStatus(i, 2, s, 2 if (s == 2 and r) else 0, None if (s == 2 and r) else NOW - age)
        for i, (s, r, age) in enumerate(states)
    )
    return obs(
        lws,
        ready=sum(1 for g in gangs if g.pods_ready == 2),
        spec=spec,
        waiting=draw(maybe_float),
        kv=draw(maybe_kv),
        demand=draw(maybe_float),
        gangs=gangs,
        balloons=draw(st.integers(0, 3)),
    )


@st.composite
def pd_policies(draw):
    lo = draw(st.integers(0, 3))
    hi = draw(st.integers(max(lo, 1), 12))
    common = {
        "deployment": "chat",
        "min_replicas": lo,
        "max_replicas": hi,
        "max_scale_up": draw(st.integers(1, 4)),
        "scale_down_window": draw(st.sampled_from(["0s", "1m", "5m"])),
        "capacity_per_replica": draw(st.sampled_from([100, 1000])),
        "min_buffer": 0,
        "max_buffer": draw(st.integers(0, 3)),
    }
    return policy(component="prefill", **common), policy(component="decode", **common)


@st.composite
def scenarios(draw):
    p_obs = draw(components("chat-p"))
    d_obs = draw(components("chat-d"))
    p_pol, d_pol = draw(pd_policies())
    forecasts = {}
    for key in (p_obs.key, d_obs.key):
        if draw(st.booleans()):
            point = draw(st.floats(min_value=0, max_value=20_000))
            forecasts[key] = Forecast(point, point * 1.3, 300)
    memory = Memory(
        {
            p_obs.key: ComponentMemory(
                proposals=tuple(
                    (NOW - draw(st.floats(0, 600)), draw(st.integers(0, 12))) for _ in range(2)
                )
            )
        }
    )
    nodes = tuple(node(f"n{i}", gpus=draw(st.sampled_from([0, 4, 8]))) for i in range(6))
    return (
        observations(p_obs, d_obs, nodes=nodes, can_grow=draw(st.booleans())),
        {p_obs.key: p_pol, d_obs.key: d_pol},
        forecasts,
        memory,
    )


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_whole_gangs_within_bounds_and_coupled(scenario):
    observations_, policies, forecasts, memory = scenario
    the_plan, _ = plan(observations_, policies, forecasts, memory, now=NOW)
    desired = {}
    for key, p in the_plan.components.items():
        pol = policies[key]
        assert isinstance(p.desired_gangs, int)
        assert isinstance(p.balloon_gangs, int)
        assert pol.min_buffer <= p.balloon_gangs <= pol.max_buffer
        current = observations_.components[key].spec_gangs
        if p.desired_gangs > pol.max_replicas:
            assert p.desired_gangs <= current  # never grows past max
        if p.desired_gangs < pol.min_replicas:
            # Only a short cluster (or a hold) leaves a component below its minimum, and
            # then it still never shrinks, except by removing gangs that serve nothing.
            assert p.desired_gangs >= current - len(p.rolled_back_groups), p.steps
        desired[key] = p.desired_gangs

    def coupled(values):
        return all(v > 0 for v in values) or all(v == 0 for v in values)

    # Coupling: both components up or both at zero. (A deployment that arrives broken, one
    # component at zero, may stay broken when the cluster has no room to repair it.)
    currents = {k: o.spec_gangs for k, o in observations_.components.items()}
    if coupled(currents.values()):
        assert coupled(desired.values())


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_no_scale_down_when_any_signal_is_missing(scenario):
    observations_, policies, forecasts, memory = scenario
    the_plan, _ = plan(observations_, policies, forecasts, memory, now=NOW)
    for key, p in the_plan.components.items():
        o = observations_.components[key]
        missing = o.signals.waiting_requests is None or o.signals.kv_usage_fraction is None
        if missing and p.desired_gangs < o.spec_gangs:
            # On missing data only two things lower a component: the operator's max-replicas,
            # and removing timed-out gangs that serve nothing.
            floor = min(o.spec_gangs, policies[key].max_replicas) - len(p.rolled_back_groups)
            assert p.desired_gangs >= floor, p.steps


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_plan_is_deterministic(scenario):
    observations_, policies, forecasts, memory = scenario
    first = plan(observations_, policies, forecasts, memory, now=NOW)
    second = plan(observations_, policies, forecasts, memory, now=NOW)
    assert first == second


BANDS = ["1:2-1:4", "1:3", "2:3", "1:1", "3:1-1:1", "1:8", "5:7-2:3", "1:2.5", "7:3", "3:4"]


@settings(max_examples=1500, deadline=None)
@given(
    prefill=st.integers(0, 30),
    decode=st.integers(0, 30),
    minimum=st.integers(0, 3),
    max_prefill=st.integers(3, 30),
    max_decode=st.integers(3, 30),
    band=st.sampled_from(BANDS),
)
def test_coupling_settles_in_one_pass(prefill, decode, minimum, max_prefill, max_decode, band):
    """Coupling what coupling returned changes nothing: a band that cannot be met within
    the maximums is approached without passing its far edge, or each tick raises the other
    side and both climb to their maximums."""
    keys = (ComponentKey("serving", "chat-p"), ComponentKey("serving", "chat-d"))
    common = {"deployment": "chat", "min_replicas": minimum, "prefill_decode_ratio": band}
    policies = {
        keys[0]: policy(component="prefill", max_replicas=max_prefill, **common),
        keys[1]: policy(component="decode", max_replicas=max_decode, **common),
    }
    bounded = {
        keys[0]: min(max(prefill, minimum), max_prefill),
        keys[1]: min(max(decode, minimum), max_decode),
    }
    once = {k: c.gangs for k, c in couple_deployment(bounded, policies).items()}
    twice = {k: c.gangs for k, c in couple_deployment(once, policies).items()}
    assert twice == once
    for key in keys:
        assert bounded[key] <= once[key] <= policies[key].max_replicas


def test_components_are_keyed_by_their_lws():
    a = obs("x")
    the_plan, _ = plan(observations(a), {a.key: policy()}, {}, Memory(), now=NOW)
    assert set(the_plan.components) == {ComponentKey("serving", "x")}
