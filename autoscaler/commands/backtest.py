"""`gang-autoscaler backtest`: rolling-origin evaluation of the forecasters on a trace.

Only wiring: the trace formats, the models and the scoring live in `forecasting`. Prints a
table; `--json FILE` writes the DESIGN.md section 8 document.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from autoscaler.commands.arg_types import positive_duration_s
from autoscaler.commands.output_paths import EXIT_BAD_INPUT, cannot_write, ensure_writable_file
from autoscaler.commands.trace_args import add_trace_arguments, trace_path
from autoscaler.sim.errors import SimulationError
from forecasting.backtest import BacktestReport, run_backtest
from forecasting.errors import ForecastingError
from forecasting.grid import DEFAULT_STEP_S
from forecasting.models import MODELS
from forecasting.traces import read_trace

DEFAULT_TRACE = "servegen_m-small"


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "backtest",
        help="score the demand forecasters on a trace",
        description="Rolling-origin backtest of the forecasters on a request trace: MASE, "
        "sMAPE, MAE ratios against persistence and seasonal-naive, upper-bound coverage "
        "and median fit time per model.",
    )
    add_trace_arguments(parser, default=DEFAULT_TRACE)
    parser.add_argument(
        "--horizon",
        type=positive_duration_s,
        default=1800.0,
        metavar="DURATION",
        help="how far ahead to forecast, e.g. 10m, 30m, 1h (default 30m); rounded up to "
        "whole windows (--step)",
    )
    parser.add_argument(
        "--step",
        type=positive_duration_s,
        default=None,
        metavar="DURATION",
        help=f"window length the models work on (default: {DEFAULT_STEP_S:g}s, or the "
        "trace's own interval when that is longer)",
    )
    parser.add_argument(
        "--model",
        action="append",
        choices=list(MODELS),
        dest="models",
        help="score only this model (repeatable; the two baselines are always scored)",
    )
    parser.add_argument(
        "--quantile", type=float, default=0.9, help="upper-bound quantile (default 0.9)"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the JSON report here")
    parser.set_defaults(func=_backtest)


def _backtest(args: argparse.Namespace) -> int:
    if not 0.5 <= args.quantile < 1:
        print("gang-autoscaler backtest: --quantile must be in [0.5, 1)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json is not None:
        # a backtest can take minutes; an output that cannot be written fails now
        try:
            ensure_writable_file(args.json)
        except OSError as err:
            return cannot_write("backtest", args.json, err)
    try:
        path = trace_path(args)
    except SimulationError as err:
        print(f"gang-autoscaler backtest: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        trace = read_trace(path)
        # a trace named is reported by that name (as simulate does), a file by its short name
        name = trace.name if path == Path(args.trace) else args.trace
        if args.step is not None and args.step < trace.native_step_s:
            # windows finer than the trace's own are empty or repeat it: every score n/a
            print(
                f"gang-autoscaler backtest: --step {args.step:g} s is finer than the trace's "
                f"own {trace.native_step_s:g} s windows",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        step_s = args.step or max(DEFAULT_STEP_S, trace.native_step_s)
        report = run_backtest(
            trace.series,
            trace=name,
            horizon_s=args.horizon,
            step_s=step_s,
            quantile=args.quantile,
            models=args.models or tuple(MODELS),
        )
    except ForecastingError as err:
        print(f"gang-autoscaler backtest: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not math.isclose(report.horizon_s, args.horizon, rel_tol=1e-9):
        print(
            f"gang-autoscaler backtest: horizon {args.horizon:g} s rounded up to "
            f"{report.horizon_s:g} s (forecasts reach whole windows of {report.step_s:g} s)",
            file=sys.stderr,
        )
    print(format_table(report))
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(report.contract_json(), indent=2) + "\n")
        except OSError as err:
            return cannot_write("backtest", args.json, err)
    return 0


def format_table(report: BacktestReport) -> str:
    width = max(16, *(len(name) + 2 for name in report.models))
    lines = [
        f"trace {report.trace}: horizon {report.horizon_s:g} s, windows of {report.step_s:g} s,"
        f" {report.train_windows} training windows, {report.scored_origins} scored origins,"
        f" upper bound at q={report.quantile:g}",
        f"{'model':<{width}}{'MASE':>8}{'sMAPE%':>8}{'vs pers':>9}{'vs snaive':>10}"
        f"{'coverage':>10}{'fit s':>8}{'fallback':>10}",
    ]
    for name, score in report.models.items():
        # the forecaster the service orders capacity from by default, biased upwards on purpose
        marker = " (default, plans capacity)" if name == report.default_model else ""
        lines.append(
            f"{name:<{width}}{_f(score.mase, 3):>8}{_f(score.smape, 2):>8}"
            f"{_f(score.ratio_vs_persistence, 3):>9}{_f(score.ratio_vs_seasonal_naive, 3):>10}"
            f"{_f(score.coverage, 3):>10}{_f(score.fit_seconds_median, 3):>8}"
            f"{_f(score.fallback_share, 3):>10}{marker}"
        )
    return "\n".join(lines)


def _f(value: float, digits: int) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"
