"""Memory of the service's demand forecasters after days of ticks, and how soon a fleet of
components has its first fitted models.

Run from the repository root, with `shared/` beside it:

    OPENBLAS_NUM_THREADS=1 python benchmarks/forecast_memory.py [--components 100]
        [--days 14] [--tick-s 15] [--json FILE]

Each case runs in a fresh process (spawned), so one case's heap does not count in another's:

- `forecasters`: the service's `DemandForecasts` (the planning model, the service's defaults:
  5-minute windows, two weeks of history, fits in a one-worker process pool) is fed `--days`
  of one demand observation every `--tick-s` for each of `--components` components, then
  every component is fitted once. What it keeps depends only on the observations, not on
  how they are batched, so a day is fed per call (the service feeds one per tick; that many
  Python calls would only make the benchmark slow). Measured: the Python heap the
  forecasters hold (`tracemalloc`, after a garbage collection) before and after the fits,
  per component, and the process's resident set.
- `raw_lists` (the baseline, in the same run): the same observations held as two Python
  lists of floats per component, which is what the fitter kept for its refits before it kept
  windows.

First fits: the `forecasters` case fits its components through `DemandForecasts.tick`, one
tick after another, each tick collecting what finished and queueing what is due (up to
`DEFAULT_FITS_IN_FLIGHT`). The output has the ticks that took and the mean wall time per fit
(the worker fits one at a time); from them, the hours a fleet of 2,000 components (1,000 PD
deployments) needs at a 15 s tick, with the fits the worker can finish in one tick, against
one fit per tick.

Demand: the shared ServeGen trace `servegen_m-small_600s.csv` (Alibaba Model Studio, mean
requests/s per 10-minute window; see ../shared/data/README.md), its last `--days` days, each
window's rate held over the ticks inside it; windows with no client at all are collection
gaps and stay missing. Component i is scaled by (1 + i / components), so no two series are
the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.core.model import ComponentKey
from autoscaler.service.forecasts import DEFAULT_FITS_IN_FLIGHT, DemandForecasts
from forecasting.traces import load_trace

TRACE = "servegen-m-small"
DAY_S = 86_400.0
FLEET_COMPONENTS = 2_000
SERVICE_TICK_S = 15.0


def demand(days: float, tick_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Tick timestamps and the trace's rate at each, over its last `days` days."""
    trace = load_trace(TRACE)
    ends = trace.series.timestamps_s
    start = ends[-1] - days * DAY_S
    ticks = np.arange(start + tick_s, ends[-1] + tick_s / 2, tick_s)
    windows = np.searchsorted(ends, ticks, side="left")
    return ticks + 1.7e9, trace.series.values[np.minimum(windows, ends.size - 1)]


def _resident_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@contextlib.contextmanager
def _traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def _heap_bytes() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def raw_lists(components: int, days: float, tick_s: float) -> dict[str, Any]:
    ticks, rates = demand(days, tick_s)
    with _traced():
        before = _heap_bytes()
        kept: list[tuple[list[float], list[float]]] = []
        for i in range(components):
            kept.append((ticks.tolist(), (rates * (1 + i / components)).tolist()))
        held = _heap_bytes() - before
    return {
        "observations_per_component": int(ticks.size),
        "heap_kib_per_component": held / components / 1024,
        "resident_mib": _resident_mib(),
    }


async def _fit_all(forecasts: DemandForecasts, keys: list[ComponentKey]) -> tuple[int, float]:
    ticks = 0
    started = time.monotonic()
    while not all(
        forecasts.status(k).fits_completed or forecasts.status(k).last_fit_error for k in keys
    ):
        forecasts.tick(now_s=time.time())
        ticks += 1
        # wait for what this tick queued, as the next 15 s tick would find it done
        while forecasts._fitter.fits_in_flight and not all(
            s.in_flight is None or s.in_flight.done() for s in forecasts._fitter._series.values()
        ):
            await asyncio.sleep(0.01)
    return ticks, time.monotonic() - started


