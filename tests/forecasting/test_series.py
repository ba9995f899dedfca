"""Windows: closed at their end, mean of what fell inside, missing stays missing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from forecasting.errors import InvalidSeries
from forecasting.series import Series, WindowAccumulator, resample


def test_window_closes_at_its_end_and_averages_its_observations() -> None:
    acc = WindowAccumulator(step_s=300)
    assert acc.push([15, 150], [2.0, 4.0]).values.size == 0  # window (0, 300] still open
    closed = acc.push([300], [6.0])  # an observation at the end belongs to and closes it
    assert closed.first_end_s == 300
    assert closed.values.tolist() == [4.0]


def test_empty_windows_are_missing_not_zero() -> None:
    windows = resample(Series([300, 1200], [5.0, 7.0]), step_s=300)
    assert windows.end_timestamps_s.tolist() == [300, 600, 900, 1200]
    assert windows.values[0] == 5.0 and windows.values[3] == 7.0
    assert math.isnan(windows.values[1]) and math.isnan(windows.values[2])


def test_nan_and_inf_values_count_as_missing_but_still_move_time() -> None:
    acc = WindowAccumulator(step_s=60)
    closed = acc.push([30, 60, 120, 180], [1.0, math.inf, math.nan, -math.inf])
    assert closed.values[0] == 1.0
    assert np.isnan(closed.values[1:]).all()
    assert closed.end_timestamps_s[-1] == 180


def test_late_observations_are_counted_not_applied() -> None:
    acc = WindowAccumulator(step_s=60)
    acc.push([60], [1.0])
    assert acc.push([90], [3.0]).values.size == 0
    acc.push([120], [5.0])  # closes (60, 120] with mean 4
    assert acc.push([100, 150], [100.0, 1.0]).values.size == 0  # 100 s is in a closed window
    assert acc.late_observations == 1


@pytest.mark.parametrize(
    ("timestamps", "values", "message"),
    [
        pytest.param([1, 2], [1.0], "pair up", id="length-mismatch"),
        pytest.param([2, 1], [1.0, 1.0], "non-decreasing", id="time-goes-back"),
        pytest.param([1, math.nan], [1.0, 1.0], "NaN or Inf", id="nan-timestamp"),
        pytest.param([[1, 2]], [[1.0, 2.0]], "one-dimensional", id="two-dimensional"),
    ],
)
def test_bad_series_is_refused_with_a_reason(timestamps, values, message) -> None:
    with pytest.raises(InvalidSeries, match=message):
        Series(timestamps, values)


def test_milliseconds_passed_as_seconds_are_refused() -> None:
    acc = WindowAccumulator(step_s=1)
    acc.push([1.0], [1.0])
    with pytest.raises(InvalidSeries, match="in seconds"):
        acc.push([1.7e12], [1.0])


@given(
    # Timestamps at millisecond resolution, as scraped samples have: subnormal floats such as
    # 5e-324 s fall on different sides of a window edge in the vectorised and the streaming
    # path (t / step underflows), which no real timestamp does.
    st.lists(
        st.tuples(st.integers(0, 50_000).map(lambda ms: ms / 1000), st.floats(0, 1e4)),
        min_size=1,
        max_size=60,
    ),
    st.lists(st.integers(1, 7), min_size=1, max_size=20),
)
def test_chunked_pushes_close_the_same_windows_as_one_push(samples, chunk_sizes) -> None:
    # Distinct timestamps: a repeat of a window-closing timestamp in a later push is late
    # by design (the window was already handed on), which one push cannot show.
    samples = sorted(dict(samples).items())
    ts = [t for t, _ in samples]
    vs = [v for _, v in samples]
    whole = resample(Series(ts, vs), step_s=5)
    acc = WindowAccumulator(step_s=5)
    parts: list[float] = []
    i = 0
    for size in chunk_sizes * 60:
        if i >= len(ts):
            break
        parts.extend(acc.push(ts[i : i + size], vs[i : i + size]).values.tolist())
        i += size
    np.testing.assert_allclose(parts, whole.values, equal_nan=True)
