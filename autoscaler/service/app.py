"""`gang-autoscaler run`: the long-running service, wired from its settings.

`run_service(settings)` is what the command calls: it sets up logging, connects to the
cluster, starts a `Service` and runs it until SIGTERM or SIGINT. `Service` is also what the
end-to-end tests start in-process, with the fake API server's client and short intervals.

Shutdown: on the signal the loop stops starting ticks; a tick in flight gets
`shutdown_grace_s` to finish (every action is idempotent, so abandoning one is safe), then
the Lease is released so a standby takes over at its next retry rather than after the
lease expires, and the HTTP server, watches and fit workers stop.

Dry-run instances never campaign for the Lease: a shadow instance deciding beside the real
one must not take leadership away from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from autoscaler.adapters.kube_adapter import KubeAdapter
from autoscaler.adapters.kube_client import DEFAULT_REQUEST_TIMEOUT_S, new_api_client
from autoscaler.adapters.kube_errors import KubeAdapterError
from autoscaler.adapters.leader_election import LeaderElector
from autoscaler.adapters.prometheus_source import PrometheusSource
from autoscaler.core.capacity import MAX_GAP_WINDOWS
from autoscaler.service.capacity_restore import CapacityRestore
from autoscaler.service.control_loop import ControlLoop
from autoscaler.service.decisions_view import decisions_view
from autoscaler.service.forecasts import (
    DEFAULT_REFIT_INTERVAL_S,
    DEFAULT_STEP_S,
    DemandForecasts,
)
from autoscaler.service.http_api import HttpServer, Probe
from autoscaler.service.logs import configure_logging
from autoscaler.service.metrics import ServiceMetrics
from autoscaler.service.settings import MIN_LEASE_DURATION_S, RunSettings

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_SHUTDOWN_GRACE_S = 5.0
# /healthz fails after this many tick intervals without a finished tick (and never sooner
# than the tick deadline plus the interval: a tick that times out is still a live loop).
STALL_TICKS = 3


def lease_timing(lease_duration_s: float) -> tuple[int, int, int]:
    """(lease duration, renew deadline, retry period) in whole seconds, in client-go's
    default proportions (15 s, 10 s, 2 s). The renew deadline stays below the lease duration
    so a leader that cannot renew stops writing before a standby may take over."""
    lease_s = int(lease_duration_s)
    if lease_s < MIN_LEASE_DURATION_S:  # refused earlier, by the settings
        raise ValueError(
            f"lease duration must be at least {MIN_LEASE_DURATION_S}s, got {lease_duration_s:g}s"
        )
    retry_s = max(1, lease_s // 7)
    renew_s = max(retry_s + 1, lease_s * 2 // 3)
    return lease_s, renew_s, retry_s


def kube_request_timeout(deadline_s: float, *, write_margin_s: float | None = None) -> float:
    """Request timeout of one Kubernetes call outside the watches: a third of the tick's
    deadline at most, so a component whose call got no answer is reported as such while the
    tick still has time for the others and for reporting; never above the adapter's default,
    and a second at least, which a busy API server may need even on a sub-second tick.

    With leader election, never above `write_margin_s`, the lease duration less the renew
    deadline: a write sent while the Lease is still held then lands before a standby may
    take it over (5 s at the defaults, 2 s at `--lease-duration 6s`)."""
    timeout_s = max(1.0, min(DEFAULT_REQUEST_TIMEOUT_S, deadline_s / 3))
    return timeout_s if write_margin_s is None else min(timeout_s, write_margin_s)


def default_identity() -> str:
    """The pod name (POD_NAME from the chart's downward API, else the hostname) and a
    per-process suffix, as client-go does, so a restarted pod is a new candidate and never
    inherits a stale term; the Lease's holder then names the pod to look at."""
    pod = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{pod}_{uuid.uuid4().hex[:8]}"


def default_lease_namespace() -> str:
    with contextlib.suppress(OSError):
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    return os.environ.get("POD_NAMESPACE") or "default"


def fit_executor() -> ProcessPoolExecutor:
    """One worker process: statsmodels holds the GIL while fitting (see forecasting.fitter)."""
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def replace_fit_executor(old: Executor) -> ProcessPoolExecutor:
    """A new fit pool; the old one is stopped (its worker terminated, ending a hung fit) in
    a thread, as joining its manager thread may take a moment the tick does not have."""
    threading.Thread(target=_stop_executor, args=(old,), name="stop-fit-pool", daemon=True).start()
    return fit_executor()


def _stop_executor(executor: Executor) -> None:
    # Read before `shutdown`, which drops both references.
    processes = list((getattr(executor, "_processes", None) or {}).values())
    manager = getattr(executor, "_executor_manager_thread", None)
    executor.shutdown(wait=False, cancel_futures=True)
    # A fit in progress would otherwise hold up the exit until it ends; its result is not
    # needed (the next start back-fills and fits again).
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()
    # The pool's manager thread sees the worker gone and closes its pipes. Left to run into
    # interpreter exit, it races Python 3.11's exit hook, which may write to a pipe being
    # closed ("Exception ignored ... Bad file descriptor").
    if manager is not None:
        manager.join(timeout=5.0)


class Service:
    """The control loop, leader election and HTTP endpoints of one instance."""

    def __init__(
        self,
        settings: RunSettings,
        *,
        api_client: client.ApiClient,
        identity: str | None = None,
        executor: Executor | None = None,
        forecast_step_s: float = DEFAULT_STEP_S,
        refit_interval_s: float = DEFAULT_REFIT_INTERVAL_S,
        http_host: str | None = None,
        shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.identity = identity or default_identity()
        self.metrics = ServiceMetrics(dry_run=settings.dry_run)
        self._api_client = api_client
        self._clock = clock
        self.shutdown_grace_s = shutdown_grace_s
        self.tick_s = settings.tick_s
        # A tick must end before the next one is due.
        self.deadline_s = settings.tick_s
        self._stopping = False
        self._started_mono = time.monotonic()
        self._owns_executor = executor is None
        self._executor = executor if executor is not None else fit_executor()

        self.elector: LeaderElector | None = None
        request_timeout_s = kube_request_timeout(self.deadline_s)
        if not settings.dry_run:
            lease_s, renew_s, retry_s = lease_timing(settings.lease_duration_s)
            request_timeout_s = kube_request_timeout(
                self.deadline_s, write_margin_s=lease_s - renew_s
            )
            self.elector = LeaderElector(
                api_client,
                identity=self.identity,
                lease_namespace=settings.lease_namespace or default_lease_namespace(),
                lease_name=settings.lease_name,
                lease_duration_s=lease_s,
                renew_deadline_s=renew_s,
                retry_period_s=retry_s,
                on_error=lambda: self.metrics.count_error("lease"),
            )
        self.kube = KubeAdapter(
            api_client,
            namespaces=settings.namespaces or None,
            may_write=self._may_write,
            can_grow=settings.cluster_can_grow,
            watch_staleness_limit_s=settings.watch_staleness_limit_s,
            event_instance=self.identity,
            default_annotations=settings.buffer.annotations(),
            balloon_image=settings.balloon_image,
            request_timeout_s=request_timeout_s,
        )
        self.prometheus = PrometheusSource(
            url=settings.prometheus_url,
            credentials=settings.prometheus_credentials,
            queries=settings.queries,
            # Half the tick at most: a slow Prometheus leaves time to plan (holding) and report.
            timeout_s=min(settings.prometheus_timeout_s, self.deadline_s / 2),
            staleness_limit_s=settings.staleness_limit_s,
            on_error=lambda error: self.metrics.count_error("prometheus"),
        )
        self.forecasts = DemandForecasts(
            executor=self._executor,
            model=settings.forecast_model,
            step_s=forecast_step_s,
            refit_interval_s=refit_interval_s,
            backfill_days=settings.backfill_days,
            replace_executor=self._replace_executor if self._owns_executor else None,
        )
        # The learned capacity is looked up over the same days as the demand history.
        self.capacity_restore = CapacityRestore(
            lookback_s=settings.backfill_days * 86_400, dry_run=settings.dry_run
        )
        self.loop = ControlLoop(
            kube=self.kube,
            prometheus=self.prometheus,
            forecasts=self.forecasts,
            capacity_restore=self.capacity_restore,
            metrics=self.metrics,
            is_leader=self.is_leader,
            leader_term=lambda: self.elector.terms if self.elector is not None else 0,
            on_became_leader=self._became_leader,
            dry_run=settings.dry_run,
            deadline_s=self.deadline_s,
            demand_window_s=settings.demand_window_s,
            clock=clock,
        )
        self.http = HttpServer(self, host=http_host, port=settings.http_port)

    # -- leadership -----------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.elector is not None and self.elector.is_leader

    def _may_write(self) -> bool:
        # In dry-run the actuator is called with dry_run=True and writes nothing; it still
        # checks this before reading what it would do.
        return self.settings.dry_run or self.is_leader()

    async def _became_leader(self, now_s: float) -> None:
        """Once per term, before the first write: the /scale writes of an earlier term are
        forgotten (another leader may have written since), the balloon PriorityClass exists,
        and balloon gangs left partial by a crash are removed (the plan recreates them whole)."""
        log.info("%s is the leader; preparing to act", self.identity)
        self.kube.scaler.forget_writes()
        self.kube.actuator.forget_balloon_sightings()
        try:
            await self.kube.ensure_priority_class()
        except KubeAdapterError as err:
            self.metrics.count_error("kubernetes")
            log.error("balloon PriorityClass: %s", err)
        try:
            removed = await self.kube.repair_balloons(now_s=now_s)
        except KubeAdapterError as err:
            self.metrics.count_error("kubernetes")
            log.error("repairing balloon gangs failed: %s", err)
        else:
            if removed:
                log.info("removed %d members of partial balloon gangs: %s", len(removed), removed)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, *, sync_timeout_s: float = 30.0) -> None:
        """Serve the endpoints, sync the watch caches, start campaigning for the Lease."""
        self._started_mono = time.monotonic()
        await self.http.start()
        await self.kube.start(sync_timeout_s=sync_timeout_s)
        if self.elector is not None:
            self.elector.start()
        self.metrics.set_leader(False)
        log.info(
            "started %s: tick %gs, %s, http port %d, capacity planned from the %s forecast",
            self.identity,
            self.tick_s,
            "dry-run" if self.settings.dry_run else "leader election on",
            self.http.port,
            self.settings.forecast_model,
        )
        if self.prometheus.timeout_s < self.settings.prometheus_timeout_s:
            # At the defaults (10s, a 15s tick) this is expected, and said at INFO; another
            # deadline that does not apply was set on purpose: a WARNING. (Which fields were
            # given is lost: the settings are validated again once merged, and the chart
            # writes every one.)
            default = type(self.settings).model_fields["prometheus_timeout"].default
            log.log(
                logging.WARNING if self.settings.prometheus_timeout != default else logging.INFO,
                "Prometheus queries get %gs, half the %gs tick, not prometheus-timeout's %gs: "
                "a slow Prometheus must leave the tick time to plan and report; a longer "
                "deadline needs a longer tick",
                self.prometheus.timeout_s,
                self.tick_s,
                self.settings.prometheus_timeout_s,
            )
        rate_window_s = self.settings.queries.demand_rate_window_s()
        if rate_window_s is not None and rate_window_s > self.settings.demand_window_s:
            log.warning(
                "the demand queries' rate() reads %gs, longer than demand-window's %gs: a "
                "capacity per gang would be learned from a stretch at target shorter than the "
                "rate() it reads, which still holds the quieter seconds before it, so it "
                "learns low; set demand-window to %gs with the queries",
                rate_window_s,
                self.settings.demand_window_s,
                rate_window_s,
            )
        if self.tick_s > MAX_GAP_WINDOWS * self.settings.demand_window_s:
            log.warning(
                "tick %gs is more than %g demand windows (%gs): no capacity per gang can be "
                "learned, since readings that far apart leave the window between them unseen; "
                "set capacity-per-replica on the LWS objects, or a shorter tick",
                self.tick_s,
                MAX_GAP_WINDOWS,
                self.settings.demand_window_s,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every `tick_s` until `stop` is set; a tick in flight then gets the grace."""
        next_due = time.monotonic()
        while not stop.is_set():
            tick = asyncio.create_task(self.loop.tick(), name=f"tick-{self.loop.ticks + 1}")
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({tick, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not tick.done():
                log.info("stopping: giving the tick in flight %gs", self.shutdown_grace_s)
                done, _ = await asyncio.wait({tick}, timeout=self.shutdown_grace_s)
                if not done:
                    log.warning("abandoning the tick in flight")
                    tick.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await tick
                break
            stopped.cancel()
            next_due += self.tick_s
            delay_s = next_due - time.monotonic()
            if delay_s < 0:  # a tick ran long: skip the missed slots rather than burst
                next_due = time.monotonic()
                delay_s = 0.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay_s)

    async def close(self, *, release_lease: bool = True) -> None:
        """Stop everything; `release_lease=False` leaves the Lease to expire (a crash)."""
        self._stopping = True
        if self.elector is not None:
            await self.elector.stop(release=release_lease)
        self.metrics.set_leader(False)
        await self.forecasts.close()
        await self.capacity_restore.close()
        await self.kube.close()
        await self.http.stop()
        self.prometheus.close()
        if self._owns_executor:
            _stop_executor(self._executor)

    def _replace_executor(self, old: Executor) -> Executor:
        self._executor = replace_fit_executor(old)
        return self._executor

    # -- what the endpoints read ----------------------------------------------------------

    def health(self) -> Probe:
        record = self.loop.last
        limit_s = max(STALL_TICKS * self.tick_s, self.tick_s + self.deadline_s)
        if record is None:
            age_s = time.monotonic() - self._started_mono
            return Probe(age_s < limit_s + 30.0, {"ticks": 0, "since_start_s": round(age_s, 3)})
        if record.finished_mono_s is not None:
            age_s = time.monotonic() - record.finished_mono_s
        else:
            age_s = self._clock() - (record.started_at_s + record.duration_s)
        return Probe(
            age_s < limit_s,
            {
                "ticks": self.loop.ticks,
                "last_tick_age_s": round(age_s, 3),
                "last_tick_outcome": record.outcome,
            },
        )

    def readiness(self) -> Probe:
        synced = {c.name: c.synced.is_set() for c in self.kube.caches}
        failing = {c.name: round(c.failing_for_s(), 3) for c in self.kube.caches}
        stale = self.kube.stale_view()
        role = "dry-run" if self.settings.dry_run else ("leader" if self.is_leader() else "standby")
        # A standby that cannot read the Lease would never take over: not ready, so that a
        # rollout stops and the probe says why, not only the NoLeader alert once it matters.
        # At least a lease duration: a Lease answered every retry period is never late by
        # the watch limit's short test values.
        lease = (
            None
            if self.elector is None
            else self.elector.lease_problem(
                limit_s=max(self.settings.watch_staleness_limit_s, self.settings.lease_duration_s)
            )
        )
        ok = all(synced.values()) and stale is None and lease is None and not self._stopping
        details = {
            "caches_synced": synced,
            "caches_failing_s": failing,
            # optional collections (DisaggregatedSetRoleScalers) whose API is absent or denied
            "caches_unavailable": {
                c.name: c.unavailable for c in self.kube.caches if c.unavailable is not None
            },
            "role": role,
            "identity": self.identity,
        }
        if stale is not None:
            details["stale"] = stale
        if lease is not None:
            details["lease"] = lease
        return Probe(ok, details)

    def metrics_exposition(self) -> tuple[bytes, str]:
        return self.metrics.exposition()

    def decisions(self) -> dict[str, Any]:
        return decisions_view(
            self.loop.last,
            last_planned=self.loop.last_planned,
            forecast_status=self.forecasts.status,
        )


async def serve(settings: RunSettings, *, stop: asyncio.Event | None = None) -> int:
    """Connect, start, run until `stop` (or SIGTERM/SIGINT), shut down; the exit code."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    try:
        api_client = await new_api_client(kubeconfig=settings.kubeconfig)
    except KubeAdapterError as err:
        log.error("cannot connect to Kubernetes: %s", err)
        return 1
    try:
        service = Service(settings, api_client=api_client)
        try:
            await service.start()
        except (KubeAdapterError, OSError) as err:
            log.error("cannot start: %s", err)
            await service.close()
            return 1
        try:
            await service.run(stop)
        finally:
            await service.close()
    finally:
        await api_client.close()
    log.info("stopped")
    return 0


def run_service(settings: RunSettings) -> int:
    """Entry point of `gang-autoscaler run`."""
    configure_logging(settings.log_format, level=logging.getLevelName(settings.log_level))
    return asyncio.run(serve(settings))
