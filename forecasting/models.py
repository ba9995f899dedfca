"""The forecasters by name, the most accurate one, and the one the autoscaler plans with.

`DEFAULT_MODEL`, the state-space model, is the most accurate: it beat both baselines and
Holt-Winters at 10, 30 and 60 minutes on the two multi-day shared traces (see
docs/forecasting.md for the figures). `PLANNING_MODEL`, what the service and the simulator
order capacity from unless told otherwise, is the same model raised to a seasonal envelope
of the last days: less accurate on purpose, it has capacity ready for daily steps that land
a few minutes apart from day to day (docs/results.md).
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
DEFAULT_MODEL = DailyStateSpace.name
PLANNING_MODEL = SeasonalEnvelope.name


def make_forecaster(name: str = DEFAULT_MODEL, **kwargs: Any) -> GridForecaster:
    """A new, unfitted forecaster; kwargs are `step_s`, `quantile`, `max_history_s`."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    return factory(**kwargs)
