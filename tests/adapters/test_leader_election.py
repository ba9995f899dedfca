"""Leader election on one Lease in the fake API server: one writer at a time, takeover after
the lease expires, fast handover on release."""

from __future__ import annotations

import asyncio
import time

import pytest

from autoscaler.adapters.kube_adapter import KubeAdapter
from autoscaler.adapters.kube_errors import NotLeader
from autoscaler.adapters.leader_election import LeaderElector
from autoscaler.core.gang_plan import ComponentPlan, GangPlan, Reason
from autoscaler.core.model import ComponentKey
from tests.adapters.test_kube_adapter_fake import NS, add_gpu_nodes, add_pd, settle
from tests.harness.fake_kube.server import FakeKube

DECODE = ComponentKey(NS, "llama-decode")
LEASE = dict(lease_duration_s=3, renew_deadline_s=2, retry_period_s=1)


def scale_to(current: int, desired: int) -> GangPlan:
    return GangPlan(
        {
            DECODE: ComponentPlan(
                key=DECODE,
                current_gangs=current,
                desired_gangs=desired,
                reason=Reason.SCALE_UP_WAITING,
                balloon_gangs=0,
                balloon_reason=Reason.BUFFER_MIN,
            )
        }
    )


async def test_inconsistent_durations_fail_at_construction():
    async with FakeKube.start() as kube, kube.api_client() as api:
        with pytest.raises(ValueError, match="lease_duration must be greater"):
            LeaderElector(api, identity="a", lease_namespace=NS, **{**LEASE, "lease_duration_s": 2})


async def test_two_instances_with_one_lease_never_both_write():
    async with FakeKube.start(bookmark_interval_s=0.1) as kube:
        add_gpu_nodes(kube, 10)
        add_pd(kube)
        async with kube.api_client() as api_a, kube.api_client() as api_b:
            a = LeaderElector(api_a, identity="a", lease_namespace=NS, **LEASE)
            b = LeaderElector(api_b, identity="b", lease_namespace=NS, **LEASE)
            adapter_a = KubeAdapter(api_a, may_write=lambda: a.is_leader)
            adapter_b = KubeAdapter(api_b, may_write=lambda: b.is_leader)
            await adapter_a.start(sync_timeout_s=5)
            await adapter_b.start(sync_timeout_s=5)
            both: list[float] = []
            samples = 0

            async def watch_leaders() -> None:
                nonlocal samples
                while True:
                    samples += 1
                    if a.is_leader and b.is_leader:
                        both.append(time.monotonic())
                    await asyncio.sleep(0.02)

            monitor = asyncio.create_task(watch_leaders())
            try:
                a.start()
                await asyncio.wait_for(a.became_leader.wait(), 5)
                b.start()
                await asyncio.sleep(1.5)  # b tries at least once and must stay a standby
                assert a.is_leader and not b.is_leader
                lease = kube.object("leases", NS, "gang-autoscaler")
                assert lease["spec"]["holderIdentity"] == "a"

                await settle(adapter_a, kube)
                await adapter_a.apply(scale_to(1, 2), adapter_a.snapshot(now_s=0), dry_run=False)
                with pytest.raises(NotLeader):
                    await adapter_b.apply(
                        scale_to(1, 3), adapter_b.snapshot(now_s=0), dry_run=False
                    )
                assert len(kube.requests("PATCH", "/scale")) == 1

                # a dies without releasing: b takes over only once the lease has expired.
                died = time.monotonic()
                await a.stop(release=False)
                assert not a.is_leader
                await asyncio.wait_for(b.became_leader.wait(), 10)
                waited = time.monotonic() - died
                assert waited >= LEASE["lease_duration_s"] - LEASE["retry_period_s"]
                await settle(adapter_b, kube)
                await adapter_b.apply(scale_to(2, 3), adapter_b.snapshot(now_s=0), dry_run=False)
                with pytest.raises(NotLeader):
                    await adapter_a.apply(
                        scale_to(3, 1), adapter_a.snapshot(now_s=0), dry_run=False
                    )
                assert kube.object("leaderworkersets", NS, "llama-decode")["spec"]["replicas"] == 3

                # b shuts down cleanly and releases: a restarted instance takes over at once.
                await b.stop(release=True)
                assert kube.object("leases", NS, "gang-autoscaler")["spec"]["holderIdentity"] in (
                    "",
                    None,
                )
                c = LeaderElector(api_a, identity="c", lease_namespace=NS, **LEASE)
                started = time.monotonic()
                c.start()
                await asyncio.wait_for(c.became_leader.wait(), 5)
                assert time.monotonic() - started < LEASE["lease_duration_s"]
                await c.stop()
            finally:
                monitor.cancel()
                await adapter_a.close()
                await adapter_b.close()
            assert samples > 100
            assert both == []


