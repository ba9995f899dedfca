"""Serving physics: prefill as a fluid FIFO queue of prompt tokens, decode as sequence slots.

Prefill: the ready prefill gangs together serve `gangs * prefill_tokens_per_s` prompt
tokens per second, first come first served. A request's first token is ready when the
prompt work queued ahead of it is done plus its own prompt at one gang's speed. Work is
served only after it arrives, within a step too: the served amount is the fluid queue's
reflection `S(t) = C(t) - sup_{s <= t} (C(s) - A(s-))` (C the cumulative capacity, A the
cumulative prompt work), exact for arrivals anywhere in a step.

Decode: each ready decode gang holds `max_sequences` running sequences; a sequence keeps its
slot for `output_tokens / per_sequence_tokens_per_s` seconds, where the per-sequence speed
is the gang's full-batch throughput shared by its slots. It also needs room in the gang's
KV cache for its prompt and half its output (its average over the hold), so long prompts
fill the cache before the slots. A request that finished prefill waits for a free slot
and room (the KV cache has nowhere to go), and its first token reaches the
user only once it holds one: TTFT = max(prefill done, decode slot) - arrival. Slots are
counted in slot-time, not in whole steps: a sequence admitted in a step holds its slot for
its hold time from the step's start, so a slot freed mid-step serves the next sequence in
the same step, and a gang admits `slots / hold` sequences a second whatever the step size.
Within a step, the slots and KV cache free at its start are taken at once and the rest of the
step's admissions are spread evenly over it (when exactly in the step a slot frees is not
tracked).

Unified gangs run both on the same GPUs: a full decode batch takes
`unified_decode_interference` of the prefill capacity, in proportion to the share of the
slots busy over the previous step (one step behind, so the same whatever the step in steady
state).

The forward pass (`step`) only moves cumulative counters, so it costs O(1) per step plus the
cohorts admitted; per-request TTFTs are computed afterwards, vectorised, by inverting the
cumulative service curves (`ttft_s`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from autoscaler.sim.config import SimSettings
from autoscaler.sim.errors import ConfigError
from autoscaler.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class ServingView:
    """Queue state after a step, in vLLM terms: counts summed over the ready gangs, KV usage
    as the fraction of their KV cache in use."""

    prefill_waiting: float
    prefill_running: float
    prefill_kv_usage: float
    decode_waiting: float
    decode_running: float
    decode_kv_usage: float


class Serving:
    def __init__(self, workload: Workload, settings: SimSettings, *, n_steps: int) -> None:
        cluster, serving = settings.cluster, settings.serving
        self.workload = workload
        self.dt = settings.step_s
        self.unified = settings.mode == "unified"
        self.prefill_per_gang = serving.prefill_tokens_per_s(cluster.pods_per_gang)
        self.slots_per_gang = float(serving.max_sequences(cluster.pods_per_gang))
        self.seq_tokens_per_s = (
            serving.decode_tokens_per_s(cluster.pods_per_gang) / self.slots_per_gang
        )
        self.interference = serving.unified_decode_interference
        self.batch_tokens = float(serving.prefill_batch_tokens)
        self.kv_tokens_per_gang = serving.kv_cache_tokens(cluster.pods_per_gang)
        # cumulative prompt work and request counts, with a leading zero
        self.work0 = np.concatenate(([0.0], np.cumsum(workload.prompt_tokens())))
        self.count0 = np.concatenate(([0.0], np.cumsum(workload.requests)))
        edges = np.arange(n_steps + 1, dtype=np.float64) * self.dt
        self.arrived_idx = np.searchsorted(workload.arrival_s, edges, side="left")
        self.held_steps = steps_held(workload.output_tokens, self.seq_tokens_per_s, dt=self.dt)
        kv_each = kv_tokens_held(workload)
        largest = float(kv_each.max(initial=0.0))
        if largest > self.kv_tokens_per_gang:
            # vLLM refuses a request longer than its cache; admitting it in slices would hold
            # every request behind it for a hold time
            raise ConfigError(
                f"a request of the trace holds {largest:,.0f} KV tokens, more than one gang's "
                f"KV cache ({self.kv_tokens_per_gang:,.0f}: serving.kv_cache_tokens_per_pod x "
                "cluster.pods_per_gang); raise serving.kv_cache_tokens_per_pod"
            )
        horizon = n_steps + int(np.ceil(self.held_steps.max())) + 3
        # what a running sequence holds: a slot, and KV cache
        self.slots = _Held(np.ones(workload.requests.size), workload, self.held_steps, horizon)
        self.kv = _Held(kv_each, workload, self.held_steps, horizon)
        self.rate_curve = np.zeros(n_steps)  # prefill capacity (tokens/s) during each step
        self.capacity_curve = np.zeros(n_steps + 1)  # cumulative prefill capacity C by each edge
        self.served_curve = np.zeros(n_steps + 1)  # prompt tokens served by each edge
        self.admitted_curve = np.zeros(n_steps + 1)  # requests given a decode slot by each edge
        # admitted at each step's start (slots and KV cache free then), and admissions/s after
        # that as slots and KV cache free
        self.admit_now_curve = np.zeros(n_steps)
        self.admit_rate_curve = np.zeros(n_steps)
        self.edges = edges
        self._served = 0.0
        # sup over s <= now of C(s) - A(s-): how far capacity has run ahead of the work, idle
        # time included; served = C(now) - this
        self._idle_capacity = 0.0
        # that sup at each cohort's arrival, filled as the cohorts arrive; TTFTs invert from it
        self.idle_at_arrival = np.zeros(workload.arrival_s.size)
        self._admitted = 0.0
        self.steps_done = 0

    def step(self, k: int, *, prefill_gangs: int, decode_gangs: int) -> ServingView:
        """Serve step k ([k*dt, (k+1)*dt)) with the gangs ready at its start."""
        self.slots.begin(k)
        self.kv.begin(k)
        slots = decode_gangs * self.slots_per_gang
        kv_room = decode_gangs * self.kv_tokens_per_gang
        capacity = prefill_gangs * self.prefill_per_gang * self.dt
        if self.unified and slots > 0:
            # the batch's share of the slots over the last step, its admissions included: the
            # sequences admitted earlier alone (`carried`) leave out the step's newcomers,
            # a share that grows with the step (all of it for holds shorter than a step)
            busy = max(self.slots.average, 0.0)
            capacity *= 1.0 - self.interference * min(busy / slots, 1.0)
        self.rate_curve[k] = capacity / self.dt
        self._served = self._serve_prefill(k, capacity)
        self.served_curve[k + 1] = self._served
        prefilled = float(np.interp(self._served, self.work0, self.count0))
        # a sequence needs a slot and room for its KV cache: what is free of both through the
        # step admits requests in order, and what is free at its start admits them at once
        done, count0 = self._admitted, self.count0
        fits = min(
            prefilled,
            self.slots.step_limit(done, slots, count0),
            self.kv.step_limit(done, kv_room, count0),
        )
        admit = max(fits - done, 0.0)
        now = min(
            admit,
            self.slots.start_limit(done, slots, count0),
            self.kv.start_limit(done, kv_room, count0),
        )
        now = max(now, 0.0)
        self.admit_now_curve[k] = now
        if admit > 0:
            end = done + admit
            by_slots = self.slots.per_step(done, end, slots, count0)
            by_kv = self.kv.per_step(done, end, kv_room, count0)
            # a sliver of a request (rounding in the cumulative counts of fractional
            # cohorts) takes no slot-time a float can show; it is booked at the step's start
            if by_slots is not None and by_kv is not None:
                self.admit_rate_curve[k] = max(min(by_slots, by_kv) - now, 0.0) / self.dt
            self._book_holds(k, self._admitted, end)
            self._admitted = end
        self.slots.end(k)
        self.kv.end(k)
        self.steps_done = k + 1
        self.admitted_curve[k + 1] = self._admitted
        arrived = self.count0[self.arrived_idx[k + 1]]
        queued = max(arrived - prefilled, 0.0)
        running_prefill = min(queued, float(prefill_gangs))
        return ServingView(
            prefill_waiting=queued - running_prefill,
            prefill_running=running_prefill,
            prefill_kv_usage=self._prefill_kv_usage(k, prefill_gangs),
            decode_waiting=max(prefilled - self._admitted, 0.0),
            decode_running=max(self.slots.average, 0.0),
            decode_kv_usage=min(max(self.kv.average, 0.0) / kv_room, 1.0) if kv_room > 0 else 0.0,
        )

    def _prefill_kv_usage(self, k: int, gangs: int) -> float:
        """What `vllm:kv_cache_usage_perc` reads on the prefill gangs after step k: the share
        of their KV cache held by the prompts in the running batch (at most one batch of
        `prefill_batch_tokens` per gang; queued prompts hold no blocks yet) and by the prompts
        already prefilled whose KV cache waits for a decode slot to take it. 0 with no gang:
        the policy reads no signal then, and a gang that becomes ready before the next tick
        starts empty."""
        capacity = gangs * self.kv_tokens_per_gang
        if capacity <= 0:
            return 0.0
        queued = max(float(self.work0[self.arrived_idx[k + 1]]) - self._served, 0.0)
        in_batch = min(queued, gangs * self.batch_tokens)
        handed_off = float(np.interp(self._admitted, self.count0, self.work0))
        awaiting_decode = max(self._served - handed_off, 0.0)
        return min((in_batch + awaiting_decode) / capacity, 1.0)

    def _serve_prefill(self, k: int, capacity: float) -> float:
        """Prompt tokens served by the end of step k with `capacity` tokens in it: capacity
        before a cohort arrives is idle, not spent on that cohort."""
        start = self.capacity_curve[k]
        end = start + capacity
        self.capacity_curve[k + 1] = end
        low, high = self.arrived_idx[k], self.arrived_idx[k + 1]
        if high > low:
            # just before each cohort arrives, capacity has run ahead of the work by this
            since_start = self.workload.arrival_s[low:high] - k * self.dt
            at_arrival = start + self.rate_curve[k] * since_start
            ahead = np.maximum.accumulate(at_arrival - self.work0[low:high])
            self.idle_at_arrival[low:high] = np.maximum(ahead, self._idle_capacity)
            self._idle_capacity = float(self.idle_at_arrival[high - 1])
        self._idle_capacity = max(self._idle_capacity, float(end - self.work0[high]))
        return float(end - self._idle_capacity)

    def _book_holds(self, k: int, low: float, high: float) -> None:
        """Book the slots and the KV cache that requests `low` to `high` (in arrival order),
        admitted in step k, hold."""
        first = int(np.searchsorted(self.count0, low, side="right")) - 1
        last = int(np.searchsorted(self.count0, high, side="left"))
        cohorts = np.arange(first, last)
        share = np.clip(self.count0[cohorts + 1], low, high) - np.clip(
            self.count0[cohorts], low, high
        )
        for resource in (self.slots, self.kv):
            resource.book(k, cohorts=cohorts, share=share, held_steps=self.held_steps[cohorts])

    def ttft_s(self) -> np.ndarray:
        """TTFT of the middle request of every cohort, over the steps simulated so far; inf
        when it was not served by then."""
        workload = self.workload
        end_step = self.steps_done
        times = self.edges[: end_step + 1]
        admitted = self.admitted_curve[: end_step + 1]
        n = workload.requests
        ahead = self.work0[:-1] + workload.prompt_tokens() * (n - 1) / (2 * n)
        own_s = workload.input_tokens / self.prefill_per_gang
        # the work ahead is done when capacity since the cohort's arrival has covered it: C
        # reaches ahead + sup_{s <= arrival} (C(s) - A(s-)), the reflection at the arrival
        arrived = int(self.arrived_idx[end_step])
        ahead_done = np.full(n.shape, np.inf)
        ahead_done[:arrived] = _invert(
            self.capacity_curve[: end_step + 1],
            times,
            ahead[:arrived] + self.idle_at_arrival[:arrived],
            self.rate_curve[:end_step],
            side="right",
        )
        prefill_done = np.maximum(ahead_done, workload.arrival_s) + own_s
        slot_position = self.count0[:-1] + n / 2
        slot_at = _invert(
            admitted,
            times,
            slot_position,
            self.admit_rate_curve[:end_step],
            side="left",
            at_start=self.admit_now_curve[:end_step],
        )
        return np.asarray(np.maximum(prefill_done, slot_at) - workload.arrival_s)


def kv_tokens_held(workload: Workload) -> np.ndarray:
    """KV tokens one sequence of each cohort holds in decode, averaged over its hold: its
    prompt and half its output (the cache grows by a token per token generated)."""
    return np.asarray(workload.input_tokens + workload.output_tokens / 2)


class _Held:
    """One thing a decode sequence holds while it runs (a slot, or its KV cache), in
    `per_sequence` units per cohort, counted in unit-time as slots are: a sequence admitted in
    a step holds its amount from the step's start for its hold time."""

    def __init__(
        self, per_sequence: np.ndarray, workload: Workload, held_steps: np.ndarray, horizon: int
    ) -> None:
        amount = workload.requests * per_sequence
        self.per_sequence = per_sequence
        # cumulative amount over the cohorts in arrival order, and the unit-steps each takes
        # in the step it is admitted (a hold shorter than a step takes that share)
        self.total0 = np.concatenate(([0.0], np.cumsum(amount)))
        self.first0 = np.concatenate(([0.0], np.cumsum(amount * np.minimum(held_steps, 1.0))))
        self.delta = np.zeros(horizon)  # held, averaged over each step (difference array)
        self.start_delta = np.zeros(horizon)  # held at each step's start (difference array)
        self.average = 0.0  # held, averaged over the last step
        self.at_start = 0.0  # held at the last step's start
        self.carried = 0.0  # held through this step by sequences admitted earlier

    def begin(self, k: int) -> None:
        self.carried = max(self.average + self.delta[k], 0.0)
        self.at_start += self.start_delta[k]

    def end(self, k: int) -> None:
        self.average += self.delta[k]

    def step_limit(self, admitted: float, room: float, count0: np.ndarray) -> float:
        """Requests (cumulative, in arrival order) what is free through the step admits."""
        used = float(np.interp(admitted, count0, self.first0))
        return float(np.interp(used + max(room - self.carried, 0.0), self.first0, count0))

    def start_limit(self, admitted: float, room: float, count0: np.ndarray) -> float:
        """Requests what is free at the step's start admits at once."""
        held = float(np.interp(admitted, count0, self.total0))
        free = max(room - self.at_start, 0.0)
        return float(np.interp(held + free, self.total0, count0)) - admitted

    def per_step(
        self, admitted: float, end: float, room: float, count0: np.ndarray
    ) -> float | None:
        """Requests like `admitted` to `end` that what is free through the step admits (None
        when they take no unit-step a float can show)."""
        first = float(
            np.interp(end, count0, self.first0) - np.interp(admitted, count0, self.first0)
        )
        if first <= 0:
            return None
        return max(room - self.carried, 0.0) / (first / (end - admitted))

    def book(
        self, k: int, *, cohorts: np.ndarray, share: np.ndarray, held_steps: np.ndarray
    ) -> None:
        """Book what `share` sequences of `cohorts`, admitted in step k, hold."""
        amount = share * self.per_sequence[cohorts]
        start = np.full(cohorts.size, k)
        book_occupancy(self.delta, start=start, sequences=amount, held_steps=held_steps)
        # held at the start of every later step the hold reaches into: from step k + 1 on,
        # for whole steps only
        whole = np.ceil(held_steps) - 1
        book_occupancy(self.start_delta, start=start + 1, sequences=amount, held_steps=whole)


