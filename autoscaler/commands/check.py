"""`gang-autoscaler check FILE...`: validate the policy annotations in manifest files.

Reads multi-document YAML, finds LeaderWorkerSet objects opted in with
`gang-autoscaler.io/enabled: "true"`, and reports every problem the service would hold a
component for, one line each: `file: namespace/name: annotation: problem`. Components of
one deployment may sit in different files; they are checked together. A DisaggregatedSet
whose roles carry the annotations is reported too: the LWS each role becomes is the
DisaggregatedSet's to scale.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autoscaler.adapters.kube_discovery import (
    DISAGGREGATED_SET_KIND,
    controlled_by,
    controller_problem,
    with_defaults,
)
from autoscaler.core.model import ComponentKey, DeploymentKey
from autoscaler.core.policy import (
    PREFIX,
    Policy,
    PolicyError,
    deployment_key,
    is_enabled,
    parse_policy,
    validate_deployment,
)
from autoscaler.core.shape import QuantityError, gang_shape_from_lws
from autoscaler.service.settings import BufferDefaults

LWS_API_GROUP = "leaderworkerset.x-k8s.io/"
DISAGGREGATED_SET_API_GROUP = "disaggregatedset.x-k8s.io/"


@dataclass(frozen=True, slots=True)
class Finding:
    source: str
    subject: str  # namespace/name, or "-" for a file-level problem
    annotation: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.subject}: {self.annotation}: {self.message}"


def _is_lws(doc: Mapping[str, Any]) -> bool:
    return doc.get("kind") == "LeaderWorkerSet" and str(doc.get("apiVersion", "")).startswith(
        LWS_API_GROUP
    )


def _is_disaggregated_set(doc: Mapping[str, Any]) -> bool:
    return doc.get("kind") == DISAGGREGATED_SET_KIND and str(doc.get("apiVersion", "")).startswith(
        DISAGGREGATED_SET_API_GROUP
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _opted_in_roles(source: str, doc: Mapping[str, Any]) -> list[Finding]:
    """A DisaggregatedSet's roles whose LWS metadata opts in: the service would hold each
    LWS the role becomes, since the DisaggregatedSet sets its replicas."""
    metadata = _mapping(doc.get("metadata"))
    name = str(metadata.get("name", "?"))
    subject = f"{metadata.get('namespace') or 'default'}/{name}"
    roles = _mapping(doc.get("spec")).get("roles")
    if not isinstance(roles, list):
        return []
    findings = []
    for index, role in enumerate(roles):
        annotations = _mapping(_mapping(_mapping(role).get("metadata")).get("annotations"))
        if any(str(k).startswith(PREFIX) for k in annotations):
            problem = controlled_by(DISAGGREGATED_SET_KIND, name)
            role_name = _mapping(role).get("name", index)
            findings.append(
                Finding(
                    source,
                    subject,
                    f"spec.roles[{index}].metadata.annotations",
                    f"role {role_name}: {problem.message}",
                )
            )
    return findings


def check_documents(
    documents: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    default_annotations: Mapping[str, str] | None = None,
) -> tuple[list[Finding], int]:
    """Check (source, object) pairs. Returns the findings and how many opted-in LWS were seen.

    `default_annotations` are laid under each LWS's own as the service lays them (the
    operator's buffer bounds): a check that ignored them would reject what the service runs.
    """
    defaults = dict(
        BufferDefaults().annotations() if default_annotations is None else default_annotations
    )
    findings: list[Finding] = []
    policies: dict[ComponentKey, Policy] = {}
    unparsed: dict[ComponentKey, frozenset[str]] = {}
    sources: dict[ComponentKey, str] = {}
    seen = 0
    for source, doc in documents:
        if _is_disaggregated_set(doc):
            findings.extend(_opted_in_roles(source, doc))
            continue
        if not _is_lws(doc):
            continue
        metadata = doc.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            findings.append(Finding(source, "-", "metadata", "must be a mapping"))
            continue
        name = str(metadata.get("name", "?"))
        key = ComponentKey(str(metadata.get("namespace") or "default"), name)
        annotations = metadata.get("annotations") or {}
        if not isinstance(annotations, Mapping):
            findings.append(Finding(source, str(key), "metadata.annotations", "must be a mapping"))
            continue
        if not is_enabled(annotations):
            if any(str(k).startswith(PREFIX) for k in annotations):
                findings.append(
                    Finding(
                        source,
                        str(key),
                        PREFIX + "enabled",
                        'policy annotations present but the LWS is not opted in (set "true")',
                    )
                )
            continue
        seen += 1
        sources[key] = source
        owned = controller_problem(doc)
        if owned is not None:
            # Its annotations are still checked, and it still counts in its deployment.
            findings.append(Finding(source, str(key), owned.annotation, owned.detail))
        try:
            gang_shape_from_lws(doc)
        except (QuantityError, ValueError, TypeError) as err:
            findings.append(Finding(source, str(key), "spec.leaderWorkerTemplate", str(err)))
        except AttributeError as err:  # a list or a scalar where the template has a mapping
            findings.append(
                Finding(source, str(key), "spec.leaderWorkerTemplate", f"malformed: {err}")
            )
        try:
            policies[key] = parse_policy(with_defaults(annotations, defaults), lws_name=name)
        except PolicyError as err:
            findings.extend(Finding(source, str(key), p.annotation, p.detail) for p in err.problems)
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
            findings.extend(
                Finding(sources[key], str(key), p.annotation, p.detail) for p in problems
            )
    return findings, seen


def _read(paths: Iterable[str]) -> tuple[list[tuple[str, Mapping[str, Any]]], list[Finding]]:
    documents: list[tuple[str, Mapping[str, Any]]] = []
    errors: list[Finding] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
            for number, doc in enumerate(yaml.safe_load_all(text), start=1):
                if not isinstance(doc, dict):
                    continue
                objects, problems = _objects(path, f"document {number}", doc)
                documents.extend(objects)
                errors.extend(problems)
        except OSError as err:
            errors.append(Finding(path, "-", "file", f"cannot read: {err.strerror or err}"))
        except UnicodeDecodeError as err:
            errors.append(
                Finding(
                    path,
                    "-",
                    "file",
                    f"not UTF-8 text: byte 0x{err.object[err.start]:02x} at offset {err.start}",
                )
            )
        except yaml.YAMLError as err:
            errors.append(Finding(path, "-", "file", f"not valid YAML: {err}".replace("\n", " ")))
    return documents, errors


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
        why = err.errors()[0]["msg"].removeprefix("Value error, ")
        why = why.replace("min_gangs", "--default-min-buffer").replace(
            "max_gangs", "--default-max-buffer"
        )
        print(f"gang-autoscaler check: {why}", file=sys.stderr)
        return 2
    documents, findings = _read(args.files)
    checked, seen = check_documents(documents, default_annotations=buffer.annotations())
    findings.extend(checked)
    for finding in findings:
        print(finding)
    if findings:
        print(f"{len(findings)} problem(s) in {seen} opted-in LeaderWorkerSet(s)", file=sys.stderr)
        return 1
    print(f"ok: {seen} opted-in LeaderWorkerSet(s), no problems", file=sys.stderr)
    return 0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="validate gang-autoscaler annotations in manifest files",
        description="Validate the gang-autoscaler.io/* policy annotations of LeaderWorkerSet "
        "objects in YAML manifests. Prints one line per problem and exits 1 on any.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML manifest files")
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
