"""Serving physics: prefill as a fluid FIFO queue of prompt tokens, decode as sequence slots.

Prefill: the ready prefill gangs together serve `gangs * prefill_tokens_per_s` prompt
tokens per second, first come first served. A request's first token is ready when the
prompt work queued ahead of it is done plus its own prompt at one gang's speed.

Decode: each ready decode gang holds `max_sequences` running sequences; a sequence keeps its
slot for `output_tokens / per_sequence_tokens_per_s` seconds, where the per-sequence speed
is the gang's full-batch throughput shared by its slots. A request that finished prefill
waits for a free slot (the KV cache has nowhere to go), and its first token reaches the
user only once it holds one: TTFT = max(prefill done, decode slot) - arrival.

Unified gangs run both on the same GPUs: a full decode batch takes
`unified_decode_interference` of the prefill capacity.

The forward pass (`step`) only moves cumulative counters, so it costs O(1) per step plus the
cohorts admitted; per-request TTFTs are computed afterwards, vectorised, by inverting the
cumulative service curves (`ttft_s`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaler.sim.config import SimSettings
from autoscaler.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class ServingView:
    """Queue state after a step, in vLLM terms (summed over ready gangs)."""

    prefill_waiting: float
    prefill_running: float
    prefill_utilization: float
    decode_waiting: float
    decode_running: float
    decode_slots: float


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
        # cumulative prompt work and request counts, with a leading zero
        self.work0 = np.concatenate(([0.0], np.cumsum(workload.prompt_tokens())))
        self.count0 = np.concatenate(([0.0], np.cumsum(workload.requests)))
        edges = np.arange(n_steps + 1, dtype=np.float64) * self.dt
        self.arrived_idx = np.searchsorted(workload.arrival_s, edges, side="left")
        hold_steps = np.ceil(workload.output_tokens / self.seq_tokens_per_s / self.dt)
        self.hold_steps = np.maximum(hold_steps, 1).astype(np.int64)
        self.finishing = np.zeros(n_steps + int(self.hold_steps.max()) + 2)
        self.served_curve = np.zeros(n_steps + 1)  # prompt tokens served by each edge
        self.rate_curve = np.zeros(n_steps)  # prefill capacity (tokens/s) during each step
        self.admitted_curve = np.zeros(n_steps + 1)  # requests given a decode slot by each edge
        self.edges = edges
        self._served = 0.0
        self._admitted = 0.0
        self._running = 0.0
        self.steps_done = 0

    def step(self, k: int, *, prefill_gangs: int, decode_gangs: int) -> ServingView:
        """Serve step k ([k*dt, (k+1)*dt)) with the gangs ready at its start."""
        self._running = max(self._running - self.finishing[k], 0.0)
        slots = decode_gangs * self.slots_per_gang
        capacity = prefill_gangs * self.prefill_per_gang * self.dt
        if self.unified and slots > 0:
            capacity *= 1.0 - self.interference * min(self._running / slots, 1.0)
        self.rate_curve[k] = capacity / self.dt
        arrived_work = self.work0[self.arrived_idx[k + 1]]
        before = self._served
        self._served = min(arrived_work, self._served + capacity)
        prefilled = float(np.interp(self._served, self.work0, self.count0))
        admit = min(max(prefilled - self._admitted, 0.0), max(slots - self._running, 0.0))
        if admit > 0:
            self._schedule_finish(k, self._admitted, self._admitted + admit)
            self._admitted += admit
            self._running += admit
        self.steps_done = k + 1
        self.served_curve[k + 1] = self._served
        self.admitted_curve[k + 1] = self._admitted
        arrived = self.count0[self.arrived_idx[k + 1]]
        queued = max(arrived - prefilled, 0.0)
        running_prefill = min(queued, float(prefill_gangs))
        return ServingView(
            prefill_waiting=queued - running_prefill,
            prefill_running=running_prefill,
            prefill_utilization=(self._served - before) / capacity if capacity > 0 else 1.0,
            decode_waiting=max(prefilled - self._admitted, 0.0),
            decode_running=self._running,
            decode_slots=slots,
        )

    def _schedule_finish(self, k: int, low: float, high: float) -> None:
        """Book the step at which each newly admitted request frees its slot."""
        first = int(np.searchsorted(self.count0, low, side="right")) - 1
        last = int(np.searchsorted(self.count0, high, side="left"))
        cohorts = np.arange(first, last)
        share = np.clip(self.count0[cohorts + 1], low, high) - np.clip(
            self.count0[cohorts], low, high
        )
        np.add.at(self.finishing, k + self.hold_steps[cohorts], share)

    def ttft_s(self) -> np.ndarray:
        """TTFT of the middle request of every cohort, over the steps simulated so far; inf
        when it was not served by then."""
        workload = self.workload
        end_step = self.steps_done
        times = self.edges[: end_step + 1]
        served = self.served_curve[: end_step + 1]
        admitted = self.admitted_curve[: end_step + 1]
        n = workload.requests
        ahead = self.work0[:-1] + workload.prompt_tokens() * (n - 1) / (2 * n)
        own_s = workload.input_tokens / self.prefill_per_gang
        ahead_done = _invert(served, times, ahead, self.rate_curve[:end_step])
        prefill_done = np.maximum(ahead_done, workload.arrival_s) + own_s
        slot_position = self.count0[:-1] + n / 2
        slot_at = _invert(admitted, times, slot_position, None)
        return np.asarray(np.maximum(prefill_done, slot_at) - workload.arrival_s)


def _invert(
    curve: np.ndarray, times: np.ndarray, values: np.ndarray, rates: np.ndarray | None
) -> np.ndarray:
    """Earliest time a cumulative curve reaches each value (inf if it never does).

    `curve[k]` is the cumulative amount by edge k. Within step k the curve grows at most at
    `rates[k]` per second from its value at the start of the step (None: instantly, as slot
    admissions do); it may grow slower because nothing more had arrived, and the callers
    take the max with each item's own arrival time to account for that.
    """
    # the step in which the curve first reaches each value (with a rate: first rises past
    # it, since an item's own service starts only once everything ahead of it is done)
    idx = np.searchsorted(curve[1:], values, side="left" if rates is None else "right")
    out = np.full(values.shape, np.inf)
    inside = idx < curve.size - 1
    k = idx[inside]
    if rates is None:
        out[inside] = times[k]
    else:
        rate = rates[k]
        extra = np.maximum(values[inside] - curve[k], 0.0)
        out[inside] = times[k] + np.where(rate > 0, extra / np.where(rate > 0, rate, 1.0), 0.0)
    return out
