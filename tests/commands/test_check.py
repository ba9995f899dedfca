"""`gang-autoscaler check`: rejects each bad annotation and accepts the shipped examples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from autoscaler.cli import main
from autoscaler.core.policy import PREFIX
from tests.harness.shared_data import shared_data_path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

LWS = """
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: {name}
  namespace: serving
  annotations: {annotations}
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec:
        containers:
          - name: vllm
            image: vllm/vllm-openai
            resources:
              limits: {{nvidia.com/gpu: "8"}}
"""


def manifest(tmp_path: Path, *components: tuple[str, dict[str, str]]) -> Path:
    docs = []
    for name, extra in components:
        annotations = {"gang-autoscaler.io/enabled": "true", **extra}
        docs.append(LWS.format(name=name, annotations=json.dumps(annotations)))
    path = tmp_path / "lws.yaml"
    path.write_text("---\n".join(docs))
    return path


def pd(prefill_extra=None, decode_extra=None):
    base = {"gang-autoscaler.io/deployment": "chat"}
    prefill = {**base, "gang-autoscaler.io/component": "prefill", **(prefill_extra or {})}
    decode = {**base, "gang-autoscaler.io/component": "decode", **(decode_extra or {})}
    return (("chat-prefill", prefill), ("chat-decode", decode))


@pytest.mark.parametrize(
    ("components", "expected"),
    [
        pytest.param(
            [("a", {"gang-autoscaler.io/max-replica": "3"})],
            "serving/a: gang-autoscaler.io/max-replica: unknown annotation",
            id="unknown-key",
        ),
        pytest.param(
            [("a", {"gang-autoscaler.io/min-replicas": "one"})],
            "serving/a: gang-autoscaler.io/min-replicas: Input should be a valid integer",
            id="non-numeric-min",
        ),
        pytest.param(
            [("a", {PREFIX + "min-replicas": "4", PREFIX + "max-replicas": "2"})],
            "serving/a: gang-autoscaler.io/min-replicas: is greater than max-replicas (2)",
            id="min-over-max",
        ),
        pytest.param(
            [("a", {"gang-autoscaler.io/gang-timeout": "10 minutes"})],
            "serving/a: gang-autoscaler.io/gang-timeout: '10 minutes' is not a duration",
            id="bad-duration",
        ),
        pytest.param(
            [("a", {"gang-autoscaler.io/prefill-decode-ratio": "1:2"})],
            "serving/a: gang-autoscaler.io/prefill-decode-ratio: a ratio needs a prefill/decode",
            id="ratio-on-unified",
        ),
        pytest.param(
            list(pd({"gang-autoscaler.io/prefill-decode-ratio": "1:2-1:4"},
                    {"gang-autoscaler.io/prefill-decode-ratio": "1:1"})),
            "serving/chat-decode: gang-autoscaler.io/prefill-decode-ratio: components of one "
            "deployment disagree",
            id="disagreeing-ratio",
        ),
        pytest.param(
            list(pd({"gang-autoscaler.io/prefill-decode-ratio": "1:2-1:4"},
                    {"gang-autoscaler.io/prefill-decode-ratio": "1:1"})),
            "serving/chat-prefill: gang-autoscaler.io/prefill-decode-ratio: components of one "
            "deployment disagree: ['0.25-0.5 prefill per decode gang', "
            "'1-1 prefill per decode gang'] (got '1:2-1:4')",
            id="disagreeing-ratio-quotes-the-annotation",
        ),
        # a field in error does not hide the checks between the fields that parsed
        pytest.param(
            [("a", {PREFIX + "min-replicas": "4", PREFIX + "max-replicas": "2",
                    PREFIX + "lead-time": "5"})],
            "serving/a: gang-autoscaler.io/min-replicas: is greater than max-replicas (2)",
            id="min-over-max-beside-a-bad-field",
        ),
        pytest.param(
            [("a", {PREFIX + "min-buffer": "3", PREFIX + "max-buffer": "1",
                    PREFIX + "max-replicas": "x"})],
            "serving/a: gang-autoscaler.io/min-buffer: is greater than max-buffer (1)",
            id="buffer-min-over-max-beside-a-bad-field",
        ),
        pytest.param(
            [("a", {PREFIX + "prefill-decode-ratio": "1:2", PREFIX + "forecast": "maybe"})],
            "serving/a: gang-autoscaler.io/prefill-decode-ratio: a ratio needs a prefill/decode",
            id="ratio-on-unified-beside-a-bad-field",
        ),
        pytest.param(
            list(pd({PREFIX + "prefill-decode-ratio": "1:2", PREFIX + "lead-time": "soon"},
                    {PREFIX + "prefill-decode-ratio": "1:1"})),
            "serving/chat-decode: gang-autoscaler.io/prefill-decode-ratio: components of one "
            "deployment disagree",
            id="disagreeing-ratio-beside-a-bad-field",
        ),
        pytest.param(
            [("a", {"gang-autoscaler.io/target-kv-cache": "1.5"})],
            "serving/a: gang-autoscaler.io/target-kv-cache: Input should be less than or equal",
            id="kv-over-1",
        ),
        pytest.param(
            [("a", {"gang-autoscaler.io/target-kv-cache": "0"})],
            "serving/a: gang-autoscaler.io/target-kv-cache: Input should be greater than 0",
            id="kv-zero",
        ),
    ],
)  # fmt: skip
def test_check_rejects(tmp_path, capsys, components, expected):
    path = manifest(tmp_path, *components)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: {expected}" in out


@pytest.mark.parametrize(
    ("own", "flags"),
    [
        # the service's default max-buffer (2) yields to an LWS's own min-buffer
        pytest.param({PREFIX + "min-buffer": "3"}, [], id="own-min-over-the-default-max"),
        # and a chart's default min-buffer yields to an LWS's own max-buffer
        pytest.param(
            {PREFIX + "max-buffer": "0"}, ["--default-min-buffer", "1"], id="own-max-under-min"
        ),
    ],
)
def test_check_lays_the_buffer_defaults_under_as_the_service_does(tmp_path, capsys, own, flags):
    path = manifest(tmp_path, ("a", own))
    assert main(["check", *flags, str(path)]) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        pytest.param(
            ["--default-min-buffer", "3", "--default-max-buffer", "1"],
            "--default-min-buffer (3) is above --default-max-buffer (1)",
            id="min-above-max",
        ),
        pytest.param(
            ["--default-max-buffer", "-1"],
            "--default-max-buffer: Input should be greater than or equal to 0",
            id="negative",
        ),
    ],
)
def test_check_refuses_buffer_defaults_the_service_would_refuse(tmp_path, capsys, flags, expected):
    path = manifest(tmp_path, ("a", {}))
    assert main(["check", *flags, str(path)]) == 2
    assert capsys.readouterr().err == f"gang-autoscaler check: {expected}\n"


def test_check_accepts_a_consistent_pd_deployment(tmp_path, capsys):
    path = manifest(tmp_path, *pd())
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out == ""


def test_check_warns_of_a_gang_timeout_under_the_lead_time(tmp_path, capsys):
    # valid, so it passes; but every gang that starts as slowly as the operator says gangs
    # may start is scaled away as a partial gang before it serves
    slow = {PREFIX + "lead-time": "15m"}
    path = manifest(tmp_path, *pd(slow, {**slow, PREFIX + "gang-timeout": "20m"}))
    assert main(["check", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == (
        f"{path}: serving/chat-prefill: gang-autoscaler.io/gang-timeout: warning: 600s is "
        "shorter than lead-time (900s): a new gang not ready by then is scaled away as a "
        "partial gang; set it above lead-time\n"
    )
    assert captured.err == "ok: 2 opted-in LeaderWorkerSet(s), no problems, 1 warning(s)\n"
    # with a problem as well, the warning does not count as one
    path = manifest(tmp_path, *pd(slow, {PREFIX + "max-replicas": "x"}))
    assert main(["check", str(path)]) == 1
    captured = capsys.readouterr()
    assert "gang-timeout: warning:" in captured.out
    assert captured.err == "1 problem(s), 1 warning(s) in 2 opted-in LeaderWorkerSet(s)\n"


@pytest.mark.parametrize(
    "partner_extra",
    [
        pytest.param({PREFIX + "max-replicas": "x"}, id="bad-field"),
        pytest.param({PREFIX + "component": "decod"}, id="bad-component"),
    ],
)
def test_a_bad_field_does_not_make_its_component_missing(tmp_path, capsys, partner_extra):
    path = manifest(tmp_path, *pd(None, partner_extra))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out  # the field itself, not "no decode component found"


def test_a_component_whose_deployment_is_in_error_joins_no_deployment(tmp_path, capsys):
    path = manifest(tmp_path, *pd(None, {PREFIX + "deployment": ""}))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "serving/chat-decode: gang-autoscaler.io/deployment: '' is not a name" in out
    # not a deployment of its own, named after the LWS, that lacks a prefill component
    assert "no prefill component" not in out


def test_a_field_in_error_is_not_compared_by_its_default(tmp_path, capsys):
    # max-replicas did not parse; its default of 10 is not what the operator wrote
    path = manifest(tmp_path, ("a", {PREFIX + "min-replicas": "50", PREFIX + "max-replicas": "x"}))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "max-replicas: Input should be a valid integer" in out
    assert "greater than" not in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "kind:\nmetadata: {name: a}\n",
            ": document 1: kind: missing or empty",
            id="empty-kind",
        ),
        pytest.param(
            "kind: List\nitems: [{kind: 3}]\n",
            ": document 1 item 1: kind: 3 is not a kind name",
            id="kind-not-a-string",
        ),
        pytest.param(
            "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: [a]\n",
            ": -: metadata: must be a mapping",
            id="metadata-a-list",
        ),
        pytest.param(
            "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\n"
            "metadata: {name: a, annotations: [b]}\n",
            ": default/a: metadata.annotations: must be a mapping",
            id="annotations-a-list",
        ),
        pytest.param(
            "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\n"
            "metadata: {name: a, annotations: {gang-autoscaler.io/enabled: 'true'}}\n"
            "spec: {leaderWorkerTemplate: [c]}\n",
            ": default/a: spec.leaderWorkerTemplate: malformed",
            id="template-a-list",
        ),
        # both passed as "ok: 0 opted-in LeaderWorkerSet(s), no problems"
        pytest.param(
            "- apiVersion: leaderworkerset.x-k8s.io/v1\n  kind: LeaderWorkerSet\n",
            ": document 1: file: a list, not a Kubernetes object",
            id="a-yaml-list-of-objects",
        ),
        pytest.param(
            "hello world\n", ": document 1: file: a str, not a Kubernetes object", id="plain-text"
        ),
    ],
)
def test_check_reports_malformed_objects_in_one_line(tmp_path, capsys, text, expected):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{path}{expected}")
    assert out.count("\n") == 1


def test_check_reports_a_file_that_is_not_utf8(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("kind: LeaderWorkerSet\nmetadata: {name: caf\u00e9}\n".encode("latin-1"))
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().out == f"{path}: not UTF-8 text: byte 0xe9 at offset 42\n"


def test_check_reports_unreadable_files_and_bad_yaml(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed")
    missing = tmp_path / "missing.yaml"
    assert main(["check", str(bad), str(missing)]) == 1
    # one line each, saying where: not the parser's snippet and its "<unicode string>"
    assert capsys.readouterr().out.splitlines() == [
        f"{bad}: not valid YAML: expected ',' or ']', but got '<stream end>' at line 1, "
        "column 16 (while parsing a flow sequence)",
        f"{missing}: cannot read: No such file or directory",
    ]


def test_check_reports_an_annotation_given_twice(tmp_path, capsys):
    """The second `max-replicas` silently won: the file read as valid with either value."""
    path = tmp_path / "twice.yaml"
    path.write_text(
        "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\n"
        "metadata:\n  name: llama\n  annotations:\n"
        '    gang-autoscaler.io/enabled: "true"\n'
        '    gang-autoscaler.io/max-replicas: "4"\n'
        '    gang-autoscaler.io/max-replicas: "40"\n'
    )
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "found key 'gang-autoscaler.io/max-replicas' twice (lines 7 and 8)" in out


@pytest.mark.parametrize(
    "merged",
    [
        pytest.param('{a: "1", a: "2"}', id="inline-mapping"),
        pytest.param('[{b: "1"}, {a: "1", a: "2"}]', id="inline-mapping-in-a-list"),
    ],
)
def test_check_reports_a_key_given_twice_in_a_merged_mapping(tmp_path, capsys, merged):
    """A mapping written inline after `<<:` is merged, never built as a mapping of its own:
    its second key won silently."""
    path = tmp_path / "merged.yaml"
    head = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: defaults}\ndata:\n"
    path.write_text(f"{head}  <<: {merged}\n")
    assert main(["check", str(path)]) == 1
    assert "found key 'a' twice" in capsys.readouterr().out
    path.write_text(f'{head}  <<: {{a: "1"}}\n  a: "2"\n')  # a merge overridden, as YAML means
    assert main(["check", str(path)]) == 0


def test_shipped_examples_pass_check_through_the_console_script():
    assert EXAMPLES, "examples/ must ship at least one manifest"
    result = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "check", *map(str, EXAMPLES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 opted-in LeaderWorkerSet(s)" in result.stderr


def test_shipped_examples_are_valid_leaderworkersets():
    crd = yaml.safe_load(
        shared_data_path("crds", "leaderworkerset.x-k8s.io_leaderworkersets.yaml").read_text()
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "LeaderWorkerSet":
                jsonschema.validate(doc, schema)


def test_an_lws_another_controller_owns_is_reported(tmp_path, capsys):
    path = manifest(tmp_path, *pd())
    docs = list(yaml.safe_load_all(path.read_text()))
    docs[0]["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "gc-only", "uid": "u0"},
        {"apiVersion": "example.com/v1", "kind": "ModelServer", "name": "chat", "uid": "u1",
         "controller": True},
    ]  # fmt: skip
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"{path}: serving/chat-prefill: gang-autoscaler.io/enabled: this LWS is controlled by "
        "ModelServer chat, which sets its spec.replicas: scaling it here would fight that "
        "controller, so the component holds"
    ]  # and its partner is not told it lacks a prefill component


def _sample_set(*, slices=1):
    # The upstream prefill/decode sample (shared data); it runs 2 slices, which External
    # scaling does not support, so the tests run one unless they say otherwise.
    sample = shared_data_path(
        "examples", "lws_config_samples_disaggregatedset_v1_disaggregatedset.yaml"
    )
    doc = yaml.safe_load(sample.read_text())
    doc["spec"]["slices"] = slices
    return sample, doc


def _opt_in(role, component, **extra):
    role["metadata"] = {
        "annotations": {PREFIX + "enabled": "true", PREFIX + "component": component, **extra}
    }


def test_a_static_disaggregated_set_role_that_opts_in_is_reported(tmp_path, capsys):
    sample, doc = _sample_set()
    _opt_in(doc["spec"]["roles"][1], "decode")
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    subject = f"{path}: default/disaggregatedset-sample role decode"
    assert out[0].startswith(
        f"{subject}: spec.roles[1].scaling.mode: this LWS is role decode of DisaggregatedSet "
        "disaggregatedset-sample, which sets its spec.replicas, and there is no "
        "DisaggregatedSetRoleScaler disaggregatedset-sample-decode"
    )
    assert "set `scaling.mode: External` on the role" in out[0]
    # the roles pair up under the set's name, so the missing partner is named too
    assert out[1:] == [
        f"{subject}: gang-autoscaler.io/deployment: no prefill component found for this "
        "deployment (got 'disaggregatedset-sample')"
    ]
    # the sample as shipped, without the annotations, is fine
    assert main(["check", str(sample)]) == 0


def test_external_disaggregated_set_roles_are_checked_as_the_lws_they_become(tmp_path, capsys):
    _, doc = _sample_set()
    for role in doc["spec"]["roles"]:
        role["scaling"] = {"mode": "External"}
        _opt_in(role, role["name"])
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path)]) == 0, capsys.readouterr().out
    # each role becomes one LWS
    assert "ok: 2 opted-in LeaderWorkerSet(s)" in capsys.readouterr().err
    # a role's own annotations are checked as an LWS's are
    _opt_in(doc["spec"]["roles"][0], "prefill", **{PREFIX + "max-replicas": "lots"})
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        f"{path}: default/disaggregatedset-sample role prefill: gang-autoscaler.io/max-replicas:"
    )


def _owned_by_the_set(path: Path, name: str = "chat") -> Path:
    """The LWS in `path` as a DisaggregatedSet's role LWS (`kubectl get lws -o yaml`)."""
    docs = list(yaml.safe_load_all(path.read_text()))
    for doc in docs:
        doc["metadata"]["ownerReferences"] = [
            {"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSet",
             "name": name, "uid": "u1", "controller": True},
        ]  # fmt: skip
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_the_lws_of_a_disaggregated_set_role_is_checked_in_the_set(tmp_path, capsys):
    # `kubectl get lws -o yaml` of an External role: the set's to say, not the LWS's
    path = _owned_by_the_set(manifest(tmp_path, *pd()))
    assert main(["check", str(path)]) == 0, capsys.readouterr().out


