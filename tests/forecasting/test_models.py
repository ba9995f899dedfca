"""The cheap updates give the same forecasts as running statsmodels over the whole history.

Series are cut from the shared ServeGen traces (rows named in each test), 600 s windows.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
from statsmodels.tsa.holtwinters import ExponentialSmoothing
from statsmodels.tsa.statespace.structural import UnobservedComponents

from forecasting.envelope import SeasonalEnvelope
from forecasting.errors import FitFailed
from forecasting.models import make_forecaster
from forecasting.series import Series
from tests.forecasting.traces import DAY_WINDOWS, STEP_S, servegen_cut

TRAIN = 3 * DAY_WINDOWS
EXTRA = 40


@pytest.mark.parametrize(
    ("trace", "start"),
    [
        pytest.param("m-small", 0, id="m-small-rows-0-471"),
        # Rows 1300-1771 of m-mid include the 23-window collection gap at rows 1410-1432.
        pytest.param("m-mid", 1300, id="m-mid-rows-1300-1771-with-gap"),
    ],
)
def test_state_space_extend_matches_a_full_filter(trace: str, start: int) -> None:
    history = servegen_cut(trace, start, start + TRAIN + EXTRA)
    forecaster = make_forecaster("state_space", step_s=STEP_S)
    forecaster.fit(Series(history.timestamps_s[:TRAIN], history.values[:TRAIN]))
    for i in range(TRAIN, TRAIN + EXTRA):
        forecaster.update([history.timestamps_s[i]], [history.values[i]])
    results = forecaster._results
    # O(1): the kept results hold only the windows since the last extension, not the history.
    assert results.nobs == 1
    assert len(pickle.dumps(results)) < 1_000_000
    # The model works in units of the series' spread at the fit (`_scale`).
    scale = forecaster._scale
    full = UnobservedComponents(
        history.values / scale,
        level="llevel",
        freq_seasonal=[{"period": DAY_WINDOWS, "harmonics": 4}],
    ).filter(results.params)
    expected = full.get_forecast(6)
    for steps in (1, 3, 6):
        point, upper = forecaster._model_forecast(steps)
        assert point == pytest.approx(expected.predicted_mean[steps - 1] * scale, rel=1e-6)
        sd = np.sqrt(expected.var_pred_mean[steps - 1]) * scale
        assert upper == pytest.approx(point + 1.2815515655446004 * sd, rel=1e-6)


@pytest.mark.parametrize("unit", [1.0, 1_000.0, 1e-3])
def test_state_space_forecasts_do_not_depend_on_the_unit(unit: float) -> None:
    """Requests/s and prompt tokens/s (a thousand times larger) are one series in two units.
    The optimizer's stopping test is not scale-free: on the larger numbers it stopped at its
    starting parameters after 0-1 iterations, reported convergence, and the upper bound
    came out about twice as wide."""
    history = servegen_cut("m-small", 0, TRAIN)
    forecasts = []
    for factor in (1.0, unit):
        forecaster = make_forecaster("state_space", step_s=STEP_S)
        forecaster.fit(Series(history.timestamps_s, history.values * factor))
        assert forecaster.model_unavailable_reason is None
        point, upper = forecaster._model_forecast(3)
        forecasts.append((point / factor, upper / factor))
    assert forecasts[1][0] == pytest.approx(forecasts[0][0], rel=1e-3)
    assert forecasts[1][1] == pytest.approx(forecasts[0][1], rel=1e-3)


@pytest.mark.parametrize(
    ("trace", "start"),
    [
        pytest.param("m-small", 0, id="m-small-rows-0-471"),
        pytest.param("m-mid", 0, id="m-mid-rows-0-471"),
    ],
)
def test_holt_winters_recursion_matches_statsmodels_with_the_fitted_weights(
    trace: str, start: int
) -> None:
    history = servegen_cut(trace, start, start + TRAIN + EXTRA)
    assert np.isfinite(history.values).all()  # the fit interpolates gaps; keep this exact
    forecaster = make_forecaster("holt_winters", step_s=STEP_S)
    forecaster.fit(Series(history.timestamps_s[:TRAIN], history.values[:TRAIN]))
    for i in range(TRAIN, TRAIN + EXTRA):
        forecaster.update([history.timestamps_s[i]], [history.values[i]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = ExponentialSmoothing(
            history.values[:TRAIN], seasonal="add", seasonal_periods=DAY_WINDOWS
        ).fit(method="least_squares")
        params = first.params
        rerun = ExponentialSmoothing(
            pd.Series(history.values),
            seasonal="add",
            seasonal_periods=DAY_WINDOWS,
            initialization_method="known",
            initial_level=params["initial_level"],
            initial_seasonal=params["initial_seasons"],
        ).fit(
            smoothing_level=params["smoothing_level"],
            smoothing_seasonal=params["smoothing_seasonal"],
            optimized=False,
        )
    expected = np.asarray(rerun.forecast(6))
    for steps in (1, 3, 6):
        assert forecaster._model_forecast(steps)[0] == pytest.approx(expected[steps - 1])


def test_holt_winters_fits_up_to_the_last_observed_window() -> None:
    """A trailing gap (Prometheus down at the refit) was filled with the last value and fitted
    as traffic: three hours of it forecast 74 where the daily cycle says 106. It is now as
    if the fit had ended at the last observed window and the gap came after, as missing
    windows."""
    step_s, n, gap = 300.0, 3 * 288, 36
    t = np.arange(1, n + 1) * step_s
    noisy = 100 + 50 * np.sin(2 * np.pi * t / 86_400) + np.random.default_rng(0).normal(0, 2, n)
    through = make_forecaster("holt_winters", step_s=step_s)
    through.fit(Series(t, np.concatenate([noisy[:-gap], np.full(gap, np.nan)])))
    after = make_forecaster("holt_winters", step_s=step_s)
    after.fit(Series(t[:-gap], noisy[:-gap]))
    after.update(t[-gap:], np.full(gap, np.nan))
    forecast = through.forecast(1800)
    assert forecast.fallback_reason is None
    assert forecast.point == pytest.approx(after.forecast(1800).point)
    truth = 100 + 50 * np.sin(2 * np.pi * (t[-1] + 1800) / 86_400)
    assert forecast.point == pytest.approx(truth, rel=0.05)


def test_a_missing_window_advances_holt_winters_without_correcting_the_level() -> None:
    history = servegen_cut("m-small", 0, TRAIN)
    forecaster = make_forecaster("holt_winters", step_s=STEP_S)
    forecaster.fit(history)
    two_ahead = forecaster._model_forecast(2)[0]
    forecaster.update([history.timestamps_s[-1] + STEP_S], [np.nan])
    assert forecaster._model_forecast(1)[0] == pytest.approx(two_ahead)


def _daily_steps(today_level: float) -> Series:
    """Three days at 100 whose step to 300 starts at window 54, 55 and 53 (10-minute windows,
    the same time of day give or take one window), then today up to window 50 at
    `today_level`: today's last hour against the same hour of those days is
    `today_level / 100`."""
    values = np.full(3 * DAY_WINDOWS + 51, 100.0)
    for day, start in enumerate((54, 55, 53)):
        values[day * DAY_WINDOWS + start : day * DAY_WINDOWS + start + 6] = 300.0
    values[3 * DAY_WINDOWS :] = today_level
    return Series((np.arange(values.size) + 1) * STEP_S, values)


@pytest.mark.parametrize(
    ("today_level", "steps", "expected"),
    [
        pytest.param(100.0, 4, 300.0, id="the-step-of-past-days-within-10-minutes"),
        pytest.param(150.0, 4, 450.0, id="scaled-by-today-against-those-days"),
        pytest.param(500.0, 4, 600.0, id="scale-capped-at-2x"),
        pytest.param(0.0, 4, 0.0, id="traffic-stopped-today-holds-nothing"),
        pytest.param(100.0, 1, 100.0, id="no-step-within-10-minutes-of-window-51"),
    ],
)
def test_seasonal_envelope_raises_the_point_to_the_peak_of_past_days(
    today_level: float, steps: int, expected: float
) -> None:
    envelope = make_forecaster("seasonal_envelope", step_s=STEP_S)
    plain = make_forecaster("state_space", step_s=STEP_S)
    history = _daily_steps(today_level)
    envelope.fit(history)
    plain.fit(history)
    assert envelope.envelope(steps) == pytest.approx(expected)  # type: ignore[attr-defined]
    raised, model = envelope.forecast(steps * STEP_S), plain.forecast(steps * STEP_S)
    assert raised is not None and model is not None and model.fallback_reason is None
    assert raised.point == pytest.approx(max(model.point, expected))
    assert raised.upper >= raised.point


def test_seasonal_envelope_needs_a_past_day() -> None:
    history = _daily_steps(100.0)
    envelope = make_forecaster("seasonal_envelope", step_s=STEP_S)
    envelope.fit(Series(history.timestamps_s[:100], history.values[:100]))
    assert envelope.envelope(4) is None  # type: ignore[attr-defined]
    forecast = envelope.forecast(4 * STEP_S)
    assert forecast is not None and forecast.fallback_reason is not None
    assert forecast.point == pytest.approx(100.0)  # persistence, nothing to raise it to


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # today's last hour averages 950 / 6 against 100 at that hour yesterday
        pytest.param(4, 300.0 * 950 / 600, id="yesterdays-step-scaled-by-today"),
        # the envelope (100 x 950 / 600) is below the last window: persistence is the larger
        pytest.param(1, 200.0, id="no-step-within-10-minutes-stays-persistence"),
    ],
)
def test_seasonal_envelope_raises_persistence_before_the_model_can_fit(
    steps: int, expected: float
) -> None:
    """Between one and two days the state-space model has too little history to fit, but
    yesterday's step is known: the persistence that stands in is raised to it."""
    values = np.full(DAY_WINDOWS + 51, 100.0)
    values[54:60] = 300.0
    values[DAY_WINDOWS:] = 150.0
    values[-1] = 200.0
    envelope = make_forecaster("seasonal_envelope", step_s=STEP_S)
    envelope.fit(Series((np.arange(values.size) + 1) * STEP_S, values))
    forecast = envelope.forecast(steps * STEP_S)
    assert forecast is not None
    assert forecast.fallback_reason is not None and "needs at least" in forecast.fallback_reason
    assert forecast.point == pytest.approx(expected)
    assert forecast.upper >= forecast.point


