"""Demand forecasting for the gang autoscaler: forecasters behind one small protocol.

No Kubernetes, no Prometheus, nothing from `autoscaler` (an import-linter contract checks
it). The service keeps one forecaster per component, fits it off the event loop with
`BackgroundFitter`, and maps each `ForecastResult` onto the decision core's `Forecast`.
See docs/forecasting.md.
"""

from forecasting.errors import ForecastingError
from forecasting.fitter import BackgroundFitter
from forecasting.models import MODELS, MOST_ACCURATE_MODEL, PLANNING_MODEL, make_forecaster
from forecasting.protocol import Forecaster, ForecastResult
from forecasting.series import Series

__all__ = [
    "MODELS",
    "MOST_ACCURATE_MODEL",
    "PLANNING_MODEL",
    "BackgroundFitter",
    "ForecastResult",
    "Forecaster",
    "ForecastingError",
    "Series",
    "make_forecaster",
]
