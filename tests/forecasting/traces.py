"""Small series cut from the shared ServeGen traces, read at test time (never copied)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from forecasting.series import Series
from tests.harness.shared_data import shared_data_path

STEP_S = 600.0
DAY_WINDOWS = 144


def servegen_rates(model: str) -> np.ndarray:
    """`requests_per_s` of `servegen_<model>_600s.csv`, all-zero windows as NaN."""
    frame = pd.read_csv(shared_data_path("traces", f"servegen_{model}_600s.csv"))
    rates = frame["requests_per_s"].to_numpy(dtype=np.float64).copy()
    rates[(rates == 0) & (frame["active_clients"].to_numpy() == 0)] = np.nan
    return rates


def servegen_cut(model: str, start_row: int, stop_row: int) -> Series:
    """Rows [start_row, stop_row) of the trace, each labelled by its window's end."""
    rates = servegen_rates(model)[start_row:stop_row]
    ends = (np.arange(start_row, stop_row, dtype=np.float64) + 1) * STEP_S
    return Series(ends, rates)
