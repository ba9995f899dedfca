"""`gang-autoscaler run` refuses bad settings before starting anything."""

from __future__ import annotations

import os

import pytest

from autoscaler.cli import main


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("GANG_AUTOSCALER_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        pytest.param(["run"], "prometheus_url", id="missing-url"),
        pytest.param(["run", "--prometheus-url", "http://p:1", "--tick", "5"], "tick", id="tick"),
        pytest.param(
            ["run", "--prometheus-url", "http://p:1", "--config", "/nonexistent/c.yaml"],
            "/nonexistent/c.yaml",
            id="missing-config",
        ),
    ],
)
def test_bad_settings_exit_2_and_name_the_problem(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert named in capsys.readouterr().err


def test_unknown_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--prometheus-url", "http://p:1", "--tik", "15s"])
    assert exit_info.value.code == 2
    assert "--tik" in capsys.readouterr().err
