"""The service's parts on their own: per-deployment isolation of the plan, the first-sight
scale-down window, lease timing, JSON logs, and the tick deadline against a Prometheus that
never answers in time."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from autoscaler.adapters.kube_state import build_state
from autoscaler.adapters.prometheus_source import ComponentTarget, PrometheusSource
from autoscaler.core.decision import plan as core_plan
from autoscaler.core.gang_plan import (
    ComponentMemory,
    ComponentPlan,
    GangPlan,
    Memory,
    Reason,
    SaturatedStretch,
)
from autoscaler.core.model import Component, ComponentKey
from autoscaler.service.app import (
    Service,
    _stop_executor,
    default_identity,
    fit_executor,
    kube_request_timeout,
    lease_timing,
)
from autoscaler.service.control_loop import (
    TickRecord,
    component_labels,
    plan_isolated,
    seed_memory,
)
from autoscaler.service.decisions_view import decisions_view
from autoscaler.service.forecasts import DemandForecasts
from autoscaler.service.http_api import HttpServer, Probe
from autoscaler.service.logs import JsonFormatter
from autoscaler.service.settings import build_run_parser, load_settings
from tests.adapters.kube_fixtures import vllm_lws
from tests.core.builders import obs, observations, policy
from tests.harness.fake_kube import FakeKube
from tests.harness.helm_chart import NAMESPACE as CHART_NAMESPACE
from tests.harness.http_stub import serve
from tests.harness.prometheus_server import free_port
from tests.service.stack import DECODE, pd_manifests, settings_for, start_service, wait_until

A, B = ComponentKey("serving", "a"), ComponentKey("serving", "b")


def test_a_plan_that_raises_holds_only_its_deployment() -> None:
    inputs = observations(obs("a", ready=2, waiting=20.0), obs("b", ready=2, waiting=20.0))
    policies = {A: policy(), B: policy()}

    def planner(observed: Any, *args: Any, **kwargs: Any) -> Any:
        if B in observed.components:
            raise ZeroDivisionError("a bug that only b's inputs reach")
        return core_plan(observed, *args, **kwargs)

    errors: list[str] = []
    # b was in a saturated stretch: what this tick read was not planned from, so it ends
    stretch = SaturatedStretch(since=950.0, last=985.0, ready_gangs=2)
    before = Memory({B: ComponentMemory(saturated=stretch, learned_capacity_per_gang=7.0)})
    plan, memory = plan_isolated(
        inputs, policies, {}, before, now_s=1000.0, on_error=errors.append, planner=planner
    )
    assert plan.components[A].desired_gangs > 2  # a still scales on its queue
    assert plan.components[B].desired_gangs == 2 and plan.components[B].hold
    assert "ZeroDivisionError" in plan.components[B].detail
    assert errors == ["plan"]
    assert A in memory.components
    assert memory.of(B).saturated is None and memory.of(B).learned_capacity_per_gang == 7.0


def test_first_sight_starts_the_scale_down_window() -> None:
    idle = observations(obs("a", ready=3, waiting=0.0, kv=0.05))
    policies = {A: policy(scale_down_window="60s")}
    memory = seed_memory(Memory(), idle, now_s=1000.0)
    early, memory = core_plan(idle, policies, {}, memory, now=1030.0)
    assert early.components[A].desired_gangs == 3
    assert early.components[A].reason is Reason.SCALE_DOWN_STABILIZED
    late, _ = core_plan(idle, policies, {}, memory, now=1061.0)
    assert late.components[A].desired_gangs < 3
    # Seeding never overwrites what the loop already remembers.
    assert seed_memory(memory, idle, now_s=2000.0) is memory


@pytest.mark.parametrize(
    ("lease_s", "expected"),
    [
        pytest.param(15, (15, 10, 2), id="client-go-defaults"),
        pytest.param(3, (3, 2, 1), id="shortest"),
        pytest.param(60, (60, 40, 8), id="long"),
    ],
)
def test_lease_timing_keeps_renew_below_lease(lease_s: float, expected: tuple[int, ...]) -> None:
    assert lease_timing(lease_s) == expected
    lease, renew, retry = expected
    assert lease > renew > 1.2 * retry  # what kubernetes-asyncio's elector requires


@pytest.mark.parametrize(
    ("deadline_s", "expected_s"),
    [
        pytest.param(15.0, 5.0, id="default-tick-gets-the-adapter-default"),
        pytest.param(60.0, 5.0, id="long-tick-never-above-the-default"),
        pytest.param(6.0, 2.0, id="short-tick-a-third"),
        pytest.param(0.5, 1.0, id="sub-second-tick-one-second"),
    ],
)
def test_kube_request_timeout_leaves_the_tick_time_for_the_others(
    deadline_s: float, expected_s: float
) -> None:
    assert kube_request_timeout(deadline_s) == expected_s


@pytest.mark.parametrize(
    ("lease_s", "expected_s"),
    [
        pytest.param(15, 5.0, id="defaults-margin-is-the-adapter-default"),
        pytest.param(6, 2.0, id="lease-6s-two-seconds"),
        pytest.param(3, 1.0, id="shortest-lease-one-second"),
    ],
)
def test_a_write_sent_while_leading_lands_before_a_standby_may_take_over(
    lease_s: int, expected_s: float
) -> None:
    """With a 5 s request timeout and `--lease-duration 6s` (2 s from the renew deadline to
    a standby's takeover), a patch sent in time could land 3 s into the new leader's term."""
    lease, renew, _ = lease_timing(lease_s)
    timeout_s = kube_request_timeout(15.0, write_margin_s=lease - renew)
    assert timeout_s == expected_s
    assert timeout_s <= lease - renew


@pytest.mark.parametrize(
    ("overrides", "expected_s"),
    [
        pytest.param({"lease_duration": "6s"}, 2.0, id="leader-election-bounds-it"),
        pytest.param({"lease_duration": "6s", "dry_run": True}, 5.0, id="dry-run-writes-none"),
    ],
)
async def test_the_service_gives_its_kubernetes_calls_that_timeout(
    overrides: dict[str, Any], expected_s: float
) -> None:
    settings = settings_for("http://127.0.0.1:9", tick="15s", **overrides)
    executor = ThreadPoolExecutor(max_workers=1)
    async with FakeKube.start() as kube, kube.api_client() as api:
        service = Service(settings, api_client=api, executor=executor)
        try:
            assert service.kube._request_timeout_s == expected_s
        finally:
            await service.close()
            executor.shutdown(wait=False)


def test_lease_shorter_than_three_seconds_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 3s"):
        lease_timing(2.0)


def test_leader_identity_names_the_pod_with_a_per_process_suffix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAME", "gang-autoscaler-7d9f-abcde")
    first, second = default_identity(), default_identity()
    assert first.startswith("gang-autoscaler-7d9f-abcde_")
    assert first != second  # a restarted process never inherits the last one's term
    monkeypatch.delenv("POD_NAME")
    assert default_identity().startswith(f"{socket.gethostname()}_")


class _AlwaysHealthy:
    def health(self) -> Probe:
        return Probe(ok=True, detail={})

    readiness = health

    def metrics_exposition(self) -> tuple[bytes, str]:
        return b"", "text/plain"

    def decisions(self) -> dict[str, Any]:
        return {}


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


async def test_the_endpoints_answer_on_ipv4_and_ipv6() -> None:
    """The kubelet probes the pod's IP, which is IPv6 on an IPv6-only cluster: the default
    listens on both families (it listened on 0.0.0.0 only)."""
    server = HttpServer(_AlwaysHealthy(), port=free_port())
    await server.start()
    try:
        hosts = ["127.0.0.1"] + (["[::1]"] if _ipv6_loopback() else [])
        async with aiohttp.ClientSession() as session:
            for host in hosts:
                async with session.get(f"http://{host}:{server.port}/healthz") as response:
                    assert response.status == 200, host
    finally:
        await server.stop()


class _SlowMetrics(_AlwaysHealthy):
    """A registry of a large fleet: 2,000 components' exposition took 0.28 s."""

    def metrics_exposition(self) -> tuple[bytes, str]:
        time.sleep(1.0)
        return b"# many series\n", "text/plain"


async def test_a_slow_metrics_exposition_leaves_the_loop_turning() -> None:
    """/metrics rendered the registry on the event loop: every scrape of a large fleet held
    the ticks, the Lease renewals and the probes for its whole length."""
    server = HttpServer(_SlowMetrics(), host="127.0.0.1", port=0)
    await server.start()
    worst_gap_s = 0.0

    async def turns() -> None:
        nonlocal worst_gap_s
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            worst_gap_s, last = max(worst_gap_s, now - last), now

    ticker = asyncio.create_task(turns())
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.port}/metrics") as response,
        ):
            assert await response.read() == b"# many series\n"
        assert worst_gap_s < 0.5
    finally:
        ticker.cancel()
        await server.stop()


