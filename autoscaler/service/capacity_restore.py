"""Learned capacities read back from Prometheus into the decision memory after a restart.

When a component is first seen, a background task asks Prometheus for the learned capacity
per gang the previous leader exported (`adapters.prometheus_restore`); the tick never waits
for it. A value found is put into the memory of a component that has not learned its own
since (a live sample always wins), once. If Prometheus cannot answer, the components are
asked about again after `retry_interval_s`; a component without an exported value learns
afresh, as it would have without this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime

from autoscaler.adapters.prometheus_restore import RestoredCapacity
from autoscaler.adapters.prometheus_source import PrometheusSource
from autoscaler.core.gang_plan import Memory
from autoscaler.core.model import ComponentKey

log = logging.getLogger(__name__)

DEFAULT_RETRY_INTERVAL_S = 60.0


class CapacityRestore:
    def __init__(
        self, *, lookback_s: float, retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S
    ) -> None:
        self.lookback_s = lookback_s
        self.retry_interval_s = retry_interval_s
        self._asked: set[ComponentKey] = set()
        self._found: dict[ComponentKey, RestoredCapacity] = {}
        self._failed_at_s: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.lookback_s > 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(
        self, source: PrometheusSource, keys: Iterable[ComponentKey], *, now_s: float
    ) -> bool:
        """Ask, in the background, about components not asked about yet; True if it did."""
        if not self.enabled or self.running:
            return False
        if self._failed_at_s is not None and now_s - self._failed_at_s < self.retry_interval_s:
            return False
        new = {key for key in keys if key not in self._asked}
        if not new:
            return False
        self._asked |= new
        self._task = asyncio.create_task(
            self._restore(source, new, now_s=now_s), name="capacity-restore"
        )
        return True

    async def _restore(
        self, source: PrometheusSource, keys: set[ComponentKey], *, now_s: float
    ) -> None:
        try:
            found = await source.restore_learned_capacity(lookback_s=self.lookback_s)
        except Exception as err:  # counted by the source; a failed restore only costs time
            self._asked -= keys
            self._failed_at_s = now_s
            log.warning(
                "learned capacity of %d components not restored (%s); retrying in %gs",
                len(keys),
                err,
                self.retry_interval_s,
            )
            return
        self._failed_at_s = None
        for key in sorted(keys & found.keys()):
            self._found[key] = found[key]

    def apply(self, memory: Memory) -> Memory:
        """`memory` with every restored capacity put into a component that has none."""
        if not self._found:
            return memory
        components = dict(memory.components)
        for key, restored in sorted(self._found.items()):
            current = components.get(key)
            if current is None:
                continue  # not planned yet; kept for the tick that plans it
            del self._found[key]
            if current.learned_capacity_per_gang is not None:
                log.info("%s: learned its own capacity per gang; the restored one is dropped", key)
                continue
            components[key] = replace(current, learned_capacity_per_gang=restored.capacity_per_gang)
            written = datetime.fromtimestamp(restored.written_at_s, tz=UTC).isoformat()
            log.info(
                "%s: restored learned capacity per gang %g (exported %s)",
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
