"""Restoring learned capacities into the decision memory: a live value wins, a failed
lookup is retried after the interval, and a lookback of zero turns the lookup off."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.adapters.prometheus_restore import CapacityIdentity
from autoscaler.adapters.prometheus_source import PrometheusSource
from autoscaler.core.gang_plan import ComponentMemory, Memory
from autoscaler.service.capacity_restore import CapacityRestore
from tests.adapters.test_prometheus_restore import (
    DAY_S,
    DECODE,
    PREFILL,
    QUERY,
    Exported,
    openmetrics,
)
from tests.harness.prometheus_server import PrometheusServer, load_openmetrics


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    now_s = int(time.time()) // 60 * 60
    series = [
        Exported(PREFILL, "prefill", "ga-1", now_s - DAY_S, now_s - 600, 20e3, 24e3, "uid-p"),
        Exported(DECODE, "decode", "ga-1", now_s - DAY_S, now_s - 600, 300, 310, "uid-d"),
    ]
    data_dir = Path(tmp_path_factory.mktemp("tsdb"))
    load_openmetrics(openmetrics(series), data_dir=data_dir)
    with PrometheusServer(data_dir=data_dir) as server:
        yield server


IDENTITIES = {
    PREFILL: CapacityIdentity("uid-p", "", QUERY),
    DECODE: CapacityIdentity("uid-d", "", QUERY),
}


async def _finished(restore: CapacityRestore) -> None:
    for _ in range(200):
        if not restore.running:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the restore did not finish")


async def _looked_up(prometheus: PrometheusServer) -> tuple[CapacityRestore, PrometheusSource]:
    """A restore whose first lookup, of both components, has answered."""
    restore = CapacityRestore(lookback_s=7 * DAY_S)
    source = PrometheusSource(url=prometheus.url)
    assert restore.start(source, IDENTITIES, now_s=0.0)
    await _finished(restore)
    return restore, source


@pytest.mark.prometheus
async def test_a_component_that_learned_meanwhile_keeps_its_own(
    prometheus: PrometheusServer,
) -> None:
    restore = CapacityRestore(lookback_s=7 * DAY_S)
    source = PrometheusSource(url=prometheus.url)
    assert restore.start(source, IDENTITIES, now_s=0.0)
    assert not restore.start(source, IDENTITIES, now_s=1.0)  # one lookup at a time
    await _finished(restore)
    memory = Memory(
        components={
            PREFILL: ComponentMemory(proposals=((0.0, 2),)),
            DECODE: ComponentMemory(learned_capacity_per_gang=500.0),
        }
    )
    restored = restore.apply(memory, IDENTITIES)
    assert restored.of(PREFILL).learned_capacity_per_gang == 24e3
    assert restored.of(PREFILL).proposals == ((0.0, 2),)  # the rest of the memory is kept
    assert restored.of(DECODE).learned_capacity_per_gang == 500.0
    # each value is used once: a later loss of the learned value is not papered over
    again = restore.apply(Memory(components={PREFILL: ComponentMemory()}), IDENTITIES)
    assert again.of(PREFILL).learned_capacity_per_gang is None
    # the components were answered: they are not asked about again
    assert not restore.start(source, IDENTITIES, now_s=1000.0)


@pytest.mark.prometheus
async def test_a_recreated_lws_is_asked_about_again_and_gets_nothing_of_the_old_one(
    prometheus: PrometheusServer,
) -> None:
    restore, source = await _looked_up(prometheus)
    # the prefill LWS was deleted and created again before the value was used
    recreated = {**IDENTITIES, PREFILL: CapacityIdentity("uid-new", "", QUERY)}
    memory = Memory(components={PREFILL: ComponentMemory(), DECODE: ComponentMemory()})
    restored = restore.apply(memory, recreated)
    assert restored.of(PREFILL).learned_capacity_per_gang is None
    assert restored.of(DECODE).learned_capacity_per_gang == 310
    assert restore.start(source, recreated, now_s=1.0)  # asked again, for the new object
    await _finished(restore)
    assert restore.apply(memory, recreated).of(PREFILL).learned_capacity_per_gang is None


@pytest.mark.prometheus
async def test_components_that_are_gone_are_forgotten(prometheus: PrometheusServer) -> None:
    restore, source = await _looked_up(prometheus)
    assert not restore.start(source, {}, now_s=1.0)  # both gone (e.g. opted out)...
    memory = Memory(components={PREFILL: ComponentMemory(), DECODE: ComponentMemory()})
    assert restore.apply(memory, IDENTITIES) == memory  # ...with their values
    assert restore.start(source, IDENTITIES, now_s=2.0)  # back: asked about afresh
    await _finished(restore)
    assert restore.apply(memory, IDENTITIES).of(DECODE).learned_capacity_per_gang == 310


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unanswered_lookup_is_retried_after_the_interval() -> None:
    restore = CapacityRestore(lookback_s=DAY_S, retry_interval_s=60.0)
    source = PrometheusSource(url=f"http://127.0.0.1:{_closed_port()}", timeout_s=1.0)
    wanted = {PREFILL: IDENTITIES[PREFILL]}
    assert restore.start(source, wanted, now_s=100.0)
    await _finished(restore)
    memory = Memory(components={PREFILL: ComponentMemory()})
    assert restore.apply(memory, wanted) == memory
    assert not restore.start(source, wanted, now_s=159.0)
    assert restore.start(source, wanted, now_s=160.0)
    await _finished(restore)
    assert source.stats.errors["connection"] == 2


async def test_a_lookback_of_zero_asks_nothing() -> None:
    restore = CapacityRestore(lookback_s=0.0)
    source = PrometheusSource(url=f"http://127.0.0.1:{_closed_port()}", timeout_s=1.0)
    assert not restore.start(source, {PREFILL: IDENTITIES[PREFILL]}, now_s=0.0)
    assert source.stats.queries_sent == 0