def test_the_lws_of_a_disaggregated_set_role_defaults_its_deployment_to_the_set(tmp_path, capsys):
    # Without a `deployment` annotation the service groups a set's role LWS by the set's
    # name; grouping them by their own names found "no decode component" for each.
    path = _owned_by_the_set(
        manifest(
            tmp_path,
            ("chat-prefill-abc12", {PREFIX + "component": "prefill"}),
            ("chat-decode-abc12", {PREFIX + "component": "decode"}),
        )
    )
    assert main(["check", str(path)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    ("enabled", "expected_exit"),
    [
        pytest.param({}, 1, id="policy-without-enabled-is-a-forgotten-opt-in"),
        pytest.param({PREFIX + "enabled": "yes"}, 1, id="enabled-yes-is-a-mistyped-opt-in"),
        pytest.param({PREFIX + "enabled": "ture"}, 1, id="enabled-ture-is-a-mistyped-opt-in"),
        pytest.param({PREFIX + "enabled": "false"}, 0, id="enabled-false-is-parked-on-purpose"),
    ],
)
def test_policy_annotations_on_an_lws_not_opted_in(tmp_path, capsys, enabled, expected_exit):
    path = tmp_path / "lws.yaml"
    annotations = {PREFIX + "max-replicas": "4", **enabled}
    path.write_text(LWS.format(name="a", annotations=json.dumps(annotations)))
    assert main(["check", str(path)]) == expected_exit, capsys.readouterr().out


ON = json.dumps({PREFIX + "enabled": "true", PREFIX + "max-replicas": "4"})


@pytest.mark.parametrize(
    ("text", "where", "expected"),
    [
        pytest.param(
            f"apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, annotations: {ON}}}",
            f"serving/web: {PREFIX}enabled, {PREFIX}max-replicas",
            "a Deployment (apps/v1) is never scaled",
            id="another-kind",
        ),
        pytest.param(
            LWS.format(name="a", annotations=ON).replace("kind: LeaderWorkerSet", "kind: lws"),
            f"serving/a: {PREFIX}enabled, {PREFIX}max-replicas",
            "a lws (leaderworkerset.x-k8s.io/v1) is never scaled",
            id="misspelled-kind",
        ),
        pytest.param(
            LWS.format(name="a", annotations="{}").replace(
                "    workerTemplate:\n",
                f"    workerTemplate:\n      metadata: {{annotations: {ON}}}\n",
            ),
            f"serving/a: spec.leaderWorkerTemplate.workerTemplate.metadata.annotations.{PREFIX}"
            "enabled",
            "not read on a pod template: put it in the LWS's own metadata.annotations",
            id="on-the-pod-template",
        ),
    ],
)
def test_policy_annotations_where_the_service_never_reads_them(tmp_path, capsys, text, where,
                                                               expected):  # fmt: skip
    """Each passed as "ok: 0 opted-in LeaderWorkerSet(s), no problems": an operator who
    annotated the wrong object learned nothing until the gangs never moved."""
    path = tmp_path / "objects.yaml"
    path.write_text(
        text.replace("metadata: {name: web,", "metadata: {namespace: serving, name: web,")
    )
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: {where}: {expected}" in out, out


@pytest.mark.parametrize(
    ("annotations", "where", "expected"),
    [
        # a YAML null under a bound raised TypeError out of the defaults merge: a traceback
        pytest.param({PREFIX + "max-buffer": None}, PREFIX + "max-buffer",
                     "annotation values must be strings", id="null-annotation"),
        pytest.param({}, "spec.leaderWorkerTemplate", "is not a Kubernetes quantity",
                     id="quantity-overflow"),
    ],
)  # fmt: skip
def test_values_that_used_to_crash_check_are_findings(tmp_path, capsys, annotations, where,
                                                      expected):  # fmt: skip
    doc = yaml.safe_load(LWS.format(name="a", annotations="{}"))
    doc["metadata"]["annotations"] = {PREFIX + "enabled": "true", **annotations}
    if where == "spec.leaderWorkerTemplate":
        container = doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
        container["resources"]["requests"] = {"cpu": "1e999999"}
    path = tmp_path / "lws.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: serving/a: {where}: " in out and expected in out, out


def _external(doc):
    for role in doc["spec"]["roles"]:
        role["scaling"] = {"mode": "External"}
        _opt_in(role, role["name"])
    return doc


def test_a_disaggregated_set_of_several_slices_is_reported(tmp_path, capsys):
    _, doc = _sample_set(slices=2)  # as upstream ships it
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(_external(doc)))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{path}: default/disaggregatedset-sample role {role}: spec.slices: 2 slices give role "
        f"{role} 2 LWS; the service scales a role through its one LWS and holds a role with "
        "more (External scaling needs `slices: 1`)"
        for role in ("prefill", "decode")
    ]


