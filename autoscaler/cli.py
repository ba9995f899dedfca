"""The `gang-autoscaler` command line: argument parsing and wiring only.

Logging is configured here, once, and nowhere on import.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

# Each entry is a module under autoscaler.commands exposing add_parser(subparsers).
COMMANDS: tuple[str, ...] = ("check", "run", "backtest", "simulate")
# The levels `run`'s settings accept (autoscaler.service.settings.RunSettings.log_level).
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR")


def _version() -> str:
    try:
        return importlib.metadata.version("gang-autoscaler")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gang-autoscaler",
        description="Whole-gang autoscaling for LeaderWorkerSet LLM inference deployments.",
    )
    log_level: dict[str, Any] = {
        "type": str.upper,
        "choices": LOG_LEVELS,
        "metavar": "LEVEL",
        "help": f"logging level ({', '.join(LOG_LEVELS)}; any case); default INFO, or for "
        "`run` its environment or config file setting",
    }
    parser.add_argument("--log-level", default=None, **log_level)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"autoscaler.commands.{name}").add_parser(subparsers)
    # Also after the command (`gang-autoscaler run --log-level debug`); not given there, it
    # leaves the one given before the command alone.
    for command in subparsers.choices.values():
        command.add_argument("--log-level", default=argparse.SUPPRESS, **log_level)
    return parser


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "configures_logging", False):
        logging.basicConfig(
            level=args.log_level or "INFO",
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
    code: int = args.func(args)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    # A reader that stops early (`gang-autoscaler simulate | head -3`) closes the pipe; the
    # next write raises BrokenPipeError. This is the handling the Python docs recommend
    # (library/signal.html, "Note on SIGPIPE"): flush inside the try so the error is raised
    # here rather than at interpreter exit, then point stdout at devnull so that exit's own
    # flush cannot fail again. Not `signal(SIGPIPE, SIG_DFL)`: the same docs warn that it
    # kills the process whenever any socket's peer goes away, and `run` writes to sockets.
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # also after --help, which leaves by SystemExit
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1  # what Python itself exits with on EPIPE, as in the docs' example


if __name__ == "__main__":
    sys.exit(main())
