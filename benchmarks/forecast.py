"""Forecasting benchmark: accuracy on the shared multi-day traces, and cost.

Run from the repository root, with `shared/` beside it:

    OPENBLAS_NUM_THREADS=1 python benchmarks/forecast.py [--json FILE]

1. Rolling-origin backtest (`forecasting.backtest`) of every model on servegen_m-small and
   servegen_m-mid at horizons of 10, 30 and 60 minutes (7 days to train, refit daily).
2. Cost of the most accurate model, and of the model capacity is planned from (the
   default) beside it, on 14 days of 5-minute data: a full fit (median of repeats) and one
   incremental update + forecast (median over a day of windows). The shared multi-day traces
   are 10-minute means, so each window is split into two 5-minute windows carrying the same
   rate.
3. Event-loop stall while a full fit runs in a thread pool and in a process pool: the
   largest gap between 10 ms asyncio ticks.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import statsmodels

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting.backtest import run_backtest
from forecasting.fitter import fit_forecaster
from forecasting.grid import GridForecaster, SeenWindows
from forecasting.models import MOST_ACCURATE_MODEL, PLANNING_MODEL, make_forecaster
from forecasting.series import Series
from forecasting.traces import load_trace

TRACES = ("servegen_m-small", "servegen_m-mid")
HORIZONS_S = (600, 1800, 3600)
FIVE_MIN_S = 300.0


def machine() -> dict[str, object]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "statsmodels": statsmodels.__version__,
        "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
    }


def accuracy() -> list[dict[str, object]]:
    rows = []
    for name in TRACES:
        trace = load_trace(name)
        for horizon_s in HORIZONS_S:
            report = run_backtest(
                trace.series, trace=trace.name, horizon_s=horizon_s, step_s=trace.native_step_s
            )
            for model, score in report.models.items():
                rows.append(
                    {
                        "trace": name,
                        "horizon_min": horizon_s // 60,
                        "model": model,
                        "origins": report.scored_origins,
                        "mae": _finite(score.mae),
                        "mase": _finite(score.mase),
                        "smape": _finite(score.smape),
                        "ratio_vs_persistence": _finite(score.ratio_vs_persistence),
                        "ratio_vs_seasonal_naive": _finite(score.ratio_vs_seasonal_naive),
                        "coverage": _finite(score.coverage),
                        "fit_seconds_median": _finite(score.fit_seconds_median),
                        "fallback_share": _finite(score.fallback_share),
                    }
                )
                print(_accuracy_line(rows[-1]), flush=True)
    return rows


def five_minute(name: str, *, days: int) -> Series:
    trace = load_trace(name)
    values = np.repeat(trace.series.values[: days * 144], 2)
    return Series(np.arange(1, values.size + 1, dtype=np.float64) * FIVE_MIN_S, values)


def cost(name: str, *, model: str = MOST_ACCURATE_MODEL, fits: int = 5) -> dict[str, object]:
    series = five_minute(name, days=14)
    train = len(series) - 288  # fit on 13 days, then update over the last day
    history = Series(series.timestamps_s[:train], series.values[:train])
    full = Series(series.timestamps_s, series.values)
    fit_s = []
    for _ in range(fits):
        forecaster = make_forecaster(model, step_s=FIVE_MIN_S)
        started = time.perf_counter()
        forecaster.fit(full)
        fit_s.append(time.perf_counter() - started)
        assert forecaster.model_unavailable_reason is None, forecaster.model_unavailable_reason
    forecaster = make_forecaster(model, step_s=FIVE_MIN_S)
    forecaster.fit(history)
    update_s = []
    for i in range(train, len(series)):
        started = time.perf_counter()
        forecaster.update([series.timestamps_s[i]], [series.values[i]])
        result = forecaster.forecast(1800)
        update_s.append(time.perf_counter() - started)
        assert result is not None and result.fallback_reason is None
    return {
        "trace": name,
        "model": model,
        "windows": len(full),
        "fit_seconds_median": statistics.median(fit_s),
        "fit_seconds_max": max(fit_s),
        "update_forecast_ms_median": 1000 * statistics.median(update_s),
        "update_forecast_ms_p99": 1000 * float(np.quantile(update_s, 0.99)),
    }


def _seen(make: Callable[[], GridForecaster], history: Series) -> SeenWindows:
    """What the service's fitter ships to the worker: the windows a forecaster was fed."""
    fed = make()
    fed.update(history.timestamps_s, history.values)
    return fed.seen()


async def _max_tick_gap(executor: Executor, history: Series) -> tuple[float, float]:
    make = functools.partial(make_forecaster, MOST_ACCURATE_MODEL, step_s=FIVE_MIN_S)
    loop = asyncio.get_running_loop()
    # Warm the worker first so process start-up is not counted as fit time.
    await loop.run_in_executor(
        executor, fit_forecaster, make, _seen(make, Series(np.array([300.0]), np.array([1.0])))
    )
    future = loop.run_in_executor(executor, fit_forecaster, make, _seen(make, history))
    started = last = time.perf_counter()
    worst = 0.0
    while not future.done():
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        worst = max(worst, now - last - 0.01)
        last = now
    await future
    return worst, last - started


def loop_stall(name: str) -> dict[str, object]:
    history = five_minute(name, days=14)
    results: dict[str, object] = {}
    with ThreadPoolExecutor(max_workers=1) as threads:
        gap, took = asyncio.run(_max_tick_gap(threads, history))
        results["thread_max_extra_delay_ms"], results["thread_fit_s"] = 1000 * gap, took
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as processes:
        gap, took = asyncio.run(_max_tick_gap(processes, history))
        results["process_max_extra_delay_ms"], results["process_fit_s"] = 1000 * gap, took
    return results


def _finite(value: float) -> float | None:
    """None for a score that is not a number (n/a), so the JSON stays JSON."""
    return value if math.isfinite(value) else None


def _accuracy_line(row: dict[str, object]) -> str:
    def f(name: str, digits: int = 3) -> str:
        value = row[name]
        return "n/a" if value is None else f"{value:.{digits}f}"

    return (
        f"| {row['trace']} | {row['horizon_min']} | {row['model']} | {f('mase')} |"
        f" {f('smape', 2)} | {f('ratio_vs_persistence')} |"
        f" {f('ratio_vs_seasonal_naive')} | {f('coverage')} |"
        f" {f('fit_seconds_median')} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    info = machine()
    print(json.dumps(info))
    print(
        "| trace | horizon min | model | MASE | sMAPE % | vs persistence |"
        " vs seasonal-naive | coverage q0.9 | fit s (median) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = accuracy()
    # the planning model beside the most accurate one, in the same run, as its baseline
    models = (MOST_ACCURATE_MODEL, PLANNING_MODEL)
    costs = [cost(name, model=model) for name in TRACES for model in models]
    for row in costs:
        print(json.dumps(row))
    stall = loop_stall(TRACES[0])
    print(json.dumps(stall))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": info, "accuracy": rows, "cost": costs, "loop_stall": stall}, indent=2
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
