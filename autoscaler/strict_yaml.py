"""YAML as `yaml.safe_load` reads it, except that a key given twice in one mapping is an error.

PyYAML keeps the last of two equal keys without a word: a configuration file with `tick:`
twice, or a manifest with one annotation twice, ran on whichever came last. The error names
the key and both lines. Merge keys (`<<: *defaults`) still override as YAML intends.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterator
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, SequenceNode

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    pass


def _refuse_duplicates(loader: _StrictLoader, node: MappingNode) -> None:
    first_line: dict[Hashable, int] = {}
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE_TAG:
            # a mapping written inline after `<<:` is only merged, never constructed as a
            # mapping of its own: its keys are checked here (an alias was, where defined)
            merged = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
            for inline in merged:
                if isinstance(inline, MappingNode):
                    _refuse_duplicates(loader, inline)
            continue
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            continue  # construct_mapping says what is wrong with it
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found key {key!r} twice (lines {first_line[key]} and {line}); the last one "
                "would silently win",
                key_node.start_mark,
            )
        first_line[key] = line


def _mapping(loader: _StrictLoader, node: MappingNode) -> dict[Any, Any]:
    _refuse_duplicates(loader, node)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_VALUE_TAG = "tag:yaml.org,2002:value"  # YAML 1.1's `=`, which no constructor takes


class _ManifestLoader(_StrictLoader):
    """Plain scalars typed as Kubernetes reads them (go-yaml v2, through sigs.k8s.io/yaml),
    not as YAML 1.1: `1:2` is the text "1:2", not the base-60 number 62; `8e-1` and `08`
    are numbers; `y` and `n` are booleans; a date is text. Else an unquoted ratio annotation
    that `kubectl apply` takes was refused, and unquoted values that it refuses
    (annotation values must be strings) passed."""


def _go_int(loader: _ManifestLoader, node: yaml.ScalarNode) -> int:
    """go-yaml's integer: Go's base-0 parse (0b, 0o, 0x in either case; a leading 0 is
    octal), underscores dropped."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        return sign * int(digits, 8)
    return sign * int(digits, 0)


# its own copy, without YAML 1.1's int, float, bool, timestamp and value
_ManifestLoader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in (_INT_TAG, _FLOAT_TAG, _BOOL_TAG, _TIMESTAMP_TAG, _VALUE_TAG)
    ]
    for first, resolvers in _StrictLoader.yaml_implicit_resolvers.items()
}
_ManifestLoader.add_implicit_resolver(
    _BOOL_TAG,
    re.compile(
        r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE"
        r"|on|On|ON|off|Off|OFF)$"
    ),
    list("yYnNtTfFoO"),
)
_ManifestLoader.add_implicit_resolver(
    _INT_TAG,
    re.compile(
        r"^[-+]?(?:0[bB]_*[01][01_]*|0[oO]_*[0-7][0-7_]*|0[xX]_*[0-9a-fA-F][0-9a-fA-F_]*"
        r"|0[0-7_]*|[1-9][0-9_]*)$"
    ),
    list("-+0123456789"),
)
_ManifestLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9_]*[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
_TRUE = frozenset({"y", "yes", "true", "on"})
_ManifestLoader.add_constructor(_INT_TAG, _go_int)


def _go_bool(loader: _ManifestLoader, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)).lower() in _TRUE


_ManifestLoader.add_constructor(_BOOL_TAG, _go_bool)


def load(text: str) -> Any:
    """The one document of `text`; `yaml.YAMLError` on bad YAML or a key given twice."""
    return yaml.load(text, Loader=_StrictLoader)


def load_all(text: str) -> Iterator[Any]:
    """Every document of `text`, as `yaml.safe_load_all`, refusing a key given twice."""
    return yaml.load_all(text, Loader=_StrictLoader)


def load_all_manifests(text: str) -> Iterator[Any]:
    """Every document of `text` with scalars typed as Kubernetes types them, refusing a key
    given twice."""
    return yaml.load_all(text, Loader=_ManifestLoader)
