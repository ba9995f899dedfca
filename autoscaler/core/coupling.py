"""Step 5: keep a prefill/decode deployment functional.

A PD deployment serves only with at least one ready gang of each component. So either every
component is at or above its minimum (and at least 1), or the whole deployment is at zero;
and, when the operator sets one, the prefill:decode ratio stays inside its band (by raising
the short side, never by cutting serving capacity).

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autoscaler.core.capacity import ceil_gangs, floor_gangs
from autoscaler.core.gang_plan import Reason
from autoscaler.core.model import Component, ComponentKey
from autoscaler.core.policy import Policy, RatioBand


@dataclass(frozen=True, slots=True)
class Coupled:
    gangs: int
    reason: Reason | None  # None: coupling did not change this component
    detail: str = ""


def functional_minimum(policy: Policy) -> int:
    """Gangs a component needs for its deployment to serve at all."""
    return max(policy.min_replicas, 1)


def couple_deployment(
    desired: Mapping[ComponentKey, int], policies: Mapping[ComponentKey, Policy]
) -> dict[ComponentKey, Coupled]:
    """Apply the all-or-nothing minimum and the ratio band to one deployment's components."""
    keys = sorted(desired)
    if len(keys) < 2:
        return {k: Coupled(desired[k], None) for k in keys}

    if all(desired[k] == 0 for k in keys):
        return {k: Coupled(0, Reason.DEPLOYMENT_AT_ZERO, "every component at zero") for k in keys}

    out: dict[ComponentKey, Coupled] = {}
    for k in keys:
        minimum = functional_minimum(policies[k])
        if desired[k] < minimum:
            out[k] = Coupled(
                minimum,
                Reason.DEPLOYMENT_MINIMUM,
                f"raised from {desired[k]} so the deployment keeps one of each component",
            )
        else:
            out[k] = Coupled(desired[k], None)

    prefill = [k for k in keys if policies[k].component is Component.PREFILL]
    decode = [k for k in keys if policies[k].component is Component.DECODE]
    band = policies[keys[0]].prefill_decode_ratio
    if band is None or len(prefill) != 1 or len(decode) != 1:
        return out
    p_key, d_key = prefill[0], decode[0]
    p, d = out[p_key].gangs, out[d_key].gangs
    if band.contains(p, d):
        return out
    raised = _smallest_in_band(
        p, d, band, max_prefill=policies[p_key].max_replicas,
        max_decode=policies[d_key].max_replicas,
    )  # fmt: skip
    if raised is None:
        # No count within both maximums is in the band: raise the short side toward it, but
        # never past the band's far edge. Past it, the next tick finds the other side short
        # and raises that, then this one again: both sides climbed to their maximums over a
        # few ticks, even while every signal was missing (3:4 at 4 and 5 gangs went to 6, 7).
        max_prefill, max_decode = policies[p_key].max_replicas, policies[d_key].max_replicas
        if p / d < band.low:
            toward = min(ceil_gangs(band.low * d), floor_gangs(band.high * d), max_prefill)
            raised = (max(p, toward), d)
        else:
            far = floor_gangs(p / band.low) if band.low > 0 else max_decode
            raised = (p, max(d, min(ceil_gangs(p / band.high), far, max_decode)))
    new_p, new_d = raised
    if new_p > p:
        out[p_key] = Coupled(new_p, Reason.RATIO_BAND, f"prefill raised to keep {band}")
    if new_d > d:
        out[d_key] = Coupled(new_d, Reason.RATIO_BAND, f"decode raised to keep {band}")
    return out


def _smallest_in_band(
    prefill: int, decode: int, band: RatioBand, *, max_prefill: int, max_decode: int
) -> tuple[int, int] | None:
    """The fewest gangs, neither side lowered, whose ratio is in the band: raising only the
    short side misses a narrow band (1:3 from 1:4 needs 2:6, not 2:4). The search stops a
    hundred decode gangs past where the band's upper end first allows the prefill count:
    a band written as a ratio of small numbers repeats well within that."""
    first = max(decode, ceil_gangs(prefill / band.high)) if band.high > 0 else decode
    for d in range(decode, min(max_decode, first + 100) + 1):
        p = max(prefill, ceil_gangs(band.low * d))
        if p <= max_prefill and band.contains(p, d):
            return p, d
    return None
