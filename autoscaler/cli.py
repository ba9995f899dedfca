"""The `gang-autoscaler` command line: argument parsing and wiring only.

Logging is configured here, once, and nowhere on import.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# Each entry is a module under autoscaler.commands exposing add_parser(subparsers).
COMMANDS: tuple[str, ...] = ("check", "run", "backtest", "simulate")
# The levels `run`'s settings accept (autoscaler.service.settings.RunSettings.log_level).
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gang-autoscaler",
        description="Whole-gang autoscaling for LeaderWorkerSet LLM inference deployments.",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        type=str.upper,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        help=f"logging level ({', '.join(LOG_LEVELS)}; any case); default INFO, or for `run` "
        "its environment or config file setting",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"autoscaler.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
