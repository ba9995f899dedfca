"""Value types the decision core consumes and produces.

Everything here is a frozen dataclass: observations and forecasts come in, a plan and the
next memory go out. Adapters build the inputs; the service and the simulator read the
outputs. Units live in the field names.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels,
or anything under autoscaler.adapters / service / sim.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from autoscaler.core.shape import GangShape, Resources


class Component(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    UNIFIED = "unified"


@dataclass(frozen=True, slots=True, order=True)
class ComponentKey:
    """Identity of one component: the namespace and name of its LeaderWorkerSet."""

    namespace: str
    lws: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.lws}"


@dataclass(frozen=True, slots=True, order=True)
class DeploymentKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class GangState(enum.StrEnum):
    READY = "ready"  # every pod Ready
    STARTING = "starting"  # every pod placed, not every pod Ready yet
    PARTIAL = "partial"  # some pods placed, some Pending
    PENDING = "pending"  # no pod placed (or pods not created yet)


@dataclass(frozen=True, slots=True)
class GangStatus:
    """One LWS group as seen from its pods."""

    group_index: int
    pods_expected: int
    pods_scheduled: int
    pods_ready: int
    # When the gang was first seen not-ready (oldest pod creation among its not-ready pods),
    # in the caller's clock (seconds). None for a ready gang.
    not_ready_since_s: float | None = None
    # Members terminating on a node that takes their replacements (not counted above): the
    # room they hold goes to the pods that replace them, so it is neither free nor to be
    # found again. On a node that does not (cordoned, drained by taint), it is not counted.
    pods_leaving: int = 0

    @property
    def state(self) -> GangState:
        if self.pods_ready >= self.pods_expected:
            return GangState.READY
        if self.pods_scheduled >= self.pods_expected:
            return GangState.STARTING
        if self.pods_scheduled > 0:
            return GangState.PARTIAL
        return GangState.PENDING


@dataclass(frozen=True, slots=True)
class Signals:
    """Load signals of one component, aggregated over its ready gangs' leader pods.

    None means "no trustworthy data" (missing, NaN, stale, Prometheus down): the core holds.
    Zero means "measured, and there is no load".
    """

    waiting_requests: float | None = None  # sum of vllm:num_requests_waiting
    running_requests: float | None = None  # sum of vllm:num_requests_running
    kv_usage_fraction: float | None = None  # mean KV-cache usage over ready gangs, 0-1
    demand: float | None = None  # arrivals in the demand signal's unit (e.g. tokens/s)
    # requests waiting for the component's deployment in front of its pods (a gateway's
    # queue); what can bring a deployment at zero gangs back, since its pods serve nothing
    wake_requests: float | None = None
    # Why a signal is None, keyed by signal name ("waiting_requests", ...), for reports.
    missing_reasons: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The adapters turn NaN and Inf into None; enforced here too, so a reading that slips
        # through is a hold, not a ValueError in the middle of `plan`. A negative count or
        # fraction is no reading either (it proposed scaling down); a negative demand is
        # the estimate's noise (served plus a shrinking queue's growth), read as no load.
        reasons = dict(self.missing_reasons)
        for name in _SIGNAL_NAMES:
            value = getattr(self, name)
            if value is not None and not (
                math.isfinite(value) and (value >= 0 or name == "demand")
            ):
                object.__setattr__(self, name, None)
                reasons.setdefault(name, f"not a reading: {value}")
        if len(reasons) != len(self.missing_reasons):
            object.__setattr__(self, "missing_reasons", reasons)


_SIGNAL_NAMES = (
    "waiting_requests",
    "running_requests",
    "kv_usage_fraction",
    "demand",
    "wake_requests",
)


@dataclass(frozen=True, slots=True)
class ComponentObservation:
    """What the adapters saw of one component at `now`."""

    key: ComponentKey
    spec_gangs: int  # the LWS's spec.replicas as last read
    gangs: tuple[GangStatus, ...]
    signals: Signals
    shape: GangShape
    balloon_gangs: int = 0  # complete balloon gangs currently held for this component
    # a digest of the gang template the LWS runs (images, arguments, resources, size); a
    # learned capacity per gang holds for one template only. None: not known, never changes
    template: str | None = None

    @property
    def ready_gangs(self) -> int:
        return sum(1 for g in self.gangs if g.state is GangState.READY)


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """Room on one node for new pods.

    `free` is allocatable minus the requests of pods bound there that a real gang cannot
    preempt; balloon pods' requests are counted as free, since a real gang preempts them.
    """

    name: str
    free: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    schedulable: bool = True
    # Namespaces of LWS pods (real ones, not balloons) bound here. LWS's exclusive placement
    # is a required anti-affinity, within a namespace, against every other group's pods: a
    # gang with an exclusive topology cannot join a domain where its namespace has a gang.
    lws_namespaces: frozenset[str] = frozenset()
    # (namespace, topology key) of the exclusively placed LWS pods bound here. Their
    # anti-affinity keeps every other group of the namespace out of this node's domain under
    # that key, a gang without an exclusive topology of its own too.
    exclusive_lws: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class ClusterObservation:
    nodes: tuple[NodeCapacity, ...]
    # When True (a cluster-autoscaler or Karpenter adds nodes), scale-ups beyond what fits now
    # are still requested; when False they are capped at what fits.
    can_grow: bool = True


@dataclass(frozen=True, slots=True)
class Forecast:
    """Demand expected `horizon_s` ahead, in the demand signal's unit."""

    point: float
    upper: float
    horizon_s: float
    fallback_reason: str | None = None  # set when a baseline stood in for the model


@dataclass(frozen=True, slots=True)
class Observations:
    components: Mapping[ComponentKey, ComponentObservation]
    cluster: ClusterObservation