def _hpa_example():
    # Upstream's LWS with three HPAs on it (shared data), the LWS opted in.
    docs = list(
        yaml.safe_load_all(
            shared_data_path("examples", "lws_site_docs_examples_hpa.yaml").read_text()
        )
    )
    docs[0]["metadata"].setdefault("annotations", {})[PREFIX + "enabled"] = "true"
    return docs


def test_an_hpa_on_an_opted_in_lws_is_reported(tmp_path, capsys):
    docs = _hpa_example()
    path = tmp_path / "lws.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    hpas = [d["metadata"]["name"] for d in docs[1:]]
    assert len(hpas) == 3
    assert out == [
        f"{path}: default/leaderworkerset-sample: gang-autoscaler.io/enabled: "
        f"HorizontalPodAutoscaler default/{hpa} ({path}) also scales LeaderWorkerSet "
        "leaderworkerset-sample; the service never writes a target another autoscaler owns, "
        "so the component would hold: remove one of the two"
        for hpa in hpas
    ]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda hpa: hpa["metadata"].update(namespace="other"), id="other-namespace"),
        pytest.param(
            lambda hpa: hpa["spec"]["scaleTargetRef"].update(name="another-lws"), id="other-lws"
        ),
        pytest.param(
            lambda hpa: hpa["spec"]["scaleTargetRef"].update(apiVersion="apps/v1"),
            id="other-api-group",
        ),
    ],
)
def test_an_hpa_on_something_else_is_not_reported(tmp_path, capsys, change):
    docs = _hpa_example()
    for hpa in docs[1:]:
        change(hpa)
    path = tmp_path / "lws.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["check", str(path)]) == 0, capsys.readouterr().out


