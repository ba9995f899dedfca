"""The top-level `gang-autoscaler` parser: `--log-level` is a checked choice in any case."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from autoscaler.cli import LOG_LEVELS, build_parser, main
from autoscaler.service.settings import RunSettings


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
