"""Whole runs on short slices of the real traces: determinism, the JSON contract, the CLI."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from autoscaler.cli import main
from autoscaler.sim.config import load_settings
from autoscaler.sim.errors import ConfigError, TraceError
from autoscaler.sim.gang_policy import GangController
from autoscaler.sim.runner import build_controllers, compare, load_workload, with_quota
from autoscaler.sim.workload import (
    BUILTIN_PATH,
    fill_collection_gaps,
    load_per_second,
    load_servegen,
    load_trace,
    scale_requests,
    trace_metadata,
)
from tests.harness.shared_data import shared_data_path

TRACES = ("traces",)
POLICY_KEYS = {
    "slo_attainment",
    "gpu_hours",
    "partial_gang_gpu_hours",
    "scale_events",
    "p99_ttft_s",
}


def _azure_conv_slice(minutes: float = 12.0):  # type: ignore[no-untyped-def]
    settings = load_settings()
    path = shared_data_path("traces", "AzureLLMInferenceTrace_conv.csv")
    workload, scale = load_workload(path, settings, scale=None, name="azure-conv")
    return workload.slice(0.0, minutes * 60), scale, settings


def test_same_seed_same_json() -> None:
    workload, scale, settings = _azure_conv_slice()
    first = compare(workload, settings, trace="azure-conv", scale=scale, progress=False)
    again = compare(workload, settings, trace="azure-conv", scale=scale, progress=False)
    assert json.dumps(first.as_json()) == json.dumps(again.as_json())
    assert set(first.as_json()["policies"]) == {"gang", "reactive", "static", "oracle"}


def test_servegen_sampling_is_seeded() -> None:
    path = shared_data_path("traces", "servegen_mm-image_600s.csv")
    a = load_servegen(path, seed=1, rate_scale=2.0)
    b = load_servegen(path, seed=1, rate_scale=2.0)
    c = load_servegen(path, seed=2, rate_scale=2.0)
    assert np.array_equal(a.requests, b.requests)
    assert not np.array_equal(a.requests, c.requests)
    # 144 windows of 600 s sampled per second; the Poisson total tracks the scaled rate
    assert a.duration_s == 144 * 600
    expected = 2.0 * 600 * float(np.loadtxt(path, delimiter=",", skiprows=1, usecols=1).sum())
    assert a.total_requests == pytest.approx(expected, rel=0.01)


def test_request_traces_load_every_row() -> None:
    conv = load_trace(shared_data_path("traces", "AzureLLMInferenceTrace_conv.csv"), seed=0)
    assert conv.total_requests == 19_366
    assert conv.duration_s == pytest.approx(3_502, abs=1)
    mooncake = load_trace(
        shared_data_path("traces", "mooncake_fast25_synthetic_trace.jsonl"), seed=0
    )
    assert mooncake.total_requests == 3_993
    per_second = load_per_second(shared_data_path("traces", "azure2023_conv_1s.csv"))
    assert per_second.total_requests == 19_366
    assert per_second.prompt_tokens().sum() == pytest.approx(conv.prompt_tokens().sum())


def test_scaling_a_request_trace_keeps_whole_requests() -> None:
    conv = load_trace(shared_data_path("traces", "AzureLLMInferenceTrace_conv.csv"), seed=0)
    scaled = scale_requests(conv, 2.5, seed=0)
    assert np.all(scaled.requests == 1.0)
    assert scaled.total_requests == pytest.approx(2.5 * 19_366, rel=0.02)
    assert np.all(np.diff(scaled.arrival_s) >= 0)


def test_builtin_trace_carries_its_attribution() -> None:
    meta = trace_metadata(BUILTIN_PATH)
    assert "CC-BY 4.0" in meta["license"]
    builtin = load_trace(BUILTIN_PATH, seed=0)
    shared = load_per_second(shared_data_path("traces", "azure2023_conv_1s.csv"))
    assert np.array_equal(builtin.requests, shared.requests)


def test_a_malformed_trace_is_refused_with_its_row(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("t_seconds,requests,input_tokens,output_tokens\n0,1,10,5\n1,x,10,5\n")
    with pytest.raises(TraceError, match=r"requests.*row 2"):
        load_trace(bad, seed=0)
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match=r"unknown trace format \(columns a,b\)"):
        load_trace(unknown, seed=0)
    wide = tmp_path / "wide.csv"  # a 7 MB header line was printed whole
    wide.write_text(",".join(f"c{i}" for i in range(10_000)) + "\n")
    with pytest.raises(TraceError, match=r"columns c0,c1,.{60,}\.\.\.\); expected") as caught:
        load_trace(wide, seed=0)
    assert len(str(caught.value)) < 300


PER_SECOND = "t_seconds,requests,input_tokens,output_tokens\n0,1,10,5\n"
SERVEGEN = "t_seconds,requests_per_s,mean_input_tokens,mean_output_tokens\n"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # each was a traceback or a misleading message in the middle of the run
        pytest.param("a.csv", PER_SECOND + "1,2,,10\n", r"no value.*input_tokens.*row 2",
                     id="empty-token-field"),
        pytest.param("a.csv", PER_SECOND + "1,2,nan,10\n", r"no value.*input_tokens.*row 2",
                     id="nan-tokens"),
        pytest.param("a.csv", PER_SECOND + "-1,2,20,10\n", r"negative.*t_seconds.*row 2",
                     id="negative-time"),
        pytest.param("a.csv", PER_SECOND + "1,inf,20,10\n", r"infinite.*requests.*row 2",
                     id="infinite-count"),
        pytest.param("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nnot-a-date,10,5\n",
                     "TIMESTAMP", id="azure-time-not-a-time"),
        pytest.param("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1700000000.5,10,5\n",
                     r"TIMESTAMP holds numbers", id="azure-time-epoch-seconds"),
        pytest.param("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n,10,5\n",
                     r"no value.*TIMESTAMP.*row 1", id="azure-time-empty"),
        pytest.param("a.csv", SERVEGEN + "600,1,10,5\n0,1,10,5\n",
                     r"t_seconds must increase.*row 2", id="servegen-out-of-order"),
        pytest.param("a.jsonl", '{"timestamp": 0, "input_length": 5}\n',
                     r"no number.*output_length.*line 1", id="jsonl-missing-key"),
        pytest.param("a.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{\n',
                     r"line 2 is not JSON", id="jsonl-bad-line"),
        pytest.param("a.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n\n'
                     '{"timestamp": 5, "input_length": -5, "output_length": 1}\n',
                     r"negative.*input_length.*line 3", id="jsonl-counts-file-lines"),
        pytest.param("a.jsonl", "\n\n", "no JSON lines", id="jsonl-empty"),
        pytest.param("a.jsonl", "[1, 2]\n", "line 1 is not a JSON object", id="jsonl-not-object"),
        pytest.param("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no rows",
                     id="azure-header-only"),
        pytest.param("a.csv", PER_SECOND + "1,2,,\n", r"no value.*input_tokens.*row 2",
                     id="busy-second-without-tokens"),
    ],
)  # fmt: skip
def test_a_bad_value_in_a_trace_is_refused_with_where_it_is(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        load_workload(path, load_settings(), scale=None, name="t")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("per_second.csv", PER_SECOND + "1,2,20,10\n", id="cohorts"),
        pytest.param("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:17:03.98,10,5\n", id="requests"),
        pytest.param("servegen.csv", SERVEGEN + "0,1,10,5\n600,1,10,5\n", id="windows"),
    ],
)  # fmt: skip
def test_a_scale_that_leaves_less_than_one_request_is_refused(
    tmp_path: Path, name: str, text: str
) -> None:
    """`--scale 1e-9` ran every policy on a millionth of a request: 100 % SLO for all four."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=r"at --scale 1e-09 the trace has .* fewer than one"):
        load_workload(path, load_settings(), scale=1e-9, name="t")
    workload, _ = load_workload(path, load_settings(), scale=1.0, name="t")
    assert workload.total_requests >= 1


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("per_second.csv", PER_SECOND + "1,2,20,10\n", id="cohorts"),
        pytest.param("servegen.csv", SERVEGEN + "0,1,10,5\n600,1,10,5\n", id="windows"),
    ],
)
def test_a_scale_past_the_largest_fleet_a_run_is_sized_for_is_refused(
    tmp_path: Path, name: str, text: str
) -> None:
    """`--scale 1e300` ended in an IndexError traceback, 1e6 ran for hours."""
    path = tmp_path / name
    path.write_text(text)
    _, sized = load_workload(path, load_settings(), scale=None, name="t")
    assert load_workload(path, load_settings(), scale=sized * 250, name="t")[1] == sized * 250
    with pytest.raises(TraceError, match=r"need about 2,008 prefill gangs; .* at most 2,000"):
        load_workload(path, load_settings(), scale=sized * 251, name="t")