def test_an_autoscaler_on_a_roles_scaler_is_reported_in_another_file(tmp_path, capsys):
    _, doc = _sample_set()
    sets = tmp_path / "ds.yaml"
    sets.write_text(yaml.safe_dump(_external(doc)))
    # KEDA drives an HPA of its own; this one scales the decode role's RoleScaler
    keda = tmp_path / "keda.yaml"
    keda.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "metadata": {"name": "decode-queue", "namespace": "default"},
                "spec": {
                    "scaleTargetRef": {
                        "apiVersion": "disaggregatedset.x-k8s.io/v1",
                        "kind": "DisaggregatedSetRoleScaler",
                        "name": "disaggregatedset-sample-decode",
                    },
                    "triggers": [],
                },
            }
        )
    )
    assert main(["check", str(sets), str(keda)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{sets}: default/disaggregatedset-sample role decode: gang-autoscaler.io/enabled: "
        f"ScaledObject default/decode-queue ({keda}) also scales DisaggregatedSetRoleScaler "
        "disaggregatedset-sample-decode; the service never writes a target another autoscaler "
        "owns, so the component would hold: remove one of the two"
    ]


def test_an_annotation_key_that_is_not_a_string_is_no_crash(tmp_path, capsys):
    """YAML reads `1: x` as an int key: `startswith` on it was an AttributeError."""
    doc = yaml.safe_load(LWS.format(name="a", annotations="{}"))
    doc["metadata"]["annotations"] = {PREFIX + "enabled": "true", 1: "x"}
    path = tmp_path / "lws.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path)]) == 0
    assert "1 opted-in" in capsys.readouterr().err


def test_a_trailing_document_separator_is_no_finding(tmp_path, capsys):
    path = tmp_path / "lws.yaml"
    path.write_text(LWS.format(name="a", annotations="{}") + "---\n")
    assert main(["check", str(path)]) == 0


def test_an_lws_defined_twice_is_reported_and_its_last_copy_checked(tmp_path, capsys):
    """A file given twice printed every finding twice; a later copy (what `kubectl apply`
    leaves) that parks the LWS passed as the opted-in first one."""
    prefill, decode = pd()
    path = manifest(tmp_path, prefill, decode, prefill)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [
        f"{path}: serving/chat-prefill: metadata.name: defined again in {path}; the later "
        "one replaces this one when applied, and only it is checked"
    ]
    assert "2 opted-in" in out.err

    parked = ("chat-prefill", {**prefill[1], PREFIX + "enabled": "false"})
    path = manifest(tmp_path, prefill, decode, parked)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "serving/chat-prefill: metadata.name: defined again" in out
    assert "serving/chat-decode: gang-autoscaler.io/deployment: no prefill component" in out


def test_a_disaggregated_set_with_its_live_lws_is_checked_through_the_lws(tmp_path, capsys):
    """`kubectl get lws,disaggregatedsets -o yaml`: each role was checked twice, once as
    `<set>-<role>` (no such LWS), and the two claimed the same component."""
    _, ds = _sample_set()
    for role in ds["spec"]["roles"]:
        role["scaling"] = {"mode": "External"}
        _opt_in(role, role["name"])
    set_name = ds["metadata"]["name"]
    live = []
    for role in ds["spec"]["roles"]:
        lws = yaml.safe_load(
            LWS.format(name=f"{set_name}-abc12-{role['name']}", annotations=json.dumps({}))
        )
        lws["metadata"]["namespace"] = ds["metadata"].get("namespace", "default")
        lws["metadata"]["annotations"] = role["metadata"]["annotations"]
        lws["metadata"]["labels"] = {
            "disaggregatedset.x-k8s.io/name": set_name,
            "disaggregatedset.x-k8s.io/role": role["name"],
        }
        lws["metadata"]["ownerReferences"] = [
            {"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSet",
             "name": set_name, "uid": "u1", "controller": True},
        ]  # fmt: skip
        live.append(lws)
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump_all([ds, *live]))
    assert main(["check", str(path)]) == 0, capsys.readouterr().out
    assert "ok: 2 opted-in" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "expected_exit", "expected"),
    [
        # go-yaml reads `1:2` as text, YAML 1.1 as the base-60 number 62
        pytest.param("1:2", 0, "", id="unquoted-ratio-is-text-as-kubectl-reads-it"),
        # go-yaml reads `8e-1` as a number, which `kubectl apply` refuses as an annotation
        pytest.param("8e-1", 1, "annotation values must be strings", id="unquoted-exponent"),
    ],
)
def test_plain_scalars_are_typed_as_kubernetes_types_them(
    tmp_path, capsys, value, expected_exit, expected
):
    prefill, decode = pd()
    path = manifest(tmp_path, prefill, decode)
    key = "prefill-decode-ratio" if value == "1:2" else "target-kv-cache"
    text = path.read_text().replace(
        '"gang-autoscaler.io/component": "prefill"',
        f'"gang-autoscaler.io/component": "prefill", "gang-autoscaler.io/{key}": {value}',
    )
    if value == "1:2":  # both components of the deployment say the same ratio
        text = text.replace(
            '"gang-autoscaler.io/component": "decode"',
            f'"gang-autoscaler.io/component": "decode", "gang-autoscaler.io/{key}": {value}',
        )
    path.write_text(text)
    assert main(["check", str(path)]) == expected_exit
    assert expected in capsys.readouterr().out


