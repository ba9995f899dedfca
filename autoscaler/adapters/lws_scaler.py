"""Writes an LWS's gang count through its `/scale` subresource, and only when it is ours to write.

The scale target is the LWS itself, or, for the LWS of a DisaggregatedSet role with
`scaling.mode: External`, the role's DisaggregatedSetRoleScaler (the DisaggregatedSet
controller copies its count to the LWS). Everything below holds for either.

The write is a JSON merge patch (`application/merge-patch+json`; the client would otherwise
send a JSON patch) carrying the resourceVersion the decision was based on, so it is
conditional: a 409 means the LWS changed since it was observed. The scaler then re-reads;
if `spec.replicas` is still what the decision assumed (only status or metadata moved), it
writes again on the fresh version; if someone else changed `spec.replicas`, it reports that
writer and stands back instead of fighting it.

Another writer is either a HorizontalPodAutoscaler whose `scaleTargetRef` is the target, or a
change of `spec.replicas` since this scaler's last write (a manual `kubectl scale`, a GitOps
sync, another autoscaler). After a foreign change the component is held for
`foreign_hold_s`; the value the other writer set becomes the new baseline.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from autoscaler.adapters.kube_client import DEFAULT_REQUEST_TIMEOUT_S, TimedApi
from autoscaler.adapters.kube_errors import (
    API_CALL_ERRORS,
    KubeAdapterError,
    NotLeader,
    describe,
    status_message,
    status_of,
)
from autoscaler.adapters.kube_objects import ScaleTarget
from autoscaler.core.model import ComponentKey

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


class ScaleResult(enum.StrEnum):
    SCALED = "scaled"
    UNCHANGED = "unchanged"  # already at the desired count
    OTHER_WRITER = "other_writer"  # an HPA or a foreign edit owns spec.replicas now
    STALE = "stale"  # the observation predates our own last write; nothing written
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ScaleOutcome:
    key: ComponentKey
    result: ScaleResult
    from_gangs: int
    to_gangs: int
    conflicts: int = 0  # 409s met (and resolved, when result is SCALED)
    detail: str = ""


class HpaUnknown(KubeAdapterError):
    """Whether an HPA targets a scale target cannot be told: the list got no answer."""


@dataclass(frozen=True, slots=True)
class _Scale:
    spec_gangs: int
    resource_version: str


class LwsScaler:
    """Scales LWS objects; remembers its own writes to recognise other writers."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        foreign_hold_s: float = 600.0,
        max_attempts: int = 4,
        clock: Callable[[], float] = time.monotonic,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        may_write: Callable[[], bool] = lambda: True,
    ) -> None:
        self._custom: Any = TimedApi(
            client.CustomObjectsApi(api_client), timeout_s=request_timeout_s
        )
        self._autoscaling: Any = TimedApi(
            client.AutoscalingV2Api(api_client), timeout_s=request_timeout_s
        )
        self._foreign_hold_s = foreign_hold_s
        self._max_attempts = max_attempts
        self._clock = clock
        # Asked right before every patch, not once before `scale`: the HPA list and re-reads
        # before it can take several request timeouts, and the Lease may be lost meanwhile.
        self._may_write = may_write
        self._last_written: dict[ComponentKey, int] = {}
        # A write whose answer was lost (no answer at all, not an error answer), as (the count
        # it was written over, the count written): it may have landed, or not.
        self._in_doubt: dict[ComponentKey, tuple[int, int]] = {}
        self._held_until: dict[ComponentKey, tuple[float, str]] = {}
        # The uid of the object the memory above is about: an LWS deleted and made again
        # under its name is a new object, whose count nobody changed behind our back.
        self._uids: dict[ComponentKey, str] = {}

    async def read(self, key: ComponentKey, target: ScaleTarget | None = None) -> _Scale:
        target = target or ScaleTarget.lws(key.lws)
        scale: dict[str, Any] = await self._custom.get_namespaced_custom_object_scale(
            target.group, target.version, key.namespace, target.plural, target.name
        )
        return _Scale(
            spec_gangs=int((scale.get("spec") or {}).get("replicas") or 0),
            resource_version=str((scale.get("metadata") or {}).get("resourceVersion") or ""),
        )

    async def hpa_targeting(
        self, key: ComponentKey, target: ScaleTarget | None = None
    ) -> str | None:
        """Name of an HPA whose scaleTargetRef is `target` (by default the LWS), if any (None
        also when the autoscaling/v2 API is not served, or RBAC refuses the HPA list: 404,
        403). Raises `HpaUnknown` when the list got no answer, or one that says nothing
        about HPAs (429 throttled, 5xx, 401): such an API server cannot say there is no HPA,
        and writing then would fight one (it reverts the write, and the next tick holds on
        "another writer" for 10 minutes, a gang started and killed)."""
        target = target or ScaleTarget.lws(key.lws)
        try:
            hpas = await self._autoscaling.list_namespaced_horizontal_pod_autoscaler(
                key.namespace, _preload_content=False
            )
            try:
                if hpas.status == 404:
                    return None
                if not 200 <= hpas.status <= 299:
                    raise ApiException(status=hpas.status, reason=status_message(await hpas.read()))
                body = await hpas.json()
            finally:
                hpas.release()
        except API_CALL_ERRORS as err:
            if status_of(err) not in (403, 404):
                raise HpaUnknown(
                    f"listing HorizontalPodAutoscalers in {key.namespace}: {describe(err)}; "
                    f"cannot tell whether one targets {target}"
                ) from err
            log.warning("cannot list HPAs in %s: %s", key.namespace, describe(err))
            return None
        for hpa in body.get("items") or []:
            if target.is_target_of((hpa.get("spec") or {}).get("scaleTargetRef") or {}):
                return str((hpa.get("metadata") or {}).get("name"))
        return None

    def forget_writes(self) -> None:
        """Start a leadership term from what is observed: the writes of an earlier term of
        this instance are history, and the leader in between wrote legitimately. A hold on
        another writer's change (a manual `kubectl scale`) stays until it expires."""
        self._last_written.clear()
        self._in_doubt.clear()

    def forget_except(self, keys: Iterable[ComponentKey]) -> None:
        """Drop what is remembered of components no longer observed (their LWS deleted or
        opted out): a recreated one starts afresh, and the memory does not grow with churn."""
        present = set(keys)
        for memory in (self._last_written, self._in_doubt, self._held_until, self._uids):
            for key in memory.keys() - present:
                del memory[key]

    def _same_object(self, key: ComponentKey, uid: str | None) -> None:
        """Forget the writes and hold of an earlier object of the same name."""
        if not uid:
            return
        if self._uids.get(key, uid) != uid:
            self._last_written.pop(key, None)
            self._in_doubt.pop(key, None)
            self._held_until.pop(key, None)
        self._uids[key] = uid

    def _hold(self, key: ComponentKey, detail: str) -> None:
        self._held_until[key] = (self._clock() + self._foreign_hold_s, detail)
        # The other writer's value is the new baseline; only a change after this is foreign.
        self._last_written.pop(key, None)
        self._in_doubt.pop(key, None)

    def holding(self, key: ComponentKey) -> str | None:
        """Why this component is held after a foreign change, or None."""
        held = self._held_until.get(key)
        if held is None or held[0] <= self._clock():
            self._held_until.pop(key, None)
            return None
        return held[1]

    async def _settle(
        self, key: ComponentKey, target: ScaleTarget, *, observed_gangs: int
    ) -> tuple[ScaleResult, str] | None:
        """None when `observed_gangs` is a count to decide from, else why not.

        It is when it is our last write, or nothing was written this term. Otherwise the
        server is asked first: the observation may predate our write (a watch lags), and a
        write whose answer was lost may have landed or not; either count is ours. Only a third
        one is another writer's, and holds the component.
        """
        last = self._last_written.get(key)
        doubt = self._in_doubt.get(key)
        if doubt is not None and observed_gangs == doubt[1]:
            del self._in_doubt[key]  # the observation shows the lost write landed
            self._last_written[key] = doubt[1]
            return None
        if doubt is None and (last is None or observed_gangs == last):
            return None
        try:
            fresh = await self.read(key, target)
        except API_CALL_ERRORS as err:
            return ScaleResult.FAILED, f"re-read: {describe(err)}"
        was = f"{last} (our last write)"
        if doubt is not None:
            del self._in_doubt[key]
            written_over, last = doubt
            was = f"{written_over} (our write of {last} got no answer)"
            if fresh.spec_gangs == written_over:
                # it never landed: decide from the count it was written over
                if observed_gangs == written_over:
                    return None
                return ScaleResult.STALE, "observation predates the count on the server"
        if fresh.spec_gangs == last:
            self._last_written[key] = last
            return ScaleResult.STALE, f"observation predates our write of {last} gangs"
        detail = (
            f"spec.replicas was changed from {was} to {fresh.spec_gangs} "
            f"by another writer; holding for {self._foreign_hold_s:g}s"
        )
        self._hold(key, detail)
        return ScaleResult.OTHER_WRITER, detail

    async def scale(
        self,
        key: ComponentKey,
        *,
        desired_gangs: int,
        observed_gangs: int,
        observed_resource_version: str | None,
        target: ScaleTarget | None = None,
        observed_uid: str | None = None,
    ) -> ScaleOutcome:
        """Set the target's spec.replicas to `desired_gangs` if nobody else changed it since it
        was observed as `observed_gangs` at `observed_resource_version` (the target's version).
        The target is the LWS unless given; `observed_uid` is the LWS's uid."""
        target = target or ScaleTarget.lws(key.lws)
        self._same_object(key, observed_uid)

        def outcome(result: ScaleResult, detail: str = "", conflicts: int = 0) -> ScaleOutcome:
            return ScaleOutcome(key, result, observed_gangs, desired_gangs, conflicts, detail)

        held = self.holding(key)
        if held:
            return outcome(ScaleResult.OTHER_WRITER, held)
        try:
            hpa = await self.hpa_targeting(key, target)
        except HpaUnknown as err:
            return outcome(ScaleResult.FAILED, str(err))
        if hpa:
            detail = f"HorizontalPodAutoscaler {key.namespace}/{hpa} targets {target}"
            return outcome(ScaleResult.OTHER_WRITER, detail)
        unsettled = await self._settle(key, target, observed_gangs=observed_gangs)
        if unsettled is not None:
            return outcome(*unsettled)
        if desired_gangs == observed_gangs:
            return outcome(ScaleResult.UNCHANGED)

        version = observed_resource_version
        conflicts = 0
        for _ in range(self._max_attempts):
            if not self._may_write():
                raise NotLeader("the leader Lease was lost before the /scale patch; not writing")
            body: dict[str, Any] = {"spec": {"replicas": desired_gangs}}
            if version:
                body["metadata"] = {"resourceVersion": version}
            try:
                await self._custom.patch_namespaced_custom_object_scale(
                    target.group,
                    target.version,
                    key.namespace,
                    target.plural,
                    target.name,
                    body,
                    _content_type=MERGE_PATCH,
                )
            except asyncio.CancelledError:
                # cut off (the tick's deadline) after the patch may have reached the server
                self._in_doubt[key] = (observed_gangs, desired_gangs)
                raise
            except API_CALL_ERRORS as err:
                if status_of(err) is None:
                    self._in_doubt[key] = (observed_gangs, desired_gangs)
                    detail = f"{describe(err)}; the write may have landed"
                    return outcome(ScaleResult.FAILED, detail, conflicts)
                if status_of(err) != 409:
                    return outcome(ScaleResult.FAILED, describe(err), conflicts)
                conflicts += 1
                try:
                    fresh = await self.read(key, target)
                except API_CALL_ERRORS as read_err:
                    detail = f"re-read after 409 failed: {describe(read_err)}"
                    return outcome(ScaleResult.FAILED, detail, conflicts)
                if fresh.spec_gangs == desired_gangs:
                    # Already where this write was taking it: an earlier write of ours whose
                    # answer was lost landed meanwhile (or another writer agrees). Not a
                    # change to hold for.
                    self._last_written[key] = desired_gangs
                    detail = f"already at {desired_gangs} gangs when re-read after a conflict"
                    return outcome(ScaleResult.UNCHANGED, detail, conflicts)
                if fresh.spec_gangs != observed_gangs:
                    detail = (
                        f"spec.replicas changed from {observed_gangs} to {fresh.spec_gangs} by "
                        f"another writer while scaling to {desired_gangs}; holding for "
                        f"{self._foreign_hold_s:g}s"
                    )
                    self._hold(key, detail)
                    return outcome(ScaleResult.OTHER_WRITER, detail, conflicts)
                version = fresh.resource_version
                continue
            self._last_written[key] = desired_gangs
            return outcome(ScaleResult.SCALED, conflicts=conflicts)
        return outcome(ScaleResult.FAILED, f"{conflicts} conflicts in a row", conflicts)
