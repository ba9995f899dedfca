"""The act step: carry a `GangPlan` out on the cluster, and say what was done.

Per component: report a rejected policy (Warning Event, no write), scale the LWS through
`/scale`, report rolled-back, stuck and unplaced gangs, and bring its balloon gangs to the
planned count. Everything is idempotent: repeating a plan after a crash changes nothing
that is already right. Balloon pods are listed fresh from the API for every pass, not taken
from the watch cache, so a lagging watch never makes a whole balloon gang look partial.

Writes happen only while `may_write()` holds (the leader Lease); a lost lease stops the
pass with `NotLeader` before the next write.

Components are carried out concurrently, at most `max_concurrent` at a time: each one's
writes are independent of the others', and a fleet-wide change (a thousand `/scale` writes
and their Events) done one after another runs past the tick's deadline.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import TypeAdapter, ValidationError

from autoscaler.adapters.balloons import (
    BalloonPlan,
    BalloonResult,
    BalloonWriter,
    balloons_by_lws,
    merged_results,
    plan_balloons,
    shape_digest,
)
from autoscaler.adapters.kube_client import DEFAULT_REQUEST_TIMEOUT_S, TimedApi
from autoscaler.adapters.kube_discovery import DiscoveredComponent
from autoscaler.adapters.kube_errors import (
    API_CALL_ERRORS,
    KubeAdapterError,
    KubeApiError,
    NotLeader,
    describe,
    status_message,
    status_of,
)
from autoscaler.adapters.kube_events import NORMAL, WARNING, EventRecorder, ObjectRef, camel_reason
from autoscaler.adapters.kube_objects import (
    BALLOON_FOR_LABEL,
    BALLOON_GANG_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    PAUSE_IMAGE,
    Obj,
    annotations_of,
    int_label,
    labels,
    namespace,
)
from autoscaler.adapters.kube_state import ComponentState, KubeState
from autoscaler.adapters.lws_scaler import LwsScaler, ScaleOutcome, ScaleResult
from autoscaler.core.gang_plan import ComponentPlan, GangPlan, Reason
from autoscaler.core.model import ComponentKey
from autoscaler.core.policy import PREFIX, Policy, policy_cautions
from autoscaler.core.shape import GangShape

log = logging.getLogger(__name__)

BALLOON_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{BALLOON_FOR_LABEL}"
# Components carried out at once: well under the API client's 100 connections (three are
# the watches), and enough to write a thousand components in about a second.
DEFAULT_MAX_CONCURRENT = 16


@dataclass(frozen=True, slots=True)
class ComponentApplied:
    key: ComponentKey
    dry_run: bool
    scale: ScaleOutcome | None = None
    balloon_plan: BalloonPlan | None = None
    balloons: BalloonResult | None = None
    events: tuple[str, ...] = ()  # "Type Reason: message" of each Event recorded
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ApplyReport:
    components: Mapping[ComponentKey, ComponentApplied] = field(default_factory=dict)
    orphan_balloons_deleted: tuple[str, ...] = ()


# A stretch of holds on missing data ends after this long without one (a new one is told)
MISSING_DATA_QUIET_S = 600.0


def _with_cautions(message: str, policy: Policy | None) -> str:
    """A partial-gang Event's message, with what in the policy makes partial gangs of gangs
    that are only slow to start (a gang-timeout shorter than the lead time)."""
    cautions = policy_cautions(policy) if policy is not None else ()
    return "; ".join([message, *(f"gang-timeout {c.message}" for c in cautions)])


def _problem_message(state: ComponentState) -> str:
    problems = "; ".join(str(p) for p in state.discovered.problems)
    gangs = state.discovered.spec_gangs
    return f"policy rejected, holding at {gangs} gangs: {problems}"


class Actuator:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        scaler: LwsScaler,
        events: EventRecorder,
        may_write: Callable[[], bool] = lambda: True,
        namespaces: Collection[str] | None = None,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        balloon_image: str = PAUSE_IMAGE,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self.max_concurrent = max_concurrent
        self._core: Any = TimedApi(client.CoreV1Api(api_client), timeout_s=request_timeout_s)
        self._scaler = scaler
        self._events = events
        self._balloons = BalloonWriter(
            api_client,
            image=balloon_image,
            request_timeout_s=request_timeout_s,
            may_write=may_write,
        )
        self._may_write = may_write
        self._namespaces = namespaces
        # When this process first saw each balloon gang split, per component (plan_balloons)
        self._balloon_split_seen: dict[ComponentKey, tuple[tuple[int, float], ...]] = {}
        # When each component last held on missing data (monotonic), if within a stretch
        self._told_missing: dict[ComponentKey, float] = {}
        self._clock = clock
        # During an `apply` pass, each Event said is written by a task of its own, at most
        # `max_concurrent` at a time, so that no component's writes wait for a report; the
        # pass waits for them at its end. A pass cut off by the tick's deadline leaves them
        # to finish: a one-off Event (a scale, a roll-back) is never said again. None
        # outside a pass, where an Event is written at once.
        self._event_tasks: set[asyncio.Task[None]] | None = None
        self._event_slots = asyncio.Semaphore(max_concurrent)
        # Every Event task not finished yet, whatever pass said it: the event loop keeps only
        # a weak reference to a task, and one left by a pass cut off must not be collected.
        self._events_in_flight: set[asyncio.Task[None]] = set()

    def forget_balloon_sightings(self) -> None:
        """Start a leadership term from what is observed: another leader may have replaced
        balloon gangs since this instance last looked, and a gang now under an old number is
        not the one seen split then."""
        self._balloon_split_seen.clear()

    def _check_leader(self) -> None:
        if not self._may_write():
            raise NotLeader("this instance does not hold the leader Lease; not writing")

    @property
    def balloons_refused(self) -> str | None:
        return self._balloons.refused

    def refuse_balloons(self, reason: str | None) -> None:
        """Create no balloon gang while `reason` holds (None: create them again)."""
        self._balloons.refused = reason

    async def list_balloon_pods(self) -> list[dict[str, Any]]:
        """Every balloon pod in scope, read from the API server (not a cache)."""
        try:
            if self._namespaces is None:
                body = await self._core.list_pod_for_all_namespaces(
                    label_selector=BALLOON_SELECTOR, _preload_content=False
                )
                return await _items(body)
            pods: list[dict[str, Any]] = []
            for ns in sorted(self._namespaces):
                body = await self._core.list_namespaced_pod(
                    ns, label_selector=BALLOON_SELECTOR, _preload_content=False
                )
                pods.extend(await _items(body))
            return pods
        except API_CALL_ERRORS as err:
            raise KubeApiError(f"listing balloon pods: {describe(err)}") from err

    async def _event(
        self, ref: ObjectRef, notes: list[str], *, type_: str, reason: str, message: str
    ) -> None:
        notes.append(f"{type_} {reason}: {message}")
        if self._event_tasks is None:
            await self._write_event(ref, type_, reason, message)
            return
        task = asyncio.create_task(self._write_event(ref, type_, reason, message))
        self._event_tasks.add(task)
        self._events_in_flight.add(task)
        task.add_done_callback(self._events_in_flight.discard)

    async def close(self) -> None:
        """Cancel the Event writes still in flight (on shutdown: a report, never worth
        holding the exit for)."""
        tasks = list(self._events_in_flight)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _write_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        async with self._event_slots:
            if not self._may_write():
                return  # the Lease lost since it was said: the next leader says it again
            try:
                await self._events.record(ref, type_=type_, reason=reason, message=message)
            except KubeAdapterError as err:
                # An Event is a report, never a reason to stop acting.
                log.warning("%s", err)
            except Exception:  # a bug: said in the log, the pass goes on
                log.exception("recording Event %s on %s/%s", reason, ref.namespace, ref.name)

    async def apply(self, gang_plan: GangPlan, state: KubeState, *, dry_run: bool) -> ApplyReport:
        """Carry `gang_plan` out: every component's writes, `max_concurrent` at a time, then
        the orphan balloons. The Events said on the way are written beside them by tasks of
        their own, waited for at the end, and then the waiting Event repeats: a slow Events
        store delays the reports and never the scaling."""
        self._check_leader()
        self._event_tasks = set()
        try:
            return await self._apply(gang_plan, state, dry_run=dry_run)
        finally:
            self._event_tasks = None

    async def _apply(self, gang_plan: GangPlan, state: KubeState, *, dry_run: bool) -> ApplyReport:
        balloon_pods: list[dict[str, Any]] | None
        try:
            balloon_pods = await self.list_balloon_pods()
        except KubeApiError as err:
            # Without a fresh view of the balloons, scale but leave the balloons alone.
            log.warning("%s; balloon gangs untouched this pass", err)
            balloon_pods = None
        grouped = balloons_by_lws(balloon_pods) if balloon_pods is not None else None
        out: dict[ComponentKey, ComponentApplied] = {}
        # an LWS gone from the cluster takes its sightings with it
        for gone in self._balloon_split_seen.keys() - state.components.keys():
            del self._balloon_split_seen[gone]
        self._balloons.forget_except({(k.namespace, k.lws) for k in state.components})
        self._scaler.forget_except(state.components)
        now = self._clock()
        self._told_missing = {
            key: last
            for key, last in self._told_missing.items()
            if key in state.components and 0 <= now - last <= MISSING_DATA_QUIET_S
        }

        async def apply_one(key: ComponentKey, comp: ComponentState) -> None:
            plan = gang_plan.components.get(key)
            mine = grouped.get((key.namespace, key.lws), []) if grouped is not None else None
            try:
                out[key] = await self._apply_one(
                    comp, plan, mine, dry_run=dry_run, now_s=state.taken_at_s
                )
            except KubeAdapterError as err:
                if isinstance(err, NotLeader):
                    raise
                # One component's failure never stops the others.
                out[key] = ComponentApplied(key, dry_run, errors=(str(err),))
            except API_CALL_ERRORS as err:
                # A call no site above expected to fail (a dropped connection mid-pass).
                out[key] = ComponentApplied(key, dry_run, errors=(describe(err),))

        await self._each(
            functools.partial(apply_one, key, comp)
            for key, comp in sorted(state.components.items())
        )
        orphans: tuple[str, ...] = ()
        if balloon_pods is not None:
            orphans = await self._delete_orphans(state, balloon_pods, dry_run=dry_run)
        # The Events, then the repeats whose 5 minutes are over (even with none since). Not
        # by an instance that lost the Lease meanwhile, which still returns the report of
        # the writes it made.
        if self._event_tasks:
            # not cancelled with the pass: a deadline here leaves them to finish
            await asyncio.wait(self._event_tasks)
        if self._may_write():
            await self._events.flush()
        return ApplyReport(components=dict(sorted(out.items())), orphan_balloons_deleted=orphans)

    async def report_holds(
        self,
        plans: Iterable[ComponentPlan],
        state: KubeState,
        *,
        dry_run: bool,
        told: dict[ComponentKey, ComponentApplied],
    ) -> None:
        """The pass for components held because the view of the cluster cannot be trusted:
        no scale, balloon or orphan write (each would act on what may no longer be true),
        only a Warning Event each saying why, `max_concurrent` at a time. Each result lands
        in `told` as it comes, so a pass cut short still reports what it did."""

        async def tell(plan: ComponentPlan) -> None:
            self._check_leader()
            key = plan.key
            notes: list[str] = []
            found = state.components[key].discovered
            dry = dry_run or _dry_run_annotated(found)
            if not dry:
                await self._event(
                    ObjectRef(key.namespace, key.lws, found.uid),
                    notes,
                    type_=WARNING,
                    reason=camel_reason(plan.reason.value),
                    message=(
                        f"holding at {plan.current_gangs} gangs, balloon gangs untouched: "
                        f"{plan.detail}"
                    ),
                )
            told[key] = ComponentApplied(key, dry, events=tuple(notes))

        await self._each(functools.partial(tell, plan) for plan in plans)

    async def _each(self, calls: Iterable[Callable[[], Awaitable[None]]]) -> None:
        """Run `calls`, `max_concurrent` at a time: a pass over a thousand components, one
        API round trip after another, would overrun the tick. The first exception (a lost
        Lease, or a bug) cancels the others before their next write and is raised as a
        one-at-a-time pass would have raised it."""
        slots = asyncio.Semaphore(self.max_concurrent)

        async def bounded(call: Callable[[], Awaitable[None]]) -> None:
            async with slots:
                await call()

        try:
            async with asyncio.TaskGroup() as tasks:
                for call in calls:
                    tasks.create_task(bounded(call))
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None

    async def _apply_one(
        self,
        comp: ComponentState,
        plan: ComponentPlan | None,
        balloon_pods: Sequence[Obj] | None,
        *,
        dry_run: bool,
        now_s: float,
    ) -> ComponentApplied:
        """`balloon_pods`: this LWS's balloon pods, None when they could not be listed."""
        found = comp.discovered
        key = found.key
        ref = ObjectRef(key.namespace, key.lws, found.uid)
        dry = dry_run or _dry_run_annotated(found)
        notes: list[str] = []
        if found.problems:
            message = _problem_message(comp)
            if not dry:
                await self._event(
                    ref, notes, type_=WARNING, reason="InvalidPolicy", message=message
                )
            return ComponentApplied(key, dry, events=tuple(notes))
        if plan is None or found.shape is None:
            return ComponentApplied(key, dry)

        balloon_plan = None
        if balloon_pods is not None:
            balloon_plan = await self._balloon_plan(
                comp, plan, balloon_pods, ref, notes, shape=found.shape, dry=dry, now_s=now_s
            )
        # A ResourceQuota counts balloon pods: on a scale-up, the pods of a gang that takes
        # a given-up balloon gang's place are refused until that balloon gang is gone, and
        # the StatefulSet controller backs off before creating them again. So the balloon
        # gangs given up go first.
        early: BalloonResult | None = None
        scaling_up = plan.changes_replicas and plan.desired_gangs > plan.current_gangs
        if balloon_plan is not None and balloon_plan.delete_pods and scaling_up and not dry:
            self._check_leader()
            early = await self._balloons.carry_out(
                found.lws,
                shape=found.shape,
                plan=replace(balloon_plan, create_gangs=()),
                dry_run=False,
            )

        # The write first, the reports after: an Event's request can take a whole request
        # timeout, and a slow Events store must not hold the scaling back.
        outcome: ScaleOutcome | None = None
        if plan.changes_replicas and not dry:
            self._check_leader()
            outcome = await self._scaler.scale(
                key,
                desired_gangs=plan.desired_gangs,
                observed_gangs=plan.current_gangs,
                observed_resource_version=found.resource_version,
                target=found.scale_target,
                observed_uid=found.uid,
            )
            await self._report_scale(ref, plan, outcome, notes, policy=found.policy)
        if plan.forgotten_capacity_per_gang is not None and not dry:
            await self._event(
                ref,
                notes,
                type_=NORMAL,
                reason="LearnedCapacityForgotten",
                message=(
                    "the gang template, the demand query (the component's kind) or the "
                    f"LWS object changed: capacity per gang "
                    f"{plan.forgotten_capacity_per_gang:g} learned for the old one is forgotten "
                    "and will be learned again at the next saturation"
                ),
            )
        await self._tell_missing_data(ref, plan, notes, dry=dry)
        kept_groups = (
            (
                plan.stuck_groups,
                "PartialGangStuck",
                "stay partially scheduled past gang-timeout; they are below the desired count "
                "and are kept",
            ),
            (
                plan.unplaced_groups,
                "GangUnplaced",
                "have had no pod placed for longer than gang-timeout; they hold no GPU and are "
                "kept while the cluster can grow: check that the node autoscaler can add nodes "
                "of this shape, and the pods' events (a ResourceQuota or a webhook refusing "
                "them, or earlier pods still terminating)",
            ),
        )
        for groups, reason, what in kept_groups:
            if groups and not dry:
                message = _with_cautions(f"groups {list(groups)} {what}", found.policy)
                await self._event(ref, notes, type_=WARNING, reason=reason, message=message)

        # A refused write (RBAC, a webhook, the API down) is an error like a balloon's: the
        # loop counts it in `errors_total{kind="kubernetes"}` and logs it, not only an Event
        # that the same RBAC mistake may keep from being written.
        scale_errors: tuple[str, ...] = ()
        if outcome is not None and outcome.result is ScaleResult.FAILED:
            scale_errors = (
                f"scaling {outcome.from_gangs} -> {outcome.to_gangs} gangs failed: "
                f"{outcome.detail}",
            )
        if balloon_pods is None or balloon_plan is None:
            return ComponentApplied(key, dry, outcome, events=tuple(notes), errors=scale_errors)
        result = early
        rest = balloon_plan if early is None else replace(balloon_plan, delete_pods=())
        if rest.changes and not dry:
            self._check_leader()
            later = await self._balloons.carry_out(
                found.lws, shape=found.shape, plan=rest, dry_run=False
            )
            result = later if early is None else merged_results(early, later)
        if result is not None:
            if balloon_plan.broken_gangs:
                await self._event(
                    ref,
                    notes,
                    type_=NORMAL,
                    reason="BalloonGangRecreated",
                    message=(
                        f"balloon gangs {list(balloon_plan.broken_gangs)} lost a member "
                        "(preempted, missing or outdated); deleted whole, and new gangs "
                        "refill the buffer"
                    ),
                )
            if result.failed:
                # e.g. a namespace's Pod Security level or a webhook refusing the pods: the
                # buffer stays short until it is fixed, and the operator must hear why
                await self._event(
                    ref,
                    notes,
                    type_=WARNING,
                    reason="BalloonWriteFailed",
                    message="balloon gang writes failed; the buffer is short: "
                    + "; ".join(result.failed),
                )
        errors = scale_errors + (tuple(result.failed) if result else ())
        return ComponentApplied(key, dry, outcome, balloon_plan, result, tuple(notes), errors)

    async def _balloon_plan(
        self,
        comp: ComponentState,
        plan: ComponentPlan,
        balloon_pods: Sequence[Obj],
        ref: ObjectRef,
        notes: list[str],
        *,
        shape: GangShape,
        dry: bool,
        now_s: float,
    ) -> BalloonPlan:
        """What to do with the component's balloon gangs this pass (said, not done)."""
        found = comp.discovered
        key = found.key
        desired_balloons = plan.balloon_gangs
        if comp.balloon_name_clash is not None:
            # none made, and those made before the other LWS appeared go: its pods need the names
            desired_balloons = 0
            if plan.balloon_gangs:
                clash = (
                    f"no balloon gang is made: balloon pods ({key.lws}-balloon-<n>-<member>) "
                    f"would take the names of LWS {comp.balloon_name_clash}'s pods and keep them "
                    "from being created; rename one of the two LWS"
                )
                # a naming problem, not a failed write: an Event on the LWS, not an error
                # counted every pass
                if not dry:
                    await self._event(
                        ref, notes, type_=WARNING, reason="BalloonNameClash", message=clash
                    )
        balloon_plan = plan_balloons(
            balloon_pods,
            lws_name=key.lws,
            desired_gangs=desired_balloons,
            pods_per_gang=shape.pods_per_gang,
            digest=shape_digest(shape, image=self._balloons.image),
            now_s=now_s,
            split_timeout_s=None if found.policy is None else found.policy.gang_timeout_s,
            split_seen=dict(self._balloon_split_seen.get(key, ())),
            stranded=comp.balloon_stranded,
        )
        self._balloon_split_seen[key] = balloon_plan.split_seen
        if not balloon_plan.create_gangs:
            self._balloons.forget(key.namespace, key.lws)
        return balloon_plan

    async def _tell_missing_data(
        self, ref: ObjectRef, plan: ComponentPlan, notes: list[str], *, dry: bool
    ) -> None:
        """A Warning Event when a component starts holding on missing data (no signal, or
        one missing where a scale-down would need it), once for each such stretch: Prometheus
        down for an hour is one Event per component, not one a tick. A stretch ends only after
        `MISSING_DATA_QUIET_S` without such a hold: with one signal missing for good (a KV
        metric not exported), the hold comes and goes with the load, tick by tick."""
        held = next((s for s in plan.steps if s.reason is Reason.HOLD_MISSING_DATA), None)
        if held is None or dry:
            return
        now = self._clock()
        last = self._told_missing.get(plan.key)
        self._told_missing[plan.key] = now
        if last is not None and 0 <= now - last <= MISSING_DATA_QUIET_S:
            return
        await self._event(
            ref,
            notes,
            type_=WARNING,
            reason=camel_reason(Reason.HOLD_MISSING_DATA.value),
            message=(
                f"not scaling down from {plan.current_gangs} gangs on missing data: {held.detail}"
            ),
        )

    async def _report_scale(
        self,
        ref: ObjectRef,
        plan: ComponentPlan,
        outcome: ScaleOutcome,
        notes: list[str],
        *,
        policy: Policy | None,
    ) -> None:
        change = f"{plan.current_gangs} -> {plan.desired_gangs} gangs"
        if outcome.result is ScaleResult.SCALED:
            detail = f": {plan.detail}" if plan.detail else ""
            if plan.reason is not Reason.PARTIAL_GANG_ROLLED_BACK:
                await self._event(
                    ref,
                    notes,
                    type_=NORMAL,
                    reason=camel_reason(plan.reason.value),
                    message=f"scaled {change} ({plan.reason.value}){detail}",
                )
            if plan.rolled_back_groups:
                # gangs waiting for nodes above a timed-out one go with it (LWS removes the
                # highest groups): named, so that no group goes unexplained
                waiting = sorted(
                    set(range(min(plan.rolled_back_groups), plan.current_gangs))
                    - set(plan.rolled_back_groups)
                )
                with_waiting = f", with groups {waiting} above them" if waiting else ""
                if plan.retry_wait_s:
                    with_waiting += (
                        f"; rolled back again in a row, they are asked for again in "
                        f"{plan.retry_wait_s:g}s at the earliest"
                    )
                await self._event(
                    ref,
                    notes,
                    type_=WARNING,
                    reason=camel_reason(Reason.PARTIAL_GANG_ROLLED_BACK.value),
                    message=_with_cautions(
                        f"groups {list(plan.rolled_back_groups)} stayed partially scheduled "
                        f"past gang-timeout and were scaled away{with_waiting} ({change})",
                        policy,
                    ),
                )
        elif outcome.result is ScaleResult.OTHER_WRITER:
            await self._event(
                ref,
                notes,
                type_=WARNING,
                reason="AnotherWriter",
                message=f"not scaling {change}: {outcome.detail}",
            )
        elif outcome.result is ScaleResult.FAILED:
            await self._event(
                ref,
                notes,
                type_=WARNING,
                reason="ScaleFailed",
                message=f"scaling {change} failed: {outcome.detail}",
            )

    async def _delete_orphans(
        self, state: KubeState, balloon_pods: list[dict[str, Any]], *, dry_run: bool
    ) -> tuple[str, ...]:
        """Balloons of an LWS that is gone or no longer opted in hold capacity for nobody."""
        known = {(k.namespace, k.lws) for k in state.components}
        orphans = [
            p for p in balloon_pods if (namespace(p), labels(p)[BALLOON_FOR_LABEL]) not in known
        ]
        if not orphans or dry_run:
            return ()
        self._check_leader()
        deleted = []
        for pod in orphans:
            pod_name = str(pod["metadata"]["name"])
            try:
                await self._core.delete_namespaced_pod(
                    pod_name, namespace(pod), grace_period_seconds=0
                )
                deleted.append(f"{namespace(pod)}/{pod_name}")
            except API_CALL_ERRORS as err:
                if status_of(err) != 404:
                    log.warning("deleting orphan balloon %s: %s", pod_name, describe(err))
        return tuple(deleted)

    async def remove_partial_balloon_gangs(self, state: KubeState) -> tuple[str, ...]:
        """Start-up repair: delete every balloon gang that is not whole (a crash between two
        member creations, or a preemption while no leader was running). Creates nothing; the
        first planned pass does that."""
        self._check_leader()
        grouped = balloons_by_lws(await self.list_balloon_pods())
        deleted: list[str] = []
        for key, comp in state.components.items():
            found = comp.discovered
            shape = found.shape
            # an LWS marked dry-run gets no write at all; one with a bad policy is held
            if shape is None or found.problems or _dry_run_annotated(found):
                continue
            mine = grouped.get((key.namespace, key.lws), [])
            indexes = [int_label(p, BALLOON_GANG_LABEL) for p in mine]
            top = max((i for i in indexes if i is not None), default=-1) + 1
            repair = plan_balloons(
                mine,
                lws_name=key.lws,
                desired_gangs=top,
                pods_per_gang=shape.pods_per_gang,
                digest=shape_digest(shape, image=self._balloons.image),
            )
            if repair.delete_pods:
                result = await self._balloons.carry_out(
                    found.lws,
                    shape=shape,
                    plan=BalloonPlan(repair.delete_pods, (), repair.broken_gangs, 0),
                    dry_run=False,
                )
                deleted.extend(f"{key.namespace}/{n}" for n in result.deleted_pods)
        return tuple(deleted)


async def _items(response: Any) -> list[dict[str, Any]]:
    try:
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=status_message(await response.read()))
        body = await response.json()
    finally:
        response.release()
    items: list[dict[str, Any]] = body.get("items") or []
    return items


def _dry_run_annotated(found: DiscoveredComponent) -> bool:
    """The LWS's own `dry-run` annotation, read from the annotation itself when its policy
    did not parse: an LWS marked dry-run gets no write at all, Events included."""
    if found.policy is not None:
        return found.policy.dry_run
    raw = annotations_of(found.lws).get(PREFIX + "dry-run")
    try:  # read as the policy reads it: "true", "yes", "on", "1"...
        return isinstance(raw, str) and TypeAdapter(bool).validate_python(raw.strip())
    except ValidationError:
        return False
