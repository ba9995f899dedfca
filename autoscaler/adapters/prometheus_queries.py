"""The PromQL the Prometheus source sends each tick, as one validated settings model.

Every query is an instant query over all pods at once, grouped `by (namespace, pod)` (the
optional `wake` query by `(namespace, deployment)`); the source maps results to components
in Python, so the number of queries per tick is fixed whatever the number of deployments:
one per configured query (`instant_queries`), six by default (five signals and the
freshness query), one more for each of `unified_demand` and `wake` set. Operators
override any of them (Helm values / the service settings) to read SGLang or a gateway
instead of vLLM; `sglang_queries()` gives a starting point. Annotation text never reaches
PromQL: these strings come from the operator's settings only.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from autoscaler.core.model import Component

BY_POD = "by (namespace, pod)"
# Queries whose rows are per deployment, not per pod: the label that names it.
GROUPED_BY = {"wake": "deployment"}
# A range selector, `[5m]`, or a subquery's range, `[1h:1m]`, in Prometheus's units.
_RANGE = re.compile(r"\[\s*((?:[0-9]+(?:ms|s|m|h|d|w|y))+)\s*(?::[^\]]*)?\]")
_RANGE_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800, "y": 31_536_000}


def _served_plus_queue_growth(*, served_counter: str, per_request: str, waiting: str,
                              rate_window: str, mean_window: str) -> str:  # fmt: skip
    """Arrivals estimated as served throughput plus the waiting queue's growth.

    While a server is saturated, `rate(tokens served)` understates demand: what does not get
    served piles up in the waiting queue. By conservation, arrivals = served + d(queue)/dt,
    with the queue measured in requests, so its growth is converted to tokens with the mean
    tokens per finished request (`per_request` histogram `_sum / _count`). When no request
    finished in `mean_window` the conversion is unknown and the served rate stands alone
    (the `or`); a draining queue lowers the estimate, clamped at 0.
    """
    served = f"sum {BY_POD} (rate({served_counter}[{rate_window}]))"
    growth = f"sum {BY_POD} (deriv({waiting}[{rate_window}]))"
    mean = (
        f"sum {BY_POD} (rate({per_request}_sum[{mean_window}]))\n"
        f"    / on (namespace, pod)\n"
        f"  (sum {BY_POD} (rate({per_request}_count[{mean_window}])) > 0)"
    )
    return (
        f"clamp_min(\n"
        f"  (\n"
        f"    {served}\n"
        f"    + on (namespace, pod)\n"
        f"    {growth}\n"
        f"    * on (namespace, pod)\n"
        f"    ({mean})\n"
        f"  )\n"
        f"  or on (namespace, pod)\n"
        f"  {served},\n"
        f"  0\n"
        f")"
    )


def vllm_query_texts(*, rate_window: str = "1m", mean_window: str = "5m") -> dict[str, str]:
    """The default vLLM queries (DESIGN section 6) with the given `rate()` windows.

    Tests use short windows (seconds) so `rate()` settles within a few 1 s scrapes.
    """
    return {
        "waiting": f"sum {BY_POD} (vllm:num_requests_waiting)",
        "running": f"sum {BY_POD} (vllm:num_requests_running)",
        # `or` matches on labels without the metric name, so a pod exposing both names (vLLM
        # 0.9.2 to 0.10.x) counts once; max over the V1 `engine` label (data parallelism).
        "kv_cache": f"max {BY_POD} (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)",
        "prefill_demand": _served_plus_queue_growth(
            served_counter="vllm:prompt_tokens_total",
            per_request="vllm:request_prompt_tokens",
            waiting="vllm:num_requests_waiting",
            rate_window=rate_window,
            mean_window=mean_window,
        ),
        "decode_demand": _served_plus_queue_growth(
            served_counter="vllm:generation_tokens_total",
            per_request="vllm:request_generation_tokens",
            waiting="vllm:num_requests_waiting",
            rate_window=rate_window,
            mean_window=mean_window,
        ),
        "sample_time": f"max {BY_POD} (timestamp(vllm:num_requests_running))",
    }


_VLLM = vllm_query_texts()


class PrometheusQueries(BaseModel):
    """The signal queries. Each is one instant query covering every pod at once, grouped
    `by (namespace, pod)`, so the number of queries per tick does not grow with the number
    of deployments. Results are mapped to components through pod names, so both labels must
    survive the aggregation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    waiting: str = Field(
        default=_VLLM["waiting"],
        min_length=1,
        description="Requests waiting to be scheduled, per leader pod (queue depth).",
    )
    running: str = Field(
        default=_VLLM["running"],
        min_length=1,
        description="Requests in the running batch, per leader pod.",
    )
    kv_cache: str = Field(
        default=_VLLM["kv_cache"],
        min_length=1,
        description="KV-cache usage fraction (0-1) per leader pod; accepts vLLM's old and new "
        "metric names (renamed in 0.9.2).",
    )
    prefill_demand: str = Field(
        default=_VLLM["prefill_demand"],
        min_length=1,
        description="Prefill demand per leader pod, in prompt tokens/s: served prompt tokens "
        "plus the waiting queue's growth times the mean prompt length.",
    )
    decode_demand: str = Field(
        default=_VLLM["decode_demand"],
        min_length=1,
        description="Decode demand per leader pod, in generated tokens/s: served tokens plus "
        "the waiting queue's growth times the mean output length.",
    )
    unified_demand: str | None = Field(
        default=None,
        min_length=1,
        description="Demand of `unified` (non-PD) components. Unset: the prefill demand "
        "(prompt tokens/s) is used, which costs no extra query.",
    )
    sample_time: str | None = Field(
        default=_VLLM["sample_time"],
        min_length=1,
        description="Unix time of each pod's newest sample, for the staleness limit. Unset: "
        "no staleness check beyond Prometheus's own lookback delta.",
    )
    wake: str | None = Field(
        default=None,
        min_length=1,
        description="Requests waiting for a deployment in front of its pods (a gateway's "
        "queue), grouped by (namespace, deployment), `deployment` being the "
        "gang-autoscaler.io/deployment name. Read only for a deployment at zero gangs, "
        "whose pods serve no metric: above 0, every component comes up to its minimum (at "
        "least 1). Unset: a deployment at zero comes back only on its forecast.",
    )

    @field_validator("*")
    @classmethod
    def _grouped_by_pod(cls, query: str | None, info: ValidationInfo) -> str | None:
        # A query without its grouping labels cannot be mapped to components; failing here
        # is clearer than a component that silently never gets data.
        label = GROUPED_BY.get(str(info.field_name), "pod")
        if query is not None and ("namespace" not in query or label not in query):
            raise ValueError(
                f"must keep the `namespace` and `{label}` labels, e.g. sum by (namespace, {label})"
            )
        return query

    def instant_queries(self) -> dict[str, str]:
        """Name -> PromQL of every query one tick sends (a fixed set)."""
        named = {
            "waiting": self.waiting,
            "running": self.running,
            "kv_cache": self.kv_cache,
            "prefill_demand": self.prefill_demand,
            "decode_demand": self.decode_demand,
            "unified_demand": self.unified_demand,
            "sample_time": self.sample_time,
            "wake": self.wake,
        }
        return {name: query for name, query in named.items() if query is not None}

    def demand_query_name(self, component: Component) -> str:
        """Which demand query a component reads: decode its own, prefill the prompt-token
        one, unified `unified_demand` when set and otherwise the prefill one."""
        if component is Component.DECODE:
            return "decode_demand"
        if component is Component.UNIFIED and self.unified_demand is not None:
            return "unified_demand"
        return "prefill_demand"

    def demand_rate_window_s(self) -> float | None:
        """The `rate()` window of the demand queries, as far as their text tells: in each
        query its shortest range (`[1m]`; a longer one averages something slow, such as the
        default queries' mean prompt length over `[5m]`), and the longest of those. None when
        no query has a range (a recording rule's series, say)."""
        windows = []
        for query in filter(None, (self.prefill_demand, self.decode_demand, self.unified_demand)):
            ranges = [
                sum(int(n) * _UNIT_S[unit] for n, unit in _RANGE_PART.findall(text))
                for text in _RANGE.findall(query)
            ]
            if ranges:
                windows.append(min(ranges))
        return float(max(windows)) if windows else None

    @classmethod
    def vllm(cls, *, rate_window: str = "1m", mean_window: str = "5m") -> PrometheusQueries:
        return cls(**vllm_query_texts(rate_window=rate_window, mean_window=mean_window))


def sglang_queries(*, rate_window: str = "1m") -> PrometheusQueries:
    """SGLang equivalents (`--enable-metrics`), a starting point for operators.

    SGLang labels series with `tp_rank` (and `dp_rank` under DP attention); only rank 0 is
    read (or series without the label, from releases before it), so tensor-parallel ranks do
    not multiply the queue. Demand is the served rate only: SGLang has no per-request prompt
    length histogram to convert queue growth into tokens. Not tested against a real SGLang.
    """
    rank0 = '{tp_rank=~"0|"}'
    return PrometheusQueries(
        waiting=f"sum {BY_POD} (sglang:num_queue_reqs{rank0})",
        running=f"sum {BY_POD} (sglang:num_running_reqs{rank0})",
        kv_cache=f"max {BY_POD} (sglang:token_usage{rank0})",
        prefill_demand=f"sum {BY_POD} (rate(sglang:prompt_tokens_total{rank0}[{rate_window}]))",
        decode_demand=(
            f"sum {BY_POD} (rate(sglang:generation_tokens_total{rank0}[{rate_window}]))"
        ),
        sample_time=f"max {BY_POD} (timestamp(sglang:num_running_reqs{rank0}))",
    )
