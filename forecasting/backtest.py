"""Rolling-origin evaluation of the forecasters on a trace.

The first `train_s` of the trace (default: 7 days or half the trace, whichever is shorter)
is the initial history. Then, window by window, each model is updated with the newly closed
window and forecasts `horizon_s` ahead (rounded up to whole windows; the report gives the
horizon used), as the service would each tick; every `refit_every_s` it is refitted on
everything seen so far (default one day: the service refits every 15 minutes, which would
make a backtest of a week take minutes a model). A forecast is scored
against the actual window `horizon_s` later. Origins whose target is missing are skipped,
and every model is scored on the same origins.

Scores per model: MAE and, scaled by the in-sample one-step naive MAE of the initial history
(Hyndman & Koehler 2006), MASE; sMAPE in percent (0-200); the MAE ratio against persistence
and against seasonal-naive at the same horizon; coverage, the share of actual values at or
below the upper bound; and the median wall time of a full fit. Where seasonal-naive never
ran (less than a day of history at every refit) persistence stood in for it throughout, and
the ratio against it would be a second ratio against persistence: it is not given (n/a,
null). Where it stood in only here and there (a window missing a day before the target),
the ratio is given, as it was.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from forecasting.baselines import Persistence, SeasonalNaive
from forecasting.errors import ForecastingError, InsufficientHistory
from forecasting.grid import DAY_S, DEFAULT_QUANTILE, DEFAULT_STEP_S, MAX_HORIZON_S
from forecasting.models import MODELS, PLANNING_MODEL, make_forecaster
from forecasting.series import FloatArray, Series, resample

DEFAULT_TRAIN_S = 7 * DAY_S
# Fewer scored forecasts than this say nothing about a model; refuse rather than report.
MIN_SCORED_ORIGINS = 10


@dataclass(frozen=True, slots=True)
class ModelScore:
    mae: float
    mase: float
    smape: float
    ratio_vs_persistence: float
    ratio_vs_seasonal_naive: float
    coverage: float
    fit_seconds_median: float
    fallback_share: float  # share of scored forecasts where a baseline stood in


@dataclass(frozen=True, slots=True)
class BacktestReport:
    trace: str
    horizon_s: float
    step_s: float
    quantile: float
    default_model: str
    train_windows: int
    scored_origins: int
    models: Mapping[str, ModelScore]

    def contract_json(self) -> dict[str, object]:
        """The `backtest --json` document (DESIGN.md section 8)."""
        return {
            "trace": self.trace,
            "horizon_s": round(self.horizon_s),
            "default_model": self.default_model,
            "models": {
                name: {
                    "mase": _finite_or_none(score.mase),
                    "smape": _finite_or_none(score.smape),
                    "ratio_vs_persistence": _finite_or_none(score.ratio_vs_persistence),
                    "ratio_vs_seasonal_naive": _finite_or_none(score.ratio_vs_seasonal_naive),
                    "coverage": _finite_or_none(score.coverage),
                    "fit_seconds_median": _finite_or_none(score.fit_seconds_median),
                }
                for name, score in self.models.items()
            },
        }


@dataclass(frozen=True, slots=True)
class _Run:
    point: FloatArray
    upper: FloatArray
    fell_back: npt.NDArray[np.bool_]
    fit_seconds: tuple[float, ...]


def run_backtest(
    series: Series,
    *,
    trace: str,
    horizon_s: float,
    step_s: float = DEFAULT_STEP_S,
    quantile: float = DEFAULT_QUANTILE,
    models: Sequence[str] = tuple(MODELS),
    train_s: float | None = None,
    refit_every_s: float = DAY_S,
    min_scored_origins: int = MIN_SCORED_ORIGINS,
) -> BacktestReport:
    """Score `models` (the two baselines and the planning model are always included) on
    `series`.

    Forecasts reach whole windows ahead, so the horizon is rounded up to whole steps; the
    report carries the horizon actually scored.
    """
    windows = resample(series, step_s=step_s)
    ends = windows.end_timestamps_s
    actual = windows.values
    steps = max(1, math.ceil(horizon_s / step_s - 1e-9))
    horizon_s = steps * step_s
    if horizon_s > MAX_HORIZON_S:
        # rounded up to whole steps: a step past 7 days makes any horizon one step
        what = f"a {horizon_s:g} s horizon" if step_s < horizon_s else f"a {step_s:g} s step"
        raise ForecastingError(
            f"{what} is past the {MAX_HORIZON_S:g} s (7 days) a forecast reaches"
        )
    train = int(
        (train_s if train_s is not None else min(DEFAULT_TRAIN_S, ends.size * step_s / 2)) // step_s
    )
    if train < 2 or train + steps > ends.size:
        raise InsufficientHistory(
            f"{ends.size} windows of {step_s:g} s cannot hold {train} training windows"
            f" plus a {horizon_s:g} s horizon"
        )
    # The planning model is always scored: the report's `default_model` names it.
    names = list(dict.fromkeys([Persistence.name, SeasonalNaive.name, *models, PLANNING_MODEL]))
    refit_windows = max(1, int(refit_every_s // step_s))
    runs = {
        name: _run_model(
            name,
            series,
            ends=ends,
            train=train,
            steps=steps,
            step_s=step_s,
            quantile=quantile,
            refit_windows=refit_windows,
        )
        for name in names
    }
    targets = actual[train - 1 + steps :]
    scored = np.isfinite(targets)
    for run in runs.values():
        scored &= np.isfinite(run.point) & np.isfinite(run.upper)
    if scored.sum() < min_scored_origins:
        raise InsufficientHistory(
            f"only {int(scored.sum())} forecasts could be scored (need {min_scored_origins}):"
            f" {ends.size} windows of {step_s:g} s, {train} for training, horizon {horizon_s:g} s;"
            " try a shorter horizon or step"
        )
    y = targets[scored]
    scale = _naive_scale(actual[:train])
    maes = {name: float(np.mean(np.abs(run.point[scored] - y))) for name, run in runs.items()}
    # persistence under another name if seasonal-naive never ran: no baseline then (a
    # missing window a day before a target makes it stand in here and there, as defined)
    seasonal_naive_mae = (
        math.nan if runs[SeasonalNaive.name].fell_back[scored].all() else maes[SeasonalNaive.name]
    )
    scores = {
        name: ModelScore(
            mae=maes[name],
            mase=maes[name] / scale if scale > 0 else math.inf,
            smape=_smape(run.point[scored], y),
            ratio_vs_persistence=_ratio(maes[name], maes[Persistence.name]),
            ratio_vs_seasonal_naive=_ratio(maes[name], seasonal_naive_mae),
            coverage=float(np.mean(y <= run.upper[scored])),
            fit_seconds_median=float(np.median(run.fit_seconds)),
            fallback_share=float(np.mean(run.fell_back[scored])),
        )
        for name, run in runs.items()
    }
    return BacktestReport(
        trace=trace,
        horizon_s=float(horizon_s),
        step_s=float(step_s),
        quantile=quantile,
        default_model=PLANNING_MODEL,
        train_windows=train,
        scored_origins=int(scored.sum()),
        models=scores,
    )


def _run_model(
    name: str,
    series: Series,
    *,
    ends: FloatArray,
    train: int,
    steps: int,
    step_s: float,
    quantile: float,
    refit_windows: int,
) -> _Run:
    forecaster = make_forecaster(name, step_s=step_s, quantile=quantile)
    horizon_s = steps * step_s
    # Raw observation index bounds of each window: window i is (ends[i] - step, ends[i]].
    bounds = np.searchsorted(series.timestamps_s, ends, side="right")
    origins = range(train, ends.size - steps + 1)
    point = np.full(len(origins), np.nan)
    upper = np.full(len(origins), np.nan)
    fell_back = np.zeros(len(origins), dtype=bool)
    fit_seconds: list[float] = []
    last_fit = -refit_windows
    for k, origin in enumerate(origins):
        known = int(bounds[origin - 1])
        if origin - last_fit >= refit_windows:
            started = time.perf_counter()
            # The window's end closes the last window, as at an update: without it a step
            # that is not a multiple of the trace's interval left the last window open,
            # and the forecast was scored one window off.
            forecaster.fit(
                Series(
                    np.append(series.timestamps_s[:known], ends[origin - 1]),
                    np.append(series.values[:known], math.nan),
                )
            )
            fit_seconds.append(time.perf_counter() - started)
            last_fit = origin
        else:
            first = int(bounds[origin - 2])
            # Always pass the window's end so an empty window closes as missing.
            forecaster.update(
                [*series.timestamps_s[first:known].tolist(), float(ends[origin - 1])],
                [*series.values[first:known].tolist(), math.nan],
            )
        result = forecaster.forecast(horizon_s)
        if result is not None:
            point[k], upper[k] = result.point, result.upper
            fell_back[k] = result.fallback_reason is not None
    return _Run(point=point, upper=upper, fell_back=fell_back, fit_seconds=tuple(fit_seconds))


def _finite_or_none(value: float) -> float | None:
    # JSON has no Inf or NaN; an undefined score (a zero baseline error) is null.
    return value if math.isfinite(value) else None


def _naive_scale(values: FloatArray) -> float:
    steps = np.abs(np.diff(values))
    steps = steps[np.isfinite(steps)]
    return float(np.mean(steps)) if steps.size else math.nan


def _smape(predicted: FloatArray, actual: FloatArray) -> float:
    denominator = np.abs(predicted) + np.abs(actual)
    nonzero = denominator > 0
    terms = 200.0 * np.abs(predicted - actual)[nonzero] / denominator[nonzero]
    # 0/0 (both zero) is a perfect forecast, not an undefined one.
    return float(np.sum(terms) / actual.size)


def _ratio(mae: float, baseline_mae: float) -> float:
    if math.isnan(baseline_mae):
        return math.nan
    return mae / baseline_mae if baseline_mae > 0 else math.inf
