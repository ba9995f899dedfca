"""The top-level `gang-autoscaler` command: `--log-level` is a checked choice in any case,
and a reader that goes away early ends it quietly."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from autoscaler.cli import LOG_LEVELS, build_parser, main
from autoscaler.service.settings import RunSettings

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("given", "level"),
    [
        pytest.param("warning", "WARNING", id="lower"),
        pytest.param("Debug", "DEBUG", id="mixed"),
        pytest.param("ERROR", "ERROR", id="upper"),
    ],
)
def test_log_level_is_taken_in_any_case(given: str, level: str) -> None:
    args = build_parser().parse_args(["--log-level", given, "check", "x.yaml"])
    assert args.log_level == level


def test_unknown_log_level_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "empty.yaml"
    manifest.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["--log-level", "bogus", "check", str(manifest)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--log-level: invalid choice" in err
    assert "WARNING" in err


def test_log_levels_are_those_run_accepts() -> None:
    annotation = RunSettings.model_fields["log_level"].annotation
    assert typing.get_args(annotation) == LOG_LEVELS


SIMULATE_A_MINUTE = ["simulate", "--duration", "1m", "--no-progress"]


def run_with_no_reader(argv: list[str], *, unbuffered: bool) -> subprocess.CompletedProcess[str]:
    """`gang-autoscaler ARGV | head -3`, made deterministic: the pipe's only reader is closed
    before the command starts, so its first write to stdout meets EPIPE."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        # `-m` from the checkout, so the code under test is this tree's, not an installed one
        return subprocess.run(
            [sys.executable, "-m", "autoscaler.cli", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=env,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    ("argv", "unbuffered"),
    [
        # a terminal user's stdout to a pipe is block-buffered: the write happens at the end
        pytest.param(SIMULATE_A_MINUTE, False, id="simulate-buffered"),
        # PYTHONUNBUFFERED=1, as container images often set: the first print writes
        pytest.param(SIMULATE_A_MINUTE, True, id="simulate-unbuffered"),
        # printed by argparse, which leaves by SystemExit with the text still buffered
        pytest.param(["--help"], False, id="help-buffered"),
    ],
)
def test_a_reader_that_went_away_ends_the_command_without_a_traceback(
    argv: list[str], unbuffered: bool
) -> None:
    result = run_with_no_reader(argv, unbuffered=unbuffered)
    assert "BrokenPipeError" not in result.stderr
    assert "Traceback" not in result.stderr
    assert result.returncode == 1  # as Python's own exit on EPIPE, not 120 (failed flush)


def test_a_reader_that_went_away_takes_no_output_file_with_it(tmp_path: Path) -> None:
    """`simulate --json J --report R | head -1` wrote neither: the table was printed first,
    and the closed pipe ended the command before the files."""
    argv = [*SIMULATE_A_MINUTE, "--policy", "static"]
    argv += ["--json", str(tmp_path / "out.json"), "--report", str(tmp_path / "report")]
    result = run_with_no_reader(argv, unbuffered=True)
    assert result.returncode == 1
    assert json.loads((tmp_path / "out.json").read_text())["policies"]["static"]
    assert (tmp_path / "report" / "report.md").is_file()


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert (
        capsys.readouterr().out
        == f"gang-autoscaler {importlib.metadata.version('gang-autoscaler')}\n"
    )


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        pytest.param(["--log-level", "error", "check", "x.yaml"], "ERROR", id="before"),
        pytest.param(["check", "x.yaml", "--log-level", "debug"], "DEBUG", id="after"),
        pytest.param(["check", "x.yaml"], None, id="neither"),
    ],
)
def test_the_log_level_is_taken_before_or_after_the_command(argv: list[str], level: str | None):
    """`gang-autoscaler run --log-level debug` was refused as an unrecognized argument."""
    assert build_parser().parse_args(argv).log_level == level
