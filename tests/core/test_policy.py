"""Policy annotations (DESIGN section 5): defaults, durations, ratios and precise errors."""

from __future__ import annotations

import pytest

from autoscaler.core.model import Component, ComponentKey
from autoscaler.core.policy import (
    ANNOTATIONS,
    PREFIX,
    PolicyError,
    is_enabled,
    parse_duration,
    parse_policy,
    parse_ratio_band,
    validate_deployment,
)


def annotations(**fields: str) -> dict[str, str]:
    out = {PREFIX + "enabled": "true"}
    out.update({PREFIX + k.replace("_", "-"): v for k, v in fields.items()})
    return out


def test_defaults_match_the_design_table():
    p = parse_policy(annotations(), lws_name="llm")
    assert p.deployment_name("llm") == "llm"
    assert p.component is Component.UNIFIED
    assert (p.min_replicas, p.max_replicas) == (1, 10)
    assert (p.target_waiting, p.target_kv_cache) == (4.0, 0.8)
    assert p.capacity_per_replica is None
    assert p.forecast is True
    assert p.lead_time_s == 300
    assert (p.min_buffer, p.max_buffer) == (0, 2)
    assert p.scale_down_window_s == 300
    assert p.max_scale_up == 2
    assert p.gang_timeout_s == 600
    assert p.prefill_decode_ratio is None
    assert p.dry_run is False


def test_every_design_annotation_is_known():
    expected = {
        "enabled", "deployment", "component", "min-replicas", "max-replicas", "target-waiting",
        "target-kv-cache", "capacity-per-replica", "forecast", "lead-time", "min-buffer",
        "max-buffer", "scale-down-window", "max-scale-up", "gang-timeout",
        "prefill-decode-ratio", "dry-run",
    }  # fmt: skip
    assert {a.removeprefix(PREFIX) for a in ANNOTATIONS} == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("5m", 300), ("1h30m", 5400), ("500ms", 0.5), ("0", 0), ("1.5h", 5400)],
)
def test_go_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "5 m", "m5", "", "5d", "-5s", "1h-3m", "٣s", "５m"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_ratio_band_is_prefill_per_decode():
    band = parse_ratio_band("1:2-1:4")
    assert (band.low, band.high) == (0.25, 0.5)
    assert band.contains(1, 3)
    assert not band.contains(1, 5)
    assert not band.contains(1, 0)


