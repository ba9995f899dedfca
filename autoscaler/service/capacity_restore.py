"""Learned capacities read back from Prometheus into the decision memory after a restart.

When a component is first seen (or its LWS was recreated, or its demand query changed), a
background task asks Prometheus for the learned capacity per gang a previous leader exported
for that LWS object and demand query (`adapters.prometheus_restore`); the tick never waits
for it. A value found is put, once, into the memory of a component that has not learned its
own since (a live sample always wins) and still has the identity it was asked for. If
Prometheus cannot answer, the components are asked about again after `retry_interval_s`; a
component without an exported value learns afresh, as it would have without this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

from autoscaler.adapters.prometheus_restore import CapacityIdentity, RestoredCapacity
from autoscaler.adapters.prometheus_source import PrometheusSource
from autoscaler.core.gang_plan import Memory
from autoscaler.core.model import ComponentKey

log = logging.getLogger(__name__)

DEFAULT_RETRY_INTERVAL_S = 60.0


class CapacityRestore:
    def __init__(
        self,
        *,
        lookback_s: float,
        retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S,
        dry_run: bool = False,
    ) -> None:
        """`dry_run`: this instance never writes, and may take what a dry-run one learned."""
        self.lookback_s = lookback_s
        self.dry_run = dry_run
        self.retry_interval_s = retry_interval_s
        self._asked: dict[ComponentKey, CapacityIdentity] = {}
        self._found: dict[ComponentKey, tuple[CapacityIdentity, RestoredCapacity]] = {}
        self._unanswered_since_s: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.lookback_s > 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(
        self,
        source: PrometheusSource,
        components: Mapping[ComponentKey, CapacityIdentity],
        *,
        now_s: float,
    ) -> bool:
        """Ask, in the background, about components not yet asked about with their current
        identity; True if it did. Components that are gone are forgotten."""
        for gone in self._asked.keys() - components.keys():
            del self._asked[gone]
            self._found.pop(gone, None)
        if not self.enabled or self.running:
            return False
        if (
            self._unanswered_since_s is not None
            and now_s - self._unanswered_since_s < self.retry_interval_s
        ):
            return False
        new = {k: v for k, v in components.items() if self._asked.get(k) != v}
        if not new:
            return False
        self._asked.update(new)
        self._task = asyncio.create_task(self._restore(source, new), name="capacity-restore")
        self._unanswered_since_s = now_s  # the retry interval counts from here until it answers
        return True

    async def _restore(
        self, source: PrometheusSource, wanted: dict[ComponentKey, CapacityIdentity]
    ) -> None:
        try:
            found = await source.restore_learned_capacity(
                wanted=wanted, lookback_s=self.lookback_s, include_dry_run=self.dry_run
            )
        except Exception as err:  # counted by the source; a failed restore only costs time
            for key, identity in wanted.items():
                if self._asked.get(key) == identity:
                    del self._asked[key]
            log.warning(
                "learned capacity of %d components not restored (%s); retrying in %gs",
                len(wanted),
                err,
                self.retry_interval_s,
            )
            return
        self._unanswered_since_s = None
        for key in sorted(found):
            self._found[key] = (wanted[key], found[key])
        none = sorted(str(k) for k in wanted.keys() - found.keys())
        log.info(
            "learned capacity found in Prometheus for %d of %d components%s",
            len(found),
            len(wanted),
            f"; none exported for {', '.join(none[:5])}{' ...' if len(none) > 5 else ''}"
            if none
            else "",
        )

    def apply(self, memory: Memory, identities: Mapping[ComponentKey, CapacityIdentity]) -> Memory:
        """`memory` with every restored capacity put into a component that has none and
        still has the identity it was exported for."""
        if not self._found:
            return memory
        components = dict(memory.components)
        for key, (identity, restored) in sorted(self._found.items()):
            current = components.get(key)
            if current is None:
                continue  # not planned yet; kept for the tick that plans it
            del self._found[key]
            if identities.get(key) != identity:
                continue  # recreated or re-queried while the lookup ran; asked again
            if current.learned_capacity_per_gang is not None:
                log.info("%s: learned its own capacity per gang; the restored one is dropped", key)
                continue
            components[key] = replace(
                current,
                learned_capacity_per_gang=restored.capacity_per_gang,
                learned_template=identity.key,
            )
            written = datetime.fromtimestamp(restored.written_at_s, tz=UTC).isoformat()
            log.info(
                "%s: restored learned capacity per gang %g (last reported %s)",
                key,
                restored.capacity_per_gang,
                written,
                extra={"component_key": str(key)},
            )
        return Memory(components=components)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
