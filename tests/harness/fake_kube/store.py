"""Object storage with one global resourceVersion counter, a bounded event history and watchers.

Like etcd behind the API server: every write gets the next resourceVersion, the change is
kept in a history of bounded length (older entries are compacted away, so a watch that
resumes from before them gets 410 Gone), and open watches receive the change at once.
Stored objects are never mutated in place: every write stores a fresh copy, so history
entries and watch events can share them safely.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Change:
    resource_version: int
    resource_key: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None


@dataclass(eq=False)
class Watcher:
    """One open watch: a queue of (type, object) filtered by namespace and selectors."""

    resource_key: str
    namespace: str | None
    matches: Callable[[Obj], bool]
    queue: asyncio.Queue[tuple[str, Obj] | None] = field(default_factory=asyncio.Queue)

    def offer(self, change: Change) -> None:
        if change.resource_key != self.resource_key:
            return
        if self.namespace is not None and change.obj["metadata"].get("namespace") != self.namespace:
            return
        now_in = self.matches(change.obj)
        was_in = change.old is not None and self.matches(change.old)
        # An object that moves into or out of a selector is ADDED or DELETED for that watch,
        # as the real watch cache reports it.
        if change.type == "DELETED":
            if now_in or was_in:
                self.queue.put_nowait(("DELETED", change.obj))
        elif change.type == "ADDED":
            if now_in:
                self.queue.put_nowait(("ADDED", change.obj))
        elif now_in and was_in:
            self.queue.put_nowait(("MODIFIED", change.obj))
        elif now_in:
            self.queue.put_nowait(("ADDED", change.obj))
        elif was_in:
            self.queue.put_nowait(("DELETED", change.obj))

    def close(self) -> None:
        self.queue.put_nowait(None)


class Store:
    def __init__(self, *, history_limit: int) -> None:
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self._history: deque[Change] = deque()
        self._history_limit = history_limit
        self._compacted_rv = 0
        self._rv = 0
        self._watchers: set[Watcher] = set()
        self._listeners: list[Callable[[Change], None]] = []

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def compacted_resource_version(self) -> int:
        """The newest resourceVersion whose change is no longer in the history."""
        return self._compacted_rv

    def next_resource_version(self) -> int:
        self._rv += 1
        return self._rv

    def get(self, resource_key: str, namespace: str, name: str) -> Obj | None:
        """The stored object itself: callers must copy before changing it."""
        return self._objects.get(resource_key, {}).get((namespace, name))

    def items(self, resource_key: str, namespace: str | None = None) -> list[Obj]:
        stored = self._objects.get(resource_key, {})
        keys = sorted(k for k in stored if namespace is None or k[0] == namespace)
        return [stored[k] for k in keys]

    def all_items(self) -> Iterator[tuple[str, Obj]]:
        for resource_key, stored in list(self._objects.items()):
            for obj in list(stored.values()):
                yield resource_key, obj

    def write(self, resource_key: str, obj: Obj, *, change_type: str) -> Obj:
        """Store a copy of `obj` with the next resourceVersion and notify watchers."""
        stored = copy.deepcopy(obj)
        rv = self.next_resource_version()
        stored["metadata"]["resourceVersion"] = str(rv)
        key = (stored["metadata"].get("namespace", ""), stored["metadata"]["name"])
        bucket = self._objects.setdefault(resource_key, {})
        old = bucket.get(key)
        bucket[key] = stored
        self._record(Change(rv, resource_key, change_type, stored, old))
        return stored

    def delete(self, resource_key: str, namespace: str, name: str) -> Obj | None:
        bucket = self._objects.get(resource_key, {})
        old = bucket.pop((namespace, name), None)
        if old is None:
            return None
        rv = self.next_resource_version()
        # The DELETED event carries the last state with a new resourceVersion, as the real
        # server sends it, so a watcher can resume after it.
        final = copy.deepcopy(old)
        final["metadata"]["resourceVersion"] = str(rv)
        self._record(Change(rv, resource_key, "DELETED", final, old))
        return final

    def _record(self, change: Change) -> None:
        self._history.append(change)
        while len(self._history) > self._history_limit:
            self._compacted_rv = self._history.popleft().resource_version
        for watcher in list(self._watchers):
            watcher.offer(change)
        for listener in list(self._listeners):
            listener(change)

    def changes_since(self, resource_version: int) -> list[Change]:
        return [c for c in self._history if c.resource_version > resource_version]

    def compact(self) -> None:
        """Drop the whole history, as an etcd compaction does."""
        if self._history:
            self._compacted_rv = self._history[-1].resource_version
        self._history.clear()

    def add_watcher(self, watcher: Watcher) -> None:
        self._watchers.add(watcher)

    def remove_watcher(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def close_watchers(self) -> None:
        for watcher in list(self._watchers):
            watcher.close()

    def add_listener(self, listener: Callable[[Change], None]) -> None:
        self._listeners.append(listener)
