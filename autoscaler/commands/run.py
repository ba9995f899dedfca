"""`gang-autoscaler run`: parse the service's settings and start it.

Only wiring: the flags come from `autoscaler.service.settings`, the service from
`autoscaler.service.app`, imported when the command runs so that `--help` and the other
subcommands never pay for (or depend on) the service's imports.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any

from autoscaler.service.settings import SettingsError, add_run_arguments, load_settings

log = logging.getLogger(__name__)

# Exit codes: 2 is argparse's own for bad usage; settings errors are bad usage too.
EXIT_BAD_SETTINGS = 2
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE from sysexits.h


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="run the autoscaling service",
        description="Run the autoscaling service: watch opted-in LeaderWorkerSets, scale them "
        "in whole gangs and keep their balloon-gang buffers. Every flag can also be set with a "
        "GANG_AUTOSCALER_* environment variable or in the --config file.",
    )
    add_run_arguments(parser)
    # The service sets up logging itself, from --log-format (JSON for log pipelines).
    parser.set_defaults(func=_run, configures_logging=True)


def _run(args: argparse.Namespace) -> int:
    given = {
        key: value
        for key, value in vars(args).items()
        # --log-level is a top-level flag; passed on only when given, so that the
        # environment or the config file can set it otherwise.
        if key not in ("func", "command") and not (key == "log_level" and value is None)
    }
    try:
        settings = load_settings(argparse.Namespace(**given))
    except SettingsError as err:
        print(f"gang-autoscaler run: {err}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        app = importlib.import_module("autoscaler.service.app")
    except ModuleNotFoundError as err:
        if err.name != "autoscaler.service.app":
            raise
        print(
            "gang-autoscaler run: the service loop (autoscaler.service.app) is not part of "
            "this build yet; the settings are valid but nothing was started",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    code: int = app.run_service(settings)
    return code
