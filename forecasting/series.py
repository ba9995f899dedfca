"""Demand series and their resampling onto a fixed grid of windows.

A `Series` holds raw observations: timestamps in seconds and values, irregular and gappy,
NaN where a value is missing. Forecasters work on a regular grid of `step_s` windows. Each
window is half-open on the left, `(end - step_s, end]`, and labelled by its end, because an
observation measures the interval that ends at its timestamp (as Prometheus `rate()` does).
A window closes as soon as an observation at or after its end arrives; its value is the mean
of the finite observations inside it, or NaN when there were none. Missing stays missing:
an empty window is never zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from forecasting.errors import InvalidSeries

FloatArray = npt.NDArray[np.float64]

# A bogus timestamp unit (milliseconds passed as seconds) would otherwise allocate millions
# of empty windows; refuse instead.
MAX_WINDOWS_PER_PUSH = 1_000_000


def _readonly(values: npt.ArrayLike, *, name: str) -> FloatArray:
    try:
        array = np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise InvalidSeries(f"{name} must be numbers") from err
    if array.ndim != 1:
        raise InvalidSeries(f"{name} must be one-dimensional, got shape {array.shape}")
    array.flags.writeable = False
    return array


@dataclass(frozen=True, slots=True)
class Series:
    """Raw observations: `values[i]` was measured over the interval ending at `timestamps_s[i]`.

    Non-finite values (NaN, +-Inf) mean "missing". Timestamps must be finite and
    non-decreasing.
    """

    timestamps_s: FloatArray
    values: FloatArray

    def __post_init__(self) -> None:
        timestamps_s = _readonly(self.timestamps_s, name="timestamps_s")
        values = _readonly(self.values, name="values")
        if timestamps_s.shape != values.shape:
            raise InvalidSeries(
                f"{timestamps_s.size} timestamps but {values.size} values; they must pair up"
            )
        if not np.all(np.isfinite(timestamps_s)):
            raise InvalidSeries("timestamps_s contains NaN or Inf")
        if timestamps_s.size > 1 and np.any(np.diff(timestamps_s) < 0):
            raise InvalidSeries("timestamps_s must be non-decreasing")
        object.__setattr__(self, "timestamps_s", timestamps_s)
        object.__setattr__(self, "values", values)

    def __len__(self) -> int:
        return int(self.values.size)

    def until(self, end_s: float) -> Series:
        """The observations at or before `end_s`."""
        stop = int(np.searchsorted(self.timestamps_s, end_s, side="right"))
        return Series(self.timestamps_s[:stop], self.values[:stop])


@dataclass(frozen=True, slots=True)
class Windows:
    """Consecutive closed windows: the first ends at `first_end_s`, one every `step_s`."""

    first_end_s: float
    step_s: float
    values: FloatArray

    @property
    def end_timestamps_s(self) -> FloatArray:
        return self.first_end_s + self.step_s * np.arange(self.values.size, dtype=np.float64)


class WindowAccumulator:
    """Turns a stream of observations into closed windows of `step_s` seconds.

    Keeps the sums of windows not yet closed, so observations may arrive one at a time (a
    control-loop tick) or in batches (a back-fill). Observations for a window that has
    already closed are dropped and counted in `late_observations`: a closed window has been
    handed to a model and cannot be revised. That includes a second observation at exactly
    the end of a window that an earlier call already closed.
    """

    def __init__(self, *, step_s: float) -> None:
        if not (math.isfinite(step_s) and step_s > 0):
            raise InvalidSeries(f"step_s must be a positive number of seconds, got {step_s}")
        self.step_s = float(step_s)
        self._last_closed: int | None = None  # index k of the last closed window (k*step end)
        self._start: int | None = None  # first window index seen, until one closes
        self._open: dict[int, tuple[float, int]] = {}  # index -> (sum, count) of finite values
        self.late_observations = 0

    def copy(self) -> WindowAccumulator:
        twin = WindowAccumulator(step_s=self.step_s)
        twin.__dict__.update({**self.__dict__, "_open": dict(self._open)})
        return twin

    @property
    def last_closed_end_s(self) -> float | None:
        return None if self._last_closed is None else self._last_closed * self.step_s

    def push(self, timestamps_s: npt.ArrayLike, values: npt.ArrayLike) -> Windows:
        """Add observations; return the windows they closed (possibly none)."""
        batch = Series(
            _readonly(timestamps_s, name="timestamps_s"), _readonly(values, name="values")
        )
        if len(batch) == 0:
            return self._empty()
        index = np.ceil(batch.timestamps_s / self.step_s).astype(np.int64)
        if self._last_closed is not None:
            fresh = index > self._last_closed
            self.late_observations += int(np.count_nonzero(~fresh))
            index, observed = index[fresh], batch.values[fresh]
        else:
            observed = batch.values
        finite = np.isfinite(observed)
        for k, total, count in _group_sums(index[finite], observed[finite]):
            old_total, old_count = self._open.get(k, (0.0, 0))
            self._open[k] = (old_total + total, old_count + count)
        # Time has reached the latest timestamp even when its value is missing.
        closed_through = math.floor(float(batch.timestamps_s[-1]) / self.step_s)
        if self._last_closed is None:
            lowest = int(index.min())
            self._start = lowest if self._start is None else min(self._start, lowest)
            first = self._start
        else:
            first = self._last_closed + 1
        if closed_through < first:
            return self._empty()
        if closed_through - first + 1 > MAX_WINDOWS_PER_PUSH:
            raise InvalidSeries(
                f"observations span {closed_through - first + 1} windows of {self.step_s:g} s;"
                " are the timestamps in seconds?"
            )
        out = np.full(closed_through - first + 1, np.nan)
        still_open: dict[int, tuple[float, int]] = {}
        for k, (total, count) in self._open.items():
            if k > closed_through:
                still_open[k] = (total, count)
                continue
            mean = total / count
            # A sum of huge finite values can overflow; that window is unusable, not infinite.
            out[k - first] = mean if math.isfinite(mean) else math.nan
        # a new dict: one emptied by pops keeps the size of a back-fill's thousands of windows
        self._open = still_open
        self._last_closed = closed_through
        out.flags.writeable = False
        return Windows(first_end_s=first * self.step_s, step_s=self.step_s, values=out)

    def _empty(self) -> Windows:
        end = self.last_closed_end_s
        first = self.step_s if end is None else end + self.step_s
        return Windows(first_end_s=first, step_s=self.step_s, values=np.empty(0))


def _group_sums(index: npt.NDArray[np.int64], values: FloatArray) -> list[tuple[int, float, int]]:
    if index.size == 0:
        return []
    keys, inverse, counts = np.unique(index, return_inverse=True, return_counts=True)
    totals = np.bincount(inverse, weights=values)
    return [(int(k), float(t), int(c)) for k, t, c in zip(keys, totals, counts, strict=True)]


def resample(series: Series, *, step_s: float) -> Windows:
    """The closed `step_s` windows of a whole series (an open last window is left out)."""
    return WindowAccumulator(step_s=step_s).push(series.timestamps_s, series.values)