def test_any_free_port_needs_a_host() -> None:
    """On every interface, port 0 binds one socket per address family, each on its own
    free port, and the one read back might not answer."""
    with pytest.raises(ValueError, match="port 0 needs a host"):
        HttpServer(_AlwaysHealthy(), port=0)
    HttpServer(_AlwaysHealthy(), host="127.0.0.1", port=0)


def test_json_log_lines_carry_the_decision_fields() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s: scaled", ("ns/a",), None)
    record.reason = "scale_up_waiting"
    record.desired_gangs = 3
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "ns/a: scaled"
    assert line["reason"] == "scale_up_waiting" and line["desired_gangs"] == 3
    assert line["level"] == "INFO" and "time" in line


def test_decisions_before_the_first_tick_is_an_empty_shell() -> None:
    assert decisions_view(None) == {"tick": None, "components": {}}


def test_decisions_keep_the_last_plan_after_a_tick_that_stopped_before_planning() -> None:
    lws = vllm_lws(name="chat", annotations={"gang-autoscaler.io/enabled": "true"}, replicas=2)
    state = build_state(lws_objects=[lws], pods=[], nodes=[], now_s=0.0)
    key = ComponentKey("serving", "chat")
    planned = GangPlan(
        {
            key: ComponentPlan(
                key=key,
                current_gangs=2,
                desired_gangs=3,
                reason=Reason.SCALE_UP_WAITING,
                balloon_gangs=1,
                balloon_reason=Reason.BUFFER_MIN,
            )
        }
    )
    common = {"duration_s": 0.1, "cpu_s": 0.1, "leader": True, "dry_run": False}
    good = TickRecord(
        number=7, started_at_s=100.0, outcome="ok", state=state, plan=planned, **common
    )
    stopped = TickRecord(number=8, started_at_s=115.0, outcome="deadline: abandoned", **common)

    view = decisions_view(stopped, last_planned=good)
    assert (view["tick"], view["outcome"]) == (8, "deadline: abandoned")
    component = view["components"]["serving/chat"]
    assert component["plan"]["desired_gangs"] == 3
    assert component["plan_tick"] == 7
    assert decisions_view(good, last_planned=good)["components"]["serving/chat"]["plan_tick"] == 7


