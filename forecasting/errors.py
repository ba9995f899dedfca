"""The one exception family of the forecasting package.

Every error raised here derives from `ForecastingError` and, when it wraps another
exception (a statsmodels or parsing failure), chains it with `raise ... from err`.
"""

from __future__ import annotations


class ForecastingError(Exception):
    """Base of every error this package raises."""


class InvalidSeries(ForecastingError):
    """Timestamps and values that cannot form a series (shape, order, units)."""


class InsufficientHistory(ForecastingError):
    """Too few observed windows for the model (short, all missing or mostly missing)."""


class FlatSeries(ForecastingError):
    """Every observed window has the same value: nothing for a model to learn."""


class FitFailed(ForecastingError):
    """The model's fit raised, did not converge, or produced non-finite parameters."""


class TraceFormatError(ForecastingError):
    """A trace file whose columns or content match none of the known formats."""
