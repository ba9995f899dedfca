"""Kubernetes Events on the LWS: every scaling decision, rejected policy, rolled-back partial
gang, balloon gang recreated, and other writer detected.

Events are de-duplicated the way `kubectl get events` shows them: the same object, type,
reason and message make one Event whose `count` and `lastTimestamp` grow, not a new Event
per tick. The Event name is derived from those four, so the de-duplication also holds across
a restart or a leader change (the other replica finds the Event and bumps it).

A repeat is written at most once per `min_write_interval_s` (5 minutes, as client-go's spam
filter refills): a bad annotation held for a day was 5,760 PATCHes of its Event, one a tick;
now 288, each with the repeats since the last. Repeats still waiting are written by `flush`
(the actuator calls it every pass) once their interval is over, so the count on the server
lags by at most the interval and a tick, also when no repeat follows. What is remembered of
each Event is bounded (client-go's 4,096): scale Events carry live numbers, so nearly every
one is new, and the memory grew for good; an Event forgotten with repeats waiting loses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from autoscaler.adapters.kube_client import DEFAULT_REQUEST_TIMEOUT_S, TimedApi
from autoscaler.adapters.kube_errors import API_CALL_ERRORS, KubeApiError, describe, status_of
from autoscaler.adapters.kube_objects import LWS_API_VERSION, LWS_KIND

log = logging.getLogger(__name__)

REPORTING_COMPONENT = "gang-autoscaler"
NORMAL = "Normal"
WARNING = "Warning"
_MAX_MESSAGE = 1024
MIN_WRITE_INTERVAL_S = 300.0
MAX_REMEMBERED = 4096


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (an LWS)."""

    namespace: str
    name: str
    uid: str | None = None
    api_version: str = LWS_API_VERSION
    kind: str = LWS_KIND


def camel_reason(reason: str) -> str:
    """`partial_gang_rolled_back` -> `PartialGangRolledBack` (Event reasons are CamelCase)."""
    return "".join(part.capitalize() for part in reason.split("_") if part)


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class _Known:
    written: int  # the count the server has
    written_at: datetime
    pending: int = 0  # repeats since, not written yet


