"""events.k8s.io/v1 Events as a second view of core/v1 Events, as the API server serves them.

One stored object, two shapes: the field mapping is that of Kubernetes'
`pkg/apis/events/v1` conversion (regarding = involvedObject, note = message,
deprecatedCount = count, ...).
"""

from __future__ import annotations

import copy
from typing import Any

Obj = dict[str, Any]

VIEW_KEY = "events.k8s.io/events"

# (core/v1 field, events.k8s.io/v1 field)
_RENAMED = (
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
)
_SHARED = (
    "metadata",
    "related",
    "reportingInstance",
    "eventTime",
    "series",
    "action",
    "reason",
    "type",
)


def _convert(obj: Obj, pairs: tuple[tuple[str, str], ...]) -> Obj:
    converted = {key: copy.deepcopy(obj[key]) for key in _SHARED if key in obj}
    for source, target in pairs:
        if obj.get(source) is not None:
            converted[target] = copy.deepcopy(obj[source])
    return converted


def core_to_events(obj: Obj) -> Obj:
    return _convert(obj, _RENAMED)


def events_to_core(obj: Obj) -> Obj:
    return _convert(obj, tuple((b, a) for a, b in _RENAMED))