def test_json_manifests_are_read_as_kubectl_reads_them(tmp_path, capsys):
    """Tab-indented JSON, and JSON objects one after another, were refused as bad YAML."""
    prefill, decode = pd()
    docs = list(yaml.safe_load_all(manifest(tmp_path, prefill, decode).read_text()))
    path = tmp_path / "lws.json"
    path.write_text("\n".join(json.dumps(d, indent="\t") for d in docs))
    assert main(["check", str(path)]) == 0, capsys.readouterr().out
    assert "ok: 2 opted-in" in capsys.readouterr().err
    path.write_text('{"kind": "LeaderWorkerSet", "kind": "Deployment"}')
    assert main(["check", str(path)]) == 1
    assert "cannot read: found key 'kind' twice" in capsys.readouterr().out


def test_check_reads_stdin_given_as_a_dash(tmp_path):
    prefill, decode = pd()
    text = manifest(tmp_path, prefill, ("chat-decode", {**decode[1], PREFIX + "lead": "5m"}))
    done = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "check", "-"],
        input=text.read_text(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("<stdin>: serving/chat-decode: gang-autoscaler.io/lead:")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "kind: LeaderWorkerSet\napiVersion: leaderworkerset.x-k8s.io/v1\n"
            "metadata: {name: a, ownerReferences: 5, annotations: "
            '{"gang-autoscaler.io/enabled": "true"}}\n',
            None,
            id="scalar-owner-references",
        ),
        pytest.param(
            "a:\n" + "".join(f"{' ' * i}a:\n" for i in range(1, 400)),
            "nested too deeply",
            id="deep-nesting",
        ),
    ],
)
def test_malformed_input_that_crashed_check_is_a_finding(tmp_path, capsys, text, expected):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    main(["check", str(path)])  # no traceback
    if expected is not None:
        assert expected in capsys.readouterr().out