@pytest.mark.parametrize(
    ("fields", "annotation", "fragment"),
    [
        pytest.param({"bogus": "1"}, "bogus", "unknown annotation", id="unknown-key"),
        pytest.param({"min_replicas": "two"}, "min-replicas", "valid integer", id="non-numeric"),
        pytest.param(
            {"min_replicas": "5", "max_replicas": "2"},
            "min-replicas",
            "greater than",
            id="min-over-max",
        ),
        pytest.param({"lead_time": "5"}, "lead-time", "not a duration", id="duration-no-unit"),
        pytest.param({"target_kv_cache": "0"}, "target-kv-cache", "greater than 0", id="kv-zero"),
        pytest.param({"target_kv_cache": "1.2"}, "target-kv-cache", "less than", id="kv-over-1"),
        pytest.param({"target_waiting": "NaN"}, "target-waiting", "finite", id="nan"),
        pytest.param({"target_waiting": "infinity"}, "target-waiting", "finite", id="infinity"),
        pytest.param(
            {"capacity_per_replica": "1e999"}, "capacity-per-replica", "finite", id="overflow"
        ),
        pytest.param({"lead_time": "9" * 400 + "s"}, "lead-time", "finite", id="huge-duration"),
        # `100000h` parsed, and its forecast blocked the tick for 23 s every window
        pytest.param({"lead_time": "24h1s"}, "lead-time", "longer than 24h", id="lead-over-a-day"),
        pytest.param({"lead_time": "100000h"}, "lead-time", "longer than 24h", id="lead-100000h"),
        pytest.param(
            {"component": "prefill", "prefill_decode_ratio": "9" * 400 + ":1"},
            "prefill-decode-ratio",
            "finite",
            id="ratio-overflows",
        ),
        pytest.param(
            {"component": "prefill", "prefill_decode_ratio": "1:" + "9" * 400},
            "prefill-decode-ratio",
            "finite",
            id="ratio-underflows-to-zero",
        ),
        pytest.param(
            {"prefill_decode_ratio": "1:2"}, "prefill-decode-ratio", "unified", id="ratio-unified"
        ),
        pytest.param(
            {"component": "prefill", "prefill_decode_ratio": "2"},
            "prefill-decode-ratio",
            "not a ratio",
            id="ratio-garbage",
        ),
        pytest.param({"component": "encoder"}, "component", "prefill", id="bad-component"),
        pytest.param({"forecast": "maybe"}, "forecast", "boolean", id="bad-bool"),
        # a metric label and a Grafana variable: a quote broke the dashboards' queries
        pytest.param({"deployment": 'llama "70b"'}, "deployment", "not a name", id="quoted"),
        pytest.param({"deployment": "a\\b"}, "deployment", "not a name", id="backslash"),
        pytest.param({"deployment": "team's llama"}, "deployment", "not a name", id="space"),
        pytest.param({"deployment": "x" * 254}, "deployment", "253", id="too-long"),
        pytest.param({"deployment": ""}, "deployment", "not a name", id="empty"),
        pytest.param(
            {"min_buffer": "3", "max_buffer": "1"}, "min-buffer", "greater than", id="buffer"
        ),
    ],
)
def test_each_bad_annotation_is_one_precise_problem(fields, annotation, fragment):
    with pytest.raises(PolicyError) as caught:
        parse_policy(annotations(**fields), lws_name="llm")
    problems = caught.value.problems
    assert len(problems) == 1
    assert problems[0].annotation == PREFIX + annotation
    assert fragment in problems[0].message


@pytest.mark.parametrize("key", ["max_replicas", "dry_run", "lead_time_s", "min_buffer"])
def test_a_field_name_is_not_an_annotation(key):
    # The model takes its field names for code that builds a Policy; as annotations they were
    # applied silently (and `min_buffer` problems named `min-buffer`, never written).
    value = {"max_replicas": "50", "dry_run": "true", "lead_time_s": "1h", "min_buffer": "3"}[key]
    with pytest.raises(PolicyError) as caught:
        parse_policy({PREFIX + "enabled": "true", PREFIX + key: value}, lws_name="llm")
    [problem] = caught.value.problems
    assert problem.annotation == PREFIX + key
    assert problem.message.startswith("unknown annotation")
    if key != "lead_time_s":
        assert f"did you mean {PREFIX}{key.replace('_', '-')}?" in problem.message


def test_several_bad_annotations_give_several_problems():
    with pytest.raises(PolicyError) as caught:
        parse_policy(annotations(min_replicas="x", lead_time="soon"), lws_name="llm")
    assert {p.annotation for p in caught.value.problems} == {
        PREFIX + "min-replicas",
        PREFIX + "lead-time",
    }


def pd(prefill_ratio: str | None, decode_ratio: str | None):
    p = {"deployment": "chat", "component": "prefill"}
    d = {"deployment": "chat", "component": "decode"}
    if prefill_ratio:
        p["prefill_decode_ratio"] = prefill_ratio
    if decode_ratio:
        d["prefill_decode_ratio"] = decode_ratio
    return {
        ComponentKey("ns", "p"): parse_policy(annotations(**p), lws_name="p"),
        ComponentKey("ns", "d"): parse_policy(annotations(**d), lws_name="d"),
    }


def test_components_agreeing_on_the_ratio_pass():
    assert validate_deployment(pd("1:2-1:4", "1:2-1:4")) == {}


