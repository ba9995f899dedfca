"""Per-component scaling policy, parsed from `gang-autoscaler.io/*` annotations on an LWS.

The annotation table of DESIGN section 5 is a contract: the keys, their defaults and their
meaning live here and only here. Parsing never raises anything but `PolicyError`, which
carries one `PolicyProblem` per bad annotation, so a caller can hold the component and
report each problem precisely.

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
)

from autoscaler.core.model import Component, ComponentKey, DeploymentKey

PREFIX = "gang-autoscaler.io/"
ENABLED_ANNOTATION = PREFIX + "enabled"

# ASCII digits only, as Go reads them: `\d` took `٣s` (an Arabic-Indic three) for 3 s
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNIT_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(text: str | float | int) -> float:
    """Parse a Go-style duration (`90s`, `5m`, `1h30m`, `500ms`, `0`) into seconds.

    Plain numbers are refused (except 0, as in Go) because `5` could mean seconds or
    minutes, and a policy that guesses wrongly scales at the wrong time.
    """
    if isinstance(text, int | float) and not isinstance(text, bool):
        if text == 0:
            return 0.0
        raise ValueError(f"{text!r} has no unit; write it like 90s, 5m or 1h")
    raw = str(text).strip()
    if raw in ("0", "+0"):
        return 0.0
    if not raw:
        raise ValueError("empty duration")
    pos = 0
    total = 0.0
    for match in _DURATION_PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNIT_S[match.group(2)]
        pos = match.end()
    if pos != len(raw):
        raise ValueError(f"{raw!r} is not a duration; write it like 90s, 5m or 1h30m")
    return total


def _duration(value: Any) -> float:
    return parse_duration(value)


Duration = Annotated[float, BeforeValidator(_duration), Field(ge=0, allow_inf_nan=False)]

# A new gang serves minutes after it is ordered (a node, the image, the weights). A day is far
# past any real lead time, and the forecast that far ahead is no longer cheap: `100000h`
# took a state-space forecast 23 s, every window, inside the tick.
MAX_LEAD_TIME_S = 86_400.0


def _lead_time(value: float) -> float:
    if value > MAX_LEAD_TIME_S:
        raise ValueError(
            "is longer than 24h, the longest lead time taken (a new gang's node, image and "
            "weights take minutes)"
        )
    return value


# A deployment name is a metric label value and a Grafana variable value: a quote or a
# backslash in it broke the dashboards' queries (Grafana escapes only some characters). The
# names of Kubernetes objects (the default is the LWS name) all fit.
_DEPLOYMENT_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")


def _deployment_name(value: str) -> str:
    if not _DEPLOYMENT_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a name: letters, digits, '-', '_' and '.', starting and ending "
            "with a letter or digit, at most 253 characters (it names the deployment in "
            "metrics and dashboards)"
        )
    return value


@dataclass(frozen=True, slots=True)
class RatioBand:
    """Allowed band of prefill gangs per decode gang, e.g. `1:2-1:4` is [0.25, 0.5]."""

    low: float
    high: float
    # the annotation as written, for messages; two spellings of one band are equal
    text: str | None = field(default=None, compare=False)

    def contains(self, prefill_gangs: int, decode_gangs: int) -> bool:
        if decode_gangs == 0:
            return prefill_gangs == 0
        ratio = prefill_gangs / decode_gangs
        return self.low - 1e-9 <= ratio <= self.high + 1e-9

    def __str__(self) -> str:
        return f"{self.low:g}-{self.high:g} prefill per decode gang"


_RATIO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*:\s*(\d+(?:\.\d+)?)\s*$")


def parse_ratio_band(text: Any) -> RatioBand:
    """Parse `P:D` (exact) or `P1:D1-P2:D2` (a band) into prefill-per-decode fractions."""
    if isinstance(text, RatioBand):
        return text
    parts = str(text).split("-")
    if len(parts) not in (1, 2):
        raise ValueError(f"{text!r} is not a ratio; write it like 1:2 or 1:2-1:4")
    fractions = []
    for part in parts:
        match = _RATIO.match(part)
        if not match:
            raise ValueError(f"{text!r} is not a ratio; write it like 1:2 or 1:2-1:4")
        prefill, decode = float(match.group(1)), float(match.group(2))
        if prefill <= 0 or decode <= 0:
            raise ValueError(f"{text!r}: both sides of a ratio must be positive")
        fraction = prefill / decode
        # 400 digits read as inf, and their ratio as inf or 0: not a band the coupling can use
        if not (math.isfinite(prefill) and math.isfinite(decode) and 0 < fraction < math.inf):
            raise ValueError(f"{text!r}: both sides of a ratio must be finite numbers")
        fractions.append(fraction)
    return RatioBand(low=min(fractions), high=max(fractions), text=str(text))


# "nan", "infinity" and "1e999" all read as floats; none of them is a usable setting.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class Policy(BaseModel):
    """The scaling policy of one component. Field aliases are the annotation keys."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, arbitrary_types_allowed=True
    )

    enabled: bool = Field(False, alias="enabled", description='"true" opts the LWS in')
    deployment: Annotated[str, AfterValidator(_deployment_name)] | None = Field(
        None,
        alias="deployment",
        description="components with the same value in one namespace form one deployment; "
        "defaults to the LWS name",
    )
    component: Component = Field(Component.UNIFIED, alias="component")
    min_replicas: int = Field(
        1, alias="min-replicas", ge=0, le=1_000_000, description="minimum gangs"
    )
    max_replicas: int = Field(
        10, alias="max-replicas", ge=1, le=1_000_000, description="maximum gangs"
    )
    target_waiting: FiniteFloat = Field(
        4.0, alias="target-waiting", gt=0, description="target waiting requests per ready gang"
    )
    target_kv_cache: FiniteFloat = Field(
        0.8, alias="target-kv-cache", gt=0, le=1, description="target KV-cache usage fraction"
    )
    capacity_per_replica: FiniteFloat | None = Field(
        None,
        alias="capacity-per-replica",
        gt=0,
        description="demand one gang serves at target, in the demand signal's unit; "
        "learned from saturated throughput when unset",
    )
    forecast: bool = Field(True, alias="forecast", description="on or off")
    lead_time_s: Annotated[Duration, AfterValidator(_lead_time)] = Field(300.0, alias="lead-time")
    min_buffer: int = Field(0, alias="min-buffer", ge=0, le=1000)
    max_buffer: int = Field(2, alias="max-buffer", ge=0, le=1000)
    scale_down_window_s: Duration = Field(300.0, alias="scale-down-window")
    max_scale_up: int = Field(2, alias="max-scale-up", ge=1, le=1_000_000)
    gang_timeout_s: Duration = Field(600.0, alias="gang-timeout", gt=0)
    prefill_decode_ratio: Annotated[RatioBand | None, BeforeValidator(parse_ratio_band)] = Field(
        None, alias="prefill-decode-ratio"
    )
    dry_run: bool = Field(False, alias="dry-run")

    def deployment_name(self, lws_name: str) -> str:
        return self.deployment or lws_name