@pytest.fixture
async def silent_prometheus() -> AsyncIterator[str]:
    """An HTTP server that accepts Prometheus queries and answers far too late."""

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.json_response({"status": "success", "data": {"result": []}})

    async with serve(slow) as (url, _):
        yield url


async def test_a_prometheus_that_hangs_cannot_stall_the_loop(
    kube: FakeKube, silent_prometheus: str
) -> None:
    kube.add_namespace("slow")
    for manifest in pd_manifests("slow", {}):
        kube.apply(manifest)
    running = await start_service(
        kube, settings_for(silent_prometheus, prometheus_timeout="30s", backfill_days=0)
    )
    try:
        await wait_until(lambda: running.service.loop.ticks >= 5, timeout_s=10, what="5 ticks")
        record = running.service.loop.last
        assert record is not None
        # Cut off at the deadline, far short of the 30 s the queries would take; the margin
        # is for a loaded machine, where cancelling and recording the tick takes a while.
        assert record.duration_s < running.service.deadline_s + 5
        status, health = await running.get("/healthz")
        assert status == 200, health
        _, body = await running.get("/decisions")
        decode = body["components"][f"slow/{DECODE}"]
        if decode["plan"] is not None:  # the tick got as far as planning: it held
            assert decode["plan"]["desired_gangs"] == decode["plan"]["current_gangs"]
        timeouts = await running.metric("gang_autoscaler_errors_total", kind="prometheus")
        deadlines = await running.metric("gang_autoscaler_errors_total", kind="tick_deadline")
        assert (timeouts or 0) + (deadlines or 0) >= 3
    finally:
        await running.close()


