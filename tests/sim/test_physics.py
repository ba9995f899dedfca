"""The simulator's physics, pinned by small cases computed by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from autoscaler.sim.cluster import Cluster
from autoscaler.sim.config import ClusterSettings, SimSettings
from autoscaler.sim.controller import Action, Snapshot
from autoscaler.sim.engine import simulate
from autoscaler.sim.errors import ConfigError
from autoscaler.sim.metrics import gpu_hours_by_use, measure
from autoscaler.sim.serving import Serving
from autoscaler.sim.workload import Workload

# defaults: 2 pods x 8 GPUs per gang, 20,000 prompt tokens/s per pod -> 40,000 per gang
PREFILL_PER_GANG = 40_000.0


def burst(requests: int, *, prompt_tokens: float, output_tokens: float = 10.0) -> Workload:
    """`requests` single-request cohorts, all arriving at t=0."""
    return Workload(
        name="burst",
        arrival_s=np.zeros(requests),
        requests=np.ones(requests),
        input_tokens=np.full(requests, prompt_tokens),
        output_tokens=np.full(requests, output_tokens),
        duration_s=60.0,
    )


def test_prefill_queue_drains_at_the_stated_rate() -> None:
    # 100 prompts of 2,000 tokens = 200,000 tokens; one gang serves 40,000 tokens/s:
    # 20 requests leave the queue each second and the queue is empty after 5 s.
    settings = SimSettings(step_s=1.0, tick_s=1.0)
    serving = Serving(burst(100, prompt_tokens=2_000), settings, n_steps=60)
    queued = []
    for k in range(7):
        view = serving.step(k, prefill_gangs=1, decode_gangs=1)
        queued.append(view.prefill_waiting + view.prefill_running)
    assert queued == pytest.approx([80, 60, 40, 20, 0, 0, 0])
    # request i has 2,000*i tokens ahead of it and its own 2,000: done at 0.05*(i+1) s
    ttft = serving.ttft_s()
    assert ttft == pytest.approx(0.05 * np.arange(1, 101))


def test_two_gangs_drain_twice_as_fast() -> None:
    settings = SimSettings(step_s=1.0, tick_s=1.0)
    serving = Serving(burst(100, prompt_tokens=2_000), settings, n_steps=60)
    views = [serving.step(k, prefill_gangs=2, decode_gangs=1) for k in range(3)]
    assert [v.prefill_waiting + v.prefill_running for v in views] == pytest.approx([60, 20, 0])
    # the last request: 99 prompts ahead at 80,000 tokens/s, then its own at one gang's speed
    assert serving.ttft_s()[-1] == pytest.approx(99 * 2_000 / 80_000 + 2_000 / 40_000)


def test_no_ready_gang_serves_nothing_and_ttft_counts_the_wait() -> None:
    settings = SimSettings(step_s=1.0, tick_s=1.0)
    serving = Serving(burst(10, prompt_tokens=4_000), settings, n_steps=60)
    for k in range(3):
        view = serving.step(k, prefill_gangs=0, decode_gangs=1)
        assert view.prefill_waiting + view.prefill_running == pytest.approx(10)
    for k in range(3, 10):
        serving.step(k, prefill_gangs=1, decode_gangs=1)
    # service starts at t=3: request i is done at 3 + 0.1*(i+1)
    assert serving.ttft_s() == pytest.approx(3 + 0.1 * np.arange(1, 11))


def test_prompts_arriving_late_in_a_step_are_not_served_before_they_arrive() -> None:
    # 80 prompts of 2,000 tokens arrive at 4.5 s, inside the first 5 s step, on one gang:
    # the gang idles until then, and request i is done at 4.5 + 0.05 * (i + 1) s. Serving
    # the step's capacity from its start would finish them all by 5 s (TTFT 0.05 s each).
    settings = SimSettings(step_s=5.0, tick_s=5.0)
    n = 80
    workload = dataclasses.replace(burst(n, prompt_tokens=2_000), arrival_s=np.full(n, 4.5))
    serving = Serving(workload, settings, n_steps=4)
    views = [serving.step(k, prefill_gangs=1, decode_gangs=4) for k in range(4)]
    # by 5 s one gang has served 0.5 s of work: 10 prompts; 70 are still queued
    assert views[0].prefill_waiting + views[0].prefill_running == pytest.approx(70)
    assert serving.ttft_s() == pytest.approx(0.05 * np.arange(1, n + 1))


def _fifo_reference(workload: Workload, gangs: list[int], step_s: float) -> np.ndarray:
    """Request by request: each starts when the one before is done and it has arrived; the
    queue drains at the ready gangs' rate, step by step, and a prompt's own first token
    takes one gang's time."""
    ttft = []
    free_at = 0.0
    for arrival, prompt in zip(workload.arrival_s, workload.input_tokens, strict=True):
        t, left = max(free_at, arrival), prompt
        start = t
        while left > 1e-9:
            k = int(t // step_s)
            rate = gangs[k] * PREFILL_PER_GANG
            used = min(left, rate * ((k + 1) * step_s - t))
            t = (k + 1) * step_s if used < left else t + used / rate
            left -= used
        free_at = t
        ttft.append(start + prompt / PREFILL_PER_GANG - arrival)
    return np.asarray(ttft)


def test_prefill_matches_a_request_by_request_fifo_queue() -> None:
    rng = np.random.default_rng(7)
    n, step_s, n_steps = 400, 5.0, 40
    workload = Workload(
        name="random",
        arrival_s=np.sort(rng.uniform(0, 150, n)),
        requests=np.ones(n),
        input_tokens=rng.integers(100, 8_000, n).astype(np.float64),
        output_tokens=np.full(n, 10.0),
        duration_s=150.0,
    )
    # at least one gang in every step: a gang that goes away in the middle of a prompt is
    # the reference's blind spot (it finishes that prompt anyway)
    gangs = [int(g) for g in rng.integers(1, 4, n_steps)]
    serving = Serving(workload, SimSettings(step_s=step_s, tick_s=step_s), n_steps=n_steps)
    for k in range(n_steps):
        serving.step(k, prefill_gangs=gangs[k], decode_gangs=8)
    assert serving.ttft_s() == pytest.approx(_fifo_reference(workload, gangs, step_s))


# defaults: 1,270,000 KV tokens per pod -> 2,540,000 per gang; 8,192 prompt tokens per batch
KV_TOKENS_PER_GANG = 2_540_000.0


@pytest.mark.parametrize(
    ("gangs", "step_s"), [(1, 1.0), (2, 1.0), (2, 5.0)], ids=["1-gang", "2-gangs", "5s-steps"]
)
def test_prefill_kv_holds_one_batch_per_gang_not_the_queue(gangs: int, step_s: float) -> None:
    # 1,000 prompts of 2,000 tokens queued: vLLM allocates KV blocks only to the prompts it
    # schedules, one batch of 8,192 tokens per gang, so the gauge reads 8,192 / 2,540,000
    # (0.32 %) however long the queue, however many gangs and whatever the step; with the
    # queue empty and every prompt handed to a decode slot it reads 0.
    settings = SimSettings(step_s=step_s, tick_s=step_s)
    serving = Serving(burst(1_000, prompt_tokens=2_000), settings, n_steps=60)
    drained_s = 1_000 * 2_000 / (gangs * PREFILL_PER_GANG)  # 50 s on 1 gang, 25 s on 2
    views = [
        serving.step(k, prefill_gangs=gangs, decode_gangs=2) for k in range(round(60 / step_s))
    ]
    deep = [v.prefill_kv_usage for v in views[: round(drained_s / step_s) - 1]]
    assert deep == pytest.approx([8_192 / KV_TOKENS_PER_GANG] * len(deep))
    assert views[-1].prefill_kv_usage == pytest.approx(0.0)


def _prompts(*groups: tuple[int, float], output_tokens: float) -> Workload:
    """Single-request cohorts arriving at t=0 in order: `count` prompts of `tokens` per group."""
    tokens = np.concatenate([np.full(count, size) for count, size in groups])
    return Workload(
        name="prompts",
        arrival_s=np.zeros(tokens.size),
        requests=np.ones(tokens.size),
        input_tokens=tokens,
        output_tokens=np.full(tokens.size, output_tokens),
        duration_s=60.0,
    )


def test_prefill_kv_holds_the_prompts_waiting_for_a_decode_slot() -> None:
    # 512 prompts of 1,000 tokens, then 88 of 3,000, on 2 prefill gangs (80,000 tokens/s:
    # all 776,000 tokens prefilled by 9.7 s) and 1 decode gang of 512 slots, each sequence
    # holding its slot for a minute: after 10 s the first 512 have the slots and the last 88
    # keep their KV cache on the prefill gangs, 264,000 tokens over 2 x 2,540,000 (the
    # trace's mean prompt would say 113,813).
    settings = SimSettings(step_s=5.0, tick_s=5.0)
    workload = _prompts((512, 1_000.0), (88, 3_000.0), output_tokens=2_812)
    serving = Serving(workload, settings, n_steps=20)
    views = [serving.step(k, prefill_gangs=2, decode_gangs=1) for k in range(2)]
    assert views[1].decode_waiting == pytest.approx(88)
    assert views[1].prefill_kv_usage == pytest.approx(264_000 / (2 * KV_TOKENS_PER_GANG))


def test_prefill_kv_fills_up_while_no_decode_gang_takes_the_prompts() -> None:
    # 1,000 prompts of 3,000 tokens on one prefill gang and no decode gang: every prefilled
    # prompt keeps its KV cache. After 30 s, 1,200,000 tokens are prefilled and a batch is
    # running: (1,200,000 + 8,192) / 2,540,000. By 70 s 2,800,000 are, more than the cache
    # holds: the gauge reads 1 (the stall that would follow is not modelled). With no prefill
    # gang there is no cache to read: 0.
    settings = SimSettings(step_s=5.0, tick_s=5.0)
    serving = Serving(burst(1_000, prompt_tokens=3_000), settings, n_steps=20)
    views = [serving.step(k, prefill_gangs=1, decode_gangs=0) for k in range(14)]
    assert views[5].prefill_kv_usage == pytest.approx((1_200_000 + 8_192) / KV_TOKENS_PER_GANG)
    assert views[13].prefill_kv_usage == 1.0
    assert serving.step(14, prefill_gangs=0, decode_gangs=0).prefill_kv_usage == 0.0


class _Record:
    """Holds one prefill and one decode gang and keeps every snapshot it is shown."""

    name = "recording"
    gang_scheduling = True

    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    def initial_gangs(self) -> dict[str, int]:
        return {"prefill": 1, "decode": 1}

    def decide(self, snapshot: Snapshot) -> dict[str, Action]:
        self.snapshots.append(snapshot)
        return {"prefill": Action(desired_gangs=1), "decode": Action(desired_gangs=1)}


def test_the_policy_reads_the_prefill_kv_the_serving_model_reports() -> None:
    # the same backlog as above, through the engine: at the 15 s tick the prefill component's
    # KV signal is the prompts waiting for the decode gang's slots
    settings = SimSettings(step_s=5.0, tick_s=15.0)
    workload = _prompts((512, 1_000.0), (88, 3_000.0), output_tokens=2_812)
    recorder = _Record()
    simulate(dataclasses.replace(workload, duration_s=30.0), recorder, settings)
    tick = next(s for s in recorder.snapshots if s.now_s == 15.0)
    # one prefill gang serves 40,000 tokens/s: all 776,000 prefilled by 19.4 s; at 15 s
    # 600,000 are: 512 prompts hold the slots and 88,000 tokens of 3,000-token prompts wait
    assert tick.components["prefill"].signals.kv_usage_fraction == pytest.approx(
        (88_000 + 8_192) / KV_TOKENS_PER_GANG
    )
    # decode's is the KV cache its 512 sequences hold: a prompt and half an output each
    assert tick.components["decode"].signals.kv_usage_fraction == pytest.approx(
        512 * (1_000 + 2_812 / 2) / KV_TOKENS_PER_GANG
    )


def _kv_bound(count: int, *, hold_s: float) -> Workload:
    """`count` sequences at t=0 holding a decode slot for `hold_s` and 10,000 KV tokens on
    average over it (a prompt plus half the output)."""
    output = hold_s * 46.875
    return burst(count, prompt_tokens=10_000 - output / 2, output_tokens=output)


def test_decode_admits_only_what_its_kv_cache_holds() -> None:
    # 300 sequences of 10,000 KV tokens on one decode gang of 512 slots and 2,540,000 tokens:
    # the KV cache, not the slots, admits 254; the other 46 wait until the first hold ends
    # at 100 s. 60 prefill gangs (2.4M tokens/s) prefill all of them within the first step.
    settings = SimSettings(step_s=5.0, tick_s=5.0)
    serving = Serving(_kv_bound(300, hold_s=100.0), settings, n_steps=30)
    views = [serving.step(k, prefill_gangs=60, decode_gangs=1) for k in range(22)]
    assert views[0].decode_running == pytest.approx(254)
    assert views[0].decode_waiting == pytest.approx(46)
    assert views[0].decode_kv_usage == pytest.approx(1.0)
    assert views[19].decode_waiting == pytest.approx(46)
    assert views[20].decode_running == pytest.approx(46)
    ttft = serving.ttft_s()
    assert ttft[:254].max() < 2.0
    assert ttft[254:] == pytest.approx(np.full(46, 100.0))


def test_decode_kv_reads_the_tokens_its_sequences_hold() -> None:
    # the same 300 sequences on two decode gangs: all admitted, 3,000,000 of 5,080,000 tokens
    settings = SimSettings(step_s=5.0, tick_s=5.0)
    serving = Serving(_kv_bound(300, hold_s=100.0), settings, n_steps=30)
    view = serving.step(0, prefill_gangs=60, decode_gangs=2)
    assert view.decode_waiting == pytest.approx(0)
    assert view.decode_kv_usage == pytest.approx(3_000_000 / (2 * KV_TOKENS_PER_GANG))


def test_kv_bound_admissions_within_a_step_follow_the_cache_as_it_frees() -> None:
    # Holds of 7.3 s (1.46 steps of 5 s): 254 sequences fill the cache in step 0; through
    # step 1 the average cache use is 254 x 0.46 x 10,000, so 137.16 more fit, none of them
    # at the step's start (the cache is full then): 27.432 a second. Request 300 gets its
    # slot at 5 + (300.5 - 254) / 27.432 = 6.695 s, after its prefill (about 1.4 s).
    settings = SimSettings(step_s=5.0, tick_s=5.0)
    serving = Serving(_kv_bound(600, hold_s=7.3), settings, n_steps=30)
    views = [serving.step(k, prefill_gangs=60, decode_gangs=1) for k in range(2)]
    assert views[0].decode_running == pytest.approx(254)
    assert serving.admit_now_curve[1] == pytest.approx(0.0)
    assert serving.admit_rate_curve[1] == pytest.approx(137.16 / 5)
    assert serving.admitted_curve[2] == pytest.approx(254 + 137.16)
    assert serving.ttft_s()[300] == pytest.approx(5 + 46.5 / 27.432)


def test_kv_bound_admissions_with_holds_shorter_than_a_step() -> None:
    # Holds of 2.5 s (half a 5 s step): each sequence takes 5,000 KV token-steps of step 0,
    # so 508 are admitted in it, 254 at its start (what the cache holds at once) and the rest
    # at (508 - 254) / 5 = 50.8 a second; the slots (1,024 half-steps) do not bind. Request
    # 400 gets its slot at (400.5 - 254) / 50.8 = 2.884 s.
    settings = SimSettings(step_s=5.0, tick_s=5.0)
    serving = Serving(_kv_bound(1_000, hold_s=2.5), settings, n_steps=30)
    serving.step(0, prefill_gangs=60, decode_gangs=1)
    assert serving.admit_now_curve[0] == pytest.approx(254)
    assert serving.admit_rate_curve[0] == pytest.approx(50.8)
    assert serving.admitted_curve[1] == pytest.approx(508)
    assert serving.ttft_s()[400] == pytest.approx(146.5 / 50.8)


def test_a_request_larger_than_a_gangs_kv_cache_is_refused() -> None:
    workload = burst(1, prompt_tokens=3_000_000.0)
    with pytest.raises(ConfigError, match=r"serving\.kv_cache_tokens_per_pod"):
        Serving(workload, SimSettings(), n_steps=10)


@pytest.mark.parametrize(
    ("mode", "component"), [("pd", "decode"), ("unified", "unified")], ids=["pd", "unified"]
)
def test_clairvoyant_decode_requirement_counts_kv_cache(mode: str, component: str) -> None:
    from autoscaler.sim.requirement import required_gangs

    # 500 sequences fit one gang's 512 slots but hold 5,000,000 KV tokens (a prompt and half
    # the output each; 6,171,875 with whole outputs, which would need 3): two gangs while
    # they run (after the first step, where a unified gang's prefill of 3.8M tokens in the
    # SLO needs more)
    workload = dataclasses.replace(_kv_bound(500, hold_s=100.0), duration_s=200.0)
    need = required_gangs(workload, SimSettings(mode=mode), n_steps=40)
    assert need[component][1:20].tolist() == [2] * 19


@pytest.mark.parametrize("seed", range(40))
def test_fractional_cohorts_on_few_slots_keep_the_service_curves_finite(seed: int) -> None:
    # Scaled per-second traces have fractional cohorts; rounding in their cumulative counts
    # left slivers of a request to admit that took no slot-time, and the admission rate
    # divided by zero (azure-code-1s with prefill at 80 % of a gang raised)
    rng = np.random.default_rng(seed)
    n = 60
    workload = Workload(
        name="fractional",
        arrival_s=np.arange(n) + 0.5,
        requests=rng.uniform(0.01, 60, n),
        input_tokens=rng.uniform(100, 4_000, n),
        output_tokens=rng.uniform(1, 600, n),
        duration_s=float(n),
    )
    serving = Serving(workload, SimSettings(step_s=5.0, tick_s=5.0), n_steps=12)
    for k in range(12):
        serving.step(k, prefill_gangs=int(rng.integers(1, 3)), decode_gangs=int(rng.integers(0, 2)))
    assert np.isfinite(serving.admit_rate_curve).all()
    assert not np.isnan(serving.ttft_s()).any()


def test_decode_slots_hold_requests_back_until_a_slot_frees() -> None:
    # 512 slots per gang (2 pods x 256). 600 tiny prompts: 512 take the free slots at t=0,
    # the other 88 wait. Each sequence generates 24,000/512 = 46.875 tokens/s, so 469 output
    # tokens hold a slot for 10.00533 s = 2.001067 steps of 5 s: full in steps 0 and 1, a
    # 0.001067 share of step 2. In step 2 the freed slot-time (512 x 0.998933 = 511.454)
    # admits the 88, spread over the step at 511.454 / 5 s a second (when in the step a slot
    # frees is not tracked).
    settings = SimSettings(step_s=5.0, tick_s=5.0)
    serving = Serving(burst(600, prompt_tokens=10, output_tokens=469), settings, n_steps=20)
    views = [serving.step(k, prefill_gangs=1, decode_gangs=1) for k in range(4)]
    tail = 469 / 46.875 / 5 - 2
    assert [v.decode_running for v in views] == pytest.approx([512, 512, 88 + 512 * tail, 88])
    assert [v.decode_waiting for v in views] == pytest.approx([88, 88, 0, 0])
    ttft = serving.ttft_s()
    # prefill of request i ends at (i + 1) * 10 / 40,000 s; its slot was free at t=0
    assert ttft[:512] == pytest.approx((np.arange(512) + 1) * 10 / PREFILL_PER_GANG)
    per_s = 512 * (1 - tail) / 5
    assert ttft[512:] == pytest.approx(10.0 + (np.arange(88) + 0.5) / per_s)


@pytest.mark.parametrize("step_s", [1.0, 5.0])
def test_a_decode_slot_serves_a_new_sequence_as_soon_as_one_ends(step_s: float) -> None:
    # Outputs of 23.4375 tokens hold a slot for 0.5 s, so one gang's 512 slots admit 1,024
    # sequences a second, whatever the step: of 10,000 waiting requests (1-token prompts,
    # prefilled within 0.25 s) the last takes a slot in the 20th wave of 512, at 9.5 s.
    # Admissions are spread within a step, so the simulator lands within one hold of that.
    settings = SimSettings(step_s=step_s, tick_s=step_s)
    serving = Serving(
        burst(10_000, prompt_tokens=1, output_tokens=23.4375), settings, n_steps=round(60 / step_s)
    )
    waiting = [
        serving.step(k, prefill_gangs=1, decode_gangs=1).decode_waiting
        for k in range(round(15 / step_s))
    ]
    last_waiting_step = max(k for k, w in enumerate(waiting) if w > 0)
    assert last_waiting_step == math.ceil(10_000 / 1_024 / step_s) - 2
    ttft = serving.ttft_s()
    assert ttft[-1] == pytest.approx(9.5, abs=0.3)
    assert np.all(np.diff(ttft[512:]) >= 0)  # first come, first served


def _cluster(**overrides: object) -> Cluster:
    return Cluster(ClusterSettings(**overrides), gang_scheduling=True)


def test_a_gang_counts_only_after_start_up() -> None:
    cluster = _cluster(node_provisioning_s=300.0, gang_startup_s=180.0)
    cluster.add_components("prefill")
    cluster.set_replicas("prefill", 1, now_s=0.0)
    for now in (0.0, 295.0):
        cluster.step(now)
        assert cluster.ready_gangs("prefill", now) == 0
    assert len(cluster.nodes) == 2  # one 8-GPU node per pod, requested at once
    cluster.step(300.0)  # nodes ready: both pods placed together
    assert cluster.real["prefill"][0].all_placed_s == 300.0
    assert cluster.ready_gangs("prefill", 479.0) == 0
    assert cluster.starting_gangs("prefill", 479.0) == 1
    assert cluster.ready_gangs("prefill", 480.0) == 1


def test_pod_by_pod_under_a_node_cap_leaves_a_partial_gang_burning_gpus() -> None:
    # 3 nodes allowed, 1 pod per node, 2 pods per gang: the second gang gets one pod
    # placed and the other Pending for ever; the placed pod holds 8 GPUs and serves nothing.
    settings = ClusterSettings(max_nodes=3, node_provisioning_s=0.0, gang_startup_s=0.0)
    by_pod = Cluster(settings, gang_scheduling=False)
    by_pod.add_components("decode")
    by_pod.start_ready("decode", 1, now_s=0.0)
    by_pod.set_replicas("decode", 2, now_s=0.0)
    partial_gpu_s = 0.0
    for now in np.arange(0.0, 3600.0, 5.0):
        by_pod.step(float(now))
        partial_gpu_s += by_pod.partial_gpus() * 5.0
    assert len(by_pod.nodes) == 3
    assert by_pod.ready_gangs("decode", 3600.0) == 1
    # the third node comes up at t=0 (no provisioning delay) after that step's scheduling
    # pass, so the lone pod is placed at t=5 s and holds 8 GPUs for the rest of the hour
    assert partial_gpu_s / 3600.0 == pytest.approx(8.0 * 3595.0 / 3600.0)

    whole = Cluster(settings, gang_scheduling=True)
    whole.add_components("decode")
    whole.start_ready("decode", 1, now_s=0.0)
    whole.set_replicas("decode", 2, now_s=0.0)
    for now in np.arange(0.0, 3600.0, 5.0):
        whole.step(float(now))
        assert whole.partial_gpus() == 0  # the gang waits whole and holds nothing


def test_preempting_a_balloon_gang_places_a_real_gang_at_once() -> None:
    cluster = _cluster(node_provisioning_s=300.0, gang_startup_s=180.0)
    cluster.add_components("prefill")
    cluster.start_ready("prefill", 1, now_s=0.0)
    cluster.set_balloons("prefill", 1, now_s=0.0)
    for now in (0.0, 300.0):  # the balloon gang's nodes come up and it is placed
        cluster.step(now)
    assert cluster.balloon_gangs_placed("prefill") == 1
    nodes_before = len(cluster.nodes)

    cluster.set_replicas("prefill", 2, now_s=600.0)
    cluster.step(600.0)
    new_gang = cluster.real["prefill"][1]
    assert new_gang.all_placed_s == 600.0  # placed in the same step, on the balloon's nodes
    assert cluster.preemptions == 1
    assert cluster.balloon_gangs_placed("prefill") == 0
    # the evicted balloon gang is recreated Pending, so the cluster grows for it
    assert cluster.balloon_gangs_ordered("prefill") == 1
    assert len(cluster.nodes) == nodes_before + 2
    assert cluster.ready_gangs("prefill", 600.0 + 180.0) == 2


def test_a_balloon_gang_is_never_placed_partly() -> None:
    cluster = _cluster(max_nodes=3, node_provisioning_s=0.0)
    cluster.add_components("prefill")
    cluster.start_ready("prefill", 1, now_s=0.0)  # 2 of the 3 nodes
    cluster.set_balloons("prefill", 1, now_s=0.0)
    for now in (0.0, 5.0, 10.0):
        cluster.step(now)
    assert cluster.balloon_gangs_placed("prefill") == 0
    assert cluster.balloon_gangs_ordered("prefill") == 1  # ordered, Pending: the report says so
    assert all(b.pods_scheduled == 0 for b in cluster.balloons["prefill"])


def test_the_cluster_grows_only_by_what_free_slots_cannot_hold() -> None:
    # 3 pods per gang, 2 pods per node: the first gang fills 3 of 4 slots on 2 nodes. A second
    # gang waits (gang scheduling: 3 pods, 1 free slot); 1 pod fits the free slot, so the
    # cluster-autoscaler adds ceil((3 - 1) / 2) = 1 node, not ceil(3 / 2) = 2.
    cluster = _cluster(
        gpus_per_pod=4, pods_per_gang=3, node_provisioning_s=300.0, gang_startup_s=0.0
    )
    cluster.add_components("prefill")
    cluster.start_ready("prefill", 1, now_s=0.0)
    assert len(cluster.nodes) == 2
    cluster.set_replicas("prefill", 2, now_s=0.0)
    cluster.step(0.0)
    assert cluster.real["prefill"][1].pods_scheduled == 0
    assert len(cluster.nodes) == 3
    cluster.step(300.0)  # the new node is up: 1 + 2 free slots take the whole gang
    assert cluster.ready_gangs("prefill", 300.0) == 2
    assert sum(n.free_slots for n in cluster.nodes.values()) == 0


def test_an_empty_node_goes_after_the_idle_timeout() -> None:
    cluster = _cluster(node_provisioning_s=0.0, node_idle_timeout_s=600.0)
    cluster.add_components("decode")
    cluster.start_ready("decode", 2, now_s=0.0)
    cluster.step(0.0)
    cluster.set_replicas("decode", 1, now_s=10.0)
    cluster.step(10.0)
    assert len(cluster.nodes) == 4
    cluster.step(609.0)
    assert len(cluster.nodes) == 4
    cluster.step(610.0)
    assert len(cluster.nodes) == 2


@pytest.mark.parametrize(
    ("prompt_tokens_per_s", "gangs"),
    [
        pytest.param(30_000, 1, id="three-quarters-of-a-gang-needs-one"),
        pytest.param(50_000, 2, id="one-and-a-quarter-gangs-needs-two"),
        pytest.param(120_000, 3, id="exactly-three-gangs"),
    ],
)
def test_clairvoyant_requirement_of_a_steady_load(prompt_tokens_per_s: int, gangs: int) -> None:
    from autoscaler.sim.requirement import required_gangs

    seconds = 600
    workload = Workload(
        name="steady",
        arrival_s=np.arange(seconds) + 0.5,
        requests=np.full(seconds, 10.0),
        input_tokens=np.full(seconds, prompt_tokens_per_s / 10),
        output_tokens=np.full(seconds, 1.0),
        duration_s=float(seconds),
    )
    need = required_gangs(workload, SimSettings(), n_steps=seconds // 5)
    # away from the end of the trace (where windows run out of arrivals)
    assert set(need["prefill"][:-24].tolist()) == {gangs}
    assert set(need["decode"].tolist()) == {1}


def test_clairvoyant_requirement_holds_a_burst_until_its_work_is_due() -> None:
    from autoscaler.sim.requirement import required_gangs

    # 180 prompts of 2,000 tokens at 10.5 s in one cohort, nothing else. All arrive at one
    # instant, so the last one waits for the 358,000 tokens ahead of it, and that must stay
    # within the slack (the SLO of 2 s less its own prefill of 0.05 s): 183,590 tokens/s, 5
    # gangs, serving until that work is due at 12.45 s, step 12. A requirement that granted
    # the burst a second more (358,000 / (1 + slack): 4 gangs) leaves its tail at 2.3 s; one
    # that fell back at 11 s leaves most of the burst queued past the SLO.
    workload = Workload(
        name="burst",
        arrival_s=np.array([10.5]),
        requests=np.array([180.0]),
        input_tokens=np.array([2_000.0]),
        output_tokens=np.array([1.0]),
        duration_s=30.0,
    )
    need = required_gangs(workload, SimSettings(step_s=1.0, tick_s=1.0), n_steps=30)
    slack = 2.0 - 2_000 / PREFILL_PER_GANG
    gangs = math.ceil(358_000 / slack / PREFILL_PER_GANG)
    assert gangs == 5
    assert need["prefill"][:10].tolist() == [1] * 10
    assert need["prefill"][10:13].tolist() == [5] * 3
    assert need["prefill"][13:].tolist() == [1] * 17


def test_clairvoyant_requirement_times_a_window_to_each_of_its_last_bins_requests() -> None:
    from autoscaler.sim.requirement import required_gangs

    # 160 prompts of 2,000 tokens in one cohort at 10.0 s, then one of 10 tokens at 10.24 s,
    # in the same 0.25 s bin. The cohort's last prompt waits for the 318,000 tokens ahead of
    # it, due within the slack of 1.95 s: 163,077 tokens/s, 5 gangs (4 leave it at 2.04 s).
    # Timed to the bin's last arrival, the window had 0.24 s more for 2,000 tokens more
    # (320,000 / 2.19 s: 4 gangs): one small late request lowered the requirement.
    workload = Workload(
        name="late-small-request",
        arrival_s=np.array([10.0, 10.24]),
        requests=np.array([160.0, 1.0]),
        input_tokens=np.array([2_000.0, 10.0]),
        output_tokens=np.array([1.0, 1.0]),
        duration_s=30.0,
    )
    settings = SimSettings(step_s=1.0, tick_s=1.0)
    need = required_gangs(workload, settings, n_steps=30)
    slack = 2.0 - 2_000 / PREFILL_PER_GANG
    assert math.ceil(318_000 / slack / PREFILL_PER_GANG) == 5
    assert math.ceil(320_000 / (0.24 + slack) / PREFILL_PER_GANG) == 4
    assert need["prefill"][10] == 5
    serving = Serving(workload, settings, n_steps=30)
    for k in range(30):
        serving.step(k, prefill_gangs=int(need["prefill"][k]), decode_gangs=int(need["decode"][k]))
    assert float(np.max(serving.ttft_s())) <= 2.0


@pytest.mark.parametrize("kind", ["per-second-cohorts", "single-requests"])
def test_serving_the_clairvoyant_requirement_meets_the_slo(kind: str) -> None:
    """Prefill gangs exactly as the requirement says, ready at once: every request's first
    token within the SLO, on bursty traffic both as per-second cohorts and as single
    requests (the two shapes of the shared traces)."""
    from autoscaler.sim.requirement import required_gangs

    rng = np.random.default_rng(11)
    seconds, step_s = 600, 5.0
    if kind == "per-second-cohorts":
        # quiet seconds, ordinary ones and rare bursts of 10 to 30 times the usual
        counts = rng.poisson(20, seconds) * rng.choice([0, 1, 20], seconds, p=[0.3, 0.68, 0.02])
        arrival = np.arange(seconds) + 0.5
    else:
        # bursts of requests within a fraction of a second, between a steady trickle
        centres = rng.uniform(0, seconds - 1, 12)
        bursts = [c + rng.uniform(0, 0.3, 300) for c in centres]
        arrival = np.sort(np.concatenate([rng.uniform(0, seconds, 6_000), *bursts]))
        counts = np.ones(arrival.size)
    keep = counts > 0
    workload = Workload(
        name=kind,
        arrival_s=arrival[keep],
        requests=counts[keep].astype(np.float64),
        input_tokens=np.full(int(keep.sum()), 1_000.0),
        output_tokens=np.full(int(keep.sum()), 10.0),
        duration_s=float(seconds),
    )
    settings = SimSettings(step_s=step_s, tick_s=15.0)
    n_steps = int(seconds / step_s)
    need = required_gangs(workload, settings, n_steps=n_steps)
    assert need["prefill"].max() >= 5  # the bursts are what the requirement is sized for
    serving = Serving(workload, settings, n_steps=n_steps)
    for k in range(n_steps):
        serving.step(k, prefill_gangs=int(need["prefill"][k]), decode_gangs=int(need["decode"][k]))
    assert serving.ttft_s().max() <= settings.slo_ttft_s


class _ScaleUpOnce:
    """One prefill and one decode gang serving at t=0; the first tick asks for a second
    prefill gang, which needs new nodes."""

    name = "scripted"
    gang_scheduling = True

    def initial_gangs(self) -> dict[str, int]:
        return {"prefill": 1, "decode": 1}

    def decide(self, snapshot: Snapshot) -> dict[str, Action]:
        return {"prefill": Action(desired_gangs=2), "decode": Action(desired_gangs=1)}


def test_gpu_hours_by_use_follow_a_scale_up_through_booting_and_start_up() -> None:
    # 2 x 8-GPU pods per gang, 8-GPU nodes. The first tick (15 s) orders a gang: its two
    # nodes boot for 300 s, then it loads for 180 s (ready at 495 s), then serves to 600 s.
    settings = SimSettings()
    workload = dataclasses.replace(burst(1, prompt_tokens=100.0), duration_s=600.0)
    result = simulate(workload, _ScaleUpOnce(), settings)
    gpu_h = 16 / 3600  # one gang's GPUs for one second
    uses = gpu_hours_by_use(result)
    assert uses == {
        "prefill serving": pytest.approx((600 + 105) * gpu_h),
        "prefill starting": pytest.approx(180 * gpu_h),
        "decode serving": pytest.approx(600 * gpu_h),
        "decode starting": 0.0,
        "balloon gangs": 0.0,
        "partial gangs": 0.0,
        "nodes booting or idle": pytest.approx(300 * gpu_h),
    }
    assert sum(uses.values()) == pytest.approx(measure(result).gpu_hours)


@pytest.mark.parametrize("step_s", [1.0, 5.0])
def test_unified_capacity_per_gang_is_what_a_saturated_unified_gang_serves(step_s: float) -> None:
    from autoscaler.sim.runner import gang_capacity

    # 1,000-token prompts and 468.75-token outputs: at 46.875 tokens/s per sequence (24,000
    # generated tokens/s over 512 slots) each holds its slot 10 s. Saturated, a unified gang
    # admits 40,000 (1 - 0.5 u) / 1,000 requests a second, so u = a / (1 + 0.5 a) of its
    # slots are full with a = 40,000 x 10 / (1,000 x 512) = 0.78125: u = 0.5618, and it
    # serves 40,000 x (1 - 0.2809) = 28,764 prompt tokens/s; at target (80 %) 23,011.
    seconds = 400
    workload = Workload(
        name="saturating",
        arrival_s=np.arange(seconds) + 0.5,
        requests=np.full(seconds, 60.0),  # 60,000 prompt tokens/s, more than one gang serves
        input_tokens=np.full(seconds, 1_000.0),
        output_tokens=np.full(seconds, 468.75),
        duration_s=float(seconds),
    )
    settings = SimSettings(mode="unified", step_s=step_s, tick_s=5.0)
    capacity = gang_capacity(workload, settings)
    assert capacity == {"unified": pytest.approx(23_011.2, rel=1e-4)}
    assert gang_capacity(workload, SimSettings()) == {"prefill": 36_000.0, "decode": 21_600.0}
    n_steps = round(seconds / step_s)
    serving = Serving(workload, settings, n_steps=n_steps)
    for k in range(n_steps):
        serving.step(k, prefill_gangs=1, decode_gangs=1)
    # steady state, after the slots have filled (several hold times); the same at any step
    first, last = round(200 / step_s), n_steps
    served = serving.served_curve[last] - serving.served_curve[first]
    measured = served / ((last - first) * settings.step_s)
    assert measured * settings.gang.unified_target_utilization == pytest.approx(
        capacity["unified"], rel=0.02
    )
