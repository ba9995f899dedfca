"""The tick benchmark's demand history: the shared trace's last days, scaled, reaching the
forecasters through the service's back-fill with the seasonal envelope active."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from autoscaler.core.model import Component, ComponentKey
from autoscaler.service.forecasts import DemandForecasts
from benchmarks.tick import (
    DECODE_TOKENS_PER_S,
    HISTORY_TRACE,
    PREFILL_TOKENS_PER_S,
    history_source,
    trace_history,
)
from forecasting.envelope import SeasonalEnvelope
from forecasting.series import Series
from forecasting.state_space import DailyStateSpace
from forecasting.traces import load_trace

END_S = 1_800_000_030.0  # not on a step, as the service's clock is not


@pytest.mark.parametrize(
    ("days", "step_s"),
    [
        pytest.param(7.0, 60.0, id="a-week-at-the-backfill-step"),
        pytest.param(2.5, 300.0, id="part-days-at-the-forecast-step"),
    ],
)
def test_history_is_the_last_days_of_the_trace_scaled_to_the_peak(
    days: float, step_s: float
) -> None:
    trace = load_trace(HISTORY_TRACE)
    grid, values = trace_history(trace, end_s=END_S, days=days, step_s=step_s, peak=3000.0)

    assert grid.size == values.size == int(days * 86_400 // step_s)
    assert END_S - step_s < grid[-1] <= END_S
    assert np.all(np.diff(grid) == step_s)
    # Each point takes the trace window (labelled by its end) that holds the same time
    # before the trace's end as the point is before the grid's end.
    native_s = trace.native_step_s
    at = trace.series.timestamps_s[-1] - (grid[-1] - grid)
    index = np.ceil(at / native_s).astype(int) - 1
    rates = trace.series.values[index]
    assert np.array_equal(np.isnan(values), np.isnan(rates))
    assert np.isnan(values).any()  # the trace's collection gaps stay missing, never zero
    assert np.nanmax(values) == pytest.approx(3000.0)
    assert values[-1] == pytest.approx(rates[-1] * 3000.0 / np.nanmax(rates))


def test_more_days_than_the_trace_holds_is_refused() -> None:
    with pytest.raises(ValueError, match="covers 14 days, not 15"):
        trace_history(load_trace(HISTORY_TRACE), end_s=END_S, days=15, step_s=60.0, peak=1.0)


async def test_backfilled_forecasters_plan_from_the_envelope_below_one_gang() -> None:
    peaks = {Component.PREFILL: PREFILL_TOKENS_PER_S, Component.DECODE: DECODE_TOKENS_PER_S}
    components = [(ComponentKey("model-0", f"llama-{kind}"), kind) for kind in peaks]
    now_s = time.time()
    with ThreadPoolExecutor(max_workers=1) as executor:
        forecasts = DemandForecasts(executor=executor, backfill_days=7.0)
        forecasts.start_backfill(history_source(), components, now_s=now_s)  # type: ignore[arg-type]
        for _ in range(600):
            forecasts.tick(now_s=now_s)
            if all(forecasts.status(key).fits_completed for key, _ in components):
                break
            await asyncio.sleep(0.05)
        await forecasts.close()

        for key, kind in components:
            status = forecasts.status(key)
            assert status.backfilled and status.fits_completed == 1, status
            assert status.last_fit_error is None
            found = forecasts.forecast(key, horizon_s=360.0, now_s=now_s)
            assert found is not None and found.fallback_reason is None
            # Below one gang's demand: the benchmark's steady ticks stay within tolerance.
            assert 0 < found.point < peaks[kind]

            # The same history fitted directly: the envelope is what raised the point above
            # the state-space model's.
            grid, values = trace_history(
                load_trace(HISTORY_TRACE), end_s=now_s, days=7.0, step_s=60.0, peak=peaks[kind]
            )
            horizon_s = forecasts.model_horizon_s(key, horizon_s=360.0, now_s=now_s)
            plain = DailyStateSpace(step_s=forecasts.step_s)
            plain.fit(Series(grid, values))
            raised = SeasonalEnvelope(step_s=forecasts.step_s)
            raised.fit(Series(grid, values))
            envelope = raised.envelope(raised.steps_ahead(horizon_s))
            assert envelope is not None
            assert found.point == pytest.approx(envelope)
            plain_point = plain.forecast(horizon_s)
            assert plain_point is not None and plain_point.point < envelope
