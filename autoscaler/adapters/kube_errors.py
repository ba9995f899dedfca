"""The exception family of the Kubernetes adapter.

Every failure that leaves the adapter is a `KubeAdapterError`, chained to the client error
that caused it, so the service can hold one component and carry on with the others.
"""

from __future__ import annotations


class KubeAdapterError(Exception):
    """Base of every error raised by the Kubernetes adapter."""


class KubeConfigError(KubeAdapterError):
    """No usable cluster configuration (kubeconfig or in-cluster service account)."""


class KubeApiError(KubeAdapterError):
    """A Kubernetes API call failed; `status` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotLeader(KubeAdapterError):
    """A write was attempted by an instance that does not hold the leader Lease."""


class BalloonShapeError(KubeAdapterError):
    """A balloon pod manifest cannot be built for an LWS (e.g. a name too long for a label)."""