def test_a_request_trace_spanning_more_than_92_days_is_refused(tmp_path: Path) -> None:
    """A gap of 1e12 s between two rows asked numpy for 124 GiB."""
    path = tmp_path / "gap.csv"
    path.write_text(PER_SECOND + "1e12,1,100,10\n")
    with pytest.raises(TraceError, match=r"the arrivals span 1\.16e\+07 days; .* at most 92"):
        load_workload(path, load_settings(), scale=None, name="t")


def test_a_trace_saved_with_a_bom_or_in_another_encoding(tmp_path: Path) -> None:
    """A spreadsheet's "CSV UTF-8" starts with a BOM, which became part of the first
    column's name (`unknown trace format`); UTF-16 was a UnicodeDecodeError traceback."""
    bom = tmp_path / "bom.csv"
    bom.write_bytes(("\ufeff" + PER_SECOND + "1,2,20,10\n").encode())
    assert load_trace(bom, seed=0).total_requests == 3
    utf16 = tmp_path / "utf16.csv"
    utf16.write_text(SERVEGEN + "0,1,10,5\n", encoding="utf-16")
    with pytest.raises(TraceError, match="cannot read"):
        load_workload(utf16, load_settings(), scale=None, name="t")


def test_valid_traces_the_checks_must_not_refuse(tmp_path: Path) -> None:
    # an empty second may leave its token sums empty
    quiet = tmp_path / "quiet.csv"
    quiet.write_text(PER_SECOND + "1,0,,\n2,1,10,5\n")
    assert load_trace(quiet, seed=0).total_requests == 2
    # JSON lines with a BOM, gzip'd
    packed = tmp_path / "mc.jsonl.gz"
    line = '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
    packed.write_bytes(gzip.compress(("\ufeff" + line).encode()))
    assert load_trace(packed, seed=0).total_requests == 1


