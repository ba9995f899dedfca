"""A bounded buffer of closed window values, newest last.

The baselines forecast from it, and every forecaster's upper bound for a baseline comes
from the spread of its past errors in it.
"""

from __future__ import annotations

import numpy as np

from forecasting.series import FloatArray, Windows


class WindowHistory:
    """The last `max_windows` closed window values (NaN for missing ones), newest last.

    The values live in one float64 buffer with some room to grow (a Python float in a deque
    costs four times as much, and a service keeps two weeks of windows for thousands of
    components). Appending writes only past the arrays already handed out by `array()`, and
    making room copies into a new buffer, so an array once returned never changes.
    """

    def __init__(self, *, max_windows: int) -> None:
        if max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {max_windows}")
        self.max_windows = max_windows
        self._room = max(16, max_windows // 4)
        self._buffer: FloatArray = np.empty(0)
        self._start = 0
        self._end = 0
        self._appended = 0  # windows ever appended, so positions survive trimming
        self._last_finite: tuple[int, float] | None = None  # (position, value)
        self.last_end_s: float | None = None

    def extend(self, windows: Windows) -> None:
        new = np.asarray(windows.values, dtype=np.float64)[-self.max_windows :]
        if new.size == 0:
            return
        kept = min(len(self), self.max_windows - new.size)
        if self._end + new.size > self._buffer.size:
            buffer = np.empty(self.max_windows + self._room)
            buffer[:kept] = self._buffer[self._end - kept : self._end]
            self._buffer, self._start, self._end = buffer, 0, kept
        self._buffer[self._end : self._end + new.size] = new
        self._end += new.size
        self._start = self._end - kept - new.size
        finite = np.flatnonzero(np.isfinite(new))
        skipped = windows.values.size - new.size
        if finite.size:
            last = int(finite[-1])
            self._last_finite = (self._appended + skipped + last, float(new[last]))
        self._appended += windows.values.size
        self.last_end_s = float(windows.end_timestamps_s[-1])

    def __len__(self) -> int:
        return self._end - self._start

    def __getstate__(self) -> dict[str, object]:
        # ship the live values only, not the room to grow
        return {**self.__dict__, "_buffer": self.array().copy(), "_start": 0, "_end": len(self)}

    def copy(self) -> WindowHistory:
        twin = WindowHistory(max_windows=self.max_windows)
        twin.__dict__.update(self.__getstate__())
        return twin

    def array(self) -> FloatArray:
        """The values, oldest first; read-only, and never changed by later appends."""
        view = self._buffer[self._start : self._end]
        view.flags.writeable = False
        return view

    def last_observed(self) -> float | None:
        """The newest finite value still in the history; None when every window is missing."""
        if self._last_finite is None or self._last_finite[0] < self._appended - len(self):
            return None
        return self._last_finite[1]


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