def test_seasonal_envelope_raises_persistence_when_a_fit_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Any reason the model cannot forecast, not only a short history: a failed fit on three
    days of history stands in with persistence, raised to the past days' step."""

    def fail(self: SeasonalEnvelope, values: np.ndarray) -> None:
        raise FitFailed("state-space fit did not converge")

    monkeypatch.setattr(SeasonalEnvelope, "_fit_windows", fail)
    envelope = make_forecaster("seasonal_envelope", step_s=STEP_S)
    envelope.fit(_daily_steps(100.0))
    forecast = envelope.forecast(4 * STEP_S)
    assert forecast is not None and forecast.fallback_reason == "state-space fit did not converge"
    assert forecast.point == pytest.approx(300.0)  # persistence says 100


def _envelope_of(values: np.ndarray, steps: int = 4) -> float | None:
    forecaster = make_forecaster("seasonal_envelope", step_s=STEP_S)
    forecaster.fit(Series((np.arange(values.size) + 1) * STEP_S, values))
    return forecaster.envelope(steps)  # type: ignore[attr-defined,no-any-return]


def test_seasonal_envelope_edges() -> None:
    stepped = _daily_steps(100.0).values
    # idle before the daily step on every day, today too: the step is still provisioned
    idle = np.where(stepped == 300.0, 300.0, 0.0)
    assert _envelope_of(idle) == pytest.approx(300.0)
    # idle on those days at this hour but busy today: as much busier as allowed (2x)
    busier = idle.copy()
    busier[3 * DAY_WINDOWS :] = 50.0
    assert _envelope_of(busier) == pytest.approx(600.0)
    # a missing window inside a day's +-10 minutes is skipped; a day with all three missing
    # drops out: with day 1's window gone, the steps of days 0 and 2 (200) are the peak
    gappy = np.where(stepped == 300.0, 200.0, stepped)
    gappy[DAY_WINDOWS + 54 : DAY_WINDOWS + 61] = 300.0
    assert _envelope_of(gappy) == pytest.approx(300.0)
    gappy[DAY_WINDOWS + 53 : DAY_WINDOWS + 56] = np.nan
    gappy[2 * DAY_WINDOWS + 53] = np.nan
    assert _envelope_of(gappy) == pytest.approx(200.0)
    # a day plus an hour of history is the least it needs (the level of the same hour)
    assert _envelope_of(stepped[: DAY_WINDOWS + 6]) is not None
    assert _envelope_of(stepped[: DAY_WINDOWS + 5]) is None


