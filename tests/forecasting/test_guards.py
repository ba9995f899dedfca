"""Every guard, with real statsmodels fits on series cut from the shared ServeGen traces.

Row numbers are rows of the CSV (0-based, header excluded); windows are 600 s.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from forecasting.grid import GridForecaster
from forecasting.models import make_forecaster
from forecasting.series import Series
from tests.forecasting.traces import DAY_WINDOWS, STEP_S, servegen_cut, servegen_rates

SEASONAL_MODELS = ["state_space", "holt_winters"]


def fitted(name: str, history: Series) -> GridForecaster:
    forecaster = make_forecaster(name, step_s=STEP_S)
    forecaster.fit(history)
    return forecaster


def assert_sane(result) -> None:
    assert result is not None
    for value in (result.point, result.upper):
        assert math.isfinite(value) and value >= 0
    assert result.upper >= result.point


@pytest.mark.parametrize("name", SEASONAL_MODELS)
def test_model_fits_three_days_of_m_small_without_falling_back(name: str) -> None:
    # Rows 0-431 (days 0-2) of servegen_m-small: the control case for the guards below.
    forecaster = fitted(name, servegen_cut("m-small", 0, 3 * DAY_WINDOWS))
    result = forecaster.forecast(1800)
    assert_sane(result)
    assert result.fallback_reason is None
    assert result.upper > result.point


@pytest.mark.parametrize("name", SEASONAL_MODELS)
def test_short_history_falls_back_to_persistence(name: str) -> None:
    # Rows 0-143 of servegen_m-small: one day, the model needs two.
    history = servegen_cut("m-small", 0, DAY_WINDOWS)
    result = fitted(name, history).forecast(1800)
    assert_sane(result)
    assert "needs at least 288" in result.fallback_reason
    assert result.point == history.values[-1]


@pytest.mark.parametrize("name", SEASONAL_MODELS)
def test_missing_windows_do_not_count_toward_the_two_days(name: str) -> None:
    # Rows 0-1007 of servegen_m-small (7 days) with the first 6 days masked, as a new LWS
    # after a 7-day back-fill: one observed day passed the two-day minimum, and the daily
    # cycle was fitted to it (Holt-Winters to a leading gap filled with a constant).
    history = servegen_cut("m-small", 0, 7 * DAY_WINDOWS)
    masked = history.values.copy()
    masked[: 6 * DAY_WINDOWS] = np.nan
    result = fitted(name, Series(history.timestamps_s, masked)).forecast(1800)
    assert_sane(result)
    assert "needs at least 288" in (result.fallback_reason or "")


@pytest.mark.parametrize("name", [*SEASONAL_MODELS, "persistence", "seasonal_naive"])
def test_all_missing_history_gives_no_forecast(name: str) -> None:
    # Rows 1410-1432 of servegen_m-mid: the longest run of all-zero (collection-gap) windows.
    history = servegen_cut("m-mid", 1410, 1433)
    assert np.isnan(history.values).all()
    forecaster = fitted(name, history)
    assert forecaster.forecast(1800) is None
    assert "all 23 windows are missing" in forecaster.model_unavailable_reason


@pytest.mark.parametrize("name", SEASONAL_MODELS)
def test_history_ending_in_a_collection_gap_still_forecasts(name: str) -> None:
    # Rows 1100-1432 of servegen_m-mid end with the 23-window gap at rows 1410-1432.
    result = fitted(name, servegen_cut("m-mid", 1100, 1433)).forecast(1800)
    assert_sane(result)


@pytest.mark.parametrize("name", SEASONAL_MODELS)
def test_nan_and_inf_values_are_treated_as_missing(name: str) -> None:
    # Rows 0-431 of servegen_m-small with two values made +Inf and -Inf.
    history = servegen_cut("m-small", 0, 3 * DAY_WINDOWS)
    values = history.values.copy()
    values[[100, 300]] = [math.inf, -math.inf]
    forecaster = fitted(name, Series(history.timestamps_s, values))
    result = forecaster.forecast(1800)
    assert_sane(result)
    assert result.fallback_reason is None
    forecaster.update([history.timestamps_s[-1] + STEP_S], [math.inf])
    assert_sane(forecaster.forecast(1800))


@pytest.mark.parametrize("name", SEASONAL_MODELS)
def test_flat_series_falls_back_with_the_reason(name: str) -> None:
    # Timestamps of rows 0-431 of servegen_m-small, every value set to that span's median.
    history = servegen_cut("m-small", 0, 3 * DAY_WINDOWS)
    level = float(np.nanmedian(history.values))
    result = fitted(name, Series(history.timestamps_s, np.full(len(history), level))).forecast(1800)
    assert result.fallback_reason.startswith("all 432 observed windows equal")
    assert result.point == result.upper == level


def test_non_convergence_falls_back() -> None:
    # Rows 0-431 of servegen_m-small with the optimizer allowed 2 iterations: it stops
    # unconverged. (The same cut scaled by 1e200 used to do it; in units of the series'
    # spread it now converges, as it should.)
    history = servegen_cut("m-small", 0, 3 * DAY_WINDOWS)
    forecaster = make_forecaster("state_space", step_s=STEP_S, max_iterations=2)
    forecaster.fit(history)
    result = forecaster.forecast(1800)
    assert result.fallback_reason == "state-space fit did not converge"
    assert_sane(result)


def test_a_series_of_huge_values_fits_as_well_as_the_same_series_in_small_units() -> None:
    history = servegen_cut("m-small", 0, 3 * DAY_WINDOWS)
    small = fitted("state_space", history).forecast(1800)
    huge = fitted("state_space", Series(history.timestamps_s, history.values * 1e200))
    result = huge.forecast(1800)
    assert result.fallback_reason is None
    assert result.point / 1e200 == pytest.approx(small.point, rel=1e-3)


def test_fit_that_raises_falls_back() -> None:
    # Same cut scaled by 1e200: Holt-Winters' least-squares fit overflows and raises.
    history = servegen_cut("m-small", 0, 3 * DAY_WINDOWS)
    scaled = Series(history.timestamps_s, history.values * 1e200)
    result = fitted("holt_winters", scaled).forecast(1800)
    assert result.fallback_reason.startswith("Holt-Winters fit raised ValueError")
    assert_sane(result)


@pytest.mark.parametrize("name", SEASONAL_MODELS)
def test_forecast_is_never_negative(name: str) -> None:
    # Rows 0-719 of servegen_m-small shifted down by its 30th percentile and clipped at 0, so
    # night troughs sit at zero and the models' raw forecasts dip below it.
    rates = servegen_rates("m-small")[: 5 * DAY_WINDOWS]
    shifted = np.clip(rates - np.nanpercentile(rates, 30), 0, None)
    ends = (np.arange(shifted.size) + 1) * STEP_S
    train = 3 * DAY_WINDOWS
    forecaster = fitted(name, Series(ends[:train], shifted[:train]))
    raw_negative = 0
    for i in range(train, shifted.size):
        forecaster.update([ends[i]], [shifted[i]])
        raw_point, _ = forecaster._model_forecast(3)
        raw_negative += raw_point < 0
        assert_sane(forecaster.forecast(1800))
    assert raw_negative > 0, "the cut should drive the raw model below zero"


@pytest.mark.parametrize(
    "absurd", [[-1.7e308, 1.7e308], [1.7e308, 1.7e308], [1.7e308, -1.7e308, 1.7e308]]
)
def test_absurd_windows_never_give_a_non_finite_forecast(absurd: list[float]) -> None:
    # Rows 0-431 of servegen_m-small, then windows near the float limit. Before the model
    # worked in units of the series' spread, the Kalman filter overflowed on them (and fell
    # back); now it follows them: either way nothing non-finite comes out.
    history = servegen_cut("m-small", 0, 3 * DAY_WINDOWS)
    forecaster = fitted("state_space", history)
    end = history.timestamps_s[-1]
    forecaster.update([end + STEP_S * (i + 1) for i in range(len(absurd))], absurd)
    result = forecaster.forecast(1800)
    assert_sane(result)
    assert math.isfinite(result.point) and math.isfinite(result.upper)


def test_an_envelope_raised_past_the_float_limit_falls_back_to_persistence() -> None:
    """The envelope's peak a day ago near the float limit, raised by a busier last hour,
    overflowed in the model and again in its fallback: point and upper were inf."""
    day = DAY_WINDOWS
    timestamps = np.arange(1, 3 * day + 1) * STEP_S
    values = np.full(timestamps.size, 100.0)
    values[::2] = 50.0
    values[-day] = 1e308  # one absurd window a day ago, at the target's time of day
    values[-12:] = 200.0  # the last hour twice as busy as that hour a day ago
    forecaster = make_forecaster("seasonal_envelope", step_s=STEP_S)
    forecaster.fit(Series(timestamps, values))
    result = forecaster.forecast(STEP_S)
    assert math.isfinite(result.point) and math.isfinite(result.upper)
    assert result.fallback_reason is not None and "persistence" in result.fallback_reason


def test_window_whose_sum_overflows_is_missing() -> None:
    forecaster = make_forecaster("persistence", step_s=STEP_S)
    forecaster.fit(Series([STEP_S], [5.0]))
    forecaster.update([1.5 * STEP_S, 2 * STEP_S], [1.7e308, 1.7e308])
    assert forecaster.forecast(STEP_S).point == 5.0


def test_seasonal_naive_without_a_day_of_history_falls_back() -> None:
    # Rows 0-99 of servegen_m-small.
    result = fitted("seasonal_naive", servegen_cut("m-small", 0, 100)).forecast(600)
    assert "needs at least 144" in result.fallback_reason


def test_seasonal_naive_uses_the_window_one_day_before_the_target() -> None:
    history = servegen_cut("m-small", 0, 2 * DAY_WINDOWS)
    result = fitted("seasonal_naive", history).forecast(1800)
    # Target is 3 windows after the last (row 290); one day earlier is row 146.
    assert result.point == history.values[2 * DAY_WINDOWS - 1 + 3 - DAY_WINDOWS]
    assert result.fallback_reason is None


@pytest.mark.parametrize("horizon_s", [8 * 86_400.0, 3.6e9])
def test_a_horizon_past_a_week_is_refused_before_any_work(horizon_s: float) -> None:
    """A state-space forecast costs time and memory in its steps: 1,000,000 hours ahead ran
    out of 24 GiB instead of answering."""
    forecaster = fitted("seasonal_envelope", servegen_cut("m-small", 0, 3 * DAY_WINDOWS))
    with pytest.raises(ValueError, match="7 days"):
        forecaster.forecast(horizon_s)
    assert_sane(forecaster.forecast(7 * 86_400.0))
