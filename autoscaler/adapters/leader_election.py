"""Leader election on a `coordination.k8s.io` Lease, with kubernetes-asyncio's elector.

Two replicas run; only the Lease holder writes. The library's `LeaderElection` does the
acquire/renew protocol; this module adds what the service needs around it:

- `is_leader` is True only while the last successful renewal is younger than the renew
  deadline (by the monotonic clock), which is shorter than the lease duration a standby
  waits out. A leader whose renewals stall (a partition, a blocked loop) stops writing before
  a standby can take over, so two instances never write at once.
- After losing the lease the instance becomes a candidate again.
- `stop()` releases the Lease (empty holder, 1 s duration, as client-go's ReleaseOnCancel),
  so a standby takes over at its next retry instead of after the full lease duration.
- A Lease call that gets no answer (a dropped connection, a timeout) is a failed try, as in
  client-go, not an exception out of the elector: the library catches only error answers.
  Each call is limited to half the renew deadline, so a silent API server cannot hold a
  renewal past the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, cast

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from autoscaler.adapters.kube_client import TimedApi
from autoscaler.adapters.kube_errors import API_CALL_ERRORS, describe

log = logging.getLogger(__name__)


def _no_answer(err: Exception) -> ApiException:
    """A lost answer in the shape the library's elector reads from a failed `get`."""
    failure = ApiException(status=HTTPStatus.SERVICE_UNAVAILABLE, reason=describe(err))
    failure.body = json.dumps({"code": int(HTTPStatus.SERVICE_UNAVAILABLE)}).encode()
    return failure


class _TimedLeaseLock(LeaseLock):
    """A LeaseLock that remembers when this candidate last wrote the Lease successfully, and
    counts a call with no answer as a failed one."""

    def __init__(
        self, *args: Any, clock: Callable[[], float], request_timeout_s: float, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.api_instance = cast(
            client.CoordinationV1Api, TimedApi(self.api_instance, timeout_s=request_timeout_s)
        )
        self._clock = clock
        self.last_write_s: float | None = None

    async def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            return await super().get(name, namespace)  # an error answer comes back as data
        except API_CALL_ERRORS as err:
            log.warning("reading the leader lease: %s", describe(err))
            return False, _no_answer(err)

    async def create(
        self, name: str, namespace: str, election_record: LeaderElectionRecord
    ) -> bool:
        return await self._write(super().create(name, namespace, election_record))

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        return await self._write(super().update(name, namespace, updated_record))

    async def _write(self, call: Awaitable[bool]) -> bool:
        started = self._clock()
        try:
            ok = await call
        except API_CALL_ERRORS as err:
            log.warning("writing the leader lease: %s", describe(err))
            return False
        if ok:
            self.last_write_s = started
        return ok


class LeaderElector:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        identity: str,
        lease_namespace: str,
        lease_name: str = "gang-autoscaler",
        lease_duration_s: int = 15,
        renew_deadline_s: int = 10,
        retry_period_s: int = 2,
        on_started_leading: Callable[[], Awaitable[None]] | None = None,
        on_stopped_leading: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity = identity
        self._api_client = api_client
        self._clock = clock
        self._lock = _TimedLeaseLock(
            lease_name,
            lease_namespace,
            identity,
            api_client=api_client,
            clock=clock,
            request_timeout_s=renew_deadline_s / 2,
        )
        self._renew_deadline_s = renew_deadline_s
        self._config_args = (lease_duration_s, renew_deadline_s, retry_period_s)
        # Fail at construction, not in a background task, on inconsistent durations.
        self._new_config()
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._leading = False
        self._task: asyncio.Task[None] | None = None
        # The elector runs the leading callback as its own task and cancels it only when a
        # renewal fails; stop() cancels it too.
        self._lead_task: asyncio.Task[Any] | None = None
        self.became_leader = asyncio.Event()
        self.terms = 0  # how many times this instance became leader

    def _new_config(self) -> electionconfig.Config:
        lease_duration_s, renew_deadline_s, retry_period_s = self._config_args
        return electionconfig.Config(
            self._lock,
            lease_duration=lease_duration_s,
            renew_deadline=renew_deadline_s,
            retry_period=retry_period_s,
            onstarted_leading=self._lead,
            onstopped_leading=self._stopped,
        )

    @property
    def is_leader(self) -> bool:
        last = self._lock.last_write_s
        return self._leading and last is not None and self._clock() - last < self._renew_deadline_s

    async def _lead(self) -> None:
        term = asyncio.current_task()
        self._lead_task = term
        self._leading = True
        self.terms += 1
        self.became_leader.set()
        log.info("%s became leader", self.identity)
        try:
            if self._on_started is not None:
                await self._on_started()
            await asyncio.Event().wait()  # until the elector cancels us on a lost lease
        finally:
            if self._lead_task is term:  # a late end of an old term must not end this one
                self._leading = False
                self.became_leader.clear()

    async def _end_term(self) -> None:
        """Cancel the leading task of the term that just ended, and wait for it: the elector
        cancels it without waiting, and not at all when its renew loop raised."""
        task, self._lead_task = self._lead_task, None
        self._leading = False
        self.became_leader.clear()
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _stopped(self) -> None:
        self._leading = False
        self.became_leader.clear()
        log.warning("%s lost the leader lease", self.identity)
        if self._on_stopped is not None:
            await self._on_stopped()

    async def _run(self) -> None:
        while True:
            try:
                await leaderelection.LeaderElection(self._new_config()).run()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the elector must outlive API errors
                log.warning("leader election failed: %r; retrying", err)
            await self._end_term()
            await asyncio.sleep(self._config_args[2])

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"leader-election-{self.identity}")

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning; if this instance holds the Lease, hand it back."""
        was_leader = self._leading
        self._leading = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._end_term()
        if release and was_leader:
            await self._release()

    async def _release(self) -> None:
        # Bounded: on shutdown an API server that accepts the request and never answers would
        # otherwise hold the pod until the kubelet kills it. Past one lease duration the Lease
        # has expired anyway, so a release that has not finished by then is moot.
        limit_s = self._config_args[0]
        try:
            await asyncio.wait_for(self._try_release(limit_s), timeout=limit_s)
        except TimeoutError:
            log.warning("releasing the lease got no answer within %gs; it expires on its own",
                        limit_s)  # fmt: skip

    async def _try_release(self, timeout_s: float) -> None:
        api: Any = TimedApi(client.CoordinationV1Api(self._api_client), timeout_s=timeout_s)
        try:
            lease = await api.read_namespaced_lease(self._lock.name, self._lock.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = ""
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = datetime.now(UTC)
            # Conditional on the version just read: never clear a lease someone else took.
            await api.replace_namespaced_lease(self._lock.name, self._lock.namespace, lease)
            log.info("%s released the leader lease", self.identity)
        except API_CALL_ERRORS as err:
            log.warning("releasing the lease failed: %s", describe(err))
