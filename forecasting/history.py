"""A bounded buffer of closed window values, newest last.

The baselines forecast from it, and every forecaster's upper bound for a baseline comes
from the spread of its past errors in it.
"""

from __future__ import annotations

import collections

import numpy as np

from forecasting.series import FloatArray, Windows


class WindowHistory:
    """The last `max_windows` closed window values (NaN for missing ones)."""

    def __init__(self, *, max_windows: int) -> None:
        self._values: collections.deque[float] = collections.deque(maxlen=max_windows)
        self._array: FloatArray | None = None  # `array()` until the next change
        self.last_end_s: float | None = None

    def clear(self) -> None:
        self._values.clear()
        self._array = None
        self.last_end_s = None

    def extend(self, windows: Windows) -> None:
        if windows.values.size == 0:
            return
        self._values.extend(windows.values.tolist())
        self._array = None
        self.last_end_s = float(windows.end_timestamps_s[-1])

    def __len__(self) -> int:
        return len(self._values)

    def __getstate__(self) -> dict[str, object]:
        # the cached array is rebuilt on demand; a fit shipped to a worker need not carry it
        return {**self.__dict__, "_array": None}

    def array(self) -> FloatArray:
        """The values, oldest first; read-only, and built once per change (a forecast is
        asked for every tick, a window closes every few minutes)."""
        if self._array is None:
            built = np.fromiter(self._values, dtype=np.float64, count=len(self._values))
            built.flags.writeable = False
            self._array = built
        return self._array

    def last_observed(self) -> float | None:
        """The newest finite value, however old; None when every window is missing."""
        for value in reversed(self._values):
            if np.isfinite(value):
                return value
        return None


def upper_quantile_of_errors(
    actual: FloatArray, predicted: FloatArray, *, quantile: float, min_pairs: int = 10
) -> float:
    """The `quantile` of (actual - predicted) over finite pairs, never below zero.

    With fewer than `min_pairs` pairs the spread is unknown and 0 is returned: the upper
    bound then equals the point forecast rather than an invented margin.
    """
    errors = actual - predicted
    errors = errors[np.isfinite(errors)]
    if errors.size < min_pairs:
        return 0.0
    return max(0.0, float(np.quantile(errors, quantile)))
