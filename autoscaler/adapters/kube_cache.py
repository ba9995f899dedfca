"""Watch-driven caches of Kubernetes objects (pods, nodes, LWS), kept as plain dicts.

The informer pattern of client-go, reduced to what the autoscaler needs: list once, then
watch from the list's resourceVersion with bookmarks; when the server says the version is
too old (410 Gone) or the connection fails, list again. Readers take a consistent copy
between two events; the service reads it once per tick.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from autoscaler.adapters.kube_errors import KubeApiError, describe, status_message
from autoscaler.adapters.kube_objects import Obj

log = logging.getLogger(__name__)

ListCall = Callable[..., Awaitable[Any]]

_CONNECT_TIMEOUT_S = 30.0
# Retries after consecutive failures back off to this by default (client-go's reflector caps
# at 30 s): an API server that is down is not asked again every second by every cache.
MAX_RETRY_DELAY_S = 30.0
# A watch that ends sooner than this with no event is a failure, not the server's timeout
# (client-go's "very short watch"): a proxy or a stopping server closing streams at once
# would otherwise be re-watched in a tight loop while nothing is heard.
_SHORT_WATCH_S = 1.0


class _ShortWatch(Exception):
    """A watch stream ended at once with no event."""


LIST_PAGE_SIZE = 500  # client-go's pager


def _key(obj: Obj) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


class WatchCache:
    """One resource collection, listed then watched, held as dicts keyed by (namespace, name).

    `list_call` is a client list method (e.g. `CoreV1Api.list_pod_for_all_namespaces`, or a
    `functools.partial` of `CustomObjectsApi.list_cluster_custom_object` with group, version
    and plural bound); it is used both to list and, through `Watch`, to watch.
    """

    def __init__(
        self,
        list_call: ListCall,
        *,
        name: str,
        watch_timeout_s: int = 60,
        retry_delay_s: float = 1.0,
        label_selector: str | None = None,
        read_grace_s: float = 30.0,
        max_retry_delay_s: float = MAX_RETRY_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
        optional: bool = False,
        page_size: int = LIST_PAGE_SIZE,
    ) -> None:
        self._list_call = list_call
        self._page_size = page_size
        self.name = name
        self._watch_timeout_s = watch_timeout_s
        # The server ends every watch after `watch_timeout_s`, so a connection silent for
        # longer than that (plus a grace) is dead: a peer gone without a reset, which TCP
        # alone would notice only after hours while the cache quietly went stale. A short
        # watch (a minute, where client-go picks 5-10) bounds that silence: resuming from
        # the last resourceVersion costs the server one request a minute per cache.
        self._read_timeout = aiohttp.ClientTimeout(
            sock_connect=_CONNECT_TIMEOUT_S, sock_read=watch_timeout_s + read_grace_s
        )
        self._retry_delay_s = retry_delay_s
        self._max_retry_delay_s = max(retry_delay_s, max_retry_delay_s)
        self._short_watch_s = min(_SHORT_WATCH_S, watch_timeout_s / 2)
        self._selector = {"label_selector": label_selector} if label_selector else {}
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        # How often the cache listed from scratch; a rise means watches are failing.
        self.lists = 0
        self.last_error: str | None = None
        self._clock = clock
        # The last proof that the objects were current (a list, an event or bookmark, a watch
        # the server ended), and since when nothing has been, on `clock`.
        self._last_heard: float | None = None
        self._failing_since: float | None = None
        # Consecutive failures without a watch that worked; a list that works while its
        # watch keeps failing does not reset it (a cluster-wide list is the dear part).
        self._failures = 0
        self._changed = asyncio.Condition()
        # An optional collection may be absent (its CRD is not installed: 404) or not
        # readable (RBAC: 403). That is an empty, current collection, not a failing cache:
        # it is listed again every watch timeout, and `unavailable` says why it is empty.
        self._optional = optional
        self.unavailable: str | None = None
        # 410 Gone answers in a row with no event between: one is a watch that outlived the
        # server's history, and is listed again at once; more is a watch expiring right
        # after each list (a proxy, a compaction racing the list), listed again after a
        # growing delay instead of as fast as the server answers
        self._gone = 0

    def items(self) -> list[dict[str, Any]]:
        return list(self._objects.values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get((namespace, name))

    def failing_for_s(self) -> float:
        """How long nothing current has been heard, once listing or watching has failed (0
        while they work). A connection that fell silent counts from the last thing heard on
        it, not from when its read timeout gave up on it."""
        if self._failing_since is None:
            return 0.0
        return max(0.0, self._clock() - self._failing_since)

    def _failed(self, error: str, *, silent: bool = False) -> float:
        """Record a failure; returns how long to wait before trying again."""
        self.last_error = error
        self._failures += 1
        if self._failing_since is None:
            now = self._clock()
            heard = self._last_heard
            self._failing_since = heard if silent and heard is not None else now
        if not self.synced.is_set():
            return self._retry_delay_s  # never listed yet: keep trying at the base delay
        backoff_s = self._retry_delay_s * 2.0 ** (self._failures - 1)
        return min(backoff_s, self._max_retry_delay_s)

    def _heard(self, *, watch_works: bool) -> None:
        if self._failing_since is not None:
            log.info("%s cache is current again", self.name)
        self._last_heard = self._clock()
        self._failing_since = None
        if watch_works:
            self._failures = 0

    async def _list(self) -> None:
        """List in pages of `page_size` (client-go's 500), each parsed off the event loop: a
        cluster's pods in one answer were hundreds of MiB parsed on the loop, holding up the
        Lease's renewals and the tick while it ran. A continue token that expires between
        pages (410) fails the list, which is then tried again from the start."""
        objects: dict[tuple[str, str], dict[str, Any]] = {}
        token: str | None = None
        while True:
            paging = {"limit": self._page_size, **({"_continue": token} if token else {})}
            response = await self._list_call(
                _preload_content=False,
                _request_timeout=self._read_timeout,
                **paging,
                **self._selector,
            )
            try:
                body = await response.read()
                if self._optional and response.status in (403, 404):
                    await self._absent(f"HTTP {response.status}: {status_message(body)}")
                    return
                if not 200 <= response.status <= 299:
                    raise KubeApiError(
                        f"listing {self.name}: HTTP {response.status}: {status_message(body)}",
                        status=response.status,
                    )
            finally:
                response.release()
            data = await asyncio.to_thread(json.loads, body)
            del body
            objects.update((_key(obj), obj) for obj in data.get("items") or [])
            metadata = data.get("metadata") or {}
            token = metadata.get("continue") or None
            if token is None:
                break
        if self.unavailable is not None:
            log.info("%s can be listed again", self.name)
            self.unavailable = None
        self._objects = objects
        self.resource_version = metadata.get("resourceVersion")
        self.lists += 1
        self._heard(watch_works=False)
        self.synced.set()
        await self._notify()

    async def _absent(self, why: str) -> None:
        if self.unavailable is None:
            log.warning("%s cannot be listed (%s); taken as none", self.name, why)
        self.unavailable = why
        self._objects = {}
        self.resource_version = None
        self._heard(watch_works=True)
        self.synced.set()
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], *, timeout_s: float) -> None:
        """Wait until `predicate()` holds after some event (for tests and start-up)."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(predicate)

    async def _watch(self) -> None:
        watch = Watch(return_type="object")
        stream = watch.stream(
            self._list_call,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout_s,
            _request_timeout=self._read_timeout,
            **self._selector,
        )
        started = asyncio.get_running_loop().time()
        events = 0
        try:
            async for event in stream:
                events += 1
                self._gone = 0
                kind = event["type"]
                obj = event["raw_object"]
                if kind in ("ADDED", "MODIFIED"):
                    self._objects[_key(obj)] = obj
                elif kind == "DELETED":
                    self._objects.pop(_key(obj), None)
                # BOOKMARK carries only a resourceVersion, which Watch records for us.
                self._heard(watch_works=True)
                if watch.resource_version:
                    self.resource_version = watch.resource_version
                await self._notify()
        finally:
            await watch.close()
        if not events and asyncio.get_running_loop().time() - started < self._short_watch_s:
            raise _ShortWatch("the watch ended at once with no event")
        self._heard(watch_works=True)  # the server ended it at its timeout
        self._gone = 0  # a watch that ran its course, quiet or not, is no 410 streak

    async def run(self) -> None:
        """List and watch until cancelled; never raises except CancelledError."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                if self.unavailable is not None:
                    # nothing to watch; the CRD may be installed, or access granted, later
                    await asyncio.sleep(self._watch_timeout_s)
                    need_list = True
                    continue
                # A watch ends when the server's timeout passes; resume from the last version.
                await self._watch()
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                need_list = True
                if err.status == 410:
                    self._gone += 1
                    if self._gone == 1:
                        log.info("%s watch expired (410 Gone); listing again", self.name)
                        continue
                    delay_s = min(
                        self._retry_delay_s * 2.0 ** (self._gone - 2), self._max_retry_delay_s
                    )
                    log.warning(
                        "%s watch expired again right after its list (410 Gone, %d in a row); "
                        "listing again in %gs",
                        self.name,
                        self._gone,
                        delay_s,
                    )
                    await asyncio.sleep(delay_s)
                    continue
                delay_s = self._failed(f"{err.status} {err.reason}")
                log.warning(
                    "%s watch failed: %s; listing again in %gs", self.name, self.last_error, delay_s
                )
                await asyncio.sleep(delay_s)
            except Exception as err:  # the connection, the server, or the body failed
                need_list = True
                described = (
                    str(err) if isinstance(err, (KubeApiError, _ShortWatch)) else describe(err)
                )
                # A read timeout means the connection had fallen silent.
                silent = isinstance(err, aiohttp.ServerTimeoutError)
                delay_s = self._failed(described, silent=silent)
                log.warning(
                    "%s cache failed: %s; listing again in %gs", self.name, self.last_error, delay_s
                )
                await asyncio.sleep(delay_s)