_ALIASES = frozenset(info.alias or name for name, info in Policy.model_fields.items())
ANNOTATIONS: tuple[str, ...] = tuple(
    PREFIX + (info.alias or name) for name, info in Policy.model_fields.items()
)


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """One bad annotation: which key, what value, and why."""

    annotation: str
    value: str | None
    message: str

    @property
    def detail(self) -> str:
        """The message with the offending value, without the annotation key."""
        shown = "" if self.value is None else f" (got {self.value!r})"
        return f"{self.message}{shown}"

    def __str__(self) -> str:
        return f"{self.annotation}: {self.detail}"


class PolicyError(ValueError):
    """The annotations of one LWS (or one deployment) do not form a valid policy.

    `partial` is the policy of the annotations that did parse, the rest at their defaults,
    and `unparsed` names the annotations (without the prefix) that did not: enough to look
    for further problems, such as a deployment's components disagreeing, never to scale on.
    """

    def __init__(
        self,
        problems: Iterable[PolicyProblem],
        *,
        partial: Policy | None = None,
        unparsed: Collection[str] = (),
    ) -> None:
        self.problems = tuple(problems)
        self.partial = partial
        self.unparsed = frozenset(unparsed)
        super().__init__("; ".join(str(p) for p in self.problems))


_COUNT: TypeAdapter[int] = TypeAdapter(int)