def steps_held(output_tokens: np.ndarray, seq_tokens_per_s: float, *, dt: float) -> np.ndarray:
    """How long each cohort's sequences hold a decode slot, in (fractional) steps of `dt`."""
    # a sequence with no output still passes through a slot; a floor keeps the
    # cumulative slot-steps strictly increasing so they can be inverted
    return np.maximum(output_tokens / seq_tokens_per_s / dt, 1e-6)


def book_occupancy(
    delta: np.ndarray, *, start: np.ndarray, sequences: np.ndarray, held_steps: np.ndarray
) -> None:
    """Add to the difference array `delta` the slots that `sequences` admitted at the start of
    step `start` hold: one slot in each whole step of `held_steps`, the fraction in the last.
    The running sum of `delta` is then the sequences running, averaged over each step."""
    whole = np.floor(held_steps).astype(np.int64)
    rest = held_steps - whole
    np.add.at(delta, start, sequences)
    np.add.at(delta, start + whole, -sequences * (1.0 - rest))
    np.add.at(delta, start + whole + 1, -sequences * rest)


def _invert(
    curve: np.ndarray,
    times: np.ndarray,
    values: np.ndarray,
    rates: np.ndarray,
    *,
    side: Literal["left", "right"],
    at_start: np.ndarray | None = None,
) -> np.ndarray:
    """Earliest time a cumulative curve reaches each value (inf if it never does).

    `curve[k]` is the cumulative amount by edge k. Within step k the curve jumps by
    `at_start[k]` (0 when None) at the step's start, then grows at most at `rates[k]` per
    second; it may grow slower because nothing more had arrived, and the callers take the
    max with each item's own arrival time to account for that. `side="right"` finds the step
    in which the curve first rises past a value (an item's own prefill starts only once all
    work ahead of it is done); `side="left"` the step in which it reaches it (a slot for the
    item itself).
    """
    idx = np.searchsorted(curve[1:], values, side=side)
    out = np.full(values.shape, np.inf)
    inside = idx < curve.size - 1
    k = idx[inside]
    rate = rates[k]
    jump = 0.0 if at_start is None else at_start[k]
    extra = np.maximum(values[inside] - curve[k] - jump, 0.0)
    out[inside] = times[k] + np.where(rate > 0, extra / np.where(rate > 0, rate, 1.0), 0.0)
    return out
