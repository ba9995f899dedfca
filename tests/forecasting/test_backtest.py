"""Rolling-origin backtest, its metrics, the trace loaders and the `backtest` command."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from autoscaler import cli
from autoscaler.commands import backtest as backtest_command
from autoscaler.commands.trace_args import trace_path
from autoscaler.service.settings import RunSettings
from autoscaler.sim.workload import BUILTIN_PATH
from forecasting.backtest import _smape, run_backtest
from forecasting.errors import ForecastingError, InsufficientHistory, TraceFormatError
from forecasting.models import MOST_ACCURATE_MODEL
from forecasting.series import Series
from forecasting.traces import SHARED_TRACES, load_trace, read_trace, resolve_trace
from tests.forecasting.traces import DAY_WINDOWS, STEP_S, servegen_cut
from tests.harness.shared_data import shared_data_path

CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "gang-autoscaler" / "values.yaml"
CONTRACT_MODEL_KEYS = {
    "mase",
    "smape",
    "ratio_vs_persistence",
    "ratio_vs_seasonal_naive",
    "coverage",
    "fit_seconds_median",
}


@pytest.fixture(scope="module")
def small_report():
    # Rows 0-575 (days 0-3) of servegen_m-small: 3 days to train, 1 day scored, one fit each.
    return run_backtest(
        servegen_cut("m-small", 0, 4 * DAY_WINDOWS),
        trace="m-small-days-0-3",
        horizon_s=1800,
        step_s=STEP_S,
        train_s=3 * 86_400,
    )


def test_backtest_scores_every_model_on_the_same_origins(small_report) -> None:
    assert small_report.train_windows == 3 * DAY_WINDOWS
    assert small_report.scored_origins == DAY_WINDOWS - 3 + 1
    assert set(small_report.models) == {
        "persistence",
        "seasonal_naive",
        "holt_winters",
        "state_space",
        "seasonal_envelope",
    }
    persistence = small_report.models["persistence"]
    assert persistence.ratio_vs_persistence == 1.0
    naive = small_report.models["seasonal_naive"]
    assert naive.ratio_vs_seasonal_naive == 1.0
    assert persistence.ratio_vs_seasonal_naive == pytest.approx(persistence.mae / naive.mae)
    for score in small_report.models.values():
        assert 0 <= score.coverage <= 1
        assert 0 <= score.smape <= 200
        assert score.mase > 0 and score.fit_seconds_median >= 0


def test_most_accurate_model_beats_seasonal_naive_on_the_small_cut(small_report) -> None:
    # A weak check on a one-day evaluation; the acceptance figures come from the full
    # benchmark (benchmarks/forecast.py, docs/forecasting.md).
    best = small_report.models[MOST_ACCURATE_MODEL]
    assert best.fallback_share == 0
    assert best.ratio_vs_seasonal_naive < 1


def test_the_default_model_is_the_one_the_service_plans_from(small_report) -> None:
    # `default_model` names what an operator gets without choosing: the service's
    # --forecast-model default, which the Helm chart's forecastModel repeats.
    chart_values = yaml.safe_load(CHART_VALUES.read_text())
    service_default = RunSettings.model_fields["forecast_model"].default
    assert small_report.default_model == service_default == chart_values["forecastModel"]
    assert small_report.contract_json()["default_model"] == "seasonal_envelope"


def test_contract_json_has_exactly_the_design_keys(small_report) -> None:
    document = small_report.contract_json()
    assert set(document) == {"trace", "horizon_s", "default_model", "models"}
    assert document["horizon_s"] == 1800
    for scores in document["models"].values():
        assert set(scores) == CONTRACT_MODEL_KEYS


def test_persistence_error_matches_a_direct_computation() -> None:
    history = servegen_cut("m-small", 0, 4 * DAY_WINDOWS)
    report = run_backtest(
        history,
        trace="t",
        horizon_s=1200,
        step_s=STEP_S,
        train_s=3 * 86_400,
        models=["persistence"],
    )
    y = history.values
    train, steps = 3 * DAY_WINDOWS, 2
    errors = []
    for origin in range(train, y.size - steps + 1):
        target = y[origin - 1 + steps]
        if np.isfinite(target):
            last = y[:origin][np.isfinite(y[:origin])][-1]
            errors.append(abs(target - last))
    assert report.models["persistence"].mae == pytest.approx(np.mean(errors))
    scale = np.nanmean(np.abs(np.diff(y[:train])))
    assert report.models["persistence"].mase == pytest.approx(np.mean(errors) / scale)


def test_no_ratio_against_a_seasonal_naive_that_was_persistence() -> None:
    """On 1.6 days, seasonal-naive never had a day of history at a fit: persistence stood in
    on every origin, and the report gave a ratio against it (1.0 for persistence) with
    nothing to say it was no seasonal baseline."""
    report = run_backtest(
        servegen_cut("m-small", 0, int(1.6 * DAY_WINDOWS)),
        trace="short",
        horizon_s=1800,
        step_s=STEP_S,
        models=("persistence", "seasonal_naive"),
    )
    naive = report.models["seasonal_naive"]
    assert naive.fallback_share == 1.0
    assert math.isnan(report.models["persistence"].ratio_vs_seasonal_naive)
    assert report.contract_json()["models"]["persistence"]["ratio_vs_seasonal_naive"] is None
    assert "n/a" in backtest_command.format_table(report).splitlines()[2]
    assert report.models["persistence"].ratio_vs_persistence == 1.0  # the rest is scored


def test_a_seasonal_naive_that_stood_in_now_and_then_is_still_the_baseline() -> None:
    """m-small's days 8-12 have collection gaps: where the window a day before the target is
    missing, persistence stands in for seasonal-naive, as the baseline is defined. A single
    such origin took the ratio from every model."""
    report = run_backtest(
        servegen_cut("m-small", 8 * DAY_WINDOWS, 13 * DAY_WINDOWS),
        trace="m-small-days-8-12",
        horizon_s=1800,
        step_s=STEP_S,
        train_s=3 * 86_400,
        models=("persistence", "seasonal_naive"),
    )
    naive, persistence = report.models["seasonal_naive"], report.models["persistence"]
    assert 0 < naive.fallback_share < 1
    assert persistence.ratio_vs_seasonal_naive == pytest.approx(persistence.mae / naive.mae)


def test_smape_counts_zero_over_zero_as_exact() -> None:
    assert _smape(np.array([0.0, 1.0]), np.array([0.0, 3.0])) == pytest.approx(50.0)


def test_too_short_a_trace_is_refused() -> None:
    with pytest.raises(InsufficientHistory, match="cannot hold"):
        run_backtest(Series([600.0, 1200.0], [1.0, 2.0]), trace="t", horizon_s=3600, step_s=600)


def test_a_horizon_past_a_week_is_refused_with_the_reason() -> None:
    """The forecasters refuse horizons over 7 days; `backtest --horizon 192h` on a long
    enough trace then ended in a traceback instead of an error naming the limit."""
    days = 30
    series = Series(np.arange(1, days * 144 + 1) * 600.0, np.ones(days * 144))
    with pytest.raises(ForecastingError, match="7 days"):
        run_backtest(series, trace="t", horizon_s=192 * 3600, step_s=600)


def test_servegen_all_zero_windows_load_as_missing() -> None:
    trace = load_trace("servegen_m-small")
    frame = pd.read_csv(shared_data_path("traces", "servegen_m-small_600s.csv"))
    gaps = (frame["requests_per_s"] == 0) & (frame["active_clients"] == 0)
    assert gaps.sum() == 37
    assert np.isnan(trace.series.values).sum() == 37
    assert trace.native_step_s == 600
    assert trace.series.timestamps_s[0] == 600  # labelled by the window's end


def test_raw_azure_csv_counts_the_same_requests_as_the_per_second_file() -> None:
    raw = load_trace("AzureLLMInferenceTrace_code")
    per_second = load_trace("azure2023_code")
    assert raw.series.values.sum() == 8819
    np.testing.assert_array_equal(raw.series.values, per_second.series.values)


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("when,how_many\n0,1\n")
    with pytest.raises(TraceFormatError, match="matches no known trace format"):
        load_trace(str(bad))


def run_command(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    backtest_command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["backtest", *argv])
    code: int = args.func(args)
    return code


def test_backtest_is_a_registered_command() -> None:
    assert "backtest" in cli.COMMANDS


def test_command_writes_the_contract_json_for_a_trace_file(tmp_path: Path, capsys) -> None:
    # Rows 0-575 of servegen_m-small written as a ServeGen-format file.
    frame = pd.read_csv(shared_data_path("traces", "servegen_m-small_600s.csv")).iloc[:576]
    trace = tmp_path / "cut.csv"
    frame.to_csv(trace, index=False)
    out = tmp_path / "report.json"
    code = run_command(
        "--trace", str(trace), "--horizon", "30m", "--model", "state_space", "--json", str(out)
    )
    assert code == 0
    document = json.loads(out.read_text())
    assert document["trace"] == "cut"
    assert document["horizon_s"] == 1800
    # the planning model (`default_model`) is always scored beside the one asked for
    assert set(document["models"]) == {
        "persistence",
        "seasonal_naive",
        "state_space",
        document["default_model"],
    }
    assert all(math.isfinite(v) for v in document["models"]["state_space"].values())
    assert "state_space" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--trace", "no-such-trace"], "no trace file", id="unknown-trace"),
        pytest.param(
            ["--trace", "azure2023_code"], "only 1 forecasts could be scored", id="hour-at-5m-step"
        ),
    ],
)
def test_command_reports_bad_input_and_exits_2(argv, message, capsys) -> None:
    assert run_command(*argv) == 2
    assert message in capsys.readouterr().err


def test_command_scores_the_raw_azure_trace_at_a_short_step(capsys) -> None:
    assert (
        run_command("--trace", "AzureLLMInferenceTrace_conv", "--horizon", "2m", "--step", "1m")
        == 0
    )
    out = capsys.readouterr().out
    # One hour holds no daily cycle: the seasonal models say so by falling back every time.
    assert "windows of 60 s" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert rows["state_space"][-1] == "1.000"
    assert rows["seasonal_envelope"][-4:] == ["1.000", "(default,", "plans", "capacity)"]


def test_command_reports_the_horizon_it_rounded_up_to(tmp_path: Path, capsys) -> None:
    frame = pd.read_csv(shared_data_path("traces", "servegen_m-small_600s.csv")).iloc[:576]
    trace = tmp_path / "cut.csv"
    frame.to_csv(trace, index=False)
    out = tmp_path / "report.json"
    argv = ("--trace", str(trace), "--horizon", "30s", "--model", "state_space")
    assert run_command(*argv, "--json", str(out)) == 0
    captured = capsys.readouterr()
    # 600 s windows: a 30 s horizon is one whole window ahead, and says so
    assert json.loads(out.read_text())["horizon_s"] == 600
    assert "horizon 600 s, windows of 600 s" in captured.out
    assert "horizon 30 s rounded up to 600 s" in captured.err


def test_command_refuses_an_unwritable_json_before_running(tmp_path: Path, capsys) -> None:
    regular_file = tmp_path / "file"
    regular_file.write_text("")
    out = regular_file / "report.json"
    assert run_command("--model", "state_space", "--json", str(out)) == 2
    captured = capsys.readouterr()
    assert f"cannot write {out}: Not a directory" in captured.err
    assert captured.out == ""  # refused before the backtest, which prints its table first


@pytest.mark.parametrize(
    ("name", "file_name"),
    [
        pytest.param("servegen_m-small", "servegen_m-small_600s.csv", id="backtest-spelling"),
        pytest.param("servegen-m-small", "servegen_m-small_600s.csv", id="simulate-spelling"),
        pytest.param("azure-code", "AzureLLMInferenceTrace_code.csv", id="simulate-request-csv"),
        pytest.param("azure-code-1s", "azure2023_code_1s.csv", id="simulate-per-second"),
        pytest.param("azure2023_conv", "azure2023_conv_1s.csv", id="backtest-per-second"),
    ],
)
def test_shared_traces_answer_to_both_spellings(name: str, file_name: str) -> None:
    assert resolve_trace(name, traces_dir=shared_data_path("traces")).name == file_name


@pytest.mark.parametrize("name", sorted(SHARED_TRACES))
def test_every_trace_name_the_command_lists_loads(name: str) -> None:
    trace = load_trace(name, traces_dir=shared_data_path("traces"))
    assert np.nansum(trace.series.values) > 0


def test_the_mooncake_trace_is_counted_per_second() -> None:
    path = shared_data_path("traces", "mooncake_fast25_synthetic_trace.jsonl")
    arrivals_ms = [json.loads(line)["timestamp"] for line in path.read_text().splitlines()]
    trace = load_trace("mooncake", traces_dir=shared_data_path("traces"))
    values = trace.series.values
    assert trace.native_step_s == 1.0
    assert values.sum() == len(arrivals_ms) == 3993  # the data README's figure
    assert values.size == math.floor(max(arrivals_ms) / 1000) + 1
    # second k counts arrivals in [k, k+1) s and is labelled by its end
    assert values[0] == sum(1 for t in arrivals_ms if t < 1000)
    assert values[500] == sum(1 for t in arrivals_ms if 500_000 <= t < 501_000)
    assert trace.series.timestamps_s[0] == 1.0


def test_an_unknown_format_is_named_without_its_whole_first_line(tmp_path: Path) -> None:
    trace = tmp_path / "wide.csv"
    trace.write_text(",".join(f"column_{i}" for i in range(100)) + "\n1\n")
    with pytest.raises(TraceFormatError) as raised:
        load_trace(str(trace))
    assert "column_0,column_1" in str(raised.value)
    assert "column_99" not in str(raised.value)


def test_command_lists_the_trace_names_it_takes(capsys) -> None:
    assert run_command("--trace", "no-such-trace") == 2
    err = capsys.readouterr().err
    for name in ("servegen_m-small", "servegen-m-small", "azure2023_conv", "azure-conv-1s"):
        assert name in err


def test_command_rejects_a_horizon_without_unit() -> None:
    with pytest.raises(SystemExit):
        run_command("--horizon", "30")


def test_command_backtests_the_builtin_trace_simulate_replays(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.json"
    argv = ("--trace", "builtin", "--horizon", "2m", "--step", "1m", "--model", "state_space")
    assert run_command(*argv, "--json", str(out)) == 0
    assert json.loads(out.read_text())["trace"] == "builtin"
    assert "trace builtin: horizon 120 s, windows of 60 s" in capsys.readouterr().out


def test_the_builtin_trace_reads_as_the_shared_file_it_was_made_from() -> None:
    # gzip-compressed, with attribution lines before the header: the same rows all the same
    builtin = read_trace(BUILTIN_PATH)
    shared = load_trace("azure-conv-1s", traces_dir=shared_data_path("traces"))
    assert builtin.native_step_s == shared.native_step_s == 1.0
    np.testing.assert_array_equal(builtin.series.timestamps_s, shared.series.timestamps_s)
    np.testing.assert_array_equal(builtin.series.values, shared.series.values)


def test_command_reads_named_traces_from_traces_dir(tmp_path: Path, capsys) -> None:
    # Days 0-3 of m-small under its own file name in another directory: the name resolves
    # there, not in the shared directory, whose file holds 14 days.
    frame = pd.read_csv(shared_data_path("traces", "servegen_m-small_600s.csv")).iloc[:576]
    frame.to_csv(tmp_path / "servegen_m-small_600s.csv", index=False)
    argv = ("--trace", "servegen-m-small", "--traces-dir", str(tmp_path))
    assert run_command(*argv, "--model", "persistence") == 0
    assert "trace servegen-m-small: horizon 1800 s, windows of 600 s, 288 training windows" in (
        capsys.readouterr().out
    )


def _option_help(command: str, dest: str) -> str:
    parser = cli.build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    (action,) = (a for a in commands.choices[command]._actions if a.dest == dest)
    # the same words but for the default each command has
    return str(action.help).replace(f"default: {action.default}", "default: DEFAULT")


@pytest.mark.parametrize("dest", ["trace", "traces_dir"])
def test_backtest_and_simulate_describe_their_trace_options_alike(dest: str) -> None:
    assert _option_help("backtest", dest) == _option_help("simulate", dest)
    assert "builtin" in _option_help("backtest", "trace")


@pytest.mark.parametrize("name", ["builtin", *sorted(SHARED_TRACES), "servegen_m-small"])
def test_backtest_takes_every_trace_name_simulate_takes(name: str) -> None:
    parser = cli.build_parser()
    traces_dir = str(shared_data_path("traces"))
    paths = {
        command: trace_path(
            parser.parse_args([command, "--trace", name, "--traces-dir", traces_dir])
        )
        for command in ("simulate", "backtest")
    }
    assert paths["backtest"] == paths["simulate"]
    assert read_trace(paths["backtest"]).series.values.size > 0


def test_the_default_model_is_always_scored() -> None:
    # `--model state_space` wrote "default_model": "seasonal_envelope" with no score for it.
    history = servegen_cut("m-small", 0, 5 * DAY_WINDOWS)
    report = run_backtest(history, trace="cut", horizon_s=1800, step_s=STEP_S,
                          models=["persistence"])  # fmt: skip
    assert report.default_model in report.models


def test_mooncake_epoch_milliseconds_are_milliseconds_not_dates(tmp_path: Path) -> None:
    """`pandas.read_json` took `timestamp` for a date: epoch milliseconds came out 1000x too
    large, and the per-second counts asked numpy for 12 TiB."""
    path = tmp_path / "epoch.jsonl"
    path.write_text(
        '{"timestamp": 1700000000000, "input_length": 1, "output_length": 1}\n'
        '{"timestamp": 1700000002500, "input_length": 1, "output_length": 1}\n'
    )
    trace = read_trace(path)
    assert trace.series.values.tolist() == [1.0, 0.0, 1.0]


def test_an_azure_trace_with_epoch_seconds_is_refused_not_read_as_nanoseconds(
    tmp_path: Path,
) -> None:
    """pandas reads a number as nanoseconds since 1970: an hour of epoch seconds became a
    series of one window, with no error."""
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1700000000,10,5\n1700003600,10,5\n")
    with pytest.raises(
        TraceFormatError, match=r"TIMESTAMP holds numbers \(the first is 1700000000\)"
    ):
        read_trace(path)


def test_an_azure_trace_without_times_says_so(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n,10,5\n,10,5\n")
    with pytest.raises(TraceFormatError, match="TIMESTAMP has no values"):
        read_trace(path)


@pytest.mark.parametrize("count", ["-3", "inf", "nan"])
def test_a_count_that_is_no_count_is_refused_with_its_row(tmp_path: Path, count: str) -> None:
    path = tmp_path / "per_second.csv"
    path.write_text(f"t_seconds,requests,input_tokens,output_tokens\n0,1,5,5\n1,{count},5,5\n")
    with pytest.raises(TraceFormatError, match="requests at data row 2"):
        read_trace(path)


def test_a_step_finer_than_the_trace_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--step 1m` on 10-minute windows scored every model n/a and exited 0."""
    path = tmp_path / "windows.csv"
    rows = "".join(f"{600 * i},{1 + i % 3},10,5\n" for i in range(6 * 144))
    path.write_text("t_seconds,requests_per_s,mean_input_tokens,mean_output_tokens\n" + rows)
    argv = ["backtest", "--trace", str(path), "--model", "persistence", "--horizon", "10m"]
    assert cli.main([*argv, "--step", "9m"]) == 2
    assert "finer than the trace's own 600 s windows" in capsys.readouterr().err
    assert cli.main([*argv, "--step", "10m"]) == 0  # its own step is fine


