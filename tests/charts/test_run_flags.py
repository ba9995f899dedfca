"""The chart passes only flags that `gang-autoscaler run` really has (read from its --help)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from typing import Any

import pytest

from tests.charts.conftest import one

FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def help_flags(*argv: str) -> set[str]:
    # The installed console script when there is one (what the image runs), else the module.
    script = shutil.which("gang-autoscaler")
    command = [script] if script else [sys.executable, "-m", "autoscaler.cli"]
    result = subprocess.run(
        [*command, *argv, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(FLAG.findall(result.stdout))


@pytest.fixture(scope="session")
def run_flags() -> set[str]:
    return help_flags("run")


@pytest.fixture(scope="session")
def top_flags() -> set[str]:
    return help_flags()


def test_run_help_lists_the_design_flags(run_flags: set[str]) -> None:
    design = {
        "--kubeconfig",
        "--prometheus-url",
        "--namespace",
        "--tick",
        "--dry-run",
        "--http-port",
        "--lease-namespace",
        "--log-format",
        "--config",
    }
    assert design <= run_flags


def test_every_flag_the_chart_passes_exists(
    rendered: list[dict[str, Any]], run_flags: set[str], top_flags: set[str]
) -> None:
    (container,) = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    assert "run" in args
    split = args.index("run")
    for arg, known in [(a, top_flags) for a in args[:split]] + [
        (a, run_flags) for a in args[split + 1 :]
    ]:
        assert arg.startswith("--"), f"positional {arg!r} in the chart's args"
        flag = arg.split("=", 1)[0]
        assert flag in known, f"the chart passes {flag}, which `gang-autoscaler` does not have"