@pytest.mark.parametrize(
    ("prefill", "decode"), [("1:2-1:4", "1:1-1:3"), ("1:2", None)], ids=["differ", "one-sided"]
)
def test_components_disagreeing_on_the_ratio_are_rejected(prefill, decode):
    problems = validate_deployment(pd(prefill, decode))
    assert set(problems) == {ComponentKey("ns", "p"), ComponentKey("ns", "d")}
    assert all("disagree" in p.message for ps in problems.values() for p in ps)


def test_prefill_without_decode_is_rejected():
    only = {k: v for k, v in pd(None, None).items() if k.lws == "p"}
    problems = validate_deployment(only)
    assert "no decode component" in problems[ComponentKey("ns", "p")][0].message


def test_cross_field_problems_are_found_beside_field_errors():
    with pytest.raises(PolicyError) as caught:
        parse_policy(
            annotations(min_replicas="4", max_replicas="2", lead_time="soon"), lws_name="a"
        )
    err = caught.value
    assert [p.annotation for p in err.problems] == [PREFIX + "lead-time", PREFIX + "min-replicas"]
    assert err.unparsed == {"lead-time"}
    assert err.partial is not None and err.partial.min_replicas == 4


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"min_replicas": "50", "max_replicas": "x"}, id="max-in-error"),
        pytest.param({"min_buffer": "5", "max_buffer": "-1"}, id="max-buffer-in-error"),
        pytest.param({"component": "encoder", "prefill_decode_ratio": "1:2"}, id="role-in-error"),
    ],
)
def test_a_field_in_error_is_not_checked_by_its_default(fields):
    with pytest.raises(PolicyError) as caught:
        parse_policy(annotations(**fields), lws_name="a")
    assert len(caught.value.problems) == 1


def test_a_disagreement_quotes_the_ratio_as_written():
    problems = validate_deployment(pd("1:4-1:2", "1:1"))
    assert problems[ComponentKey("ns", "p")][0].value == "1:4-1:2"
    assert problems[ComponentKey("ns", "d")][0].value == "1:1"
    # spelled differently, one band still agrees with itself
    assert validate_deployment(pd("1:2-1:4", "2:8-1:2")) == {}


def test_deployment_checks_leave_out_what_did_not_parse():
    policies = pd("1:2", "1:1")
    decode = ComponentKey("ns", "d")
    assert validate_deployment(policies, unparsed={decode: {"prefill-decode-ratio"}}) == {}
    # a component whose role is unknown may be the one that seems to be missing
    prefill_only = {k: p for k, p in pd(None, None).items() if k.lws == "p"}
    prefill_only[decode] = parse_policy(annotations(deployment="chat"), lws_name="d")
    assert validate_deployment(prefill_only, unparsed={decode: {"component"}}) == {}


def test_every_reason_is_explained_in_the_docs() -> None:
    """Operators match a log line, a metric label or an Event to docs/decision.md's table."""
    from pathlib import Path

    from autoscaler.core.gang_plan import Reason

    text = (Path(__file__).resolve().parents[2] / "docs" / "decision.md").read_text()
    table = text.split("## Reasons", 1)[1]
    assert [r.value for r in Reason if f"`{r.value}`" not in table] == []


def test_surrounding_whitespace_is_stripped_from_every_value():
    """`enabled: "true "` opted the LWS in (`is_enabled` strips) and then held it as
    invalid; `min-replicas: " 2 "` parsed while `component: " decode"` did not."""
    raw = annotations(
        component=" decode", min_replicas=" 2 ", dry_run="true ", lead_time=" 6m", forecast="off "
    )
    raw[PREFIX + "enabled"] = "true "
    assert is_enabled(raw)
    p = parse_policy(raw, lws_name="llm")
    assert (p.component, p.min_replicas, p.dry_run, p.lead_time_s, p.forecast) == (
        Component.DECODE,
        2,
        True,
        360.0,
        False,
    )


@pytest.mark.parametrize("name", ["llama", "Llama-3.1_70B", "a", "x" * 253, "team.chat-v2"])
def test_deployment_names_of_objects_and_labels_are_taken(name):
    assert parse_policy(annotations(deployment=name), lws_name="llm").deployment == name
