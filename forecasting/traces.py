"""Loading the shared trace formats into a `Series` of request rates.

Formats, recognised by their header:

- ServeGen 600 s aggregates: `t_seconds,requests_per_s,...` with `t_seconds` the start of
  each window. Rows where every client's rate is zero (`requests_per_s == 0` and
  `active_clients == 0`) are collection gaps, not idle service (the data README says so: the
  same hours have thousands of requests per second on the other days), so they are missing.
- Azure per-second aggregates: `t_seconds,requests,input_tokens,output_tokens`, one row per
  second including empty ones; a zero there is a real quiet second.
- Raw Azure LLM inference CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`, one row per
  request; counted per second from the first request's second.
- Mooncake JSON lines: `{"timestamp": <ms>, "input_length": ..., ...}`, one line per
  request; counted per second from time 0.

Every series is in requests per second, each value labelled by the end of the interval it
measures (the convention of `forecasting.series`).
"""

from __future__ import annotations

import csv
import gzip
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

from forecasting.errors import TraceFormatError
from forecasting.series import Series

SERVEGEN_COLUMNS = ("t_seconds", "requests_per_s")
AZURE_1S_COLUMNS = ("t_seconds", "requests")
AZURE_RAW_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TRACE_SUFFIXES = ("", ".csv", "_600s.csv", "_1s.csv", ".jsonl")
TRACES_ENV = "GANG_AUTOSCALER_TRACES"
# Longest span of arrivals read from a request trace: more is a wrong date, not a workload
# (one request dated 2099 in an Azure file asked numpy for 18 GiB of per-second counts).
MAX_SPAN_S = 92 * 86_400.0

# The shared traces by the names the commands document -> their files in the traces
# directory. Every file there also answers to its short name, the stem without `_600s` or
# `_1s` (`servegen_m-small`, `azure2023_conv`), so `simulate` and `backtest` take both.
SHARED_TRACES: dict[str, str] = {
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
    "azure-code-1s": "azure2023_code_1s.csv",
    "azure-conv-1s": "azure2023_conv_1s.csv",
    "mooncake": "mooncake_fast25_synthetic_trace.jsonl",
    "servegen-m-mid": "servegen_m-mid_600s.csv",
    "servegen-m-small": "servegen_m-small_600s.csv",
    "servegen-mm-image": "servegen_mm-image_600s.csv",
}


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    series: Series
    native_step_s: float  # the interval each row aggregates
    source: Path


def default_traces_dir() -> Path:
    """$GANG_AUTOSCALER_TRACES, else `shared/data/traces` beside the repository checkout."""
    if os.environ.get(TRACES_ENV):
        return Path(os.environ[TRACES_ENV])
    return Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"