def test_policy_annotations_on_a_disaggregated_set_roles_pod_template(tmp_path, capsys):
    """Passed as "ok: 0 opted-in": the role never scaled."""
    _, ds = _sample_set()
    role = ds["spec"]["roles"][1]
    template = role["spec"]["leaderWorkerTemplate"]
    part = "leaderTemplate" if "leaderTemplate" in template else "workerTemplate"
    template[part].setdefault("metadata", {})["annotations"] = {PREFIX + "enabled": "true"}
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(ds))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    where = f"spec.roles[1].spec.leaderWorkerTemplate.{part}.metadata.annotations"
    assert f"{where}.{PREFIX}enabled: not read on a pod template: put it in the role's" in out


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        pytest.param("08", True, id="08-is-a-float-to-go-yaml"),
        pytest.param("y", True, id="y-is-a-boolean-to-go-yaml"),
        pytest.param("0o17", True, id="0o17-is-an-integer-to-go-yaml"),
        pytest.param("2024-01-01", False, id="a-date-is-text-to-go-yaml"),
        pytest.param(".", False, id="a-dot-is-text"),
    ],
)
def test_unquoted_values_are_refused_as_kubectl_refuses_them(tmp_path, capsys, value, refused):
    path = manifest(tmp_path, ("a", {}))
    path.write_text(
        path.read_text().replace(
            '"gang-autoscaler.io/enabled": "true"',
            f'"gang-autoscaler.io/enabled": "true", "gang-autoscaler.io/deployment": {value}',
        )
    )
    main(["check", str(path)])
    out = capsys.readouterr().out
    assert ("annotation values must be strings" in out) is refused, out


