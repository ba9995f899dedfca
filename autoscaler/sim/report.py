"""What a comparison run leaves behind: the comparison table, the DESIGN section 8 JSON, a
per-step time-series CSV, PNG plots and a `report.md` that ties them together."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from autoscaler.sim.metrics import DAY_S, by_day, counted_ttft_s, gpu_hours_by_use
from autoscaler.sim.runner import Comparison

TABLE_COLUMNS = (
    ("policy", "{}"),
    ("SLO attained", "{:.2%}"),
    ("GPU-hours", "{:.1f}"),
    ("partial-gang GPU-h", "{:.2f}"),
    ("scale events", "{}"),
    ("p99 TTFT s", "{:.2f}"),
)


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table padded to its columns, so it also reads on a terminal."""
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines)


def table(comparison: Comparison) -> str:
    """The comparison as a Markdown table (also readable on a terminal)."""
    rows = []
    for name, m in comparison.metrics.items():
        values = (
            name,
            m.slo_attainment,
            m.gpu_hours,
            m.partial_gang_gpu_hours,
            m.scale_events,
            m.p99_ttft_s,
        )
        rows.append([fmt.format(v) for (_, fmt), v in zip(TABLE_COLUMNS, values, strict=True)])
    return _markdown_table([title for title, _ in TABLE_COLUMNS], rows)


def uses_table(comparison: Comparison) -> str:
    """GPU-hours by use (`gpu_hours_by_use`), one row per policy, as a Markdown table."""
    uses = {name: gpu_hours_by_use(result) for name, result in comparison.results.items()}
    columns = list(next(iter(uses.values())))
    rows = [
        [name, *(f"{parts[c]:.1f}" for c in columns), f"{sum(parts.values()):.1f}"]
        for name, parts in uses.items()
    ]
    return _markdown_table(["GPU-hours", *columns, "total"], rows)


def days_table(comparison: Comparison) -> str:
    """SLO attainment and GPU-hours per day (`by_day`), two columns per policy."""
    days = {name: by_day(result) for name, result in comparison.results.items()}
    header = ["day"]
    for name in days:
        header += [f"{name} SLO", f"{name} GPU-h"]
    rows = []
    for index in range(max(len(d) for d in days.values())):
        row = [str(index)]
        for per_day in days.values():
            day = per_day[index] if index < len(per_day) else None
            row += ["-", "-"] if day is None else [
                f"{day.slo_attainment:.2%}", f"{day.gpu_hours:.1f}"
            ]  # fmt: skip
        rows.append(row)
    return _markdown_table(header, rows)


def write_json(comparison: Comparison, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(comparison.as_json(), indent=2) + "\n", encoding="utf-8")


