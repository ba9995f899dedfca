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
- A leader that reads another holder in the Lease (it was deleted, and a standby created it
  afresh) stops at once, not at its renew deadline; and an instance whose term follows
  another holder's acts only once that holder's lease duration has passed since its record
  was first read, so the Lease deleted under a leader cannot give two writers.
- A holder's lease expires after the duration written in the Lease, as in client-go, not
  the reader's own: replicas rolled out with another `--lease-duration` do not take over
  early.
- A Lease that cannot be read or written (its Role missing, `--lease-namespace` naming no
  namespace) is logged once per distinct cause with the API server's message, counted
  (`on_error`), and said by `lease_problem` (the service's `/readyz`).
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
from autoscaler.adapters.kube_errors import API_CALL_ERRORS, describe, status_of

log = logging.getLogger(__name__)


def _no_answer(err: Exception) -> ApiException:
    """A lost answer in the shape the library's elector reads from a failed `get`."""
    failure = ApiException(status=HTTPStatus.SERVICE_UNAVAILABLE, reason=describe(err))
    failure.body = json.dumps({"code": int(HTTPStatus.SERVICE_UNAVAILABLE)}).encode()
    return failure


class _TimedLeaseLock(LeaseLock):
    """A LeaseLock that remembers when this candidate last wrote the Lease successfully and
    when another holder's record was first read, counts a call with no answer as a failed
    one, and says why a call failed once per cause."""

    def __init__(
        self,
        *args: Any,
        clock: Callable[[], float],
        request_timeout_s: float,
        on_error: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.api_instance = cast(
            client.CoordinationV1Api, TimedApi(self.api_instance, timeout_s=request_timeout_s)
        )
        self._clock = clock
        self._on_error = on_error
        self.last_write_s: float | None = None
        # the last answer about the Lease (found, or not there), and the last failure's cause
        self.last_read_s: float | None = None
        self.problem: str | None = None
        # another holder's record as last read, when it was first read, and its duration
        self._other: tuple[Any, ...] | None = None
        self.other_seen_s: float | None = None
        self.other_duration_s = 0.0

    async def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            found, record = await super().get(name, namespace)  # an error comes back as data
        except API_CALL_ERRORS as err:
            self._failed("reading", err)
            return False, _no_answer(err)
        if found:
            self._answered()
            if isinstance(record, LeaderElectionRecord):
                self._observe(record)
        elif isinstance(record, ApiException) and record.status == HTTPStatus.NOT_FOUND:
            self._answered()  # no Lease yet: the elector creates it
            self._other = None
        elif isinstance(record, Exception):
            self._failed("reading", record)
        return found, record

    def _observe(self, record: LeaderElectionRecord) -> None:
        holder = record.holder_identity
        if not holder:
            # released: its holder stopped before it let go, so a term may act at once
            self._other = self.other_seen_s = None
            return
        if holder == self.identity:
            self._other = None
            return
        # Another instance holds it: this one is no leader from now on, whatever its last
        # renewal (the Lease was deleted and recreated by a standby).
        self.last_write_s = None
        seen = (holder, record.renew_time, record.lease_duration, record.acquire_time)
        if seen != self._other:
            self._other = seen
            self.other_seen_s = self._clock()
            try:
                self.other_duration_s = float(record.lease_duration or 0)
            except ValueError:
                self.other_duration_s = 0.0

    async def create(
        self, name: str, namespace: str, election_record: LeaderElectionRecord
    ) -> bool:
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=name), spec=self.update_lease(election_record)
        )
        return await self._write(
            "creating", self.api_instance.create_namespaced_lease(namespace, body)
        )

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        # The holder's own duration, as client-go reads it: one rolled out with a longer
        # `--lease-duration` is still leading when this reader's shorter one has passed.
        if (
            self._other is not None
            and self.other_seen_s is not None
            and self._clock() - self.other_seen_s < self.other_duration_s
        ):
            return False
        if self.lease_reference is None:
            return False
        self.lease_reference.spec = self.update_lease(updated_record, self.lease_reference.spec)
        return await self._write(
            "updating",
            self.api_instance.replace_namespaced_lease(
                name=name, namespace=namespace, body=self.lease_reference
            ),
        )

    async def _write(self, action: str, call: Awaitable[Any]) -> bool:
        started = self._clock()
        try:
            await call
        except ApiException as err:
            if err.status == HTTPStatus.CONFLICT:
                # another candidate wrote it first (a takeover race): a lost try, no fault
                self._answered()
                log.info("%s the leader lease: another instance wrote it first", action)
                return False
            self._failed(action, err)
            return False
        except API_CALL_ERRORS as err:
            self._failed(action, err)
            return False
        self._answered()
        self.last_write_s = started
        return True

    def _answered(self) -> None:
        self.last_read_s = self._clock()
        if self.problem is not None:
            log.info("the leader lease %s/%s answers again", self.namespace, self.name)
            self.problem = None

    def _failed(self, action: str, err: Exception) -> None:
        problem = f"{action} the leader lease {self.namespace}/{self.name}: {describe(err)}"
        if status_of(err) == HTTPStatus.FORBIDDEN:
            problem += (
                " (the service account needs get, create and update on leases in that "
                "namespace: the chart's Lease Role)"
            )
        elif status_of(err) == HTTPStatus.NOT_FOUND:
            problem += " (does the namespace exist? --lease-namespace)"
        if self._on_error is not None:
            self._on_error()
        if problem != self.problem:
            log.warning("%s; this instance cannot lead until it can", problem)
            self.problem = problem


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
        on_error: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_error` is called for every Lease call that failed (not a lost race)."""
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
            on_error=on_error,
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
        self._started_s: float | None = None

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
        now = self._clock()
        if not (self._leading and last is not None and now - last < self._renew_deadline_s):
            return False
        # A term that follows another holder's record (a Lease deleted under it and created
        # afresh here) waits until that holder has stopped: by its renew deadline, which is
        # within its lease duration (its own, written in the Lease: a replica of a rollout
        # that changed it may have a longer one than this).
        other_s = self._lock.other_seen_s
        wait_s = max(self._renew_deadline_s, self._lock.other_duration_s)
        return other_s is None or now - other_s >= wait_s

    def lease_problem(self, *, limit_s: float) -> str | None:
        """Why this instance could not lead now: the last failed Lease call's cause, when no
        Lease call has been answered for `limit_s` (since the start, before any answer)."""
        if self._started_s is None:
            return None
        answered_s = self._lock.last_read_s
        since_s = self._started_s if answered_s is None else answered_s
        if self._clock() - since_s <= limit_s:
            return None
        return self._lock.problem or f"no answer about the leader lease for over {limit_s:g}s"

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
        if self._started_s is None:
            self._started_s = self._clock()
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