def resolve_trace(name_or_path: str, *, traces_dir: Path | None = None) -> Path:
    """A file path as given, or a shared trace by either of its names (`servegen-m-small`,
    `servegen_m-small`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    directory = traces_dir or default_traces_dir()
    if name_or_path in SHARED_TRACES:
        candidate = directory / SHARED_TRACES[name_or_path]
        if candidate.is_file():
            return candidate
        raise TraceFormatError(
            f"shared trace {name_or_path!r}: no file {candidate.name} in {directory}"
        )
    for suffix in TRACE_SUFFIXES:
        candidate = directory / f"{name_or_path}{suffix}"
        if candidate.is_file():
            return candidate
    raise TraceFormatError(
        f"no trace file {name_or_path!r} and no shared trace of that name in {directory};"
        f" shared trace names: {', '.join(shared_trace_names(directory))}"
    )


def shared_trace_names(directory: Path) -> list[str]:
    """The names `resolve_trace` takes for the shared traces: the documented ones, then the
    short names of the files that are (or should be) in `directory`."""
    files = {Path(name) for name in SHARED_TRACES.values()}
    if directory.is_dir():
        files.update(p for p in directory.iterdir() if p.suffix in (".csv", ".jsonl"))
    return [*SHARED_TRACES, *sorted({_short_name(p) for p in files})]


def load_trace(name_or_path: str, *, traces_dir: Path | None = None) -> Trace:
    return read_trace(resolve_trace(name_or_path, traces_dir=traces_dir))


def read_trace(path: Path) -> Trace:
    """One trace file, in any of the formats above, gzip-compressed or not; `#` lines
    before the header (the attribution of the trace the package ships) are skipped."""
    try:
        with _open_text(path) as handle:
            comment_lines = 0
            first_line = handle.readline()
            while first_line.startswith("#"):
                comment_lines += 1
                first_line = handle.readline()
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise TraceFormatError(f"cannot read {path}: {err}") from err
    header = tuple(next(csv.reader([first_line]), ()))
    name = _short_name(path)
    try:
        if first_line.lstrip().startswith("{"):
            series, step_s = _mooncake(path)
        elif header[: len(SERVEGEN_COLUMNS)] == SERVEGEN_COLUMNS:
            series, step_s = _servegen(path, skiprows=comment_lines)
        elif header[: len(AZURE_1S_COLUMNS)] == AZURE_1S_COLUMNS:
            series, step_s = _azure_per_second(path, skiprows=comment_lines)
        elif header[: len(AZURE_RAW_COLUMNS)] == AZURE_RAW_COLUMNS:
            series, step_s = _azure_raw(path, skiprows=comment_lines)
        else:
            shown = ",".join(header)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise TraceFormatError(
                f"{path}: header {shown!r} matches no known trace format"
                " (ServeGen t_seconds,requests_per_s,...; Azure t_seconds,requests,...;"
                " raw Azure TIMESTAMP,ContextTokens,GeneratedTokens; Mooncake JSON lines)"
            )
    except (ValueError, KeyError, pd.errors.ParserError) as err:
        raise TraceFormatError(f"{path}: {err}") from err
    return Trace(name=name, series=series, native_step_s=step_s, source=path)


def _open_text(path: Path) -> IO[str]:
    # UTF-8 whatever the locale, and a BOM (a spreadsheet's "CSV UTF-8") is no character
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="", encoding="utf-8-sig")
    return path.open(newline="", encoding="utf-8-sig")


def _short_name(path: Path) -> str:
    stem = Path(path.name.removesuffix(".gz")).stem
    return stem.removesuffix("_600s").removesuffix("_1s")


def _regular_step(t_seconds: np.ndarray, path: Path) -> float:
    if t_seconds.size < 2:
        raise TraceFormatError(f"{path}: {t_seconds.size} rows; a series needs two at least")
    return regular_step(t_seconds, path)


def regular_step(t_seconds: np.ndarray, path: Path) -> float:
    """The one spacing of a series' `t_seconds` (two rows at least), or TraceFormatError
    naming the first row that breaks it: a window missing or out of place would otherwise
    be replayed stretched or moved."""
    steps = np.diff(t_seconds)
    step = float(steps[0])
    uneven = ~np.isclose(steps, step, rtol=0.0, atol=1e-6)
    if step <= 0 or uneven.any():
        row = int(uneven.argmax()) + 2 if step > 0 else 2  # 1-based data rows
        raise TraceFormatError(
            f"{path}: t_seconds is not evenly spaced ({step:g} s apart from the first row, "
            f"{float(steps[row - 2]):g} s before data row {row}); give every window a row"
        )
    return step


def servegen_gaps(frame: pd.DataFrame) -> np.ndarray:
    """Rows of a ServeGen window series that are collection gaps: no client sent anything."""
    gap = frame["requests_per_s"].to_numpy() == 0
    if "active_clients" in frame:
        gap &= frame["active_clients"].to_numpy() == 0
    return np.asarray(gap, dtype=bool)


def _servegen(path: Path, *, skiprows: int) -> tuple[Series, float]:
    frame = pd.read_csv(path, skiprows=skiprows)
    t = frame["t_seconds"].to_numpy(dtype=np.float64)
    step_s = _regular_step(t, path)
    rate = _counts(frame, "requests_per_s", path).copy()
    rate[servegen_gaps(frame)] = np.nan
    return Series(t + step_s, rate), step_s


def _azure_per_second(path: Path, *, skiprows: int) -> tuple[Series, float]:
    frame = pd.read_csv(path, skiprows=skiprows)
    t = frame["t_seconds"].to_numpy(dtype=np.float64)
    step_s = _regular_step(t, path)
    rate = _counts(frame, "requests", path) / step_s
    return Series(t + step_s, rate), step_s


def azure_arrival_seconds(stamps: pd.Series, path: Path) -> np.ndarray:
    """Seconds from the whole second of the first request, from an Azure trace's TIMESTAMP
    column of dates and times (`2023-11-16 18:17:03.9799600`).

    Numbers are refused: pandas reads them as nanoseconds since 1970, so epoch seconds
    squeezed an hour of requests into 4 ms, with no error."""
    if stamps.isna().all():  # pandas reads a column of empty cells as float NaN
        raise TraceFormatError(f"{path}: TIMESTAMP has no values")
    if pd.api.types.is_numeric_dtype(stamps) or pd.api.types.is_bool_dtype(stamps):
        first = stamps.iloc[0].item() if len(stamps) else ""
        raise TraceFormatError(
            f"{path}: TIMESTAMP holds numbers (the first is {first}), not dates and times "
            "like 2023-11-16 18:17:03.9799600; for times in seconds from a start, write the "
            "per-second columns t_seconds,requests,input_tokens,output_tokens"
        )
    try:
        # in UTC: times with offsets that change (a daylight-saving switch) are refused
        # otherwise, with advice for pandas' own callers
        arrivals = pd.to_datetime(stamps, format="mixed", utc=True)
    except (ValueError, TypeError) as err:  # a string that is no time, or mixed time zones
        raise TraceFormatError(f"{path}: TIMESTAMP: {err}") from err
    if arrivals.isna().any():
        raise TraceFormatError(f"{path}: unparseable TIMESTAMP values")
    seconds: np.ndarray = (arrivals - arrivals.min().floor("s")).dt.total_seconds().to_numpy()
    return seconds


def _azure_raw(path: Path, *, skiprows: int) -> tuple[Series, float]:
    frame = pd.read_csv(path, usecols=["TIMESTAMP"], skiprows=skiprows)
    return _per_second(azure_arrival_seconds(frame["TIMESTAMP"], path), path)


def read_json_lines(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    """`columns` of a JSON-lines trace as numbers (NaN where a line has none).

    Line by line, not `pandas.read_json`: that takes a key named `timestamp` for a date, so
    epoch milliseconds came out 1000x too large (a backtest that asked for 12 TiB)."""
    rows: list[dict[str, object]] = []
    lines: list[int] = []
    try:
        with _open_text(path) as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip() or line.startswith("#"):  # the attribution lines
                    continue
                lines.append(number)
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise TraceFormatError(
                        f"{path}: line {number} is not JSON ({err.msg})"
                    ) from err
                if not isinstance(row, dict):
                    raise TraceFormatError(f"{path}: line {number} is not a JSON object")
                rows.append({c: row.get(c) for c in columns})
    except (OSError, UnicodeDecodeError) as err:
        raise TraceFormatError(f"{path}: cannot read trace ({type(err).__name__})") from err
    if not rows:
        raise TraceFormatError(f"{path}: no JSON lines")
    # indexed by line number - 1, so that a bad value's index + 1 is its line in the file
    frame = pd.DataFrame(rows, columns=list(columns), index=np.asarray(lines) - 1)
    return frame.apply(pd.to_numeric, errors="coerce").astype(np.float64)


def _mooncake(path: Path) -> tuple[Series, float]:
    milliseconds = read_json_lines(path, ("timestamp",))["timestamp"].to_numpy(np.float64)
    if not np.isfinite(milliseconds).all() or (milliseconds < 0).any():
        raise TraceFormatError(f"{path}: timestamp values must be milliseconds, finite, >= 0")
    return _per_second((milliseconds - milliseconds.min()) / 1000.0, path)


def _counts(frame: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    """A count or rate column: numbers, finite and not negative."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        row = int(bad.argmax()) + 1
        raise TraceFormatError(
            f"{path}: {column} at data row {row} is {frame[column].iloc[row - 1]!r}, not a "
            "finite number >= 0"
        )
    return np.asarray(values, dtype=np.float64)


def _per_second(arrival_s: np.ndarray, path: Path) -> tuple[Series, float]:
    """Requests per second, each whole second (from 0) a value, empty ones included."""
    span_s = float(arrival_s.max()) if arrival_s.size else 0.0
    if span_s > MAX_SPAN_S:
        last = int(arrival_s.argmax())
        raise TraceFormatError(
            f"{path}: the requests span {span_s / 86_400:,.4g} days (the latest is request "
            f"{last + 1}); at most {MAX_SPAN_S / 86_400:.0f} are read, a second at a time "
            "(a wrong date or time in the trace?)"
        )
    counts = np.bincount(np.floor(arrival_s).astype(np.int64)).astype(np.float64)
    t = np.arange(counts.size, dtype=np.float64)
    return Series(t + 1.0, counts), 1.0