@pytest.mark.parametrize("quiet", [1.0, 0.3, 0.0], ids=["no-quiet-day", "day-at-30pc", "day-idle"])
def test_a_quiet_day_does_not_raise_the_busiest_days_peak(quiet: float) -> None:
    """Four identical days that step from 100 to 300 half an hour ahead, but yesterday at a
    fraction of that. The busiest day's peak was scaled by today's level over the mean of
    every day's: 300 became 391 with yesterday at 30 %, 450 with it idle. Each day's peak is
    now scaled by its own level."""
    day = np.full(DAY_WINDOWS, 100.0)
    day[105:] = 300.0
    values = np.tile(day, 5)[: 4 * DAY_WINDOWS + 102]  # today: 3 windows before the step
    values[3 * DAY_WINDOWS : 4 * DAY_WINDOWS] *= quiet
    assert _envelope_of(values, steps=5) == pytest.approx(300.0)


def _hour_windows(*, days_back: tuple[int, ...], part: slice) -> list[int]:
    """Indices (from the end) of `part` of the last hour, on the given days back."""
    return [i - d * DAY_WINDOWS for d in days_back for i in range(-6, 0)[part]]


@pytest.mark.parametrize(
    "gap",
    [
        pytest.param(_hour_windows(days_back=(0,), part=slice(0, 3)), id="today-before-step"),
        pytest.param(_hour_windows(days_back=(0,), part=slice(3, 6)), id="today-in-step"),
        pytest.param(_hour_windows(days_back=(1,), part=slice(3, 6)), id="a-past-day-in-step"),
        pytest.param(_hour_windows(days_back=(1, 2, 3), part=slice(3, 6)),
                     id="every-past-day-in-step"),
        pytest.param(_hour_windows(days_back=(1, 2, 3), part=slice(0, 3)),
                     id="every-past-day-before-step"),
    ],
)  # fmt: skip
def test_a_gap_in_the_hours_compared_does_not_skew_the_level_ratio(gap: list[int]) -> None:
    """Four identical days that step from 100 to 300 half an hour before the forecast. With
    part of an hour missing (today's or a past day's), its other part was compared with the
    whole hour: the step's half against 200, so the envelope came out 1.5x, 2x or half
    what the identical days say. Now both are read at the windows both observed."""
    day = np.full(DAY_WINDOWS, 100.0)
    day[100:] = 300.0
    values = np.tile(day, 4)[: 3 * DAY_WINDOWS + 103]  # today: 3 windows into the step
    assert _envelope_of(values.copy(), steps=2) == pytest.approx(300.0)
    values[gap] = np.nan
    assert _envelope_of(values, steps=2) == pytest.approx(300.0)


