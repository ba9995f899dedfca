"""Generate the Grafana dashboards of gang-autoscaler as JSON.

    python dashboards/generate.py          # writes dashboards/*.json and the chart's copies

Plain dictionaries in Grafana's dashboard JSON model (schemaVersion 39), not
grafana-foundation-sdk: its PyPI releases are cut per Grafana version and an unpinned install
gives Grafana 10.1 types; the JSON model below is what Grafana 10 and 11 both import, and
`tests/dashboards` checks every panel's structure and runs every query against a real
Prometheus. The chart carries byte-identical copies (a Helm chart cannot read files outside its
directory); a test fails when they drift.

How vLLM pod series are tied to deployments: leader pods are named `<lws>-<group>`, so
`label_replace` derives `lws` from the `pod` label, and `gang_autoscaler_component_info`
(exported by the service, one series per component) maps `(namespace, lws)` to the deployment
and component. This needs only the `namespace` and `pod` labels the service's own queries
already need; no extra relabelling.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHART_COPY = HERE.parent / "charts" / "gang-autoscaler" / "dashboards"

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SELECTOR = 'namespace="$namespace", deployment="$deployment", component=~"$component"'
COMPONENT_INFO = f"gang_autoscaler_component_info{{{SELECTOR}}}"
# A second release beside the first (a dry-run shadow, docs/operators.md) exports the same
# series under its own job: every query of the service's own metrics reads the selected one.
_OWN_METRIC = re.compile(r"\b(gang_autoscaler_\w+)(\{)?")


def scoped(expr: str) -> str:
    """`expr` with every selector of the service's own metrics limited to `job="$job"`."""

    def add(match: re.Match[str]) -> str:
        name = match.group(1)
        return f'{name}{{job="$job", ' if match.group(2) else f'{name}{{job="$job"}}'

    return _OWN_METRIC.sub(add, expr)


def by_component(vllm_expr: str) -> str:
    """`vllm_expr` (per pod, any labels) joined to the selected deployment's components."""
    with_lws = f'label_replace({vllm_expr}, "lws", "$1", "pod", "(.+)-[0-9]+")'
    return (
        f"{with_lws}\n  * on (namespace, lws) group_left (component)\n"
        f"  max by (namespace, lws, component) ({COMPONENT_INFO})"
    )


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "refId": ref,
    }


def timeseries(
    panel_id: int,
    title: str,
    description: str,
    targets: list[tuple[str, str]],
    *,
    unit: str,
    grid: tuple[int, int, int, int],
    min_value: float | None = 0,
    draw: str = "line",
) -> dict[str, Any]:
    x, y, w, h = grid
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {"drawStyle": draw, "lineWidth": 1, "fillOpacity": 10, "showPoints": "never"},
    }
    if min_value is not None:
        defaults["min"] = min_value
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)
        ],
    }


def datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
    }


def query_variable(
    name: str, label: str, query: str, *, multi: bool = False, include_all: bool = False
) -> dict[str, Any]:
    variable: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "refresh": 2,  # on time-range change: components come and go
        "sort": 1,
        "multi": multi,
        "includeAll": include_all,
        "current": {},
        "hide": 0,
    }
    if include_all:
        variable["allValue"] = ".*"
    return variable


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[dict[str, Any]],
    variables: list[dict[str, Any]],
    annotations: list[dict[str, Any]],
) -> dict[str, Any]:
    for panel in panels:
        for panel_target in panel.get("targets", []):
            panel_target["expr"] = scoped(panel_target["expr"])
    for annotation in annotations:
        annotation["expr"] = scoped(annotation["expr"])
    for variable in variables:
        if variable["type"] == "query":
            variable["query"]["query"] = variable["definition"] = scoped(variable["definition"])
    # the release: the job its ServiceMonitor scrapes it under (the Service's name)
    job = query_variable("job", "Release", "label_values(gang_autoscaler_leader, job)")
    variables = [*variables[:1], job, *variables[1:]]  # after the data source
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gang-autoscaler", "llm-inference", "leaderworkerset"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": variables},
        "annotations": {"list": [builtin, *annotations]},
        "links": [],
        "panels": panels,
    }