def forecasters(components: int, days: float, tick_s: float) -> dict[str, Any]:
    ticks, rates = demand(days, tick_s)
    keys = [ComponentKey(f"ns-{i}", "decode") for i in range(components)]
    per_day = int(DAY_S // tick_s)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        pool.submit(sum, [1]).result()  # start the worker before anything is measured
        with _traced():
            before = _heap_bytes()
            forecasts = DemandForecasts(executor=pool)
            for i, key in enumerate(keys):
                scaled = rates * (1 + i / components)
                for start in range(0, ticks.size, per_day):
                    # what a back-fill does with each chunk of history it reads
                    forecasts._observe(
                        key,
                        ticks[start : start + per_day].tolist(),
                        scaled[start : start + per_day].tolist(),
                    )
            fed = _heap_bytes() - before
            fit_ticks, fit_s = asyncio.run(_fit_all(forecasts, keys))
            fitted = _heap_bytes() - before
        now_s = float(ticks[-1])
        results = [forecasts.forecast(k, horizon_s=300.0, now_s=now_s) for k in keys]
    errors = {forecasts.status(k).last_fit_error for k in keys} - {None}
    fit_each_s = fit_s / components
    fits_per_tick = min(DEFAULT_FITS_IN_FLIGHT, max(1, int(SERVICE_TICK_S // fit_each_s)))
    return {
        "observations_per_component": int(ticks.size),
        "heap_kib_per_component_fed": fed / components / 1024,
        "heap_kib_per_component_fitted": fitted / components / 1024,
        "resident_mib": _resident_mib(),
        "forecasts_from_the_model": sum(
            1 for r in results if r is not None and r.fallback_reason is None
        ),
        "fit_errors": sorted(errors),
        "first_fits_ticks": fit_ticks,
        "fit_seconds_each": fit_each_s,
        "fleet_first_fits_hours": FLEET_COMPONENTS / fits_per_tick * SERVICE_TICK_S / 3600,
        "fleet_first_fits_hours_one_per_tick": FLEET_COMPONENTS * SERVICE_TICK_S / 3600,
    }


def run_isolated(case: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """`case(*args)` in a fresh process: tracemalloc counts every thread's allocations, so a
    process with other work in its threads (a test run's) would count those too."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as p:
        return p.submit(case, *args).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--components", type=int, default=100)
    parser.add_argument("--days", type=float, default=14.0)
    parser.add_argument("--tick-s", type=float, default=SERVICE_TICK_S)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cores": os.cpu_count(),
            "platform": platform.platform(),
        },
        "components": args.components,
        "days": args.days,
        "tick_s": args.tick_s,
        "fits_in_flight": DEFAULT_FITS_IN_FLIGHT,
    }
    out["raw_lists"] = run_isolated(raw_lists, args.components, args.days, args.tick_s)
    out["forecasters"] = run_isolated(forecasters, args.components, args.days, args.tick_s)
    raw, kept = out["raw_lists"], out["forecasters"]
    print(
        f"{args.components} components, {args.days:g} days at a {args.tick_s:g} s tick "
        f"({raw['observations_per_component']:,} observations each)\n"
        f"  raw observations as Python lists (baseline): "
        f"{raw['heap_kib_per_component']:,.0f} KiB per component\n"
        f"  forecasters, fed:    {kept['heap_kib_per_component_fed']:,.0f} KiB per component\n"
        f"  forecasters, fitted: {kept['heap_kib_per_component_fitted']:,.0f} KiB per component "
        f"({kept['forecasts_from_the_model']} of {args.components} forecasts from the model; "
        f"resident {kept['resident_mib']:,.0f} MiB)\n"
        f"  first fits: {kept['first_fits_ticks']} ticks, {kept['fit_seconds_each']:.2f} s per fit;"
        f" {FLEET_COMPONENTS:,} components at a {SERVICE_TICK_S:g} s tick: "
        f"{kept['fleet_first_fits_hours']:.1f} h (one fit per tick: "
        f"{kept['fleet_first_fits_hours_one_per_tick']:.1f} h)"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