def test_mooncake_epoch_milliseconds_are_milliseconds_not_dates(tmp_path: Path) -> None:
    """`pandas.read_json` took the `timestamp` key for a date: epoch milliseconds came out
    1000x too late, and the run asked for TiBs."""
    path = tmp_path / "epoch.jsonl"
    path.write_text(
        '{"timestamp": 1700000000000, "input_length": 100, "output_length": 5}\n'
        '{"timestamp": 1700000060000, "input_length": 100, "output_length": 5}\n'
    )
    workload = load_trace(path, seed=0)
    assert workload.arrival_s.tolist() == [0.0, 60.0]
    assert workload.duration_s == 61.0


def test_a_per_second_trace_is_replayed_from_its_first_row(tmp_path: Path) -> None:
    """The other loaders count from the first request; this one counted from 0, so a trace
    in epoch seconds asked for decades of empty steps first."""
    path = tmp_path / "late.csv"
    header = PER_SECOND.splitlines()[0]
    path.write_text(header + "\n1700000000,2,20,10\n1700000001,0,,\n1700000002,1,10,5\n")
    workload = load_trace(path, seed=0)
    assert workload.arrival_s.tolist() == [0.5, 2.5]
    assert workload.duration_s == 3.0


def test_a_servegen_series_with_a_window_missing_is_refused(tmp_path: Path) -> None:
    """Each row replays for the series' window length: the median spacing stretched every
    window of 0, 600, 1800 to 900 s and moved the third."""
    path = tmp_path / "gap.csv"
    path.write_text(SERVEGEN + "0,1,10,5\n600,1,10,5\n1800,1,10,5\n")
    with pytest.raises(
        TraceError,
        match=r"t_seconds is not evenly spaced \(600 s apart from the first row, 1200 s before "
        r"data row 3\); give every window a row",
    ):
        load_workload(path, load_settings(), scale=None, name="t")