async def _start_up_warnings(
    kube: FakeKube,
    prometheus_url: str,
    caplog: pytest.LogCaptureFixture,
    demand_window: str,
    text: str,
) -> list[str]:
    """The warnings containing `text` a service with this demand window logs at start."""
    caplog.set_level(logging.WARNING, logger="autoscaler.service.app")
    running = await start_service(
        kube, settings_for(prometheus_url, demand_window=demand_window, backfill_days=0)
    )
    await running.close()
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.parametrize(("demand_window", "warned"), [("200ms", True), ("5s", False)])
async def test_a_tick_too_long_to_learn_a_capacity_is_warned_of_at_start(
    kube: FakeKube,
    silent_prometheus: str,
    caplog: pytest.LogCaptureFixture,
    demand_window: str,
    warned: bool,
) -> None:
    """Readings more than two demand windows apart never make a stretch at target, so no
    capacity per gang is ever learned: the service says so instead of staying silent."""
    found = await _start_up_warnings(
        kube, silent_prometheus, caplog, demand_window, "no capacity per gang can be"
    )
    assert len(found) == (1 if warned else 0)
    if warned:
        assert found[0].startswith("tick 0.5s is more than 2 demand windows (0.2s)")


@pytest.mark.parametrize(("demand_window", "warned"), [("2s", True), ("5s", False)])
async def test_a_demand_window_shorter_than_the_queries_rate_is_warned_of_at_start(
    kube: FakeKube,
    silent_prometheus: str,
    caplog: pytest.LogCaptureFixture,
    demand_window: str,
    warned: bool,
) -> None:
    """The queries' rate() over 5 s with a 2 s demand window: a capacity would be learned
    from 2 s at target while the rate still holds 3 quieter seconds before them."""
    found = await _start_up_warnings(kube, silent_prometheus, caplog, demand_window, "rate() reads")
    assert found == (
        ["the demand queries' rate() reads 5s, longer than demand-window's 2s: a capacity per "
         "gang would be learned from a stretch at target shorter than the rate() it reads, "
         "which still holds the quieter seconds before it, so it learns low; set "
         "demand-window to 5s with the queries"]
        if warned else []
    )  # fmt: skip


@pytest.mark.parametrize(
    ("timeout", "level"),
    [
        pytest.param("2s", logging.WARNING, id="set-and-cut-is-a-warning"),
        pytest.param(None, logging.INFO, id="default-cut-is-info"),
        pytest.param("200ms", None, id="under-half-the-tick-is-not-cut"),
    ],
)
async def test_a_prometheus_deadline_cut_to_half_the_tick_is_said_at_start(
    kube: FakeKube,
    silent_prometheus: str,
    caplog: pytest.LogCaptureFixture,
    timeout: str | None,
    level: int | None,
) -> None:
    """`prometheus.timeout` over half the tick applied only half the tick, and nothing said
    so: an operator who raised it for a slow Thanos saw no change and no reason."""
    caplog.set_level(logging.INFO, logger="autoscaler.service.app")
    # through the flags, as `run` reads them (the merged settings are validated again)
    argv = ["--prometheus-url", silent_prometheus, "--tick", "500ms", "--lease-duration", "3s"]
    argv += ["--http-port", str(free_port()), "--lease-namespace", CHART_NAMESPACE]
    argv += ["--backfill-days", "0"] + (["--prometheus-timeout", timeout] if timeout else [])
    running = await start_service(kube, load_settings(build_run_parser().parse_args(argv)))
    await running.close()
    found = [r for r in caplog.records if "Prometheus queries get" in r.getMessage()]
    assert [r.levelno for r in found] == ([] if level is None else [level])
    if found:
        assert found[0].getMessage().startswith("Prometheus queries get 0.25s, half the 0.5s tick")


def test_forecast_horizon_counts_from_now_not_from_the_last_closed_window() -> None:
    key = ComponentKey("serving", "llm")
    start_s = 1_700_000_000.0
    with ThreadPoolExecutor(max_workers=1) as pool:
        forecasts = DemandForecasts(executor=pool, step_s=300.0)
        assert forecasts.model_horizon_s(key, horizon_s=300.0, now_s=start_s) == 300.0
        for minute in range(1, 13):  # one-minute demand samples for 12 minutes
            forecasts.record(key, now_s=start_s + 60 * minute, demand=1000.0)
        now_s = start_s + 60 * 12
        last_end_s = forecasts._fitter.last_window_end_s(key)
        assert last_end_s is not None and 0 < now_s - last_end_s <= 300
        asked_s = forecasts.model_horizon_s(key, horizon_s=300.0, now_s=now_s)
        # a stalled feed cannot push the horizon out by more than one step
        far_s = forecasts.model_horizon_s(key, horizon_s=300.0, now_s=now_s + 3600)
        found = forecasts.forecast(key, horizon_s=300.0, now_s=now_s)
    assert asked_s == pytest.approx(300.0 + (now_s - last_end_s))
    assert far_s == pytest.approx(600.0)
    assert found is not None
    assert found.horizon_s == 300.0  # reported from now, as the plan reasons with it
    assert found.point == pytest.approx(1000.0)


