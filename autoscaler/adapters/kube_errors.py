"""The exception family of the Kubernetes adapter.

Every failure that leaves the adapter is a `KubeAdapterError`, chained to the client error
that caused it, so the service can hold one component and carry on with the others.
"""

from __future__ import annotations

import json

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

# What one Kubernetes API call can fail with: an error answer (`ApiException`), or no answer
# at all (a refused or dropped connection, a client-side timeout), which kubernetes-asyncio
# lets through from aiohttp as it is. Every call site catches both.
API_CALL_ERRORS: tuple[type[Exception], ...] = (ApiException, aiohttp.ClientError, TimeoutError)


def status_of(err: Exception) -> int | None:
    """The HTTP status of a failed call; None when no answer came back."""
    return err.status if isinstance(err, ApiException) else None


def describe(err: Exception) -> str:
    """One line for a failed call: `409 Conflict`, or `no answer (ServerDisconnectedError)`.
    A refusal (4xx) carries the API server's message, which names what to fix (RBAC's
    "cannot patch resource ... in the namespace ...", a missing namespace)."""
    if isinstance(err, ApiException):
        status = err.status if isinstance(err.status, int) else 0
        if 400 <= status < 500 and err.body:
            return f"{err.status} {err.reason}: {status_message(err.body)}"
        return f"{err.status} {err.reason}"
    detail = str(err)
    return f"no answer ({type(err).__name__}{': ' + detail if detail else ''})"


def status_message(body: bytes) -> str:
    """The `message` of an API server's Status answer (e.g. RBAC's "pods is forbidden: User
    ... cannot list resource ..."), else the start of the body: one readable line for an
    answer read without the client's own error handling (`_preload_content=False`)."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message)[:300] if message else repr(body[:200])


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