def deployment_dashboard() -> dict[str, Any]:
    s = SELECTOR
    panels = [
        timeseries(
            1,
            "Demand vs forecast vs capacity",
            "Demand arriving now (served plus queue growth), the forecast one lead time ahead "
            "(point and upper bound), the forecast times the traffic's burst factor (what the "
            "forecast floor plans for) and the capacity of the ready gangs, per component, in "
            "the demand signal's unit (tokens/s by default). Upper bound above capacity is "
            "what the balloon buffer covers.",
            [
                (f"max by (component) (gang_autoscaler_demand{{{s}}})", "{{component}} demand"),
                (
                    f"max by (component) (gang_autoscaler_forecast_demand{{{s}}})",
                    "{{component}} forecast",
                ),
                (
                    f"max by (component) (gang_autoscaler_forecast_demand_upper{{{s}}})",
                    "{{component}} forecast upper",
                ),
                (
                    f"max by (component) (gang_autoscaler_forecast_demand{{{s}}})\n"
                    f"  * max by (component) (gang_autoscaler_burst_factor{{{s}}})",
                    "{{component}} forecast x burst factor",
                ),
                (
                    f"max by (component) (gang_autoscaler_capacity_per_gang{{{s}}})\n"
                    f"  * max by (component) (gang_autoscaler_ready_gangs{{{s}}})",
                    "{{component}} capacity (ready gangs)",
                ),
            ],
            unit="short",
            grid=(0, 0, 24, 9),
        ),
        timeseries(
            2,
            "Gangs per component: desired, current, ready",
            "Desired is what the last plan wants; current is the LWS spec.replicas; ready "
            "counts gangs whose every pod is Ready. Ready below current for long means gangs "
            "cannot start (capacity, images, weights).",
            [
                (
                    f"max by (component) (gang_autoscaler_desired_gangs{{{s}}})",
                    "{{component}} desired",
                ),
                (
                    f"max by (component) (gang_autoscaler_current_gangs{{{s}}})",
                    "{{component}} current",
                ),
                (f"max by (component) (gang_autoscaler_ready_gangs{{{s}}})", "{{component}} ready"),
            ],
            unit="none",
            grid=(0, 9, 12, 8),
        ),
        timeseries(
            3,
            "Partial gangs",
            "Gangs with some pods placed and some Pending: they hold GPUs and serve nothing. "
            "Past gang-timeout they count as not ready and are scaled away. Unplaced: gangs "
            "with no pod placed past gang-timeout, kept while the cluster can grow (nodes "
            "slow or not coming, or pods refused).",
            [
                (f"max by (component) (gang_autoscaler_partial_gangs{{{s}}})", "{{component}}"),
                (
                    f"max by (component) (gang_autoscaler_unplaced_gangs{{{s}}})",
                    "{{component}} unplaced",
                ),
            ],
            unit="none",
            grid=(12, 9, 12, 8),
            draw="bars",
        ),
        timeseries(
            4,
            "Balloon gangs",
            "Placeholder gangs at priority -5 holding capacity for the next scale-up; real "
            "gangs preempt them. Existing vs wanted by the last plan.",
            [
                (f"max by (component) (gang_autoscaler_balloon_gangs{{{s}}})", "{{component}}"),
                (
                    f"max by (component) (gang_autoscaler_desired_balloon_gangs{{{s}}})",
                    "{{component}} desired",
                ),
            ],
            unit="none",
            grid=(0, 17, 12, 8),
        ),
        timeseries(
            5,
            "Queue depth (vllm:num_requests_waiting)",
            "Requests waiting to be scheduled, summed over the component's leader pods.",
            [
                (
                    "sum by (component) (\n"
                    + by_component('vllm:num_requests_waiting{namespace="$namespace"}')
                    + "\n)",
                    "{{component}}",
                )
            ],
            unit="short",
            grid=(12, 17, 12, 8),
        ),
        timeseries(
            6,
            "KV-cache usage (highest leader)",
            "vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc before vLLM 0.9.2; the "
            "fullest leader pod of each component.",
            [
                (
                    "max by (component) (\n"
                    + by_component(
                        '(vllm:kv_cache_usage_perc{namespace="$namespace"}'
                        ' or vllm:gpu_cache_usage_perc{namespace="$namespace"})'
                    )
                    + "\n)",
                    "{{component}}",
                )
            ],
            unit="percentunit",
            grid=(0, 25, 12, 8),
        ),
        timeseries(
            7,
            "Time to first token p50 / p99",
            "From vllm:time_to_first_token_seconds (frontend arrival to first token, queueing "
            "included), over all leader pods of each component.",
            [
                (
                    f"histogram_quantile({q}, sum by (le, component) (\n"
                    + by_component(
                        "rate(vllm:time_to_first_token_seconds_bucket"
                        '{namespace="$namespace"}[$__rate_interval])'
                    )
                    + "\n))",
                    f"{{{{component}}}} p{int(q * 100)}",
                )
                for q in (0.5, 0.99)
            ],
            unit="s",
            grid=(12, 25, 12, 8),
        ),
        timeseries(
            8,
            "Token throughput (served)",
            "Prompt and generated tokens/s actually served by the component's leaders. While "
            "a component is saturated this is below demand.",
            [
                (
                    "sum by (component) (\n"
                    + by_component(
                        'rate(vllm:prompt_tokens_total{namespace="$namespace"}[$__rate_interval])'
                    )
                    + "\n)",
                    "{{component}} prompt",
                ),
                (
                    "sum by (component) (\n"
                    + by_component(
                        "rate(vllm:generation_tokens_total"
                        '{namespace="$namespace"}[$__rate_interval])'
                    )
                    + "\n)",
                    "{{component}} generated",
                ),
            ],
            unit="short",
            grid=(0, 33, 12, 8),
        ),
        timeseries(
            9,
            "Decisions by reason",
            "Why each plan chose its number of gangs (the same reason as in /decisions, the "
            "Events and the logs).",
            [
                (
                    "sum by (component, reason) (max without (instance, pod) "
                    f"(rate(gang_autoscaler_decisions_total{{{s}}}[$__rate_interval])))",
                    "{{component}} {{reason}}",
                )
            ],
            unit="ops",
            grid=(12, 33, 12, 8),
        ),
    ]
    variables = [
        datasource_variable(),
        query_variable(
            "namespace", "Namespace", "label_values(gang_autoscaler_component_info, namespace)"
        ),
        query_variable(
            "deployment",
            "Deployment",
            'label_values(gang_autoscaler_component_info{namespace="$namespace"}, deployment)',
        ),
        query_variable(
            "component",
            "Component",
            "label_values(gang_autoscaler_component_info"
            '{namespace="$namespace", deployment="$deployment"}, component)',
            multi=True,
            include_all=True,
        ),
    ]
    annotations = [
        {
            "name": "Scaling decisions",
            "datasource": DATASOURCE,
            "enable": True,
            "hide": False,
            "iconColor": "orange",
            "expr": f"changes(gang_autoscaler_desired_gangs{{{s}}}[$__rate_interval]) > 0",
            "step": "30s",  # Grafana merges consecutive hits into one region
            "titleFormat": "{{component}}: desired gangs changed",
            "textFormat": "see Decisions by reason and /decisions",
            "tagKeys": "component",
            "useValueForTime": False,
        }
    ]
    return dashboard(
        "gang-autoscaler-deployment",
        "gang-autoscaler / deployment",
        "One autoscaled LLM deployment: demand, forecast, capacity and gangs per component, "
        "with the vLLM signals the decisions read.",
        panels,
        variables,
        annotations,
    )


