"""argparse value types shared by the subcommands."""

from __future__ import annotations

import argparse
import math

from autoscaler.core.policy import parse_duration


def positive_duration_s(text: str) -> float:
    """A Go-style duration longer than zero, in seconds (`90s`, `5m`, `1h30m`)."""
    try:
        seconds = parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than zero")
    if not math.isfinite(seconds):  # hundreds of digits add up to inf
        raise argparse.ArgumentTypeError(f"{text!r} is too long to be a duration")
    return seconds
