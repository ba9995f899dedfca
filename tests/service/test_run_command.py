"""`gang-autoscaler run` refuses bad settings before starting anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_an_unusable_kubeconfig_stops_the_service_with_one_line(tmp_path: Path) -> None:
    # The real command, as a subprocess: the service sets up the process's logging itself.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("garbage: [\n")
    command = [
        sys.executable,
        "-c",
        "import sys; from autoscaler.cli import main; sys.exit(main())",
        "run",
        "--prometheus-url=http://127.0.0.1:1",
        f"--kubeconfig={kubeconfig}",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANG_AUTOSCALER_")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith(
        f"cannot connect to Kubernetes: kubeconfig {kubeconfig}: not valid YAML: expected the "
        "node content, but found '<stream end>' (line 2, column 1)"
    )


def test_a_misspelled_variable_stops_the_command_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Singular like the flag --namespace; ignored, it left the service watching everything.
    monkeypatch.setenv("GANG_AUTOSCALER_NAMESPACE", "team-a")
    assert main(["run", "--prometheus-url", "http://p:1"]) == 2
    assert capsys.readouterr().err == (
        "gang-autoscaler run: invalid settings:\n"
        "  environment variable GANG_AUTOSCALER_NAMESPACE: unknown setting; "
        "did you mean GANG_AUTOSCALER_NAMESPACES?\n"
    )
