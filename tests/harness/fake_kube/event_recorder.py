"""Events written by the emulated controllers, one per (object, reason, message).

Like client-go's event recorder, repeating the same event does not add another object.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import TYPE_CHECKING

from tests.harness.fake_kube.store import Obj

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster


def rfc3339_micro(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_event(
    cluster: Cluster,
    *,
    regarding: Obj,
    kind: str,
    api_version: str,
    reason: str,
    message: str,
    type_: str,
    component: str = "lws",
) -> None:
    """Write one core/v1 Event per (object, reason, message), as a controller's recorder does."""
    events = cluster.rtype("", "events")
    meta = regarding["metadata"]
    namespace = meta.get("namespace") or "default"
    digest = hashlib.sha1(f"{meta['uid']}/{reason}/{message}".encode()).hexdigest()[:10]
    name = f"{meta['name']}.{digest}"
    if cluster.store.get(events.key, namespace, name) is not None:
        return
    now = cluster.now_text()
    cluster.create(
        events,
        namespace,
        {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": api_version,
                "kind": kind,
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": component},
            "eventTime": rfc3339_micro(cluster.clock()),
            "reportingInstance": f"{component}-fake",
            "action": reason,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": component,
        },
        reconcile=False,
    )
