"""`gang-autoscaler simulate`: replay a trace through the simulated cluster with every policy.

Only wiring: the simulator lives in `autoscaler.sim`. Prints the comparison table; `--json`
writes the DESIGN.md section 8 document and `--report DIR` the CSV, plots and report.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from autoscaler.commands.arg_types import positive_duration_s
from autoscaler.commands.output_paths import (
    EXIT_BAD_INPUT,
    cannot_write,
    ensure_writable_directory,
    ensure_writable_file,
)
from autoscaler.commands.trace_args import add_trace_arguments, trace_path
from autoscaler.sim.config import load_settings
from autoscaler.sim.errors import SimulationError, TraceError
from autoscaler.sim.report import table, uses_table, write_json, write_report
from autoscaler.sim.runner import POLICIES, compare, load_workload
from autoscaler.sim.workload import BUILTIN_TRACE


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from err
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above zero")
    return value


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="replay a trace against a simulated cluster and compare policies",
        description="Replay a request trace through a simulated GPU cluster with the real "
        "decision core (gang) and the alternatives (reactive HPA, static peak sizing, a "
        "clairvoyant oracle); print SLO attainment, GPU-hours, partial-gang GPU-hours, scale "
        "events and p99 TTFT for each, and where each policy's GPU-hours go.",
    )
    add_trace_arguments(parser, default=BUILTIN_TRACE)
    parser.add_argument(
        "--policy",
        default="all",
        choices=[*POLICIES, "all"],
        help="which policy to run (default all)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the JSON results here")
    parser.add_argument(
        "--report", type=Path, metavar="DIR", help="write CSV, PNG plots and report.md here"
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML overriding simulator settings"
    )
    parser.add_argument(
        "--scale",
        type=_positive,
        default=None,
        help="traffic multiplier (default: size the trace's busiest minute to "
        "target_peak_gangs prefill gangs)",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default 0)")
    parser.add_argument("--mode", choices=["pd", "unified"], default=None, help="default pd")
    parser.add_argument(
        "--step", type=positive_duration_s, default=None, help="simulation step (5s)"
    )
    parser.add_argument(
        "--duration",
        type=positive_duration_s,
        default=None,
        help="replay only this much of the trace",
    )
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress", dest="progress", action="store_true", default=None, help="progress bar"
    )
    progress.add_argument("--no-progress", dest="progress", action="store_false")
    parser.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(
            args.config,
            flags={"seed": "--seed", "mode": "--mode", "step_s": "--step"},
            seed=args.seed,
            mode=args.mode,
            step_s=args.step,
        )
        path = trace_path(args)
        # a trace named is reported by that name, a file by its file name
        name = path.name if path == Path(args.trace) else args.trace
    except SimulationError as err:
        print(f"gang-autoscaler simulate: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        workload, scale = load_workload(path, settings, scale=args.scale, name=name)
        if args.duration is not None:
            workload = workload.slice(0.0, args.duration)
            if workload.arrival_s.size == 0:
                raise TraceError(f"no request arrives in the first {args.duration:g} s")
    except SimulationError as err:
        print(f"gang-autoscaler simulate: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # A run can take minutes; an output that cannot be written fails now, not after it (and
    # after the trace is read: a trace refused leaves no directory made for its outputs).
    for output, ensure_writable in (
        (args.json, ensure_writable_file),
        (args.report, ensure_writable_directory),
    ):
        if output is not None:
            try:
                ensure_writable(output)
            except OSError as err:
                return cannot_write("simulate", output, err)
    try:
        policies = POLICIES if args.policy == "all" else (args.policy,)
        comparison = compare(
            workload,
            settings,
            policies=policies,
            trace=name,
            scale=scale,
            progress=args.progress,
        )
    except SimulationError as err:
        print(f"gang-autoscaler simulate: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # The files first: a reader of the table that stops early (`| head`) ends the process at
    # the next print, and must not take the JSON and the report with it.
    if args.json is not None:
        try:
            write_json(comparison, args.json)
        except OSError as err:
            return cannot_write("simulate", args.json, err)
    if args.report is not None:
        try:
            written = write_report(comparison, args.report)
        except OSError as err:
            return cannot_write("simulate", args.report, err)
        for written_file in written:
            print(f"wrote {written_file}", file=sys.stderr)
    print(
        f"trace {name}: {workload.total_requests:,.0f} requests over "
        f"{workload.duration_s / 3600:.2f} h, traffic x{scale:.3g}, SLO TTFT <= "
        f"{settings.slo_ttft_s:g} s"
    )
    print(table(comparison))
    print()
    print(uses_table(comparison))
    return 0
