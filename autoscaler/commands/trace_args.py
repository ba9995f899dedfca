"""`--trace` and `--traces-dir`, which `simulate` and `backtest` take alike.

One definition, so both commands accept the same names (`builtin`, the shared traces by
either spelling, a file) through the simulator's resolver and say so in the same words.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoscaler.sim.workload import BUILTIN_TRACE, resolve_trace
from forecasting import traces


def add_trace_arguments(parser: argparse.ArgumentParser, *, default: str) -> None:
    parser.add_argument(
        "--trace",
        default=default,
        metavar="NAME|PATH",
        help=f"a trace file, {BUILTIN_TRACE} (shipped with the package), or a shared trace in "
        f"--traces-dir by name ({', '.join(traces.SHARED_TRACES)}) or by its file's short "
        f"name (e.g. servegen_m-small, AzureLLMInferenceTrace_conv); default: {default}",
    )
    parser.add_argument(
        "--traces-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"directory of the shared traces (default ${traces.TRACES_ENV} or "
        "../shared/data/traces)",
    )


def trace_path(args: argparse.Namespace) -> Path:
    """The file `--trace` names; raises `autoscaler.sim.errors.TraceError`."""
    traces_dir: Path = args.traces_dir or traces.default_traces_dir()
    return resolve_trace(args.trace, traces_dir=traces_dir)
