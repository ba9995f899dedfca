"""The forecaster memory benchmark on a small case: it runs, its forecasts come from fitted
models, and the forecasters hold less than the raw observations (they keep windows)."""

from __future__ import annotations

from benchmarks.forecast_memory import DAY_S, demand, forecasters, raw_lists, run_isolated


def test_demand_is_the_trace_held_over_each_tick() -> None:
    ticks, rates = demand(3, 60.0)
    assert ticks.size == 3 * DAY_S / 60
    assert (ticks[1:] - ticks[:-1] == 60.0).all()
    # ten one-minute ticks share one 10-minute window's rate
    assert len(set(rates[-10:].tolist())) == 1


def test_forecasters_keep_windows_not_observations() -> None:
    # each in its own process, as the benchmark runs them: the heap is the process's, and this
    # one's threads (left by earlier tests) would be counted too
    raw = run_isolated(raw_lists, 3, 3, 15.0)
    kept = run_isolated(forecasters, 3, 3, 15.0)
    assert raw["observations_per_component"] == kept["observations_per_component"] == 17_280
    assert kept["forecasts_from_the_model"] == 3 and kept["fit_errors"] == []
    # 17,280 observations as floats are over 500 KiB; three days of 5-minute windows are 7 KiB
    assert raw["heap_kib_per_component"] > 500
    assert kept["heap_kib_per_component_fed"] < raw["heap_kib_per_component"] / 5
