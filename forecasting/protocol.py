"""The small protocol every forecaster follows, and what a forecast returns.

The service keeps one forecaster per component: `fit` on the back-filled history (off the
event loop), `update` with each tick's observation (cheap, on the loop), and `forecast` the
lead time ahead. It maps a `ForecastResult` onto the decision core's `Forecast`; this package
does not import the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy.typing as npt

from forecasting.series import Series


@dataclass(frozen=True, slots=True)
class ForecastResult:
    """Demand expected `horizon_s` ahead, in the series' unit.

    `upper` is the forecast's `quantile` (e.g. 0.9: the actual value should be at or below it
    nine times in ten). Both are finite and never negative. `fallback_reason` is set when a
    baseline stood in for the model, and says why.
    """

    point: float
    upper: float
    quantile: float
    horizon_s: float
    fallback_reason: str | None = None


class Forecaster(Protocol):
    """Fit on a history, update cheaply with new observations, forecast ahead.

    Timestamps are seconds; an observation measures the interval ending at its timestamp.
    Values may be NaN or Inf (treated as missing).
    """

    @property
    def name(self) -> str: ...

    def fit(self, history: Series) -> None:
        """Replace the model with one fitted on `history`. May be slow: run it off the loop."""

    def update(self, timestamps_s: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """Add observations newer than what the model has seen. Must be cheap."""

    def forecast(self, horizon_s: float) -> ForecastResult | None:
        """Demand `horizon_s` after the last closed window; None when nothing was observed."""