def annotation_count(value: object) -> int | None:
    """An integer annotation as `parse_policy` reads it (`"2"`, `" 2 "`, `"2.0"`), or None
    when it would not parse."""
    try:
        return _COUNT.validate_python(value.strip() if isinstance(value, str) else value)
    except ValidationError:
        return None


def is_enabled(annotations: Mapping[str, str] | None) -> bool:
    return str((annotations or {}).get(ENABLED_ANNOTATION, "")).strip().lower() == "true"


def _pydantic_message(error: Mapping[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown annotation under " + PREFIX
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def parse_policy(annotations: Mapping[str, str] | None, *, lws_name: str) -> Policy:
    """Build the Policy of one LWS from its annotations, or raise PolicyError."""
    # Surrounding whitespace (a YAML `"true "`) is stripped from every value, as `is_enabled`
    # strips it: before, an LWS opted in with `"true "` was then held as invalid, and some
    # annotations took `" 2 "` while others refused `" decode"`.
    raw = {
        key.removeprefix(PREFIX): value.strip() if isinstance(value, str) else value
        for key, value in (annotations or {}).items()
        if isinstance(key, str) and key.startswith(PREFIX)  # YAML may give `1:` an int key
    }
    problems = [
        PolicyProblem(PREFIX + key, repr(value), "annotation values must be strings")
        for key, value in raw.items()
        if not isinstance(value, str)
    ]
    # The model also takes its field names (`max_replicas`), for code that builds a Policy;
    # an annotation is only ever its alias (`max-replicas`).
    for key in raw.keys() - _ALIASES:
        hint = key.replace("_", "-")
        problems.append(
            PolicyProblem(
                PREFIX + key,
                None,
                "unknown annotation under "
                + PREFIX
                + (f"; did you mean {PREFIX}{hint}?" if hint in _ALIASES else ""),
            )
        )
    unparsed = {p.annotation.removeprefix(PREFIX) for p in problems}
    cause: ValidationError | None = None
    try:
        policy = Policy.model_validate({k: v for k, v in raw.items() if k not in unparsed})
    except ValidationError as err:
        cause = err
        for error in err.errors():
            alias = str(error["loc"][0]) if error["loc"] else ""
            problems.append(PolicyProblem(PREFIX + alias, raw.get(alias), _pydantic_message(error)))
            unparsed.add(alias)
        # Without the fields in error the rest still parses; its cross-field problems are
        # reported now rather than after the operator has fixed the first ones.
        try:
            policy = Policy.model_validate({k: v for k, v in raw.items() if k not in unparsed})
        except ValidationError:
            raise PolicyError(problems, unparsed=unparsed) from err
    problems.extend(_cross_field_problems(policy, raw, unparsed=unparsed))
    if problems:
        raise PolicyError(problems, partial=policy, unparsed=unparsed) from cause
    return policy


def _cross_field_problems(
    policy: Policy, raw: Mapping[str, Any], *, unparsed: Collection[str]
) -> list[PolicyProblem]:
    """Problems between annotations of one LWS, among those that parsed.

    A check that involves an annotation in error is skipped: the default standing in for it
    is not what the operator wrote.
    """

    def parsed(*aliases: str) -> bool:
        return not any(alias in unparsed for alias in aliases)

    problems: list[PolicyProblem] = []
    if parsed("min-replicas", "max-replicas") and policy.min_replicas > policy.max_replicas:
        problems.append(
            PolicyProblem(
                PREFIX + "min-replicas",
                raw.get("min-replicas", str(policy.min_replicas)),
                f"is greater than max-replicas ({policy.max_replicas})",
            )
        )
    if parsed("min-buffer", "max-buffer") and policy.min_buffer > policy.max_buffer:
        problems.append(
            PolicyProblem(
                PREFIX + "min-buffer",
                raw.get("min-buffer", str(policy.min_buffer)),
                f"is greater than max-buffer ({policy.max_buffer})",
            )
        )
    if (
        parsed("prefill-decode-ratio", "component")
        and policy.prefill_decode_ratio is not None
        and policy.component is Component.UNIFIED
    ):
        problems.append(
            PolicyProblem(
                PREFIX + "prefill-decode-ratio",
                raw.get("prefill-decode-ratio"),
                "a ratio needs a prefill/decode deployment; this component is unified",
            )
        )
    return problems


def policy_cautions(policy: Policy) -> tuple[PolicyProblem, ...]:
    """Valid annotations that work against each other: said, never held on.

    A `gang-timeout` shorter than `lead-time` scales away, as a partial gang, a new gang
    whose nodes come one by one or that is loading its weights when start-up takes as long
    as the operator says it may (a gang with no pod placed waits while the cluster can
    grow). Not refused: the lead time is an estimate, and a component whose
    operator only raised it would otherwise stop scaling."""
    cautions: list[PolicyProblem] = []
    if policy.gang_timeout_s < policy.lead_time_s:
        cautions.append(
            PolicyProblem(
                PREFIX + "gang-timeout",
                None,
                f"{policy.gang_timeout_s:g}s is shorter than lead-time "
                f"({policy.lead_time_s:g}s): a new gang not ready by then is scaled away as a "
                "partial gang; set it above lead-time",
            )
        )
    return tuple(cautions)


def deployment_key(key: ComponentKey, policy: Policy) -> DeploymentKey:
    return DeploymentKey(key.namespace, policy.deployment_name(key.lws))


def validate_deployment(
    policies: Mapping[ComponentKey, Policy],
    *,
    unparsed: Mapping[ComponentKey, Collection[str]] | None = None,
) -> dict[ComponentKey, tuple[PolicyProblem, ...]]:
    """Cross-component checks for the components of ONE deployment.

    Returns the problems per component (empty dict when the deployment is consistent).
    A deployment is either one unified component, or one prefill and one decode component
    that agree on the ratio band. `unparsed` names, per component, annotations that did not
    parse (`PolicyError.unparsed`; their policies are `PolicyError.partial`): checks that
    would read one of them leave that component out.
    """
    problems: dict[ComponentKey, list[PolicyProblem]] = {}

    def add(key: ComponentKey, annotation: str, value: str | None, message: str) -> None:
        problems.setdefault(key, []).append(PolicyProblem(PREFIX + annotation, value, message))

    def parsed(key: ComponentKey, alias: str) -> bool:
        return alias not in (unparsed or {}).get(key, ())

    by_component: dict[Component, list[ComponentKey]] = {}
    for key, policy in sorted(policies.items()):
        if parsed(key, "component"):
            by_component.setdefault(policy.component, []).append(key)
    # a component whose role did not parse may be the one that seems to be missing
    roles_known = sum(len(keys) for keys in by_component.values()) == len(policies)

    for component, keys in by_component.items():
        if len(keys) > 1:
            names = ", ".join(k.lws for k in keys)
            for key in keys:
                add(key, "component", component.value, f"{len(keys)} LWS claim it: {names}")
    unified = by_component.get(Component.UNIFIED, [])
    pd = by_component.get(Component.PREFILL, []) + by_component.get(Component.DECODE, [])
    if unified and pd:
        for key in unified + pd:
            add(
                key,
                "component",
                policies[key].component.value,
                "a deployment is either unified or prefill+decode, not both",
            )
    elif (
        pd
        and roles_known
        and not (by_component.get(Component.PREFILL) and by_component.get(Component.DECODE))
    ):
        missing = "decode" if by_component.get(Component.PREFILL) else "prefill"
        for key in pd:
            add(
                key,
                "deployment",
                policies[key].deployment,
                f"no {missing} component found for this deployment",
            )

    with_ratio = [k for k in pd if parsed(k, "prefill-decode-ratio")]
    ratios = {policies[k].prefill_decode_ratio for k in with_ratio}
    if len(ratios) > 1:
        shown = sorted(str(r) for r in ratios)
        for key in with_ratio:
            band = policies[key].prefill_decode_ratio
            add(
                key,
                "prefill-decode-ratio",
                None if band is None else band.text or str(band),
                f"components of one deployment disagree: {shown}",
            )
    with_min = [k for k in pd if parsed(k, "min-replicas")]
    scale_to_zero = {policies[k].min_replicas == 0 for k in with_min}
    if len(scale_to_zero) > 1:
        for key in with_min:
            add(
                key,
                "min-replicas",
                str(policies[key].min_replicas),
                "scale to zero (min-replicas 0) must be set on every component or none",
            )
    return {key: tuple(found) for key, found in problems.items()}