def test_no_forecast_from_demand_unread_for_over_an_hour_unless_at_zero() -> None:
    """A demand query broken by a server upgrade leaves every window missing; the model
    kept forecasting from the last readings (persistence from days-old values) with nothing
    to say so, and the floor and the balloons followed them."""
    key = ComponentKey("serving", "llm")
    with ThreadPoolExecutor(max_workers=1) as pool:
        forecasts = DemandForecasts(executor=pool, step_s=300.0)
        for minute in range(1, 13):
            forecasts.record(key, now_s=60.0 * minute, demand=1000.0)
        for minute in range(13, 13 + 61):
            forecasts.record(key, now_s=60.0 * minute, demand=None)
        now_s = 60.0 * 72  # the last reading, at minute 12, is exactly an hour old
        assert forecasts.forecast(key, horizon_s=300.0, now_s=now_s) is not None
        assert forecasts.status(key).withheld is None
        now_s += 60.0
        assert forecasts.forecast(key, horizon_s=300.0, now_s=now_s) is None
        assert "no demand read for 3660s" in (forecasts.status(key).withheld or "")
        # at zero gangs nothing can be read: the forecast is what brings the component back
        found = forecasts.forecast(key, horizon_s=300.0, now_s=now_s, at_zero=True)
        assert found is not None and found.point == pytest.approx(1000.0)
        forecasts.record(key, now_s=now_s + 60.0, demand=900.0)
        assert forecasts.forecast(key, horizon_s=300.0, now_s=now_s + 60.0) is not None
        assert forecasts.status(key).withheld is None


def test_a_clock_stepped_forward_then_back_drops_the_history_to_back_fill_it() -> None:
    """One tick 12 hours ahead (an NTP misstep), then the clock is corrected: every later
    reading was behind the model's windows and dropped, for 12 hours, while the forecast
    went on for the wrong time of day and nothing said so. Now the history is dropped, the
    next back-fill (`start_backfill` sees a component it does not know) reads it afresh, and
    until then no forecast is made from the wrong clock."""
    key = ComponentKey("serving", "llm")
    with ThreadPoolExecutor(max_workers=1) as pool:
        forecasts = DemandForecasts(executor=pool, step_s=300.0)
        for minute in range(1, 13):
            forecasts.record(key, now_s=60.0 * minute, demand=1000.0)
        forecasts.record(key, now_s=60.0 * 12 + 12 * 3600, demand=1000.0)  # the misstep
        forecasts.record(key, now_s=60.0 * 13, demand=1000.0)  # corrected
        assert forecasts.forecast(key, horizon_s=300.0, now_s=60.0 * 13) is None
        assert not forecasts.status(key).backfilled  # to be read again
        assert forecasts._fitter.last_window_end_s(key) is None
        for minute in range(14, 26):  # live again, on the corrected clock
            forecasts.record(key, now_s=60.0 * minute, demand=1000.0)
        last_end_s = forecasts._fitter.last_window_end_s(key)
        assert last_end_s is not None and last_end_s <= 60.0 * 25
        assert forecasts.forecast(key, horizon_s=300.0, now_s=60.0 * 25) is not None
        # a step back of minutes drops only those readings: the fleet keeps its history
        forecasts.record(key, now_s=60.0 * 25 + 1800, demand=1000.0)
        ahead_end_s = forecasts._fitter.last_window_end_s(key)
        forecasts.record(key, now_s=60.0 * 26, demand=1000.0)
        assert forecasts._fitter.last_window_end_s(key) == ahead_end_s
        assert forecasts.forecast(key, horizon_s=300.0, now_s=60.0 * 26) is not None


