"""The acceptance table: read from real `simulate --json` output, and each criterion's edge
computed by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoscaler.cli import main as cli
from benchmarks.acceptance import judge
from benchmarks.acceptance import main as acceptance


def _policies(**gang: float) -> dict[str, dict[str, Any]]:
    """gang at 99.5 %, 130 GPU-h and no partial gangs unless told; oracle 100 GPU-h, static
    200, reactive 99 %."""
    base = {"slo_attainment": 0.995, "gpu_hours": 130.0, "partial_gang_gpu_hours": 0.0}
    return {
        "gang": base | gang,
        "oracle": {"slo_attainment": 1.0, "gpu_hours": 100.0, "partial_gang_gpu_hours": 0.0},
        "static": {"slo_attainment": 1.0, "gpu_hours": 200.0, "partial_gang_gpu_hours": 0.0},
        "reactive": {"slo_attainment": 0.99, "gpu_hours": 150.0, "partial_gang_gpu_hours": 0.0},
    }


def test_the_edges_of_each_criterion() -> None:
    # exactly 99 % and exactly 1.3x the oracle pass; the same GPU-hours as static do not
    assert [c.holds for c in judge(_policies(slo_attainment=0.99))] == [
        True,
        True,
        True,
        False,  # 99 % is not above reactive's 99 %
        True,
    ]
    assert [c.holds for c in judge(_policies(gpu_hours=130.01))][1] is False
    assert [c.holds for c in judge(_policies(gpu_hours=200.0))][2] is False
    assert [c.holds for c in judge(_policies(partial_gang_gpu_hours=0.01))][4] is False
    assert all(c.holds for c in judge(_policies()))


def test_a_reactive_policy_that_missed_nothing_cannot_be_beaten_and_the_cell_says_so() -> None:
    policies = _policies(slo_attainment=1.0)
    policies["reactive"]["slo_attainment"] = 1.0
    cell = judge(policies)[3]
    assert not cell.holds
    assert str(cell) == "**no** (100.00%, missed none: at most a tie)"


def test_the_table_reads_what_simulate_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "builtin.json"
    argv = ["simulate", "--duration", "10m", "--no-progress", "--json", str(out)]
    assert cli(argv) == 0
    capsys.readouterr()
    policies = json.loads(out.read_text())["policies"]
    cells = judge(policies)
    code = acceptance([str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| trace | SLO >= 99% |")
    assert lines[2] == "| builtin | " + " | ".join(map(str, cells)) + " |"
    assert f"({policies['gang']['slo_attainment']:.2%})" in lines[2]
    assert code == (0 if all(c.holds for c in cells) else 1)


def test_nothing_to_read_is_said_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert acceptance([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"acceptance: no <trace>.json in {tmp_path}\n"
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"x\.json: not a simulate --json result"):
        acceptance([str(tmp_path)])
