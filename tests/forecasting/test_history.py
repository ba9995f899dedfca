"""The window history: bounded, array-backed, and safe to read while it grows."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from forecasting.baselines import Persistence
from forecasting.history import WindowHistory
from forecasting.series import Windows

NAN = float("nan")


def windows(first_end_s: float, *values: float) -> Windows:
    return Windows(first_end_s=first_end_s, step_s=300.0, values=np.array(values))


def test_keeps_the_last_max_windows_through_many_appends() -> None:
    history = WindowHistory(max_windows=20)
    for i in range(100):  # 100 appends of 3: the buffer is remade many times
        history.extend(windows(300.0 * (3 * i + 1), 3 * i, 3 * i + 1, 3 * i + 2))
    np.testing.assert_array_equal(history.array(), np.arange(280, 300))
    assert history.last_end_s == 300.0 * 300
    assert len(history) == 20


def test_an_array_once_returned_never_changes() -> None:
    history = WindowHistory(max_windows=20)
    history.extend(windows(300.0, *range(20)))
    first = history.array()
    seen = first.copy()
    for i in range(20, 200):
        history.extend(windows(300.0 * (i + 1), i))
    np.testing.assert_array_equal(first, seen)
    with pytest.raises(ValueError):
        first[0] = 1.0  # read-only


def test_a_batch_longer_than_the_history_keeps_its_end() -> None:
    history = WindowHistory(max_windows=4)
    history.extend(windows(300.0, *range(10)))
    np.testing.assert_array_equal(history.array(), [6, 7, 8, 9])
    assert history.last_end_s == 3000.0


@pytest.mark.parametrize(
    ("batches", "expected"),
    [
        pytest.param([(1, 2, NAN)], 2.0, id="newest-finite-before-a-gap"),
        pytest.param([(1, 2), (NAN, NAN)], 2.0, id="from-an-earlier-batch"),
        pytest.param([(NAN, NAN)], None, id="every-window-missing"),
        pytest.param([(5,), (NAN,) * 4], None, id="the-finite-value-was-trimmed"),
        pytest.param([(5,), (NAN,) * 3], 5.0, id="the-finite-value-is-the-oldest-kept"),
    ],
)
def test_last_observed(batches: list[tuple[float, ...]], expected: float | None) -> None:
    history = WindowHistory(max_windows=4)
    end = 0.0
    for batch in batches:
        history.extend(windows(end + 300.0, *batch))
        end += 300.0 * len(batch)
    assert history.last_observed() == expected


def test_a_copy_and_a_pickle_carry_the_values_not_the_room_to_grow() -> None:
    history = WindowHistory(max_windows=1000)
    history.extend(windows(300.0, *range(10)))
    for twin in (history.copy(), pickle.loads(pickle.dumps(history))):
        np.testing.assert_array_equal(twin.array(), np.arange(10))
        assert twin._buffer.size == 10
        assert twin.last_end_s == history.last_end_s and twin.last_observed() == 9.0
        twin.extend(windows(3300.0, 10.0))  # a copy grows on its own
        assert len(twin) == 11 and len(history) == 10


def test_a_forecast_is_kept_until_a_window_closes() -> None:
    forecaster = Persistence(step_s=300.0)
    forecaster.fit_seen(forecaster.seen())  # fitted on nothing yet: no forecast
    assert forecaster.forecast(600) is None
    forecaster.update([300.0, 450.0], [10.0, 99.0])
    assert forecaster.forecast(600).point == 10.0
    forecaster.update([500.0], [1.0])  # inside the open window: nothing closed
    assert forecaster.forecast(600).point == 10.0
    forecaster.update([600.0], [2.0])  # closes (300, 600]: the mean of 99, 1 and 2
    assert forecaster.forecast(600).point == pytest.approx(34.0)
    assert forecaster.forecast(900).horizon_s == 900.0
