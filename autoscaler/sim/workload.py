"""Workloads the simulator replays: arrivals with prompt and output lengths, from real traces.

Every workload is a sequence of *cohorts*: requests arriving together at one instant with
the same prompt and output length. A request-level trace (Azure, Mooncake) has one request
per cohort; a per-second aggregate has one cohort per second; a ServeGen 10-minute rate
series is sampled into one cohort per second (Poisson counts, fixed seed). Cohorts keep
multi-day series to arrays of a few million entries, so the serving model stays vectorised.
"""

from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from autoscaler.sim.errors import TraceError
from forecasting.errors import TraceFormatError
from forecasting.traces import (
    azure_arrival_seconds,
    read_json_lines,
    regular_step,
    servegen_gaps,
)
from forecasting.traces import resolve_trace as resolve_shared_trace

logger = logging.getLogger(__name__)

BUILTIN_TRACE = "builtin"
BUILTIN_PATH = Path(__file__).resolve().parent / "data" / "azure2023_conv_1s.csv.gz"


@dataclass(frozen=True, slots=True)
class Workload:
    """Cohorts sorted by arrival time. Arrays are aligned, one entry per cohort."""

    name: str
    arrival_s: np.ndarray  # float64, seconds from the start of the trace
    requests: np.ndarray  # float64 request count per cohort (>0)
    input_tokens: np.ndarray  # float64 prompt tokens per request
    output_tokens: np.ndarray  # float64 generated tokens per request
    duration_s: float

    @property
    def total_requests(self) -> float:
        return float(self.requests.sum())

    def prompt_tokens(self) -> np.ndarray:
        return np.asarray(self.requests * self.input_tokens, dtype=np.float64)

    def generated_tokens(self) -> np.ndarray:
        return np.asarray(self.requests * self.output_tokens, dtype=np.float64)

    def slice(self, start_s: float, end_s: float) -> Workload:
        """The cohorts in [start_s, end_s), re-based to start at 0."""
        mask = (self.arrival_s >= start_s) & (self.arrival_s < end_s)
        return Workload(
            name=f"{self.name}[{start_s:g}s:{end_s:g}s]",
            arrival_s=self.arrival_s[mask] - start_s,
            requests=self.requests[mask],
            input_tokens=self.input_tokens[mask],
            output_tokens=self.output_tokens[mask],
            duration_s=min(end_s, self.duration_s) - start_s,
        )


