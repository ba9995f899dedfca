"""The forecasters by name, the default one the autoscaler plans with, and the most accurate.

`PLANNING_MODEL` is the default: what the service (`--forecast-model`), the simulator and
`backtest` (its report's `default_model`) use unless told otherwise, so that a backtest
scores the forecaster capacity is really ordered from. It is the state-space model raised to
a seasonal envelope of the last days: less accurate on purpose, it has capacity ready for
daily steps that land a few minutes apart from day to day (docs/results.md).
`MOST_ACCURATE_MODEL`, the plain state-space model, beat both baselines and Holt-Winters at
10, 30 and 60 minutes on the two multi-day shared traces (docs/forecasting.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from forecasting.baselines import Persistence, SeasonalNaive
from forecasting.envelope import SeasonalEnvelope
from forecasting.grid import GridForecaster
from forecasting.holt_winters import HoltWinters
from forecasting.state_space import DailyStateSpace

MODELS: Mapping[str, Callable[..., GridForecaster]] = {
    Persistence.name: Persistence,
    SeasonalNaive.name: SeasonalNaive,
    HoltWinters.name: HoltWinters,
    DailyStateSpace.name: DailyStateSpace,
    SeasonalEnvelope.name: SeasonalEnvelope,
}
PLANNING_MODEL = SeasonalEnvelope.name
MOST_ACCURATE_MODEL = DailyStateSpace.name


def make_forecaster(name: str = PLANNING_MODEL, **kwargs: Any) -> GridForecaster:
    """A new, unfitted forecaster; kwargs are `step_s`, `quantile`, `max_history_s`."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    return factory(**kwargs)