def test_a_compressed_servegen_series_is_sized_as_the_plain_one(tmp_path: Path) -> None:
    """A `.csv.gz` was sampled at x1 and its counts then multiplied, with another scale."""
    text = SERVEGEN + "0,1,1000,50\n600,3,1000,50\n1200,2,1000,50\n"
    plain = tmp_path / "sg.csv"
    plain.write_text(text)
    packed = tmp_path / "sg.csv.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    settings = load_settings()
    workload, scale = load_workload(plain, settings, scale=None, name="t")
    workload_gz, scale_gz = load_workload(packed, settings, scale=None, name="t")
    assert scale_gz == scale
    assert workload_gz.requests.tolist() == workload.requests.tolist()


def test_a_servegen_series_with_nothing_to_size_by_asks_for_a_scale(tmp_path: Path) -> None:
    path = tmp_path / "quiet.csv"
    path.write_text(SERVEGEN + "0,1,,\n600,2,,\n")
    with pytest.raises(TraceError, match="give --scale"):
        load_workload(path, load_settings(), scale=None, name="t")


def test_a_bad_config_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "sim.yaml"
    config.write_text("cluster:\n  gpus_per_pod: 16\n")
    with pytest.raises(ConfigError, match="gpus_per_pod"):
        load_settings(config)
    config.write_text("serving:\n  prefill_tokens_per_s_per_pod: 5000\n")
    assert load_settings(config).serving.prefill_tokens_per_s_per_pod == 5000


def test_gang_policy_drives_the_real_core() -> None:
    workload, _, settings = _azure_conv_slice(minutes=5)
    settings = with_quota(workload, settings)
    (controller,) = build_controllers(workload, settings, ["gang"])
    assert isinstance(controller, GangController)
    from autoscaler.sim.engine import simulate

    simulate(workload, controller, settings, progress=False)
    assert controller.last_plan is not None
    plans = list(controller.last_plan.components.values())
    assert {p.key.lws for p in plans} == {"model-prefill", "model-decode"}
    assert all(p.reason and p.steps for p in plans)


def test_gang_policy_plans_from_the_forecaster_it_is_given() -> None:
    # a forecaster that always expects 1.3M prompt tokens/s: at the prefill capacity per
    # gang (36,000 tokens/s) and the burst factor of the slice's readings the forecast floor
    # asks for more than 36 gangs, which the default forecaster on this calm slice never does
    from autoscaler.sim.engine import simulate
    from forecasting.baselines import Persistence
    from forecasting.models import make_forecaster
    from forecasting.protocol import ForecastResult

    class Expects(Persistence):
        def forecast(self, horizon_s: float) -> ForecastResult:
            return ForecastResult(point=1.3e6, upper=1.3e6, quantile=0.9, horizon_s=horizon_s)

    workload, _, settings = _azure_conv_slice(minutes=5)
    settings = with_quota(workload, settings)
    built: list[str] = []

    def factory(component: str, step_s: float):  # type: ignore[no-untyped-def]
        built.append(component)
        return Expects(step_s=step_s) if component == "prefill" else make_forecaster(step_s=step_s)

    (controller,) = build_controllers(workload, settings, ["gang"], forecaster_factory=factory)
    result = simulate(workload, controller, settings, progress=False)
    assert sorted(built) == ["decode", "prefill"]
    # the capacity planned with, from the first tick: the annotation's
    planned = result.series["prefill_capacity_per_gang"][round(settings.tick_s / settings.step_s) :]
    assert set(planned.tolist()) == {36_000.0}
    assert controller.last_plan is not None
    plans = {p.key.lws: p for p in controller.last_plan.components.values()}
    floors = {
        p: [s.gangs for s in plan.steps if s.stage == "forecast"] for p, plan in plans.items()
    }
    prefill = plans["model-prefill"]
    assert prefill.capacity_per_gang == 36_000.0
    assert prefill.burst_factor is not None and prefill.burst_factor > 1
    wanted = math.ceil(1.3e6 * prefill.burst_factor / 36_000.0)
    assert floors["model-prefill"] == [wanted]
    assert wanted not in floors["model-decode"]  # decode plans from its own, default forecaster