def test_stopping_the_fit_pool_ends_a_fit_in_progress() -> None:
    executor = fit_executor()
    fitting = executor.submit(time.sleep, 60)  # a fit far longer than any real one
    while not executor._processes or not all(p.is_alive() for p in executor._processes.values()):
        time.sleep(0.05)
    workers = list(executor._processes.values())
    manager = executor._executor_manager_thread
    started = time.monotonic()
    _stop_executor(executor)
    # The worker is gone and the pool's thread has closed its pipes: the service exits now,
    # not after the fit, and nothing is left to race the interpreter's exit.
    assert time.monotonic() - started < 5
    for worker in workers:
        worker.join(timeout=5)
        assert not worker.is_alive()
    assert manager is not None and not manager.is_alive()
    assert fitting.done()


def test_a_fit_stuck_in_the_worker_is_counted_once_by_the_tick() -> None:
    key = ComponentKey("serving", "llm")
    release = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(release.wait, 30)  # holds the one worker, as a hung fit would
        forecasts = DemandForecasts(executor=pool, step_s=300.0, fit_timeout_s=60.0)
        for minute in range(1, 13):
            forecasts.record(key, now_s=60.0 * minute, demand=1000.0)
        assert forecasts.tick(now_s=720.0) == 0  # submitted, queued behind the stuck one
        assert forecasts.tick(now_s=780.0) == 0
        assert forecasts.tick(now_s=781.0) == 1  # overdue: abandoned, and said so once
        assert forecasts.tick(now_s=790.0) == 0
        assert "did not finish within 60 s" in (forecasts.status(key).last_fit_error or "")
        release.set()


def test_forecasts_of_components_that_are_gone_or_changed_unit_are_forgotten() -> None:
    """A deleted component's history stayed in memory and was refitted every refit interval,
    taking the one fit worker from live components; a component whose `component` kind
    changed kept forecasting prompt tokens/s as generated tokens/s."""
    kept, deleted, flipped = (ComponentKey("serving", n) for n in ("kept", "deleted", "flipped"))
    identities = {kept: ("u1", "prompt"), deleted: ("u2", "prompt"), flipped: ("u3", "prompt")}
    with ThreadPoolExecutor(max_workers=1) as pool:
        forecasts = DemandForecasts(executor=pool, step_s=60.0, refit_interval_s=60.0)
        assert forecasts.keep_only(identities) == []
        for minute in range(1, 13):
            for key in identities:
                forecasts.record(key, now_s=60.0 * minute, demand=1000.0)
        forecasts.tick(now_s=720.0)  # a fit in flight
        forgotten = forecasts.keep_only({kept: ("u1", "prompt"), flipped: ("u3", "generated")})
        assert sorted(forgotten) == sorted([deleted, flipped])
        assert forecasts.forecast(deleted, horizon_s=300.0, now_s=720.0) is None
        assert forecasts.forecast(flipped, horizon_s=300.0, now_s=720.0) is None
        assert forecasts.forecast(kept, horizon_s=300.0, now_s=720.0) is not None
        # only the live series is held, and fitted, from now on
        assert set(forecasts._fitter._series) == {kept}
        for now_s in range(780, 1500, 60):
            forecasts.tick(now_s=float(now_s))
            time.sleep(0.05)
        assert forecasts.status(kept).fits_completed >= 1
        assert set(forecasts._fitter._series) == {kept}
        assert forecasts.keep_only({kept: ("u1", "prompt"), flipped: ("u3", "generated")}) == []


async def test_back_fills_cannot_take_the_threads_the_tick_queries_need() -> None:
    """Range queries of eight new LWS's back-fills, all slow: the tick's instant queries
    still answer. On the loop's default pool (6 threads on 2 CPUs) they waited behind them."""
    release = asyncio.Event()

    async def prometheus(request: web.Request) -> web.Response:
        if request.path.endswith("/query_range"):
            await release.wait()
            return web.json_response(
                {"status": "success", "data": {"resultType": "matrix", "result": []}}
            )
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": []}}
        )

    keys = [ComponentKey("serving", f"llm-{i}") for i in range(8)]
    async with serve(prometheus) as (url, _):
        source = PrometheusSource(url=url, timeout_s=60)
        backfills = [
            asyncio.create_task(
                source.backfill_demand([(key, Component.PREFILL)], end_s=time.time(), days=1)
            )
            for key in keys
        ]
        try:
            await asyncio.sleep(0.5)  # every back-fill has sent its first range query
            target = ComponentTarget(
                key=keys[0], component=Component.PREFILL, ready_group_indexes=frozenset({0})
            )
            signals = await asyncio.wait_for(source.observe([target]), timeout=20)
            assert keys[0] in signals
            assert not any(task.done() for task in backfills)  # still held by Prometheus
        finally:
            release.set()
            await asyncio.gather(*backfills, return_exceptions=True)
            source.close()