def controller_dashboard() -> dict[str, Any]:
    panels = [
        timeseries(
            1,
            "Tick duration p50 / p99",
            "Wall time of one control-loop tick per instance. Near the tick interval means a "
            "slow Prometheus or API server; the tick deadline then abandons work.",
            [
                (
                    f"histogram_quantile({q}, sum by (le, instance) "
                    "(rate(gang_autoscaler_tick_duration_seconds_bucket[$__rate_interval])))",
                    f"{{{{instance}}}} p{int(q * 100)}",
                )
                for q in (0.5, 0.99)
            ],
            unit="s",
            grid=(0, 0, 12, 8),
        ),
        timeseries(
            2,
            "Seconds since last tick",
            "Grows without bound when the loop is stuck; /healthz fails soon after. No line "
            "before a replica's first tick (its timestamp is 0 until then).",
            [
                (
                    "time() - (max by (instance) (gang_autoscaler_last_tick_timestamp_seconds) "
                    "> 0)",
                    "{{instance}}",
                )
            ],
            unit="s",
            grid=(12, 0, 12, 8),
        ),
        timeseries(
            3,
            "Errors by kind",
            "Errors per second by kind (prometheus, kubernetes, forecast, ...). The affected "
            "components hold while errors last.",
            [
                (
                    "sum by (kind) (rate(gang_autoscaler_errors_total[$__rate_interval]))",
                    "{{kind}}",
                )
            ],
            unit="ops",
            grid=(0, 8, 12, 8),
        ),
        timeseries(
            4,
            "Decisions by reason",
            "Plans per second by reason, over every component.",
            [
                (
                    # every replica of a dry-run release plans and counts: one of them
                    "sum by (reason) (max without (instance, pod) "
                    "(rate(gang_autoscaler_decisions_total[$__rate_interval])))",
                    "{{reason}}",
                )
            ],
            unit="ops",
            grid=(12, 8, 12, 8),
        ),
        timeseries(
            5,
            "Leader",
            "1 on the instance holding the Lease. Exactly one line at 1 is healthy; none "
            "means nothing is scaling.",
            [("max by (instance) (gang_autoscaler_leader)", "{{instance}}")],
            unit="none",
            grid=(0, 16, 12, 8),
            draw="bars",
        ),
        timeseries(
            6,
            "Policy problems",
            "Bad gang-autoscaler.io annotations now, by LWS and annotation: the component "
            "holds until they are fixed, and a Warning Event on the LWS names the problem. "
            "No line is healthy.",
            [
                (
                    "max by (namespace, lws, annotation) (gang_autoscaler_policy_problems)",
                    "{{namespace}}/{{lws}} {{annotation}}",
                )
            ],
            unit="none",
            grid=(12, 16, 12, 8),
        ),
        timeseries(
            7,
            "Prometheus queries per tick",
            "A fixed, small number: it must not grow with the number of deployments.",
            [("max by (instance) (gang_autoscaler_prometheus_queries_per_tick)", "{{instance}}")],
            unit="none",
            grid=(0, 24, 12, 8),
        ),
        timeseries(
            8,
            "Scale writes",
            "Writes to LeaderWorkerSet /scale by direction (none in dry-run).",
            [
                (
                    "sum by (namespace, deployment, component, direction) "
                    "(rate(gang_autoscaler_scale_writes_total[$__rate_interval]))",
                    "{{namespace}}/{{deployment}} {{component}} {{direction}}",
                )
            ],
            unit="ops",
            grid=(12, 24, 12, 8),
        ),
        timeseries(
            9,
            "Watch caches failing",
            "How long each watch cache (leaderworkersets, pods, nodes) has failed to list and "
            "watch; 0 is healthy. Past the watch staleness limit (60 s by default) every "
            "component holds and nothing is written.",
            [
                (
                    "max by (instance, cache) (gang_autoscaler_watch_failing_seconds)",
                    "{{instance}} {{cache}}",
                )
            ],
            unit="s",
            grid=(0, 32, 12, 8),
        ),
    ]
    return dashboard(
        "gang-autoscaler-controller",
        "gang-autoscaler / controller",
        "Health of the gang-autoscaler service itself: ticks, errors, decisions, leadership.",
        panels,
        [datasource_variable()],
        [],
    )


DASHBOARDS = {
    "gang-autoscaler-deployment.json": deployment_dashboard,
    "gang-autoscaler-controller.json": controller_dashboard,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    CHART_COPY.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        text = render(build)
        for directory in (HERE, CHART_COPY):
            (directory / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