def test_a_jsonl_trace_with_a_bom_reads_as_json(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_text('\ufeff{"timestamp": 0, "input_length": 1, "output_length": 1}\n')
    assert read_trace(path).series.values.tolist() == [1.0]


def test_a_duration_of_hundreds_of_digits_is_too_long(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # argparse: it added up to inf, then OverflowError
        cli.main(["backtest", "--horizon", "9" * 400 + "h"])
    assert "is too long to be a duration" in capsys.readouterr().err


def test_a_header_only_series_says_it_has_too_few_rows(tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    path.write_text("t_seconds,requests,input_tokens,output_tokens\n0,1,5,5\n")
    with pytest.raises(TraceFormatError, match="1 rows; a series needs two at least"):
        read_trace(path)


def _trace_file(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_one_request_dated_decades_away_is_refused_not_counted_per_second(
    tmp_path: Path,
) -> None:
    """Counted a second at a time, one request dated 2099 among 2023's asked numpy for
    18 GiB."""
    path = _trace_file(
        tmp_path / "azure.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:17:03.9799600,10,5",
        "2099-11-16 18:17:04.0000000,10,5",
        "2023-11-16 18:17:05.1000000,10,5",
    )
    with pytest.raises(TraceFormatError, match=r"span 2.776e\+04 days \(the latest is request 2\)"):
        read_trace(path)


def test_azure_times_with_changing_offsets_are_read_in_utc(tmp_path: Path) -> None:
    """Across a daylight-saving switch pandas refused them, with advice for its own callers
    ("Pass utc=True")."""
    path = _trace_file(
        tmp_path / "azure.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-10-29 02:59:59.5+02:00,10,5",
        "2023-10-29 02:00:00.5+01:00,10,5",
    )
    assert read_trace(path).series.values.tolist() == [1.0, 1.0]


def test_attribution_lines_before_json_lines_are_skipped(tmp_path: Path) -> None:
    path = _trace_file(
        tmp_path / "attributed.jsonl",
        "# from kvcache-ai/Mooncake, Apache-2.0",
        '{"timestamp": 0, "input_length": 1, "output_length": 1}',
        '{"timestamp": 1500, "input_length": 1, "output_length": 1}',
    )
    assert read_trace(path).series.values.tolist() == [1.0, 1.0]


def test_a_step_past_seven_days_is_named_not_the_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The horizon is rounded up to whole steps: `--step 100000000h` with the default
    horizon was reported as "a 3.6e+11 s horizon"."""
    path = tmp_path / "per_second.csv"
    rows = "".join(f"{i},{1 + i % 3},10,5\n" for i in range(600))
    path.write_text("t_seconds,requests,input_tokens,output_tokens\n" + rows)
    assert cli.main(["backtest", "--trace", str(path), "--step", "100000000h"]) == 2
    assert "a 3.6e+11 s step is past the 604800 s" in capsys.readouterr().err