async def test_a_renewal_with_no_answer_ends_the_term_cleanly():
    """Dropped connections are failed tries, as in client-go: the elector's own loop retries
    them, and a term that ends is over before the next starts. The library catches only
    error answers, so before, a dropped connection escaped its renew loop, the first term's
    task was never cancelled, and when it finally ended it cleared the next term's leadership:
    an instance renewing the Lease that would never write again."""
    async with FakeKube.start() as kube, kube.api_client() as api:
        a = LeaderElector(api, identity="a", lease_namespace=NS, **LEASE)
        a.start()
        try:
            await asyncio.wait_for(a.became_leader.wait(), 5)
            first_term = a._lead_task
            assert first_term is not None
            kube.inject_fault(
                code=0, method="GET", path_contains="/leases/", action="disconnect", times=5
            )
            # five in a row outlast the renew deadline (2 s at one try a second)
            deadline = time.monotonic() + 15
            while not (a.terms == 2 and a.is_leader) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert a.terms == 2 and a.is_leader
            assert first_term.done()  # cancelled and waited for, not left to end later
            await asyncio.sleep(LEASE["lease_duration_s"] + 0.5)
            assert a.is_leader and a.terms == 2
            assert kube.object("leases", NS, "gang-autoscaler")["spec"]["holderIdentity"] == "a"
        finally:
            await a.stop()


async def test_a_silent_api_server_cannot_stall_a_renewal():
    """Each Lease call waits at most half the renew deadline: a read held silent for 20 s
    is given up after 1 s and retried, and the leader keeps its Lease. Without a timeout the
    elector waited out the 20 s, and the leader stopped writing after 2 s."""
    async with FakeKube.start() as kube, kube.api_client() as api:
        a = LeaderElector(api, identity="a", lease_namespace=NS, **LEASE)
        a.start()
        try:
            await asyncio.wait_for(a.became_leader.wait(), 5)
            reads = len(kube.requests("GET", "/leases/"))
            kube.inject_fault(code=0, method="GET", path_contains="/leases/", action="stall",
                              stall_s=20)  # fmt: skip
            await asyncio.sleep(4 * LEASE["retry_period_s"])
            assert len(kube.requests("GET", "/leases/")) >= reads + 3  # still renewing
            assert a.is_leader
        finally:
            await a.stop()


async def test_a_silent_api_server_cannot_stall_the_release_on_shutdown():
    """The release had no timeout: with the API server accepting Lease calls and never
    answering (a control-plane upgrade), stopping waited until the kubelet killed the pod.
    Now it gives up after one lease duration, when the Lease has expired anyway."""
    async with FakeKube.start() as kube, kube.api_client() as api:
        a = LeaderElector(api, identity="a", lease_namespace=NS, **LEASE)
        a.start()
        await asyncio.wait_for(a.became_leader.wait(), 5)
        kube.inject_fault(code=0, path_contains="/leases/", action="stall", stall_s=60,
                          times=1000)  # fmt: skip
        started = time.monotonic()
        await asyncio.wait_for(a.stop(release=True), timeout=20)
        assert time.monotonic() - started < LEASE["lease_duration_s"] + 1.0
        assert not a.is_leader


# Longer than LEASE, so that the steps below fall clearly inside or outside each limit.
SLOW_LEASE = dict(lease_duration_s=6, renew_deadline_s=4, retry_period_s=1)


async def _leader_and_standby(api_a, api_b, *, standby=SLOW_LEASE):
    """a leads with SLOW_LEASE; b, with `standby`'s durations, has read a's record."""
    a = LeaderElector(api_a, identity="a", lease_namespace=NS, **SLOW_LEASE)
    b = LeaderElector(api_b, identity="b", lease_namespace=NS, **standby)
    a.start()
    await asyncio.wait_for(a.became_leader.wait(), 5)
    b.start()
    await asyncio.sleep(1.5)  # b has read a's record
    assert a.is_leader and not b.is_leader
    return a, b


async def _renewed(kube: FakeKube, identity: str) -> None:
    """Until the Lease's record is renewed by `identity` (a fresh renewal to time from)."""
    lease = kube.object("leases", NS, "gang-autoscaler")
    assert lease is not None
    before = lease["spec"]["renewTime"]
    while True:
        lease = kube.object("leases", NS, "gang-autoscaler")
        if lease and lease["spec"]["renewTime"] != before:
            assert lease["spec"]["holderIdentity"] == identity
            return
        await asyncio.sleep(0.02)


async def test_a_leader_that_reads_another_holder_stops_at_once():
    """The Lease deleted (by hand, to force a failover, or by a prune) and created afresh
    by another instance: the leader read the new holder a second later and still wrote
    until its renew deadline, 4 s here (8 s with the defaults, both instances patching)."""
    async with FakeKube.start() as kube, kube.api_client() as api:
        a = LeaderElector(api, identity="a", lease_namespace=NS, **SLOW_LEASE)
        a.start()
        try:
            await asyncio.wait_for(a.became_leader.wait(), 5)
            await _renewed(kube, "a")
            lease = kube.remove("leases", NS, "gang-autoscaler")
            spec = {**lease["spec"], "holderIdentity": "intruder", "leaseTransitions": 1}
            kube.apply({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": "gang-autoscaler", "namespace": NS},
                        "spec": spec})  # fmt: skip
            replaced = time.monotonic()
            while a.is_leader and time.monotonic() - replaced < 5:
                await asyncio.sleep(0.02)
            assert time.monotonic() - replaced < 2 * SLOW_LEASE["retry_period_s"]
        finally:
            await a.stop(release=False)