def _build(
    name: str,
    arrival_s: ArrayLike,
    requests: ArrayLike,
    input_tokens: ArrayLike,
    output_tokens: ArrayLike,
    duration_s: float,
    *,
    empty: str | None = None,
) -> Workload:
    """`empty` says why no request is left when it is not the trace's fault (a scale)."""
    arrival = np.asarray(arrival_s, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    count = np.asarray(requests, dtype=np.float64)[order]
    keep = count > 0
    workload = Workload(
        name=name,
        arrival_s=arrival[order][keep],
        requests=count[keep],
        input_tokens=np.maximum(np.asarray(input_tokens, dtype=np.float64)[order][keep], 1.0),
        output_tokens=np.maximum(np.asarray(output_tokens, dtype=np.float64)[order][keep], 1.0),
        duration_s=float(duration_s),
    )
    if workload.arrival_s.size == 0:
        raise TraceError(empty or f"trace {name!r} has no requests")
    return workload


def _scaled_to_nothing(scale: float, total: float) -> str:
    return (
        f"at --scale {scale:g} the trace has {total:.3g} requests, fewer than one; raise "
        "--scale or leave it out (automatic)"
    )


def load_azure_requests(path: Path, *, name: str | None = None) -> Workload:
    """Azure LLM inference trace: `TIMESTAMP,ContextTokens,GeneratedTokens`, one request a row."""
    frame = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    try:
        arrival = azure_arrival_seconds(frame["TIMESTAMP"], path)
    except TraceFormatError as err:
        raise TraceError(str(err)) from err
    return _build(
        name or path.stem,
        arrival,
        np.ones(len(frame)),
        frame["ContextTokens"].to_numpy(),
        frame["GeneratedTokens"].to_numpy(),
        float(np.ceil(arrival.max() + 1e-9)),
    )


def load_per_second(path: Path, *, name: str | None = None) -> Workload:
    """Per-second aggregates: `t_seconds,requests,input_tokens,output_tokens` (token sums).

    Each second becomes one cohort placed at the middle of the second, with the second's
    mean prompt and output lengths.
    """
    tokens = ("input_tokens", "output_tokens")
    frame = _read_csv(path, ("t_seconds", "requests", *tokens), may_be_empty=tokens)
    # an empty second may leave its token sums empty; a second with requests may not
    busy = frame["requests"].to_numpy() > 0
    _first_bad(path, frame[list(tokens)].isna() & busy[:, None], "no value")
    frame[list(tokens)] = frame[list(tokens)].fillna(0.0)
    count = frame["requests"].to_numpy(dtype=np.float64)
    safe = np.where(count > 0, count, 1.0)
    # from the first row's second, as the other loaders count from the first request: a
    # trace in epoch seconds replayed 56 years of silence first
    seconds = frame["t_seconds"].to_numpy(dtype=np.float64)
    seconds = seconds - seconds.min() if seconds.size else seconds
    return _build(
        name or path.stem,
        seconds + 0.5,
        count,
        frame["input_tokens"].to_numpy(dtype=np.float64) / safe,
        frame["output_tokens"].to_numpy(dtype=np.float64) / safe,
        float(seconds.max() + 1) if seconds.size else 1.0,
    )


def load_mooncake(path: Path, *, name: str | None = None) -> Workload:
    """Mooncake JSON lines: `timestamp` (ms), `input_length`, `output_length`."""
    columns = ("timestamp", "input_length", "output_length")
    try:
        values = read_json_lines(path, columns)
    except TraceFormatError as err:
        raise TraceError(str(err)) from err
    _first_bad(path, values.isna(), "no number", row_name="line")
    _first_bad(path, pd.DataFrame(~np.isfinite(values), columns=list(columns)),
               "an infinite value", row_name="line")  # fmt: skip
    _first_bad(path, values < 0, "a negative value", row_name="line")
    arrival = values["timestamp"].to_numpy(dtype=np.float64) / 1000.0
    arrival -= arrival.min()
    return _build(
        name or path.stem,
        arrival,
        np.ones(len(values)),
        values["input_length"].to_numpy(),
        values["output_length"].to_numpy(),
        float(np.ceil(arrival.max() + 1e-9)),
    )


def load_servegen(
    path: Path, *, seed: int, rate_scale: float = 1.0, name: str | None = None
) -> Workload:
    """ServeGen 10-minute windows, sampled into per-second Poisson cohorts.

    The window's `requests_per_s` times `rate_scale` is the Poisson mean for each second;
    prompt and output lengths are the window's rate-weighted means. Windows whose length
    columns are empty take the last known lengths.

    A window where every client reports zero is a collection gap, not a quiet spell (the
    shared data's README: "treat as missing"; in m-small and m-mid they sit between busy
    windows). Its rate is interpolated linearly in time between the windows either side,
    so a gap replays as the traffic around it instead of a silence followed by a step.
    """
    frame = read_servegen_windows(path)
    window_s = float(np.diff(frame["t_seconds"].to_numpy())[0]) if len(frame) > 1 else 600
    lengths = frame[["mean_input_tokens", "mean_output_tokens"]].ffill().bfill()
    if lengths.isna().any().any():
        raise TraceError(f"{path}: no prompt/output lengths in any window")
    rates = fill_collection_gaps(
        frame["t_seconds"].to_numpy(dtype=np.float64),
        frame["requests_per_s"].to_numpy(dtype=np.float64),
        gap=servegen_gaps(frame),
    )
    rng = np.random.default_rng(seed)
    per_window = int(window_s)
    rate = np.repeat(rates * rate_scale, per_window)
    counts = rng.poisson(np.maximum(rate, 0.0)).astype(np.float64)
    start = float(frame["t_seconds"].iloc[0])
    seconds = start + np.arange(counts.size, dtype=np.float64)
    return _build(
        name or path.stem,
        seconds - start + 0.5,
        counts,
        np.repeat(lengths["mean_input_tokens"].to_numpy(dtype=np.float64), per_window),
        np.repeat(lengths["mean_output_tokens"].to_numpy(dtype=np.float64), per_window),
        float(counts.size),
        empty=_scaled_to_nothing(rate_scale, 0.0) if rate_scale != 1.0 else None,
    )


SERVEGEN_COLUMNS = ("t_seconds", "requests_per_s", "mean_input_tokens", "mean_output_tokens")


def read_servegen_windows(path: Path) -> pd.DataFrame:
    """The checked rows of a ServeGen window series (empty length columns allowed: those
    windows take the last known lengths), one window after another."""
    frame = _read_csv(path, SERVEGEN_COLUMNS, may_be_empty=SERVEGEN_COLUMNS[2:])
    steps = np.diff(frame["t_seconds"].to_numpy(dtype=np.float64))
    if steps.size and not (steps > 0).all():
        row = int((steps <= 0).argmax()) + 2
        raise TraceError(f"{path}: t_seconds must increase row by row (data row {row} does not)")
    if steps.size:
        try:  # each row is replayed for one window's length
            regular_step(frame["t_seconds"].to_numpy(dtype=np.float64), path)
        except TraceFormatError as err:
            raise TraceError(str(err)) from err
    return frame


def fill_collection_gaps(
    t_seconds: np.ndarray, rates: np.ndarray, *, gap: np.ndarray
) -> np.ndarray:
    """Rates with the `gap` windows interpolated linearly in time from their neighbours.

    Gaps at either end take the nearest measured window. A series that is all gap is
    returned unchanged (there is nothing to interpolate from; `_build` rejects it).
    """
    if gap.all() or not gap.any():
        return rates
    logger.info(
        "%d of %d windows are collection gaps (all clients zero); their rates are "
        "interpolated from the windows either side",
        int(gap.sum()),
        rates.size,
    )
    filled = rates.copy()
    filled[gap] = np.interp(t_seconds[gap], t_seconds[~gap], rates[~gap])
    return filled


def scale_requests(workload: Workload, scale: float, *, seed: int) -> Workload:
    """Multiply a trace's traffic by `scale` while keeping its burst pattern.

    Each cohort's request count is multiplied by `scale`; a single-request cohort (request
    traces) is instead copied floor(scale) times plus once more with the fractional
    probability, each copy shifted by a uniform offset within one second, so a scaled request
    trace is still made of whole requests with the original 1-second burst structure.
    """
    if scale <= 0:
        raise TraceError(f"scale must be positive, got {scale}")
    if scale == 1.0:
        return workload
    if not np.all(workload.requests == 1.0):
        total = workload.total_requests * scale
        if not total >= 1:  # every policy would meet the SLO on a fraction of a request
            raise TraceError(_scaled_to_nothing(scale, total))
        return Workload(
            name=workload.name,
            arrival_s=workload.arrival_s,
            requests=workload.requests * scale,
            input_tokens=workload.input_tokens,
            output_tokens=workload.output_tokens,
            duration_s=workload.duration_s,
        )
    rng = np.random.default_rng(seed)
    whole = int(np.floor(scale))
    copies = whole + (rng.random(workload.arrival_s.size) < scale - whole)
    index = np.repeat(np.arange(workload.arrival_s.size), copies)
    # the first copy keeps the original time; further copies are jittered within a second
    first = np.r_[True, index[1:] != index[:-1]]
    jitter = np.where(first, 0.0, rng.random(index.size))
    arrival = np.minimum(workload.arrival_s[index] + jitter, workload.duration_s - 1e-6)
    return _build(
        workload.name,
        arrival,
        np.ones(index.size),
        workload.input_tokens[index],
        workload.output_tokens[index],
        workload.duration_s,
        empty=_scaled_to_nothing(scale, 0.0),
    )


def resolve_trace(name_or_path: str, *, traces_dir: Path | None) -> Path:
    """`builtin`, a path to a trace file, or a shared trace by either of its names
    (`forecasting.traces.resolve_trace`, which `backtest` uses too)."""
    if name_or_path == BUILTIN_TRACE:
        return BUILTIN_PATH
    try:
        return resolve_shared_trace(name_or_path, traces_dir=traces_dir)
    except TraceFormatError as err:
        raise TraceError(f"{err}; {BUILTIN_TRACE!r} is the trace shipped with the package") from err


def load_trace(path: Path, *, seed: int, name: str | None = None) -> Workload:
    """Load any supported trace file, recognised by its columns."""
    label = name or path.name.removesuffix(".gz").rsplit(".", 1)[0]
    if path.name.removesuffix(".gz").endswith(".jsonl"):
        return load_mooncake(path, name=label)
    header = header_columns(path)
    if "TIMESTAMP" in header:
        return load_azure_requests(path, name=label)
    if "requests_per_s" in header:
        return load_servegen(path, seed=seed, name=label)
    if "t_seconds" in header and "requests" in header:
        return load_per_second(path, name=label)
    shown = ",".join(sorted(header))
    shown = shown if len(shown) <= 80 else shown[:77] + "..."  # one 7 MB line was all printed
    raise TraceError(
        f"{path}: unknown trace format (columns {shown}); expected an Azure request "
        "CSV, a per-second aggregate, a ServeGen window series or Mooncake JSON lines"
    )


def header_columns(path: Path) -> set[str]:
    """The column names of a CSV trace's header row."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8-sig") as handle:
            for line in handle:
                if line.strip() and not line.startswith("#"):
                    return {c.strip() for c in line.split(",")}
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(f"{path}: cannot read trace") from err
    raise TraceError(f"{path}: empty trace file")


def _read_csv(
    path: Path, columns: tuple[str, ...], *, may_be_empty: tuple[str, ...] = ()
) -> pd.DataFrame:
    """The trace's rows, every value of `columns` present (but those in `may_be_empty`),
    numeric (but `TIMESTAMP`), finite and not negative; else a `TraceError` naming the first
    bad value. A BOM (a spreadsheet's "CSV UTF-8") is not part of the first column's name."""
    try:
        frame = pd.read_csv(path, comment="#", encoding="utf-8-sig")
    except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise TraceError(f"{path}: cannot read trace CSV ({type(err).__name__})") from err
    _require(path, frame, columns)
    if frame.empty:
        raise TraceError(f"{path}: no rows under the header")
    numeric = [c for c in columns if c != "TIMESTAMP"]
    values = frame[numeric].apply(pd.to_numeric, errors="coerce")
    _first_bad(path, values.isna() & frame[numeric].notna(), "a non-numeric value")
    _first_bad(path, frame[[c for c in columns if c not in may_be_empty]].isna(), "no value")
    finite = np.isfinite(values.to_numpy(dtype=np.float64, na_value=0.0))
    _first_bad(path, pd.DataFrame(~finite, columns=numeric), "an infinite value")
    _first_bad(path, values < 0, "a negative value")
    frame[numeric] = values
    return frame


def _first_bad(path: Path, bad: pd.DataFrame, what: str, *, row_name: str = "data row") -> None:
    """Raise for the first row with a bad value (the leftmost in it); a row's index + 1 is
    its number (data rows from 0; JSON lines index theirs by line)."""
    rows = bad.any(axis=1)
    if rows.any():
        index = rows.to_numpy().argmax()
        column = bad.iloc[index].idxmax()
        raise TraceError(
            f"{path}: {what} in column {column!r} at {row_name} {bad.index[index] + 1}"
        )


def _require(path: Path, frame: pd.DataFrame, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise TraceError(f"{path}: missing columns {missing}")


def trace_metadata(path: Path) -> dict[str, str]:
    """Attribution comment lines (`# key: value`) at the top of a shipped trace."""
    opener = gzip.open if path.suffix == ".gz" else open
    meta: dict[str, str] = {}
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if not line.startswith("#"):
                break
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
    return meta
