"""YAML as `yaml.safe_load` reads it, except that a key given twice in one mapping is an error.

PyYAML keeps the last of two equal keys without a word: a configuration file with `tick:`
twice, or a manifest with one annotation twice, ran on whichever came last. The error names
the key and both lines. Merge keys (`<<: *defaults`) still override as YAML intends.
"""

from __future__ import annotations

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


def load(text: str) -> Any:
    """The one document of `text`; `yaml.YAMLError` on bad YAML or a key given twice."""
    return yaml.load(text, Loader=_StrictLoader)


def load_all(text: str) -> Iterator[Any]:
    """Every document of `text`, as `yaml.safe_load_all`, refusing a key given twice."""
    return yaml.load_all(text, Loader=_StrictLoader)