def test_seasonal_envelope_survives_the_trip_to_a_worker_process() -> None:
    forecaster = make_forecaster("seasonal_envelope", step_s=STEP_S)
    forecaster.fit(_daily_steps(150.0))
    before = forecaster.forecast(4 * STEP_S)
    copy = pickle.loads(pickle.dumps(forecaster))
    assert copy.forecast(4 * STEP_S) == before
    copy.update([(3 * DAY_WINDOWS + 52) * STEP_S], [150.0])  # the cached array is rebuilt
    assert copy.envelope(3) == pytest.approx(450.0)  # type: ignore[attr-defined]


def test_a_state_space_model_updated_between_refits_grows_only_by_its_windows() -> None:
    """Every `extend` of results fitted with a parameter covariance added ~110 bytes of text
    about it: a model kept while its refits failed (a component at zero for days) grew
    without bound, 119 KB per thousand windows. What is left is the history's 8 bytes a
    window, bounded by `max_history_s`."""
    rng = np.random.default_rng(0)
    t = np.arange(3 * DAY_WINDOWS + 1100)
    y = 100 + 20 * np.sin(2 * np.pi * t / DAY_WINDOWS) + rng.normal(0, 3, t.size)
    forecaster = make_forecaster("state_space", step_s=STEP_S)
    forecaster.fit(Series((t[: 3 * DAY_WINDOWS] + 1) * STEP_S, y[: 3 * DAY_WINDOWS]))
    sizes = []
    for i in range(3 * DAY_WINDOWS, t.size):
        forecaster.update(np.array([(i + 1) * STEP_S]), y[i : i + 1])
        if i - 3 * DAY_WINDOWS in (99, 1099):
            sizes.append(len(pickle.dumps(forecaster)))
    assert sizes[1] - sizes[0] < 12 * 1000, sizes
    result = forecaster.forecast(STEP_S)
    assert result is not None and result.fallback_reason is None