class EventRecorder:
    """Creates or bumps Events; counts are cached so a repeat costs one PATCH, at most one
    per `min_write_interval_s` for each Event."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        instance: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        min_write_interval_s: float = MIN_WRITE_INTERVAL_S,
        max_remembered: int = MAX_REMEMBERED,
    ) -> None:
        self._core: Any = TimedApi(client.CoreV1Api(api_client), timeout_s=request_timeout_s)
        self._instance = instance or socket.gethostname()
        self._clock = clock
        self._min_write_interval_s = min_write_interval_s
        self._max_remembered = max_remembered
        self._known: OrderedDict[tuple[str, str], _Known] = OrderedDict()
        # One `record` at a time per Event, and how many wait for it: two at once (a pass
        # cut off by its deadline leaves its Event writes running into the next pass) both
        # found it uncached and created it; the late answer cached count 1 over the 2 the
        # server held, and every later repeat was counted one short.
        self._in_progress: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, key: tuple[str, str]) -> AsyncIterator[None]:
        lock, users = self._in_progress.get(key, (asyncio.Lock(), 0))
        self._in_progress[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._in_progress[key]
            if users > 1:
                self._in_progress[key] = (lock, users - 1)
            else:
                del self._in_progress[key]

    def _remember(self, key: tuple[str, str], known: _Known) -> None:
        self._known[key] = known
        self._known.move_to_end(key)
        while len(self._known) > self._max_remembered:
            self._known.popitem(last=False)

    @staticmethod
    def event_name(ref: ObjectRef, *, type_: str, reason: str, message: str) -> str:
        digest = hashlib.sha256(
            "\x00".join((ref.uid or "", ref.kind, type_, reason, message)).encode()
        ).hexdigest()[:16]
        return f"{ref.name}.{digest}"

    async def record(self, ref: ObjectRef, *, type_: str, reason: str, message: str) -> int:
        """Record one occurrence; returns the Event's count after it (written or not yet)."""
        message = message[:_MAX_MESSAGE]
        event_name = self.event_name(ref, type_=type_, reason=reason, message=message)
        cache_key = (ref.namespace, event_name)
        async with self._one_at_a_time(cache_key):
            return await self._record(ref, cache_key, type_, reason, message)

    async def _record(
        self, ref: ObjectRef, cache_key: tuple[str, str], type_: str, reason: str, message: str
    ) -> int:
        event_name = cache_key[1]
        moment = self._clock()
        now = _timestamp(moment)
        known = self._known.get(cache_key)
        if known is not None and (
            0 <= (moment - known.written_at).total_seconds() < self._min_write_interval_s
        ):
            known.pending += 1
            self._known.move_to_end(cache_key)
            return known.written + known.pending
        try:
            if known is None:
                created, count = await self._create_or_read(
                    ref, event_name, type_, reason, message, now
                )
                if created:
                    self._remember(cache_key, _Known(1, moment))
                    return 1
                known = _Known(count, moment)
            count = known.written + known.pending + 1
            try:
                await self._bump(ref.namespace, event_name, count, now)
            except ApiException as err:
                if err.status != 404:
                    raise
                # The Event expired (the API server keeps them about an hour): start over.
                self._known.pop(cache_key, None)
                _, count = await self._create_or_read(ref, event_name, type_, reason, message, now)
                self._remember(cache_key, _Known(count, moment))
                return count
            self._remember(cache_key, _Known(count, moment))
            return count
        except API_CALL_ERRORS as err:
            raise KubeApiError(
                f"recording Event {reason} on {ref.namespace}/{ref.name}: {describe(err)}",
                status=status_of(err),
            ) from err

    async def flush(self) -> None:
        """Write the repeats waiting on Events whose interval is over. A failure is logged
        and the repeats wait for the next pass: an Event is a report, never a reason to
        stop acting. A request with no answer at all (a timeout, a dropped connection) ends
        the pass: one after another, each would wait its own timeout."""
        moment = self._clock()
        due = [
            (key, known)
            for key, known in self._known.items()
            if known.pending
            and not 0 <= (moment - known.written_at).total_seconds() < self._min_write_interval_s
        ]
        for (namespace, event_name), known in due:
            count = known.written + known.pending
            try:
                await self._bump(namespace, event_name, count, _timestamp(moment))
            except API_CALL_ERRORS as err:
                if status_of(err) == 404:  # expired: the repeats go with it
                    self._known.pop((namespace, event_name), None)
                else:
                    log.warning(
                        "writing repeats of Event %s/%s: %s", namespace, event_name, describe(err)
                    )
                if status_of(err) is None:
                    return
                continue
            known.written, known.pending, known.written_at = count, 0, moment

    async def _create_or_read(
        self, ref: ObjectRef, event_name: str, type_: str, reason: str, message: str, now: str
    ) -> tuple[bool, int]:
        """Create the Event with count 1, or read the count it already has: (created, count)."""
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name, "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": ref.api_version,
                "kind": ref.kind,
                "name": ref.name,
                "namespace": ref.namespace,
                **({"uid": ref.uid} if ref.uid else {}),
            },
            "type": type_,
            "reason": reason,
            "message": message,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": REPORTING_COMPONENT, "host": self._instance},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": self._instance,
        }
        try:
            await self._core.create_namespaced_event(ref.namespace, body)
            return True, 1
        except ApiException as err:
            if err.status != 409:
                raise
        # It exists already (another instance, or before a restart). Read its count through
        # a PATCH rather than a GET: the chart grants events create and patch only.
        existing = await self._core.patch_namespaced_event(
            event_name,
            ref.namespace,
            {"lastTimestamp": now},
            _content_type="application/merge-patch+json",
        )
        return False, int(existing.count or 1)

    async def _bump(self, namespace: str, event_name: str, count: int, now: str) -> None:
        await self._core.patch_namespaced_event(
            event_name,
            namespace,
            {"count": count, "lastTimestamp": now},
            _content_type="application/merge-patch+json",
        )
