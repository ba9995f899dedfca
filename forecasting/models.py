"""The forecasters by name, and which one the service uses by default.

The default is the state-space model: it beat both baselines and Holt-Winters at 10, 30
and 60 minutes on the two multi-day shared traces (see docs/forecasting.md for the figures).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from forecasting.baselines import Persistence, SeasonalNaive
from forecasting.grid import GridForecaster
from forecasting.holt_winters import HoltWinters
from forecasting.state_space import DailyStateSpace

MODELS: Mapping[str, Callable[..., GridForecaster]] = {
    Persistence.name: Persistence,
    SeasonalNaive.name: SeasonalNaive,
    HoltWinters.name: HoltWinters,
    DailyStateSpace.name: DailyStateSpace,
}
DEFAULT_MODEL = DailyStateSpace.name


def make_forecaster(name: str = DEFAULT_MODEL, **kwargs: Any) -> GridForecaster:
    """A new, unfitted forecaster; kwargs are `step_s`, `quantile`, `max_history_s`."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    return factory(**kwargs)
