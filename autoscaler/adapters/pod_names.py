"""LeaderWorkerSet pod names: `<lws>-<group>` for a leader, `<lws>-<group>-<worker>` for a worker.

Prometheus only knows pods by `namespace` and `pod` labels, so series are mapped back to LWS
groups by name. LWS names may themselves contain dashes and digits (`llama-3-70b`), so a
name is parsed against the known LWS names of its namespace rather than split blindly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PodIdentity:
    namespace: str
    lws: str
    group_index: int
    worker_index: int  # 0 for the leader

    @property
    def is_leader(self) -> bool:
        return self.worker_index == 0


def leader_pod_name(lws: str, group_index: int) -> str:
    return f"{lws}-{group_index}"


def parse_index(text: str) -> int | None:
    """A group or worker index as LWS writes it in pod names, else None."""
    # LWS formats indexes as plain decimal; "01" or "+1" is some other pod.
    if text.isdigit() and text.isascii() and str(int(text)) == text:
        return int(text)
    return None


class PodNameIndex:
    """Resolve pod names to (LWS, group, worker) against a known set of LWS names."""

    def __init__(self, lws_names: Iterable[tuple[str, str]]) -> None:
        """`lws_names`: (namespace, LWS name) pairs."""
        self._known = frozenset(lws_names)

    def resolve(self, namespace: str, pod: str) -> PodIdentity | None:
        """The pod's identity, or None when it belongs to no known LWS.

        The longest LWS name wins. `a-2-1` with LWS `a` and `a-2` both known is read as the
        leader of group 1 of `a-2`, not worker 1 of group 2 of `a`: the name alone cannot
        tell them apart, and a leader is the only pod whose series the source reads.
        """
        parts = pod.split("-")
        if len(parts) >= 2:
            group = parse_index(parts[-1])
            lws = "-".join(parts[:-1])
            if group is not None and (namespace, lws) in self._known:
                return PodIdentity(namespace, lws, group, 0)
        if len(parts) >= 3:
            group, worker = parse_index(parts[-2]), parse_index(parts[-1])
            lws = "-".join(parts[:-2])
            if (
                group is not None
                and worker is not None
                and worker >= 1
                and (namespace, lws) in self._known
            ):
                return PodIdentity(namespace, lws, group, worker)
        return None
