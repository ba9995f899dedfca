"""One tick of the service: discover -> observe -> forecast -> plan -> act -> report.

`ControlLoop.tick` runs the phases under one deadline, so a slow Prometheus or API server
cannot stall the loop past it: a tick that runs out of time is abandoned where it stands
(every write is idempotent, so the next tick simply repeats what is still needed) and counted
as `errors_total{kind="tick_deadline"}`. One component never stops the others: Prometheus
trouble turns into missing signals (the core holds), a forecast that raises leaves that
component without a forecast, a plan that raises is retried deployment by deployment and
holds only the deployment that failed, and the Kubernetes adapter applies each component on
its own.

Only the leader acts; a standby runs every other phase, so its decision memory (the
scale-down window) is warm when it takes over. Dry-run decides everything and writes nothing.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from autoscaler.adapters.kube_adapter import KubeAdapter
from autoscaler.adapters.kube_apply import ApplyReport, ComponentApplied
from autoscaler.adapters.kube_errors import KubeAdapterError, NotLeader
from autoscaler.adapters.kube_state import KubeState
from autoscaler.adapters.lws_scaler import ScaleResult
from autoscaler.adapters.prometheus_restore import CapacityIdentity
from autoscaler.adapters.prometheus_source import ComponentTarget, PrometheusSource
from autoscaler.core.capacity import DEFAULT_DEMAND_WINDOW_S
from autoscaler.core.decision import hold_every_component
from autoscaler.core.decision import plan as plan_gangs
from autoscaler.core.gang_plan import (
    ComponentMemory,
    ComponentPlan,
    GangPlan,
    Memory,
    Reason,
    Step,
)
from autoscaler.core.model import (
    ComponentKey,
    DeploymentKey,
    Forecast,
    GangState,
    Observations,
    Signals,
)
from autoscaler.core.policy import Policy, deployment_key
from autoscaler.service.capacity_restore import CapacityRestore
from autoscaler.service.forecasts import DemandForecasts
from autoscaler.service.metrics import ComponentLabels, ServiceMetrics

log = logging.getLogger(__name__)

# Components forecast between two turns given to the other tasks of the loop.
FORECASTS_BETWEEN_YIELDS = 50


@dataclass(frozen=True, slots=True)
class TickRecord:
    """Everything one tick saw, decided and did: the source of `/decisions` and the logs."""

    number: int
    started_at_s: float
    duration_s: float
    cpu_s: float
    leader: bool
    dry_run: bool
    outcome: str  # "ok", or why the tick stopped early
    # when it finished on the monotonic clock: /healthz ages ticks by it, so a step of the
    # wall clock neither hides a stalled loop (back) nor restarts a healthy one (forward)
    finished_mono_s: float | None = None
    state: KubeState | None = None
    signals: Mapping[ComponentKey, Signals] = field(default_factory=dict)
    forecasts: Mapping[ComponentKey, Forecast] = field(default_factory=dict)
    plan: GangPlan | None = None
    applied: ApplyReport | None = None
    errors: tuple[str, ...] = ()


def component_labels(state: KubeState, key: ComponentKey) -> ComponentLabels:
    """The labels of a component's series. An LWS held on a policy problem reports under
    its own name as the deployment: two of them in one deployment (both roles of a
    DisaggregatedSet mid-rollout, two LWS claiming one component) shared one series, last
    write wins, and two `component_info` series for one (namespace, deployment, component)
    broke every alert that joins on it, for the whole cluster."""
    found = state.components[key].discovered
    policy = found.policy
    shared = found.deployment if found.usable else None
    return ComponentLabels(
        namespace=key.namespace,
        deployment=shared.name if shared is not None else key.lws,
        component=policy.component.value if policy else "unknown",
        lws=key.lws,
    )


def _held_plan(key: ComponentKey, spec_gangs: int, balloons: int, detail: str) -> ComponentPlan:
    return ComponentPlan(
        key=key,
        current_gangs=spec_gangs,
        desired_gangs=spec_gangs,
        reason=Reason.HOLD_POLICY_ERROR,
        balloon_gangs=balloons,
        balloon_reason=Reason.HOLD_POLICY_ERROR,
        hold=True,
        steps=(Step("hold", spec_gangs, Reason.HOLD_POLICY_ERROR, detail),),
        detail=detail,
    )


def seed_memory(memory: Memory, observations: Observations, *, now_s: float) -> Memory:
    """Memory for components seen for the first time: their current gangs as a proposal at
    `now_s`, so the scale-down window starts when this instance first saw them. Without it
    a restarted service or a new leader, whose memory is empty, would scale down at once on
    a momentary lull; with it a restart never scales down sooner than the window allows."""
    new = {
        key: ComponentMemory(proposals=((now_s, obs.spec_gangs),))
        for key, obs in observations.components.items()
        if key not in memory.components
    }
    if not new:
        return memory
    return Memory(components={**memory.components, **new})


def plan_isolated(
    observations: Observations,
    policies: Mapping[ComponentKey, Policy],
    forecasts: Mapping[ComponentKey, Forecast],
    memory: Memory,
    *,
    now_s: float,
    on_error: Callable[[str], None],
    planner: Callable[..., tuple[GangPlan, Memory]] = plan_gangs,
) -> tuple[GangPlan, Memory]:
    """The core's plan over every component; if it raises, plan each deployment alone and
    hold (at its current gangs and balloons) only the deployments that still raise."""
    try:
        return planner(observations, policies, forecasts, memory, now=now_s)
    except Exception:
        log.exception("planning all components at once failed; planning each deployment alone")
    groups: dict[DeploymentKey | ComponentKey, list[ComponentKey]] = {}
    for key in observations.components:
        policy = policies.get(key)
        groups.setdefault(deployment_key(key, policy) if policy else key, []).append(key)
    plans: dict[ComponentKey, ComponentPlan] = {}
    memories = dict(memory.components)
    for group, keys in sorted(groups.items(), key=lambda item: str(item[0])):
        subset = Observations(
            components={k: observations.components[k] for k in keys},
            cluster=observations.cluster,
        )
        try:
            sub_plan, sub_memory = planner(
                subset,
                {k: policies[k] for k in keys if k in policies},
                {k: forecasts[k] for k in keys if k in forecasts},
                Memory({k: memory.of(k) for k in keys}),
                now=now_s,
            )
        except Exception as err:
            on_error("plan")
            log.exception("planning %s failed; holding it", group)
            for k in keys:
                obs = observations.components[k]
                plans[k] = _held_plan(
                    k, obs.spec_gangs, obs.balloon_gangs, f"planning failed: {err!r}"
                )
                # what this tick read was not planned from: a saturated stretch ends here
                memories[k] = replace(memory.of(k), saturated=None)
            continue
        plans.update(sub_plan.components)
        memories.update(sub_memory.components)
    return GangPlan(components=plans), Memory(components=memories)


class ControlLoop:
    """The phases of one tick and the state carried between ticks (memory, last record)."""

    def __init__(
        self,
        *,
        kube: KubeAdapter,
        prometheus: PrometheusSource,
        forecasts: DemandForecasts,
        capacity_restore: CapacityRestore,
        metrics: ServiceMetrics,
        is_leader: Callable[[], bool],
        on_became_leader: Callable[[float], Awaitable[None]],
        dry_run: bool,
        leader_term: Callable[[], int] = lambda: 0,
        deadline_s: float,
        demand_window_s: float = DEFAULT_DEMAND_WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._prometheus = prometheus
        self._forecasts = forecasts
        self._capacity_restore = capacity_restore
        self._metrics = metrics
        self._is_leader = is_leader
        self._leader_term = leader_term
        self._on_became_leader = on_became_leader
        self.dry_run = dry_run
        self.deadline_s = deadline_s
        self._planner = partial(plan_gangs, demand_window_s=demand_window_s)
        self._clock = clock
        self.memory = Memory()
        self.ticks = 0
        self.last: TickRecord | None = None
        # The last tick that produced a plan: `/decisions` keeps showing it after a tick
        # that stopped before planning (a deadline, an error).
        self.last_planned: TickRecord | None = None
        # The leadership term this instance acted in on the last tick (None: it did not act).
        # A term, not a flag: a Lease lost and won back between two ticks is a new term, and
        # the leader in between may have written.
        self._acting_term: int | None = None
        self._reported: dict[ComponentKey, ComponentLabels] = {}
        self._last_logged: dict[ComponentKey, tuple[object, ...]] = {}
        self._policy_problems_seen: set[tuple[ComponentKey, str, str]] = set()
        self._policy_error_lws: set[tuple[str, str]] = set()  # with a policy_errors series
        # Components told (by Event) that they hold on a stale cluster view, this episode.
        self._told_stale: set[ComponentKey] = set()

    async def tick(self) -> TickRecord:
        """Run one tick; never raises except CancelledError (a shutdown)."""
        self.ticks += 1
        started_s = self._clock()
        started_mono = time.monotonic()
        started_cpu = time.process_time()
        leader = self.dry_run or self._is_leader()
        parts: dict[str, object] = {}
        errors: list[str] = []
        outcome = "ok"
        try:
            async with asyncio.timeout(self.deadline_s):
                await self._phases(started_s, leader=leader, parts=parts, errors=errors)
        except TimeoutError:
            outcome = f"deadline: the tick took longer than {self.deadline_s:g}s and was abandoned"
            self._metrics.count_error("tick_deadline")
            log.warning("tick %d %s (in %s)", self.ticks, outcome, parts.get("phase"))
        except NotLeader as err:
            outcome = f"stopped acting: {err}"
            log.warning("tick %d: %s", self.ticks, err)
        except Exception as err:  # a bug in a phase: the loop must survive it
            outcome = f"error: {err!r}"
            self._metrics.count_error("tick")
            log.exception("tick %d failed in %s", self.ticks, parts.get("phase"))
        finished_mono = time.monotonic()
        duration_s = finished_mono - started_mono
        record = TickRecord(
            number=self.ticks,
            started_at_s=started_s,
            duration_s=duration_s,
            finished_mono_s=finished_mono,
            cpu_s=time.process_time() - started_cpu,
            leader=leader,
            dry_run=self.dry_run,
            outcome=outcome,
            state=parts.get("state"),  # type: ignore[arg-type]
            signals=parts.get("signals", {}),  # type: ignore[arg-type]
            forecasts=parts.get("forecasts", {}),  # type: ignore[arg-type]
            plan=parts.get("plan"),  # type: ignore[arg-type]
            applied=parts.get("applied"),  # type: ignore[arg-type]
            errors=tuple(errors),
        )
        self.last = record
        if record.plan is not None:
            self.last_planned = record
        self._metrics.observe_tick(
            duration_s=duration_s,
            finished_at_s=self._clock(),
            queries=self._prometheus.stats.last_tick_queries,
        )
        return record

    async def _phases(
        self, now_s: float, *, leader: bool, parts: dict[str, object], errors: list[str]
    ) -> None:
        # discover: the watch caches, no API call
        parts["phase"] = "discover"
        state = self._kube.snapshot(now_s=now_s)
        parts["state"] = state
        self._count_policy_problems(state)
        if not leader and self._reported:
            # Only the leader reports per-component state.
            for labels in self._reported.values():
                self._metrics.forget_component(labels)
            self._reported.clear()
        self._metrics.set_leader(leader and not self.dry_run)
        # `KubeState.policies` builds a new dict on every access: read it once per tick.
        policies = state.policies
        self._metrics.observe_watch_caches(
            {cache.name: cache.failing_for_s() for cache in self._kube.caches}
        )
        stale = self._kube.stale_view()
        if stale is not None:
            # Before taking office: a new leader's first writes (the balloon repair) wait
            # for a view they can trust, and happen once it is back.
            await self._hold_on_stale_view(
                state,
                policies,
                f"cluster view is stale: {stale}",
                now_s,
                leader=leader,
                parts=parts,
                errors=errors,
            )
            return
        self._told_stale.clear()
        term = self._leader_term() if leader else None
        if term is not None and term != self._acting_term and not self.dry_run:
            await self._on_became_leader(now_s)
        self._acting_term = term

        # observe: a fixed set of Prometheus queries for every component at once
        parts["phase"] = "observe"
        kinds = {key: policy.component for key, policy in policies.items()}
        targets = [
            ComponentTarget(
                key=key,
                component=kinds[key],
                ready_group_indexes=frozenset(comp.leader_pods.values()),
                deployment=comp.discovered.deployment.name if comp.discovered.deployment else None,
                at_zero=comp.discovered.spec_gangs == 0,
            )
            for key, comp in state.components.items()
            if comp.observation is not None and key in kinds
        ]
        # A demand series is read with one query (one unit). Not tied to the LWS object: the
        # back-fill reads history by pod name, so a recreated LWS would get it back anyway.
        forgotten = self._forecasts.keep_only(
            {t.key: self._prometheus.demand_fingerprint(t.component) for t in targets}
        )
        if forgotten:
            log.info(
                "forgot the demand history of %d components (gone, held, or now read with "
                "another demand query): %s",
                len(forgotten),
                ", ".join(str(k) for k in sorted(forgotten)[:5]),
            )
        self._forecasts.start_backfill(
            self._prometheus, [(t.key, t.component) for t in targets], now_s=now_s
        )
        # A learned capacity is valid for one LWS object, gang template and demand query.
        identities = {
            t.key: CapacityIdentity(
                lws_uid=state.components[t.key].discovered.uid or "",
                demand_query=self._prometheus.demand_fingerprint(t.component),
                template=state.components[t.key].discovered.template,
            )
            for t in targets
        }
        self._capacity_restore.start(self._prometheus, identities, now_s=now_s)
        signals = await self._prometheus.observe(targets)
        parts["signals"] = signals
        if any(s.missing_reasons for s in signals.values()):
            errors.extend(
                sorted({r for s in signals.values() for r in s.missing_reasons.values()})[:5]
            )

        # forecast: the latest off-loop fit, one lead time ahead
        parts["phase"] = "forecast"
        forecasts: dict[ComponentKey, Forecast] = {}
        for count, target in enumerate(targets, start=1):
            if count % FORECASTS_BETWEEN_YIELDS == 0:
                # A tick that closes a forecast window extends every model (about 1.7 ms a
                # component): without a turn for the other tasks, 2,000 components held
                # Lease renewals and probe answers for over 4 s.
                await asyncio.sleep(0)
            key = target.key
            try:
                self._forecasts.record(key, now_s=now_s, demand=signals[key].demand)
                found = self._forecasts.forecast(
                    key,
                    horizon_s=policies[key].lead_time_s,
                    now_s=now_s,
                    at_zero=target.at_zero,
                )
            except Exception as err:  # one forecaster's failure leaves one component without
                self._metrics.count_error("forecast")
                errors.append(f"forecast {key}: {err!r}")
                log.warning("forecast of %s failed: %r", key, err)
                continue
            if found is not None:
                forecasts[key] = found
        await asyncio.sleep(0)  # the last forecasts, then the fits collected: two turns
        try:
            abandoned = self._forecasts.tick(now_s=now_s)
        except Exception as err:
            self._metrics.count_error("forecast")
            log.warning("forecast fitter tick failed: %r", err)
        else:
            if abandoned:
                self._metrics.count_error("fit_timeout", abandoned)
        parts["forecasts"] = forecasts
        await asyncio.sleep(0)

        # plan: the pure core
        parts["phase"] = "plan"
        observations = state.observations(
            signals, capacity_keys={key: identity.key for key, identity in identities.items()}
        )
        self.memory = seed_memory(self.memory, observations, now_s=now_s)
        self.memory = self._capacity_restore.apply(self.memory, identities)
        gang_plan, self.memory = plan_isolated(
            observations,
            policies,
            forecasts,
            self.memory,
            now_s=now_s,
            on_error=self._metrics.count_error,
            planner=self._planner,
        )
        parts["plan"] = gang_plan

        # act: only the leader, and never in dry-run
        applied: ApplyReport | None = None
        if leader:
            parts["phase"] = "act"
            try:
                applied = await self._kube.apply(gang_plan, state, dry_run=self.dry_run)
            except NotLeader:
                raise
            except KubeAdapterError as err:
                self._metrics.count_error("kubernetes")
                errors.append(f"act: {err}")
                log.warning("acting on the plan failed: %s", err)
            parts["applied"] = applied

        # report
        parts["phase"] = "report"
        self._report(
            state, signals, forecasts, gang_plan, applied, identities=identities, leader=leader
        )

    async def _hold_on_stale_view(
        self,
        state: KubeState,
        policies: Mapping[ComponentKey, Policy],
        detail: str,
        now_s: float,
        *,
        leader: bool,
        parts: dict[str, object],
        errors: list[str],
    ) -> None:
        """The tick when a watch cache has been failing past the limit: what it says about
        gangs, pods and nodes may no longer be true, so nothing is observed, planned on or
        written. Every component holds, the hold is remembered in its scale-down window, and
        each is told once per episode by a Warning Event (not once per tick: the API server
        may be what is struggling)."""
        self._metrics.count_error("stale_view")
        errors.append(detail)
        log.warning("tick %d: %s; holding every component, writing nothing", self.ticks, detail)
        parts["phase"] = "plan"
        observations = state.observations({})
        self.memory = seed_memory(self.memory, observations, now_s=now_s)
        gang_plan, self.memory = hold_every_component(
            observations,
            policies,
            self.memory,
            now=now_s,
            reason=Reason.HOLD_STALE_VIEW,
            detail=detail,
        )
        parts["plan"] = gang_plan
        applied: ApplyReport | None = None
        if leader:
            parts["phase"] = "act"
            told: dict[ComponentKey, ComponentApplied] = {}
            parts["applied"] = applied = ApplyReport(components=told)
            untold = [
                plan for key, plan in sorted(gang_plan.components.items())
                if key not in self._told_stale
            ]  # fmt: skip
            # Told before the calls: a tick cut short by its deadline does not make the next
            # one send (or bump) the same Events again.
            self._told_stale.update(plan.key for plan in untold)
            await self._kube.report_holds(untold, state, dry_run=self.dry_run, told=told)
        parts["phase"] = "report"
        self._report(
            state, {}, {}, gang_plan, applied, identities={}, leader=leader, observed=False
        )

    # -- report ---------------------------------------------------------------------------

    def _count_policy_problems(self, state: KubeState) -> None:
        current: collections.Counter[tuple[str, str, str]] = collections.Counter()
        # Counted and logged once while it lasts: keyed by the problem, not the object's
        # resourceVersion, which every status write of the LWS controller changes. A problem
        # that goes away and comes back counts again.
        previous, self._policy_problems_seen = self._policy_problems_seen, set()
        for namespace, lws in self._policy_error_lws - {
            (k.namespace, k.lws) for k in state.components
        }:
            self._metrics.forget_policy_errors(namespace=namespace, lws=lws)
        self._policy_error_lws &= {(k.namespace, k.lws) for k in state.components}
        for key, problems in state.problems.items():
            for problem in problems:
                current[(key.namespace, key.lws, problem.annotation)] += 1
                seen = (key, problem.annotation, str(problem))
                self._policy_problems_seen.add(seen)
                if seen in previous:
                    continue
                self._metrics.count_policy_error(
                    namespace=key.namespace, lws=key.lws, annotation=problem.annotation
                )
                self._policy_error_lws.add((key.namespace, key.lws))
                log.warning(
                    "%s: policy rejected: %s",
                    key,
                    problem,
                    extra={"component_key": str(key), "annotation": problem.annotation},
                )
        self._metrics.set_policy_problems(current)

    def _report(
        self,
        state: KubeState,
        signals: Mapping[ComponentKey, Signals],
        forecasts: Mapping[ComponentKey, Forecast],
        gang_plan: GangPlan,
        applied: ApplyReport | None,
        *,
        identities: Mapping[ComponentKey, CapacityIdentity],
        leader: bool,
        observed: bool = True,
    ) -> None:
        """`observed=False`: the snapshot is not trusted, so what it says of gangs (ready,
        partial, balloon) is left out of the gauges rather than exported as current."""
        gone = set(self._reported) - set(gang_plan.components)
        left: list[ComponentLabels] = []  # labels no component of this tick reports under
        for key in set(self._last_logged) - set(gang_plan.components):
            del self._last_logged[key]  # on every role: a standby reports nothing, but logs
        for key in sorted(gang_plan.components):
            plan = gang_plan.components[key]
            labels = component_labels(state, key)
            comp_applied = applied.components.get(key) if applied else None
            if comp_applied is not None:
                for error in comp_applied.errors:
                    self._metrics.count_error("kubernetes")
                    log.warning("%s: %s", key, error)
                scale = comp_applied.scale
                if scale is not None and scale.result is ScaleResult.SCALED:
                    self._metrics.count_scale_write(
                        labels, from_gangs=scale.from_gangs, to_gangs=scale.to_gangs
                    )
            self._log_decision(key, plan, signals.get(key), forecasts.get(key), leader=leader)
            if plan.forgotten_capacity_per_gang is not None:
                now_for = identities.get(key)
                log.info(
                    "%s: gang template, demand query or LWS object changed (now template %s, "
                    "demand query %s, uid %s); capacity per gang %g learned for the old one is "
                    "forgotten and will be learned again at the next saturation",
                    key,
                    now_for.template if now_for else "?",
                    now_for.demand_query if now_for else "?",
                    now_for.lws_uid if now_for else "?",
                    plan.forgotten_capacity_per_gang,
                    extra={"component_key": str(key)},
                )
            if not leader:
                continue
            self._metrics.count_decision(labels, reason=plan.reason.value)
            if plan.forgotten_capacity_per_gang is not None:
                self._metrics.count_forgotten_capacity(labels)
            obs = state.components[key].observation if observed else None
            sig = signals.get(key, Signals())
            forecast = forecasts.get(key)
            self._metrics.observe_component(
                labels,
                current_gangs=plan.current_gangs,
                desired_gangs=plan.desired_gangs,
                ready_gangs=obs.ready_gangs if obs else None,
                partial_gangs=(
                    sum(1 for g in obs.gangs if g.state is GangState.PARTIAL) if obs else None
                ),
                balloon_gangs=obs.balloon_gangs if obs else None,
                desired_balloon_gangs=plan.balloon_gangs,
                demand=sig.demand,
                capacity_per_gang=plan.capacity_per_gang,
                forecast_demand=forecast.point if forecast else None,
                forecast_demand_upper=forecast.upper if forecast else None,
                burst_factor=plan.burst_factor,
                # a held plan does not classify its gangs: no reading, not zero
                unplaced_gangs=None if plan.hold or not obs else len(plan.unplaced_groups),
            )
            identity = identities.get(key)
            if identity is not None:
                # a held component keeps what it learned for an older template until its
                # next plan forgets it; that value is not this template's to export
                memory = self.memory.of(key)
                same = memory.learned_template == identity.key
                self._metrics.observe_learned_capacity(
                    labels,
                    identity=identity,
                    value=memory.learned_capacity_per_gang if same else None,
                )
            previous = self._reported.get(key)
            if previous is not None and previous != labels:
                left.append(previous)  # its deployment or kind changed
            self._reported[key] = labels
        # Components that are gone (deleted, opted out) leave the dashboards.
        left.extend(self._reported.pop(key) for key in gone)
        # Two LWS can report under one (namespace, deployment, component) (a DisaggregatedSet
        # rollout's old and new role LWS): their shared series stay while one of them does.
        in_use = {labels.values() for labels in self._reported.values()}
        for labels in left:
            self._metrics.forget_component(labels, series_shared=labels.values() in in_use)

    def _log_decision(
        self,
        key: ComponentKey,
        plan: ComponentPlan,
        signals: Signals | None,
        forecast: Forecast | None,
        *,
        leader: bool,
    ) -> None:
        """Every decision logs its reason: at INFO when it changes something or its reason
        differs from the last tick's, at DEBUG when it repeats (a steady fleet of a thousand
        components would otherwise log a thousand identical lines per tick)."""
        fingerprint = (plan.desired_gangs, plan.current_gangs, plan.reason, plan.balloon_gangs)
        repeated = self._last_logged.get(key) == fingerprint
        self._last_logged[key] = fingerprint
        level = logging.DEBUG if repeated and not plan.changes_replicas else logging.INFO
        if not log.isEnabledFor(level):
            return
        role = "dry-run" if self.dry_run else ("leader" if leader else "standby")
        log.log(
            level,
            "%s: %d -> %d gangs (%s%s); balloons %d (%s)",
            key,
            plan.current_gangs,
            plan.desired_gangs,
            plan.reason.value,
            f": {plan.detail}" if plan.detail else "",
            plan.balloon_gangs,
            plan.balloon_reason.value,
            extra={
                "component_key": str(key),
                "current_gangs": plan.current_gangs,
                "desired_gangs": plan.desired_gangs,
                "reason": plan.reason.value,
                "detail": plan.detail,
                "hold": plan.hold,
                "balloon_gangs": plan.balloon_gangs,
                "balloon_reason": plan.balloon_reason.value,
                "waiting_requests": signals.waiting_requests if signals else None,
                "kv_usage_fraction": signals.kv_usage_fraction if signals else None,
                "demand": signals.demand if signals else None,
                "forecast_point": forecast.point if forecast else None,
                "role": role,
            },
        )
