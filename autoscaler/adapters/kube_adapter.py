"""The Kubernetes side of the service in one object: watch, snapshot, act.

    adapter = KubeAdapter(api_client, namespaces=None, may_write=elector_is_leader)
    await adapter.start()                 # caches synced, PriorityClass checked
    await adapter.repair_balloons()       # once, after winning the Lease
    state = adapter.snapshot(now_s=time.time())
    adapter.stale_view()                  # None, or why the caches cannot be trusted
    plan, memory = core.plan(state.observations(signals), state.policies, ...)
    report = await adapter.apply(plan, state, dry_run=False)

`snapshot` reads only the watch caches (no API call). `apply` writes only while `may_write()`
holds and is safe to repeat with the same plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from kubernetes_asyncio import client

from autoscaler.adapters.balloons import PriorityClassMismatch, ensure_priority_class
from autoscaler.adapters.kube_apply import Actuator, ApplyReport, ComponentApplied
from autoscaler.adapters.kube_cache import MAX_RETRY_DELAY_S, WatchCache
from autoscaler.adapters.kube_client import DEFAULT_REQUEST_TIMEOUT_S
from autoscaler.adapters.kube_discovery import ParseCache
from autoscaler.adapters.kube_errors import KubeAdapterError
from autoscaler.adapters.kube_events import EventRecorder
from autoscaler.adapters.kube_objects import (
    DS_GROUP,
    DS_VERSION,
    LWS_GROUP,
    LWS_PLURAL,
    LWS_VERSION,
    PAUSE_IMAGE,
    ROLE_SCALER_PLURAL,
)
from autoscaler.adapters.kube_state import KubeState, build_state
from autoscaler.adapters.lws_scaler import LwsScaler
from autoscaler.core.gang_plan import ComponentPlan, GangPlan
from autoscaler.core.model import ComponentKey

log = logging.getLogger(__name__)

PRIORITY_CLASS_RECHECK_S = 60.0


class KubeAdapter:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespaces: Collection[str] | None = None,
        may_write: Callable[[], bool] = lambda: True,
        can_grow: bool = True,
        watch_timeout_s: int = 60,
        watch_staleness_limit_s: float = 60.0,
        foreign_hold_s: float = 600.0,
        event_instance: str | None = None,
        default_annotations: Mapping[str, str] | None = None,
        balloon_image: str = PAUSE_IMAGE,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self._namespaces = frozenset(namespaces) if namespaces else None
        self._default_annotations = dict(default_annotations or {})
        self._parse_cache = ParseCache()
        self._can_grow = can_grow
        # The snapshot counts whole balloon gangs by the digest the actuator builds them with.
        self._balloon_image = balloon_image
        self.watch_staleness_limit_s = watch_staleness_limit_s
        core = client.CoreV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)
        # Retries back off to a quarter of the staleness limit at most, so an outage shorter
        # than about three quarters of it ends before the limit, and never holds anything.
        retry_cap_s = min(MAX_RETRY_DELAY_S, watch_staleness_limit_s / 4)

        def cache(
            list_call: Callable[..., Any], name: str, *, optional: bool = False
        ) -> WatchCache:
            return WatchCache(
                list_call,
                name=name,
                watch_timeout_s=watch_timeout_s,
                max_retry_delay_s=retry_cap_s,
                optional=optional,
            )

        # Pods and nodes cluster-wide: free capacity depends on every pod on a node.
        self.pods = cache(core.list_pod_for_all_namespaces, "pods")
        self.nodes = cache(core.list_node, "nodes")
        self.lws = cache(
            functools.partial(
                custom.list_cluster_custom_object, LWS_GROUP, LWS_VERSION, LWS_PLURAL
            ),
            "leaderworkersets",
        )
        # Only DisaggregatedSet roles with `scaling.mode: External` have one; a cluster
        # without the DisaggregatedSet CRD (LWS before v0.10) has none to list.
        self.role_scalers = cache(
            functools.partial(
                custom.list_cluster_custom_object, DS_GROUP, DS_VERSION, ROLE_SCALER_PLURAL
            ),
            ROLE_SCALER_PLURAL,
            optional=True,
        )
        # Every read and write outside the watches answers within this, or counts as no
        # answer for its component alone.
        self._request_timeout_s = request_timeout_s
        self.scaler = LwsScaler(
            api_client,
            foreign_hold_s=foreign_hold_s,
            request_timeout_s=request_timeout_s,
            may_write=may_write,
        )
        self.events = EventRecorder(
            api_client, instance=event_instance, request_timeout_s=request_timeout_s
        )
        self.actuator = Actuator(
            api_client,
            scaler=self.scaler,
            events=self.events,
            may_write=may_write,
            namespaces=self._namespaces,
            balloon_image=balloon_image,
            request_timeout_s=request_timeout_s,
        )
        self._api_client = api_client
        self._tasks: list[asyncio.Task[None]] = []
        self.priority_class_status: str | None = None
        self._class_checked_mono = -float("inf")

    @property
    def caches(self) -> tuple[WatchCache, ...]:
        return (self.lws, self.pods, self.nodes, self.role_scalers)

    async def start(self, *, sync_timeout_s: float = 30.0) -> None:
        """Start the watches and wait until each has listed once."""
        for cache in self.caches:
            self._tasks.append(asyncio.create_task(cache.run(), name=f"watch-{cache.name}"))
        try:
            async with asyncio.timeout(sync_timeout_s):
                for cache in self.caches:
                    await cache.synced.wait()
        except TimeoutError as err:
            unsynced = [c.name for c in self.caches if not c.synced.is_set()]
            errors = {c.name: c.last_error for c in self.caches if c.last_error}
            raise KubeAdapterError(f"caches {unsynced} did not sync: {errors}") from err

    def stale_view(self) -> str | None:
        """Why the snapshot cannot be trusted, or None: each cache that has heard nothing
        current for longer than the watch staleness limit since its listing or watching
        failed. The text names the limit, not the growing age. The RoleScalers are not
        among them: only the components of DisaggregatedSet roles scale through those, and
        they alone hold when that view is stale (`snapshot`); a 503 from their API (a CRD
        being installed, a broken conversion webhook) held every LWS of the cluster."""
        stale = [self._stale(cache) for cache in self.caches if cache is not self.role_scalers]
        return "; ".join(s for s in stale if s) or None

    def _stale(self, cache: WatchCache) -> str | None:
        limit_s = self.watch_staleness_limit_s
        if cache.failing_for_s() <= limit_s:
            return None
        return (
            f"{cache.name}: list and watch failing for more than {limit_s:g}s "
            f"(last error: {cache.last_error})"
        )

    async def ensure_priority_class(self) -> str:
        """Create the balloon PriorityClass if needed (call once as leader). While it has
        another value, no balloon gang is created (`PriorityClassMismatch`)."""
        self._class_checked_mono = time.monotonic()
        try:
            self.priority_class_status = await ensure_priority_class(
                self._api_client, request_timeout_s=self._request_timeout_s
            )
        except PriorityClassMismatch as err:
            self.actuator.refuse_balloons(str(err))
            raise
        except KubeAdapterError as err:
            # Still refused, for a new reason: the class of another value was deleted but
            # cannot be created here (the chart grants only `get` on it). Said as it is now,
            # not as the value the class no longer has.
            if self.actuator.balloons_refused is not None:
                self.actuator.refuse_balloons(str(err))
            raise
        self.actuator.refuse_balloons(None)
        log.info("%s", self.priority_class_status)
        return self.priority_class_status

    def snapshot(self, *, now_s: float) -> KubeState:
        return build_state(
            lws_objects=self.lws.items(),
            pods=self.pods.items(),
            nodes=self.nodes.items(),
            now_s=now_s,
            namespaces=self._namespaces,
            can_grow=self._can_grow,
            default_annotations=self._default_annotations,
            parse_cache=self._parse_cache,
            role_scalers=self.role_scalers.items(),
            role_scalers_error=self.role_scalers.unavailable,
            role_scalers_stale=self._stale(self.role_scalers),
            balloon_image=self._balloon_image,
        )

    async def repair_balloons(self, *, now_s: float) -> tuple[str, ...]:
        """Delete every partial balloon gang (after a crash); the next apply recreates them."""
        return await self.actuator.remove_partial_balloon_gangs(self.snapshot(now_s=now_s))

    async def apply(self, plan: GangPlan, state: KubeState, *, dry_run: bool) -> ApplyReport:
        if not dry_run and self.actuator.balloons_refused is not None:
            await self._recheck_priority_class()
        return await self.actuator.apply(plan, state, dry_run=dry_run)

    async def _recheck_priority_class(self) -> None:
        """While balloons are refused for the PriorityClass's value, look again every
        `PRIORITY_CLASS_RECHECK_S`: once a human has deleted the class, it is recreated
        and balloons are made again without a restart."""
        if time.monotonic() - self._class_checked_mono < PRIORITY_CLASS_RECHECK_S:
            return
        with contextlib.suppress(KubeAdapterError):  # still refused; the Event says why
            await self.ensure_priority_class()

    async def report_holds(
        self,
        plans: Iterable[ComponentPlan],
        state: KubeState,
        *,
        dry_run: bool,
        told: dict[ComponentKey, ComponentApplied],
    ) -> None:
        await self.actuator.report_holds(plans, state, dry_run=dry_run, told=told)

    async def close(self) -> None:
        await self.actuator.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