def test_lws_held_on_a_policy_problem_report_under_their_own_names() -> None:
    # two decode LWS in one deployment (as both generations of a DisaggregatedSet role are
    # mid-rollout): both held, and under one (namespace, deployment, component) their series
    # were one, and the alerts joining on `component_info` failed for the whole cluster
    on = {"gang-autoscaler.io/enabled": "true", "gang-autoscaler.io/deployment": "llama"}
    lws = [
        vllm_lws(
            name="llama-prefill", annotations={**on, "gang-autoscaler.io/component": "prefill"}
        ),
        vllm_lws(name="llama-decode", annotations={**on, "gang-autoscaler.io/component": "decode"}),
        vllm_lws(
            name="llama-decode-2", annotations={**on, "gang-autoscaler.io/component": "decode"}
        ),
    ]
    state = build_state(lws_objects=lws, pods=[], nodes=[], now_s=0.0)
    labels = {key.lws: component_labels(state, key) for key in state.components}
    assert {k.lws for k in state.problems} == {"llama-decode", "llama-decode-2"}
    assert {n: (lb.deployment, lb.component) for n, lb in labels.items()} == {
        "llama-prefill": ("llama", "prefill"),
        "llama-decode": ("llama-decode", "decode"),
        "llama-decode-2": ("llama-decode-2", "decode"),
    }
    # a usable deployment keeps its name
    usable = build_state(lws_objects=lws[:2], pods=[], nodes=[], now_s=0.0)
    assert {component_labels(usable, k).deployment for k in usable.components} == {"llama"}


@pytest.mark.parametrize(
    ("wall_step_s", "mono_age_s", "healthy"),
    [
        pytest.param(-86_400.0, 300.0, False, id="clock-back-a-day-hides-no-stall"),
        pytest.param(+86_400.0, 5.0, True, id="clock-ahead-a-day-restarts-nothing"),
        pytest.param(0.0, 5.0, True, id="ticking"),
        pytest.param(0.0, 300.0, False, id="stalled"),
    ],
)
def test_health_ages_the_last_tick_on_the_monotonic_clock(
    wall_step_s: float, mono_age_s: float, healthy: bool
) -> None:
    """A tick's age was the wall clock's now minus its wall-clock finish: a step back of a
    day kept a stalled loop healthy for a day; a step ahead failed the probe of a healthy
    one, and the kubelet restarted it."""
    from types import SimpleNamespace

    from autoscaler.service.app import Service

    finished_wall = 1_000_000.0
    record = TickRecord(
        number=3, started_at_s=finished_wall - 0.1, duration_s=0.1, cpu_s=0.1, leader=True,
        dry_run=False, outcome="ok", finished_mono_s=time.monotonic() - mono_age_s,
    )  # fmt: skip
    service = SimpleNamespace(
        loop=SimpleNamespace(last=record, ticks=3),
        tick_s=15.0,
        deadline_s=15.0,
        _clock=lambda: finished_wall + mono_age_s + wall_step_s,
    )
    probe = Service.health(service)  # type: ignore[arg-type]
    assert probe.ok is healthy


def test_a_clock_step_back_is_said_once_per_component(caplog):
    """NTP stepping the clock back 10 minutes: every dropped reading was a warning, once per
    component per tick (7,800 lines for 200 components)."""
    keys = [ComponentKey("serving", f"llm-{i}") for i in range(3)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        forecasts = DemandForecasts(executor=pool, step_s=300.0)
        now_s = 1_000_000.0
        for _ in range(40):
            now_s += 15
            for key in keys:
                forecasts.record(key, now_s=now_s, demand=100.0)
        caplog.set_level(logging.WARNING)
        caplog.clear()
        now_s -= 600
        for _ in range(40):
            now_s += 15
            for key in keys:
                forecasts.record(key, now_s=now_s, demand=100.0)
    dropped = [r for r in caplog.records if "dropped demand observation" in r.getMessage()]
    assert len(dropped) == len(keys)