def test_a_plain_dot_elsewhere_does_not_stop_the_file_being_read(tmp_path, capsys):
    """`workingDir: .` was read as a float and failed the whole file ("not valid JSON")."""
    path = manifest(tmp_path, *pd())
    path.write_text(
        path.read_text().replace("image: vllm/vllm-openai", "image: x\n            workingDir: .")
    )
    assert main(["check", str(path)]) == 0, capsys.readouterr().out


def test_yaml_that_starts_with_a_brace_is_read_as_yaml(tmp_path, capsys):
    """kubectl (1.33 and later) reads a flow mapping, and JSON followed by YAML documents;
    both were refused as bad JSON."""
    prefill, decode = pd()
    docs = list(yaml.safe_load_all(manifest(tmp_path, prefill, decode).read_text()))
    path = tmp_path / "mixed.yaml"
    path.write_text(json.dumps(docs[0]) + "\n---\n" + yaml.safe_dump(docs[1]))
    assert main(["check", str(path)]) == 0, capsys.readouterr().out
    path.write_text("{kind: ConfigMap, apiVersion: v1, metadata: {name: x}}\n")
    assert main(["check", str(path)]) == 0, capsys.readouterr().out


def test_objects_given_twice_without_our_annotations_are_taken_once_quietly(tmp_path, capsys):
    """A file given twice: an LWS that is not opted in failed the check, and an HPA on an
    opted-in LWS was reported once per copy."""
    plain = manifest(tmp_path, ("a", {}))
    plain.write_text(plain.read_text().replace('"gang-autoscaler.io/enabled": "true"', ""))
    assert main(["check", str(plain), str(plain)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    lws = manifest(tmp_path, ("a", {}))
    hpa = tmp_path / "hpa.yaml"
    hpa.write_text(
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\n"
        "metadata: {name: a, namespace: serving}\nspec:\n  scaleTargetRef: "
        "{apiVersion: leaderworkerset.x-k8s.io/v1, kind: LeaderWorkerSet, name: a}\n"
    )
    assert main(["check", str(lws), str(hpa), str(hpa)]) == 1
    assert capsys.readouterr().out.count("also scales") == 1


def test_an_equals_sign_value_is_text(tmp_path, capsys):
    """YAML 1.1's `=` had no constructor: `args: ["--sep", =]` failed the whole file."""
    path = manifest(tmp_path, *pd())
    path.write_text(
        path.read_text().replace(
            "image: vllm/vllm-openai", "image: x\n            args: [--sep, =]"
        )
    )
    assert main(["check", str(path)]) == 0, capsys.readouterr().out


def test_a_json_stream_with_a_bad_second_object_says_where(tmp_path, capsys):
    prefill, decode = pd()
    docs = list(yaml.safe_load_all(manifest(tmp_path, prefill, decode).read_text()))
    path = tmp_path / "lws.json"
    path.write_text(json.dumps(docs[0]) + "\n" + json.dumps(docs[1]).replace(",", "", 1))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: not valid JSON: Expecting ',' delimiter: line 2"), out


def test_a_flow_mapping_with_a_key_given_twice_says_so(tmp_path, capsys):
    path = tmp_path / "cm.yaml"
    path.write_text("{apiVersion: v1, kind: ConfigMap, metadata: {name: x}, data: {a: 1, a: 2}}\n")
    assert main(["check", str(path)]) == 1
    assert "found key 'a' twice" in capsys.readouterr().out