async def test_a_lease_deleted_under_its_leader_is_taken_only_after_its_deadline():
    """The standby finds the Lease gone and creates it: it waits until the holder it last
    read has passed its lease duration (its renew deadline is within it), by which that
    holder has stopped whatever it read since. Before, it led at once, while the old leader
    kept writing."""
    async with FakeKube.start() as kube, kube.api_client() as api_a, kube.api_client() as api_b:
        a, b = await _leader_and_standby(api_a, api_b)
        try:
            await _renewed(kube, "a")
            await _renewed(kube, "a")  # b has read this record too: it is a's last
            last_renewal = time.monotonic()
            await a.stop(release=False)  # a silent old leader (it may still write)
            kube.remove("leases", NS, "gang-autoscaler")
            await asyncio.wait_for(b.became_leader.wait(), 5)
            while not b.is_leader and time.monotonic() - last_renewal < 10:
                await asyncio.sleep(0.02)
            assert b.is_leader
            waited = time.monotonic() - last_renewal
            assert waited >= SLOW_LEASE["renew_deadline_s"] - SLOW_LEASE["retry_period_s"]
        finally:
            await a.stop(release=False)
            await b.stop(release=False)


async def test_a_holder_s_own_lease_duration_decides_when_it_expired():
    """Mid-rollout of a change to the lease duration: a standby with 3 s took over the
    Lease of a leader with 6 s after 3 s of silence, while the leader was still inside
    its 4 s renew deadline. The duration written in the Lease counts, as in client-go."""
    async with FakeKube.start() as kube, kube.api_client() as api_a, kube.api_client() as api_b:
        a, b = await _leader_and_standby(api_a, api_b, standby=LEASE)
        try:
            await _renewed(kube, "a")
            last_renewal = time.monotonic()
            await a.stop(release=False)
            await asyncio.wait_for(b.became_leader.wait(), 15)
            waited = time.monotonic() - last_renewal
            assert waited >= SLOW_LEASE["lease_duration_s"] - LEASE["retry_period_s"]
        finally:
            await b.stop(release=False)


async def test_a_lease_deleted_under_a_holder_with_a_longer_lease_waits_out_its_own():
    """Mid-rollout of a shorter lease: the holder has 6 s (renew deadline 4 s), the standby
    3 s (2 s). The Lease deleted, the standby created it and acted after its own renew
    deadline, 2 s, while the holder could still write for 4 s."""
    async with FakeKube.start() as kube, kube.api_client() as api_a, kube.api_client() as api_b:
        a, b = await _leader_and_standby(api_a, api_b, standby=LEASE)
        try:
            await _renewed(kube, "a")
            await _renewed(kube, "a")  # b has read this record: a's last
            last_renewal = time.monotonic()
            await a.stop(release=False)
            kube.remove("leases", NS, "gang-autoscaler")
            while not b.is_leader and time.monotonic() - last_renewal < 12:
                await asyncio.sleep(0.02)
            assert b.is_leader
            assert time.monotonic() - last_renewal >= SLOW_LEASE["renew_deadline_s"]
        finally:
            await a.stop(release=False)
            await b.stop(release=False)


async def test_a_released_lease_is_led_at_once_by_the_standby_that_read_its_holder():
    """The release hands over at the standby's next try; the wait after another holder's
    record (above) does not apply to a holder that let go."""
    async with FakeKube.start() as kube, kube.api_client() as api_a, kube.api_client() as api_b:
        a, b = await _leader_and_standby(api_a, api_b)
        try:
            released = time.monotonic()
            await a.stop(release=True)
            while not b.is_leader and time.monotonic() - released < 10:
                await asyncio.sleep(0.02)
            assert b.is_leader
            assert time.monotonic() - released < 2 * SLOW_LEASE["retry_period_s"] + 0.5
        finally:
            await b.stop(release=False)


async def test_a_lease_it_may_not_read_is_said_once_counted_and_reported(caplog):
    """A missing Lease Role: the library logged "Error retrieving resource lock ... as
    Forbidden" every 2 s, naming neither the namespace nor the permission, and nothing
    counted it; the instance stayed a standby with a ready probe."""
    errors = 0

    def count() -> None:
        nonlocal errors
        errors += 1

    async with FakeKube.start() as kube, kube.api_client() as api:
        kube.inject_fault(code=403, method="GET", path_contains="/leases/", times=1000)
        a = LeaderElector(api, identity="a", lease_namespace=NS, on_error=count, **LEASE)
        a.start()
        try:
            await asyncio.sleep(3.5)
            assert not a.is_leader and errors >= 3
            problem = a.lease_problem(limit_s=3)
            assert problem is not None
            assert f"reading the leader lease {NS}/gang-autoscaler: 403 Forbidden" in problem
            assert "get, create and update on leases" in problem
            said = [r for r in caplog.records if "cannot lead until it can" in r.getMessage()]
            assert len(said) == 1  # once per cause, not once per try
            assert a.lease_problem(limit_s=60) is None  # not yet past the limit
        finally:
            await a.stop(release=False)
