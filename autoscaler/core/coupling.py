"""Step 5: keep a prefill/decode deployment functional.

A PD deployment serves only with at least one ready gang of each component. So either every
component is at or above its minimum (and at least 1), or the whole deployment is at zero;
and, when the operator sets one, the prefill:decode ratio stays inside its band (by raising
the short side, never by cutting serving capacity).

Must not import: asyncio, aiohttp, kubernetes_asyncio, prometheus_api_client, statsmodels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autoscaler.core.gang_plan import Reason
from autoscaler.core.model import Component, ComponentKey
from autoscaler.core.policy import Policy


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
    if p / d < band.low:
        wanted = min(math.ceil(band.low * d - 1e-9), policies[p_key].max_replicas)
        if wanted > p:
            out[p_key] = Coupled(wanted, Reason.RATIO_BAND, f"prefill raised to keep {band}")
    else:
        wanted = min(math.ceil(p / band.high - 1e-9), policies[d_key].max_replicas)
        if wanted > d:
            out[d_key] = Coupled(wanted, Reason.RATIO_BAND, f"decode raised to keep {band}")
    return out