def timeseries_frame(comparison: Comparison) -> pd.DataFrame:
    frames = []
    for name, result in comparison.results.items():
        frame = pd.DataFrame({k: v for k, v in result.series.items()})
        frame.insert(0, "policy", name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def ttft_percentiles(comparison: Comparison, *, bin_s: float = 60.0) -> pd.DataFrame:
    """Request-weighted p50/p99 TTFT per `bin_s` of arrival time, per policy; a request
    never served counts as the metrics count it (waiting until the end of the run)."""
    rows = []
    for name, result in comparison.results.items():
        workload = result.workload
        frame = pd.DataFrame(
            {
                "bin": (workload.arrival_s // bin_s) * bin_s,
                "ttft": counted_ttft_s(result),
                "w": workload.requests,
            }
        )
        for start, group in frame.groupby("bin"):
            order = np.argsort(group["ttft"].to_numpy())
            values = group["ttft"].to_numpy()[order]
            cumulative = np.cumsum(group["w"].to_numpy()[order])
            total = cumulative[-1]
            p50 = values[min(np.searchsorted(cumulative, 0.5 * total), values.size - 1)]
            p99 = values[min(np.searchsorted(cumulative, 0.99 * total), values.size - 1)]
            rows.append({"policy": name, "time_s": start, "p50_ttft_s": p50, "p99_ttft_s": p99})
    return pd.DataFrame(rows)


def write_report(comparison: Comparison, directory: Path) -> list[Path]:
    """Write JSON, CSVs, plots and report.md into `directory`; return the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    json_path = directory / "results.json"
    write_json(comparison, json_path)
    written.append(json_path)
    csv_path = directory / "timeseries.csv"
    timeseries_frame(comparison).to_csv(csv_path, index=False, float_format="%.6g")
    written.append(csv_path)
    ttft = ttft_percentiles(comparison)
    ttft_path = directory / "ttft_per_minute.csv"
    ttft.to_csv(ttft_path, index=False, float_format="%.6g")
    written.append(ttft_path)
    plots = _plots(comparison, ttft, directory)
    written.extend(plots)
    report = directory / "report.md"
    report.write_text(_markdown(comparison, plots), encoding="utf-8")
    written.append(report)
    return written


def _plots(comparison: Comparison, ttft: pd.DataFrame, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    first = next(iter(comparison.results.values()))
    components = [c.removesuffix("_demand") for c in first.series if c.endswith("_demand")]
    hours = first.series["time_s"] / 3600.0

    # demand vs forecast vs capacity, for the gang policy (or the first policy run)
    focus = comparison.results.get("gang", first)
    fig, axes = plt.subplots(len(components), 1, figsize=(10, 3.2 * len(components)), sharex=True)
    for ax, comp in zip(np.atleast_1d(axes), components, strict=True):
        s = focus.series
        ax.plot(hours, s[f"{comp}_demand"], label="demand (1 min rate)", lw=0.8)
        if np.isfinite(s[f"{comp}_forecast_point"]).any():  # a policy that forecasts
            ax.plot(hours, s[f"{comp}_forecast_point"], label="forecast, lead time ahead", lw=0.8)
            ax.plot(
                hours, s[f"{comp}_forecast_upper"], label="forecast upper bound", lw=0.6, ls=":"
            )
        ax.plot(hours, s[f"{comp}_capacity"], label="ready capacity", lw=1.0)
        unit = "generated tokens/s" if comp == "decode" else "prompt tokens/s"
        ax.set_ylabel(f"{comp}\n{unit}")
        _legend_outside(ax)
    np.atleast_1d(axes)[-1].set_xlabel("hours")
    fig.suptitle(f"{comparison.trace}: demand, forecast and capacity ({focus.policy})")
    written.append(_save(fig, directory / "demand_forecast_capacity.png"))

    fig, axes = plt.subplots(len(components), 1, figsize=(10, 3.2 * len(components)), sharex=True)
    for ax, comp in zip(np.atleast_1d(axes), components, strict=True):
        held = False
        ordered = 0.0
        for name, result in comparison.results.items():
            ordered = max(ordered, float(np.nanmax(result.series[f"{comp}_balloon_ordered"])))
            line = ax.step(hours, result.series[f"{comp}_ready_gangs"], where="post", lw=1.0)
            if np.nansum(result.series[f"{comp}_balloon_gangs"]) > 0:
                held = True
                ax.step(
                    hours,
                    result.series[f"{comp}_ready_gangs"] + result.series[f"{comp}_balloon_gangs"],
                    where="post",
                    lw=0.6,
                    ls="--",
                    color=line[0].get_color(),
                    label=f"{name} + balloons",
                )
            line[0].set_label(f"{name} ready")
        if not held:
            # say why no balloon line is drawn: none ordered, or none placed before it was
            # withdrawn (its nodes still booted: they are in "nodes booting or idle")
            why = (
                f"balloon gangs ordered (up to {ordered:.0f}) but none placed"
                if ordered > 0
                else "no balloon gangs ordered by any policy"
            )
            ax.set_title(f"{comp}: {why}", fontsize=8, loc="left")
        ax.set_ylabel(f"{comp} gangs")
        _legend_outside(ax)
    np.atleast_1d(axes)[-1].set_xlabel("hours")
    fig.suptitle(f"{comparison.trace}: ready gangs and balloon gangs")
    written.append(_save(fig, directory / "gangs_and_balloons.png"))

    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name, group in ttft.groupby("policy", sort=False):
        line = ax.plot(group["time_s"] / 3600.0, group["p99_ttft_s"], lw=1.0, label=f"{name} p99")
        ax.plot(
            group["time_s"] / 3600.0,
            group["p50_ttft_s"],
            lw=0.6,
            ls=":",
            color=line[0].get_color(),
            label=f"{name} p50",
        )
    ax.axhline(first.settings.slo_ttft_s, color="k", lw=0.6, ls="--", label="SLO")
    ax.set_yscale("log")
    ax.set_ylabel("TTFT s (per minute)")
    ax.set_xlabel("hours")
    _legend_outside(ax)
    fig.suptitle(f"{comparison.trace}: TTFT percentiles")
    written.append(_save(fig, directory / "ttft_percentiles.png"))
    return written


def _legend_outside(ax: object) -> None:
    """The legend right of the plot: inside, any corner hid some policy's curve."""
    ax.legend(  # type: ignore[attr-defined]
        loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7
    )


def _save(fig: object, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    # "tight" takes in the legends outside the axes
    fig.savefig(path, dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path


def _markdown(comparison: Comparison, plots: list[Path]) -> str:
    first = next(iter(comparison.results.values()))
    settings = first.settings
    cluster = settings.cluster
    lines = [
        f"# Simulation: {comparison.trace}",
        "",
        f"- requests: {comparison.workload.total_requests:,.0f} over "
        f"{comparison.workload.duration_s / 3600:.2f} h (traffic scale x{comparison.scale:.3g})",
        f"- mode: {settings.mode}; step {settings.step_s:g} s; tick {settings.tick_s:g} s; "
        f"SLO TTFT <= {settings.slo_ttft_s:g} s; seed {settings.seed}",
        f"- gang: {cluster.pods_per_gang} pods x {cluster.gpus_per_pod} GPUs; nodes of "
        f"{cluster.gpus_per_node} GPUs, at most {cluster.max_nodes or 'unlimited'}; node "
        f"provisioning {cluster.node_provisioning_s:g} s; gang start-up "
        f"{cluster.gang_startup_s:g} s",
        "",
        table(comparison),
        "",
        "GPU-hours count every node that exists (provisioning included) for as long as it "
        "exists; partial-gang GPU-hours count GPUs held by pods of gangs that are only partly "
        "placed. See docs/simulator.md for the model.",
        "",
        "## Where the GPU-hours go",
        "",
        uses_table(comparison),
        "",
        "Serving: gangs that are ready. Starting: gangs placed and loading (gang start-up). "
        "Nodes booting or idle: GPUs of nodes being provisioned, or with nothing on them "
        "(a node is removed after the cluster's idle timeout).",
        "",
    ]
    if comparison.workload.duration_s > DAY_S:
        lines += [
            "## Day by day",
            "",
            days_table(comparison),
            "",
            "Days count from the trace's start. A request that was never served counts as "
            "missed on the day it arrived.",
            "",
        ]
    for path in plots:
        lines += [f"![{path.stem}]({path.name})", ""]
    return "\n".join(lines)