def test_cli_writes_the_design_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.json"
    report = tmp_path / "report"
    code = main(
        [
            "simulate",
            "--duration",
            "10m",
            "--json",
            str(out),
            "--report",
            str(report),
            "--no-progress",
        ]
    )
    assert code == 0
    document = json.loads(out.read_text())
    assert set(document) == {"trace", "policies"}
    assert document["trace"] == "builtin"
    for name, figures in document["policies"].items():
        assert set(figures) == POLICY_KEYS, name
        assert 0.0 <= figures["slo_attainment"] <= 1.0
        assert math.isfinite(figures["p99_ttft_s"])
        assert isinstance(figures["scale_events"], int)
    printed = capsys.readouterr().out
    assert "| gang" in printed and "| oracle" in printed
    assert "nodes booting or idle" in printed  # where the GPU-hours go
    assert "## Where the GPU-hours go" in (report / "report.md").read_text()
    for name in ("report.md", "timeseries.csv", "gangs_and_balloons.png", "ttft_percentiles.png"):
        assert (report / name).stat().st_size > 0


def test_cli_refuses_an_unknown_trace(capsys: pytest.CaptureFixture[str]) -> None:
    traces_dir = str(shared_data_path("traces"))
    argv = ["simulate", "--trace", "no-such-trace", "--traces-dir", traces_dir, "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no-such-trace" in err
    # the names it takes, in both spellings
    for name in (
        "builtin",
        "servegen-m-small",
        "servegen_m-small",
        "azure-conv-1s",
        "azure2023_conv",
    ):
        assert name in err


def test_cli_runs_a_trace_named_as_backtest_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    traces_dir = str(shared_data_path("traces"))
    argv = ["simulate", "--trace", "azure2023_conv", "--traces-dir", traces_dir]
    assert main([*argv, "--duration", "5m", "--policy", "static", "--no-progress"]) == 0
    assert "trace azure2023_conv: " in capsys.readouterr().out


def test_cli_names_a_bad_gang_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "sim.yaml"
    config.write_text('gang: {prefill: {max-bufer: "1", lead-time: "5"}}\n')
    argv = ["simulate", "--config", str(config), "--duration", "1m", "--no-progress"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "gang.prefill.lead-time: '5' is not a duration" in captured.err
    assert "gang.prefill.max-bufer: unknown annotation" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("config", "flags", "expected"),
    [
        pytest.param(
            None,
            ["--step", "7s"],
            "invalid simulator configuration:\n"
            "  settings: tick_s (15 s) must be a whole multiple of step_s (7 s)",
            id="step-not-dividing-the-tick",
        ),
        pytest.param(
            "clusterx: {}\nstep_s: -1\n",
            [],
            "{path}: invalid simulator configuration:\n"
            "  step_s: -1 s is shorter than 0.1 s, the shortest step the simulator takes "
            "(a run's memory and time grow with the number of steps)\n"
            "  clusterx: unknown setting",
            id="every-problem-once-by-its-key",
        ),
        pytest.param(
            None,
            ["--step", "1ns"],  # 10 minutes of 1ns steps asked numpy for 4.37 TiB
            "invalid simulator configuration:\n"
            "  --step: 1e-09 s is shorter than 0.1 s, the shortest step the simulator takes",
            id="a-nanosecond-step",
        ),
        pytest.param(
            "step_s: 0.000001\n",  # ran for minutes
            [],
            "{path}: invalid simulator configuration:\n"
            "  step_s: 1e-06 s is shorter than 0.1 s, the shortest step the simulator takes",
            id="a-microsecond-step-in-the-file",
        ),
        pytest.param(
            "step_s: 30\n",
            [],
            "{path}: invalid simulator configuration:\n"
            "  settings: tick_s (15 s) must be a whole multiple of step_s (30 s)",
            id="step-longer-than-the-tick",
        ),
        pytest.param(
            "",
            ["--seed", "-1"],  # numpy's generator refuses it, mid-run on a ServeGen trace
            "{path}: invalid simulator configuration:\n"
            "  --seed: Input should be greater than or equal to 0",
            id="a-flag-is-named-as-a-flag",
        ),
        pytest.param(
            "cluster: {node_provisioning_s: .inf}\n",  # OverflowError in round()
            [],
            "{path}: invalid simulator configuration:\n"
            "  cluster.node_provisioning_s: Input should be a finite number",
            id="an-infinite-setting",
        ),
        pytest.param(
            "cluster: {node_provisioning_s: 100000}\n",  # blamed `gang.prefill.lead-time`
            [],
            "{path}: invalid simulator configuration:\n"
            "  settings: cluster.node_provisioning_s + cluster.gang_startup_s + tick_s "
            "(100195 s) is the lead time of a new gang, at most 24h",
            id="a-lead-time-over-a-day",
        ),
        pytest.param(
            "cluster: [\n",
            [],
            "{path}: simulator configuration is not valid YAML: while parsing a flow node "
            "expected the node content, but found '<stream end>'",
            id="bad-yaml-says-where",
        ),
        pytest.param(
            "tick_s: 15\nseed: 1\ntick_s: 30\n",  # the second tick_s silently won
            [],
            "{path}: simulator configuration is not valid YAML: while constructing a mapping "
            "in \"<unicode string>\", line 1, column 1: tick_s: 15 ^ found key 'tick_s' twice "
            "(lines 1 and 3)",
            id="a-key-given-twice",
        ),
        pytest.param(
            "step_s: true\ncluster: {gpus_per_node: yes}\n",  # ran 1 s steps; blamed the pod
            [],
            "{path}: invalid simulator configuration:\n"
            "  step_s: true is a yes/no; a number is expected here\n"
            "  cluster.gpus_per_node: true is a yes/no; a number is expected here",
            id="a-yes-or-no-for-a-number",
        ),
        pytest.param(
            "gang: {prefill: {min-buffer: 1, dry-run: false, lead-time: 5m}}\n",
            [],
            "{path}: invalid simulator configuration:\n"
            "  gang.prefill: annotation values are strings, as on the LWS; quote them: "
            'min-buffer: "1", dry-run: "false"\n',
            id="unquoted-annotation-values",
        ),
    ],
)
def test_cli_says_what_is_wrong_with_the_configuration(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config: str | None,
    flags: list[str],
    expected: str,
) -> None:
    path = tmp_path / "sim.yaml"
    argv = ["simulate", *flags, "--duration", "1m", "--no-progress"]
    if config is not None:
        path.write_text(config)
        argv += ["--config", str(path)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("gang-autoscaler simulate: " + expected.format(path=path))
    assert "pydantic" not in captured.err
    assert captured.out == ""


def test_cli_refuses_a_run_with_nothing_to_replay(capsys: pytest.CaptureFixture[str]) -> None:
    # the built-in trace's first request comes after 0.1 s: an IndexError in the oracle
    assert main(["simulate", "--duration", "100ms", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert "no request arrives in the first 0.1 s" in captured.err
    assert captured.out == ""


def test_a_trace_refused_leaves_no_output_directory_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "wrong.csv"
    trace.write_text("a,b,c\n1,2,3\n")
    json_path, report = tmp_path / "j" / "out.json", tmp_path / "report"
    argv = ["simulate", "--trace", str(trace), "--json", str(json_path), "--report", str(report)]
    assert main([*argv, "--no-progress"]) == 2
    assert "unknown trace format (columns a,b,c)" in capsys.readouterr().err
    assert not json_path.parent.exists() and not report.exists()


def test_cli_refuses_an_infinite_scale(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:  # argparse's usage error
        main(["simulate", "--scale", "inf", "--no-progress"])
    assert stopped.value.code == 2
    assert "'inf' must be a finite number above zero" in capsys.readouterr().err


def test_the_shortest_step_is_a_tenth_of_a_second() -> None:
    assert load_settings(step_s=0.1).step_s == 0.1  # 150 steps to the default 15 s tick
    with pytest.raises(ConfigError, match=r"--step: 0\.099 s is shorter than 0\.1 s"):
        load_settings(flags={"step_s": "--step"}, step_s=0.099)


def test_cli_says_why_a_configuration_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.yaml"
    assert main(["simulate", "--config", str(missing), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"gang-autoscaler simulate: {missing}: cannot read simulator configuration: "
        "No such file or directory\n"
    )


def test_cli_refuses_a_node_cap_below_the_static_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every run starts with its fleet in place; a cap under `static`'s would be exceeded.
    config = tmp_path / "sim.yaml"
    argv = ["simulate", "--config", str(config), "--duration", "10m", "--no-progress"]
    config.write_text("cluster: {max_nodes: 8}\n")
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        "gang-autoscaler simulate: cluster.max_nodes 8 is below the 22 nodes the `static` "
        "policy holds for this trace's peak (11 gangs of 2 pods, 1 pod(s) per node); raise it, "
        "or scale the traffic down with --scale"
    )
    assert captured.out == ""
    config.write_text("cluster: {max_nodes: 22}\n")
    assert main([*argv, "--policy", "static"]) == 0
    assert "| static" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "under_a_file"),
    [
        pytest.param("--json", "out.json", id="json-under-a-file"),
        pytest.param("--report", "report", id="report-under-a-file"),
        pytest.param("--json", "", id="json-is-a-directory"),
    ],
)
def test_cli_refuses_an_unwritable_output_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, under_a_file: str
) -> None:
    regular_file = tmp_path / "file"
    regular_file.write_text("")
    output = regular_file / under_a_file if under_a_file else tmp_path
    argv = ["simulate", option, str(output), "--duration", "1m", "--no-progress"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert f"cannot write {output}: " in captured.err
    assert captured.out == ""  # refused before the run, which prints its table first


def test_a_unified_deployment_runs_through_the_core() -> None:
    workload, scale, settings = _azure_conv_slice(minutes=6)
    settings = settings.model_copy(update={"mode": "unified"})
    comparison = compare(workload, settings, trace="azure-conv", scale=scale, progress=False)
    gang = comparison.results["gang"]
    assert "unified_ready_gangs" in gang.series
    assert "prefill_ready_gangs" not in gang.series
    assert comparison.metrics["static"].slo_attainment > 0.99


def test_servegen_collection_gaps_replay_as_the_traffic_around_them() -> None:
    # m-small has 37 windows where every client reports zero ("treat as missing")
    path = shared_data_path("traces", "servegen_m-small_600s.csv")
    frame = np.genfromtxt(path, delimiter=",", names=True)
    gaps = np.flatnonzero(frame["requests_per_s"] == 0)
    assert gaps.size == 37
    workload = load_servegen(path, seed=0)
    per_window = np.bincount((workload.arrival_s // 600).astype(int), weights=workload.requests)
    for window in gaps:
        before = frame["requests_per_s"][:window][frame["requests_per_s"][:window] > 0][-1]
        after = frame["requests_per_s"][window:][frame["requests_per_s"][window:] > 0][0]
        low, high = sorted((before, after))
        assert 0.95 * low * 600 <= per_window[window] <= 1.05 * high * 600


def test_fill_collection_gaps_interpolates_in_time() -> None:
    t = np.array([0.0, 600.0, 1200.0, 1800.0, 2400.0])
    rates = np.array([0.0, 10.0, 0.0, 0.0, 40.0])
    filled = fill_collection_gaps(t, rates, gap=rates == 0)
    assert filled.tolist() == [10.0, 10.0, 20.0, 30.0, 40.0]
    untouched = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert fill_collection_gaps(t, untouched, gap=untouched == 0) is untouched


def test_a_null_target_utilization_leaves_the_capacity_to_be_learned() -> None:
    """`gang.<component>_target_utilization: null` runs `gang` as an operator who has not
    measured a capacity per gang: the annotation is unset, and the core learns it once a
    component has stayed at its target for the demand window."""
    from autoscaler.sim.engine import simulate
    from autoscaler.sim.gang_policy import default_annotations
    from autoscaler.sim.runner import gang_capacity
    from autoscaler.sim.workload import resolve_trace

    settings = load_settings(
        gang={"prefill_target_utilization": None, "decode_target_utilization": None}
    )
    workload, _ = load_workload(
        resolve_trace("builtin", traces_dir=None), settings, scale=None, name="builtin"
    )
    workload = workload.slice(0.0, 40 * 60.0)
    assert gang_capacity(workload, settings) == {"prefill": None, "decode": None}
    annotations = default_annotations(
        settings, "prefill", max_gangs=16, target_waiting=35, capacity=None
    )
    assert "gang-autoscaler.io/capacity-per-replica" not in annotations
    settings = with_quota(workload, settings)
    (controller,) = build_controllers(workload, settings, ["gang"])
    plans = [controller.policies[k].capacity_per_replica for k in controller.keys.values()]
    assert plans == [None, None]
    result = simulate(workload, controller, settings, progress=False)
    assert controller.last_plan is not None
    prefill = controller.last_plan.components[controller.keys["prefill"]]
    # a saturated prefill gang serves 40,000 prompt tokens/s; at its 0.8 target 32,000
    assert prefill.capacity_per_gang is not None
    assert 0.7 * 40_000 <= prefill.capacity_per_gang <= 40_000
    # the time series shows when it was learned: nothing at first, the plan's value at the end
    learned = result.series["prefill_capacity_per_gang"]
    assert np.isnan(learned[: round(60 / settings.step_s)]).all()
    assert learned[-1] == prefill.capacity_per_gang


def test_bursts_of_seconds_teach_no_capacity() -> None:
    """The Azure code trace's bursts fill the prefill queue for seconds while the one-minute
    demand rate reads the quiet around them. Sampled at any saturated tick, its first 20
    minutes taught prefill about 10,600 prompt tokens/s per gang (a third of the 32,000 at
    target), from which the floor ordered up to three times the gangs over the hour. No
    stretch lasts a whole minute at target, so nothing is learned."""
    from autoscaler.sim.engine import simulate

    settings = load_settings(
        gang={"prefill_target_utilization": None, "decode_target_utilization": None}
    )
    path = shared_data_path("traces", "AzureLLMInferenceTrace_code.csv")
    workload, _ = load_workload(path, settings, scale=None, name="azure-code")
    workload = workload.slice(0.0, 20 * 60.0)
    settings = with_quota(workload, settings)
    (controller,) = build_controllers(workload, settings, ["gang"])
    simulate(workload, controller, settings, progress=False)
    assert controller.last_plan is not None
    prefill = controller.last_plan.components[controller.keys["prefill"]]
    assert prefill.capacity_per_gang is None
    assert any(s.stage == "no_floor" for s in prefill.steps)
