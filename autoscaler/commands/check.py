"""`gang-autoscaler check FILE...`: validate the policy annotations in manifest files.

Reads multi-document YAML, finds LeaderWorkerSet objects opted in with
`gang-autoscaler.io/enabled: "true"`, and reports every problem the service would hold a
component for, one line each: `file: namespace/name: annotation: problem`. Components of
one deployment may sit in different files; they are checked together.

A DisaggregatedSet's roles are checked as the LWS each becomes: the role's
`metadata.annotations` are that LWS's, and its deployment defaults to the set's name. A role
the service cannot scale (one without `scaling.mode: External`) is reported. An LWS manifest
that another controller owns is reported, except a DisaggregatedSet's: whether its role is
External is written in the DisaggregatedSet, and checked there. A set of more than one slice
is reported too: each of its roles has one LWS per slice, and the service holds such a role.

A HorizontalPodAutoscaler or KEDA ScaledObject in the same files whose `scaleTargetRef` is
an opted-in LWS (or a role's DisaggregatedSetRoleScaler) is reported: the service never
writes a target another autoscaler owns.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autoscaler import strict_yaml
from autoscaler.adapters.kube_discovery import (
    controller_problem,
    owner_defaults,
    role_scaler_name,
    static_role,
    with_defaults,
)
from autoscaler.adapters.kube_objects import DS_KIND, DS_NAME_LABEL, DS_ROLE_LABEL, ScaleTarget
from autoscaler.core.model import ComponentKey, DeploymentKey
from autoscaler.core.policy import (
    ANNOTATIONS,
    PREFIX,
    Policy,
    PolicyError,
    deployment_key,
    is_enabled,
    parse_policy,
    policy_cautions,
    validate_deployment,
)
from autoscaler.core.shape import QuantityError, gang_shape_from_lws
from autoscaler.service.settings import BufferDefaults
from autoscaler.validation_errors import describe_validation_error

LWS_API_GROUP = "leaderworkerset.x-k8s.io/"
DISAGGREGATED_SET_API_GROUP = "disaggregatedset.x-k8s.io/"
# Other autoscalers that write a `/scale` subresource named by `spec.scaleTargetRef`: the
# HPA (autoscaling/v1 and v2) and KEDA's ScaledObject (which drives an HPA of its own).
OTHER_AUTOSCALERS = {"HorizontalPodAutoscaler": "autoscaling/", "ScaledObject": "keda.sh/"}


@dataclass(frozen=True, slots=True)
class Finding:
    source: str
    subject: str  # namespace/name, or "-" for a file-level problem
    annotation: str
    message: str
    # a valid policy that works against itself: printed, not counted as a problem
    warning: bool = False

    def __str__(self) -> str:
        said = f"warning: {self.message}" if self.warning else self.message
        if (self.subject, self.annotation) == ("-", "file"):  # about the file as a whole
            return f"{self.source}: {said}"
        return f"{self.source}: {self.subject}: {self.annotation}: {said}"


def _is_lws(doc: Mapping[str, Any]) -> bool:
    return doc.get("kind") == "LeaderWorkerSet" and str(doc.get("apiVersion", "")).startswith(
        LWS_API_GROUP
    )


def _is_disaggregated_set(doc: Mapping[str, Any]) -> bool:
    return doc.get("kind") == DS_KIND and str(doc.get("apiVersion", "")).startswith(
        DISAGGREGATED_SET_API_GROUP
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True, slots=True)
class _Candidate:
    """An LWS to check: one written as such, or the one a DisaggregatedSet role becomes."""

    source: str
    key: ComponentKey
    subject: str  # where its findings point
    metadata: Mapping[str, Any]
    lws: Mapping[str, Any]  # the LWS, or the role (its `spec` is the LWS's)
    scale_target: ScaleTarget
    template_path: str = "spec.leaderWorkerTemplate"
    defaults: Mapping[str, str] | None = None  # over the operator's, under its own
    findings: tuple[Finding, ...] = ()
    role: tuple[str, str] | None = None  # (DisaggregatedSet, role) of a role's candidate


def _roles(source: str, doc: Mapping[str, Any]) -> list[_Candidate]:
    """The LWS each role of a DisaggregatedSet becomes. A role whose metadata carries
    gang-autoscaler annotations but that the service cannot scale (not External) comes with
    its finding."""
    metadata = _mapping(doc.get("metadata"))
    name = str(metadata.get("name", "?"))
    namespace = str(metadata.get("namespace") or "default")
    roles = _mapping(doc.get("spec")).get("roles")
    if not isinstance(roles, list):
        return []
    slices = _mapping(doc.get("spec")).get("slices", 1)
    found = []
    for index, role in enumerate(roles):
        role = _mapping(role)
        role_name = str(role.get("name", index))
        subject = f"{namespace}/{name} role {role_name}"
        role_meta = _mapping(role.get("metadata"))
        annotations = _mapping(role_meta.get("annotations"))
        scaler = ScaleTarget.role_scaler(role_scaler_name(name, role_name))
        unscalable: list[Finding] = []
        if any(str(k).startswith(PREFIX) for k in annotations):
            if _mapping(role.get("scaling")).get("mode") != "External":
                problem = static_role(name, role_name)
                where = f"spec.roles[{index}].scaling.mode"
                unscalable.append(Finding(source, subject, where, problem.message))
            if isinstance(slices, int) and slices > 1:
                unscalable.append(
                    Finding(
                        source,
                        subject,
                        "spec.slices",
                        f"{slices} slices give role {role_name} {slices} LWS; the service "
                        "scales a role through its one LWS and holds a role with more "
                        "(External scaling needs `slices: 1`)",
                    )
                )
        found.append(
            _Candidate(
                source,
                ComponentKey(namespace, f"{name}-{role_name}"),
                subject,
                role_meta,
                role,
                scaler,
                template_path=f"spec.roles[{index}].spec.leaderWorkerTemplate",
                defaults={PREFIX + "deployment": name},
                findings=tuple(unscalable),
                role=(name, role_name),
            )
        )
    return found


def _candidates(
    documents: Iterable[tuple[str, Mapping[str, Any]]], findings: list[Finding]
) -> list[_Candidate]:
    found: list[_Candidate] = []
    for source, doc in documents:
        if _is_disaggregated_set(doc):
            found.extend(_roles(source, doc))
            continue
        if not _is_lws(doc):
            continue
        metadata = doc.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            findings.append(Finding(source, "-", "metadata", "must be a mapping"))
            continue
        key = ComponentKey(
            str(metadata.get("namespace") or "default"), str(metadata.get("name", "?"))
        )
        owned = controller_problem(doc)
        found.append(
            _Candidate(
                source,
                key,
                str(key),
                metadata,
                doc,
                ScaleTarget.lws(key.lws),
                # `kubectl get lws -o yaml` of a DisaggregatedSet's roles: grouped as the
                # service groups them, by the owner's name
                defaults=owner_defaults(doc),
                findings=(Finding(source, str(key), owned.annotation, owned.detail),)
                if owned is not None
                else (),
            )
        )
    # A DisaggregatedSet given with the LWS of its roles (`kubectl get lws,disaggregatedsets
    # -o yaml`): the service sees only the LWS, so a role is checked once, through its LWS.
    live = {
        (c.key.namespace, str(_labels(c.metadata).get(DS_NAME_LABEL)), str(role))
        for c in found
        if c.role is None and (role := _labels(c.metadata).get(DS_ROLE_LABEL))
    }
    return [c for c in found if c.role is None or (c.key.namespace, *c.role) not in live]


def _labels(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(metadata.get("labels"))


@dataclass(frozen=True, slots=True)
class _OtherAutoscaler:
    source: str
    namespace: str
    name: str  # "HorizontalPodAutoscaler ns/name"
    scale_target_ref: Mapping[str, Any]


def _other_autoscalers(
    documents: Iterable[tuple[str, Mapping[str, Any]]],
) -> list[_OtherAutoscaler]:
    found = []
    for source, doc in documents:
        kind = doc.get("kind")
        group = OTHER_AUTOSCALERS.get(kind) if isinstance(kind, str) else None
        if group is None or not str(doc.get("apiVersion", "")).startswith(group):
            continue
        metadata = _mapping(doc.get("metadata"))
        namespace = str(metadata.get("namespace") or "default")
        name = f"{kind} {namespace}/{metadata.get('name', '?')}"
        ref = _mapping(_mapping(doc.get("spec")).get("scaleTargetRef"))
        found.append(_OtherAutoscaler(source, namespace, name, ref))
    return found


def _ours(annotations: object) -> list[str]:
    """The policy annotations among these (not every key under the prefix: balloon pods
    carry `gang-autoscaler.io/balloon-shape`)."""
    return sorted(str(k) for k in _mapping(annotations) if str(k) in ANNOTATIONS)


def _on_pod_templates(
    source: str, subject: str, owner: Mapping[str, Any], path: str, instead: str
) -> list[Finding]:
    """Policy annotations on the pod templates of an LWS (or of a role's LWS spec)."""
    template = _mapping(_mapping(owner.get("spec")).get("leaderWorkerTemplate"))
    found = []
    for part in ("leaderTemplate", "workerTemplate"):
        pod_meta = _mapping(_mapping(template.get(part)).get("metadata"))
        for key in _ours(pod_meta.get("annotations")):
            found.append(
                Finding(
                    source,
                    subject,
                    f"{path}spec.leaderWorkerTemplate.{part}.metadata.annotations.{key}",
                    f"not read on a pod template: put it in {instead} metadata.annotations",
                )
            )
    return found


def _misplaced(documents: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Finding]:
    """gang-autoscaler annotations where the service never reads them: on another kind (a
    Deployment, an LWS of another API version), on an LWS's pod templates, or on a
    DisaggregatedSet itself rather than its roles. Each would pass as "no problems" and
    never scale."""
    found = []
    for source, doc in documents:
        metadata = _mapping(doc.get("metadata"))
        subject = f"{metadata.get('namespace') or 'default'}/{metadata.get('name', '?')}"
        own = _ours(metadata.get("annotations"))
        if _is_lws(doc):
            found.extend(_on_pod_templates(source, subject, doc, "", "the LWS's own"))
        elif _is_disaggregated_set(doc):
            roles = _mapping(doc.get("spec")).get("roles")
            for index, role in enumerate(roles if isinstance(roles, list) else ()):
                found.extend(
                    _on_pod_templates(
                        source, subject, _mapping(role), f"spec.roles[{index}].", "the role's"
                    )
                )
            for key in own:
                found.append(
                    Finding(
                        source,
                        subject,
                        f"metadata.annotations.{key}",
                        "not read on the DisaggregatedSet itself: put it in "
                        "spec.roles[].metadata.annotations of each role to scale",
                    )
                )
        elif own:
            found.append(
                Finding(
                    source,
                    subject,
                    ", ".join(own),
                    f"a {doc.get('kind')} ({doc.get('apiVersion', 'no apiVersion')}) is never "
                    "scaled: the service reads these annotations on LeaderWorkerSets "
                    f"({LWS_API_GROUP}v1) and DisaggregatedSet roles only",
                )
            )
    return found


def _last_copies(
    documents: Iterable[tuple[str, Mapping[str, Any]]],
) -> tuple[list[tuple[str, Mapping[str, Any]]], list[Finding]]:
    """Each object once: its last copy, the one `kubectl apply` leaves (two files, or a
    copy-paste that kept a name). An earlier copy that carries gang-autoscaler annotations
    is a finding; one that does not is dropped without a word."""
    docs = list(documents)
    last = {_identity(doc, i): i for i, (_, doc) in enumerate(docs)}
    kept: list[tuple[str, Mapping[str, Any]]] = []
    findings: list[Finding] = []
    for i, (source, doc) in enumerate(docs):
        identity = _identity(doc, i)
        if last[identity] == i:
            kept.append((source, doc))
            continue
        if _annotated(doc):
            later = docs[last[identity]][0]
            findings.append(
                Finding(
                    source,
                    f"{identity[2]}/{identity[3]}",
                    "metadata.name",
                    f"defined again in {later}; the later one replaces this one when "
                    "applied, and only it is checked",
                )
            )
    return kept, findings


def _identity(doc: Mapping[str, Any], index: int) -> tuple[object, ...]:
    """(kind, API group, namespace, name); an object without a name is its own."""
    metadata = _mapping(doc.get("metadata"))
    name = metadata.get("name")
    if not name:
        return ("unnamed", index, "", "")
    group = str(doc.get("apiVersion", "")).rpartition("/")[0]
    return (doc.get("kind"), group, str(metadata.get("namespace") or "default"), str(name))


def _annotated(doc: Mapping[str, Any]) -> bool:
    """Whether the object, or a role of it, carries an annotation under the prefix."""
    roles = _mapping(doc.get("spec")).get("roles")
    metas = [doc.get("metadata")] + [
        _mapping(r).get("metadata") for r in (roles if isinstance(roles, list) else ())
    ]
    return any(
        str(key).startswith(PREFIX)
        for meta in metas
        for key in _mapping(_mapping(meta).get("annotations"))
    )


def check_documents(
    documents: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    default_annotations: Mapping[str, str] | None = None,
) -> tuple[list[Finding], int]:
    """Check (source, object) pairs. Returns the findings and how many opted-in LWS (or
    DisaggregatedSet roles) were seen.

    `default_annotations` are laid under each LWS's own as the service lays them (the
    operator's buffer bounds): a check that ignored them would reject what the service runs.
    """
    defaults = dict(
        BufferDefaults().annotations() if default_annotations is None else default_annotations
    )
    documents, replaced = _last_copies(documents)
    autoscalers = _other_autoscalers(documents)
    findings: list[Finding] = _misplaced(documents)
    policies: dict[ComponentKey, Policy] = {}
    unparsed: dict[ComponentKey, frozenset[str]] = {}
    where: dict[ComponentKey, tuple[str, str]] = {}  # (source, subject)
    findings.extend(replaced)
    seen = 0
    candidates = _candidates(documents, findings)
    # An object given twice (two files, or a copy-paste that kept a name): `kubectl apply`
    # leaves the last one, so that one is checked, and each earlier one is a finding.
    last = {c.key: c for c in candidates}
    for lws in candidates:
        source, key, subject = lws.source, lws.key, lws.subject
        if last[key] is not lws:
            later = last[key]
            findings.append(
                Finding(
                    source,
                    subject,
                    "metadata.name",
                    f"defined again in {later.source} ({later.subject}); the later one "
                    "replaces this one when applied, and only it is checked",
                )
            )
            continue
        annotations = lws.metadata.get("annotations") or {}
        if not isinstance(annotations, Mapping):
            findings.append(Finding(source, subject, "metadata.annotations", "must be a mapping"))
            continue
        if not is_enabled(annotations):
            # Policy annotations without `enabled: "true"` look like a forgotten or mistyped
            # opt-in ("yes", "ture"); an explicit "false" is a deployment parked on purpose
            # (docs/operators.md), not a problem.
            parked = str(annotations.get(PREFIX + "enabled", "")).strip().lower() == "false"
            if not parked and any(str(k).startswith(PREFIX) for k in annotations):
                findings.append(
                    Finding(
                        source,
                        subject,
                        PREFIX + "enabled",
                        'policy annotations present but the LWS is not opted in (set "true")',
                    )
                )
            continue
        seen += 1
        where[key] = (source, subject)
        # Its annotations are still checked, and it still counts in its deployment.
        findings.extend(lws.findings)
        for other in autoscalers:
            if other.namespace == key.namespace and lws.scale_target.is_target_of(
                other.scale_target_ref
            ):
                findings.append(
                    Finding(
                        source,
                        subject,
                        PREFIX + "enabled",
                        f"{other.name} ({other.source}) also scales {lws.scale_target}; the "
                        "service never writes a target another autoscaler owns, so the "
                        "component would hold: remove one of the two",
                    )
                )
        try:
            gang_shape_from_lws(lws.lws)
        except (QuantityError, ValueError, TypeError, ArithmeticError) as err:
            findings.append(Finding(source, subject, lws.template_path, str(err)))
        except AttributeError as err:  # a list or a scalar where the template has a mapping
            findings.append(Finding(source, subject, lws.template_path, f"malformed: {err}"))
        own_defaults = {**defaults, **(lws.defaults or {})}
        try:
            policies[key] = parse_policy(with_defaults(annotations, own_defaults), lws_name=key.lws)
            findings.extend(
                Finding(source, subject, c.annotation, c.detail, warning=True)
                for c in policy_cautions(policies[key])
            )
        except PolicyError as err:
            findings.extend(Finding(source, subject, p.annotation, p.detail) for p in err.problems)
            # What did parse is still checked against the other components of its deployment,
            # unless which deployment it belongs to is itself in error.
            if err.partial is not None and "deployment" not in err.unparsed:
                policies[key] = err.partial
                unparsed[key] = err.unparsed

    deployments: dict[DeploymentKey, dict[ComponentKey, Policy]] = {}
    for key, policy in policies.items():
        deployments.setdefault(deployment_key(key, policy), {})[key] = policy
    for members in deployments.values():
        problems_by_key = validate_deployment(members, unparsed=unparsed)
        for key, problems in sorted(problems_by_key.items()):
            findings.extend(Finding(*where[key], p.annotation, p.detail) for p in problems)
    return findings, seen


def _read(paths: Iterable[str]) -> tuple[list[tuple[str, Mapping[str, Any]]], list[Finding]]:
    documents: list[tuple[str, Mapping[str, Any]]] = []
    errors: list[Finding] = []
    for path in paths:
        name = "<stdin>" if path == "-" else path
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
            for number, doc in enumerate(_documents(text), start=1):
                if doc is None:  # an empty document, e.g. after a trailing `---`
                    continue
                if not isinstance(doc, dict):
                    # a YAML list of objects, or plain text: said, not passed as "no problems"
                    errors.append(
                        Finding(
                            name,
                            f"document {number}",
                            "file",
                            f"{_a(type(doc).__name__)}, not a Kubernetes object (a mapping "
                            "with kind and metadata); several objects go in documents split "
                            "by ---, or in a kind: List",
                        )
                    )
                    continue
                objects, problems = _objects(name, f"document {number}", doc)
                documents.extend(objects)
                errors.extend(problems)
        except OSError as err:
            errors.append(Finding(name, "-", "file", f"cannot read: {err.strerror or err}"))
        except UnicodeDecodeError as err:
            errors.append(
                Finding(
                    name,
                    "-",
                    "file",
                    f"not UTF-8 text: byte 0x{err.object[err.start]:02x} at offset {err.start}",
                )
            )
        except yaml.YAMLError as err:
            errors.append(Finding(name, "-", "file", f"not valid YAML: {_yaml_problem(err)}"))
        except json.JSONDecodeError as err:
            errors.append(Finding(name, "-", "file", f"not valid JSON: {err}"))
        except ValueError as err:  # a key given twice in JSON, a scalar no type takes
            errors.append(Finding(name, "-", "file", f"cannot read: {err}"))
        except RecursionError:
            errors.append(Finding(name, "-", "file", "nested too deeply to read"))
    return documents, errors


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _documents(text: str) -> list[Any]:
    """The documents of a manifest file, as `kubectl` reads them: JSON objects one after
    another (tabs and all), or else YAML documents with scalars typed as Kubernetes types
    them. Text that starts with `{` but is not JSON (a flow mapping, or one JSON object
    followed by YAML documents) is read on as YAML from where JSON stopped, as kubectl 1.33
    and later read it; past a second JSON object, a JSON error is one."""
    start = len(text) - len(text.lstrip("\ufeff \t\r\n"))
    if text[start : start + 1] != "{":  # kubectl takes only `{` for JSON
        return list(strict_yaml.load_all_manifests(text))
    decoder = json.JSONDecoder(object_pairs_hook=_refuse_duplicate_keys)
    found: list[Any] = []
    while start < len(text):
        try:
            doc, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as err:
            if len(found) > 1:
                raise
            if not found:  # YAML from the start: its error says what is wrong
                return list(strict_yaml.load_all_manifests(text))
            try:
                return [*found, *strict_yaml.load_all_manifests(text[start:])]
            except yaml.YAMLError:
                raise err from None  # JSON, then neither: where the JSON goes wrong
        found.append(doc)
        start = _SPACE.match(text, end).end()  # type: ignore[union-attr]  # \s* matches
    return found


_SPACE = re.compile(r"\s*")


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"found key {key!r} twice; the last one would silently win")
        found[key] = value
    return found


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line: what is wrong and where (line and column from 1), without the parser's
    snippet of the text and the `"<unicode string>"` it read from."""
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem is None:
        return " ".join(str(err).split())
    where = err.problem_mark
    at = "" if where is None else f" at line {where.line + 1}, column {where.column + 1}"
    context = f" ({err.context})" if err.context else ""
    return f"{err.problem}{at}{context}"


def _objects(
    path: str, where: str, doc: Mapping[str, Any]
) -> tuple[list[tuple[str, Mapping[str, Any]]], list[Finding]]:
    """The objects of one YAML document: itself, or the items of a `...List`."""
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind.strip():
        shown = "missing or empty" if kind in (None, "") else f"{kind!r} is not a kind name"
        return [], [Finding(path, where, "kind", f"{shown}; every Kubernetes object has one")]
    items = doc.get("items") if kind.endswith("List") else None
    if not isinstance(items, list):
        return [(path, doc)], []
    objects: list[tuple[str, Mapping[str, Any]]] = []
    problems: list[Finding] = []
    for number, item in enumerate(items, start=1):
        if isinstance(item, dict):
            found, wrong = _objects(path, f"{where} item {number}", item)
            objects.extend(found)
            problems.extend(wrong)
    return objects, problems


def run(args: argparse.Namespace) -> int:
    try:
        buffer = BufferDefaults(
            min_gangs=args.default_min_buffer, max_gangs=args.default_max_buffer
        )
    except ValidationError as err:
        flags = {"min_gangs": "--default-min-buffer", "max_gangs": "--default-max-buffer"}
        why = describe_validation_error(err, names=flags).strip()
        for field, flag in flags.items():  # named in a message across both
            why = why.replace(field, flag)
        print(f"gang-autoscaler check: {why.removeprefix('settings: ')}", file=sys.stderr)
        return 2
    documents, findings = _read(args.files)
    checked, seen = check_documents(documents, default_annotations=buffer.annotations())
    findings.extend(checked)
    for finding in findings:
        print(finding)
    problems = sum(not f.warning for f in findings)
    warnings = f", {len(findings) - problems} warning(s)" if len(findings) > problems else ""
    if problems:
        print(
            f"{problems} problem(s){warnings} in {seen} opted-in LeaderWorkerSet(s)",
            file=sys.stderr,
        )
        return 1
    print(f"ok: {seen} opted-in LeaderWorkerSet(s), no problems{warnings}", file=sys.stderr)
    return 0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="validate gang-autoscaler annotations in manifest files",
        description="Validate the gang-autoscaler.io/* policy annotations of LeaderWorkerSet "
        "objects in YAML manifests. Prints one line per problem and exits 1 on any.",
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="YAML or JSON manifest files; - reads standard input",
    )
    defaults = BufferDefaults()
    parser.add_argument(
        "--default-min-buffer",
        type=int,
        default=defaults.min_gangs,
        metavar="N",
        help="min-buffer for an LWS that sets none, as the service is run with (the chart's "
        f"buffer.minGangs; default {defaults.min_gangs})",
    )
    parser.add_argument(
        "--default-max-buffer",
        type=int,
        default=defaults.max_gangs,
        metavar="N",
        help="max-buffer for an LWS that sets none (the chart's buffer.maxGangs; default "
        f"{defaults.max_gangs})",
    )
    parser.set_defaults(func=run)
