"""API errors of the fake server, rendered as the real server renders them: a `Status` body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    """An error the fake answers with a `Status` object and an HTTP code."""

    def __init__(
        self,
        code: int,
        *,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def not_found(plural: str, name: str, *, group: str = "") -> ApiError:
    resource = f"{plural}.{group}" if group else plural
    return ApiError(
        404,
        reason="NotFound",
        message=f'{resource} "{name}" not found',
        details={"name": name, "group": group, "kind": plural},
    )


def already_exists(plural: str, name: str, *, group: str = "") -> ApiError:
    resource = f"{plural}.{group}" if group else plural
    return ApiError(
        409,
        reason="AlreadyExists",
        message=f'{resource} "{name}" already exists',
        details={"name": name, "group": group, "kind": plural},
    )


def conflict(plural: str, name: str, *, group: str = "") -> ApiError:
    resource = f"{plural}.{group}" if group else plural
    return ApiError(
        409,
        reason="Conflict",
        message=(
            f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again"
        ),
        details={"name": name, "group": group, "kind": plural},
    )


def invalid(kind: str, name: str, causes: list[tuple[str, str]], *, group: str = "") -> ApiError:
    """422 Invalid; `causes` are (field, message) pairs, as the real server lists them."""
    summary = ", ".join(f"{field}: {message}" for field, message in causes)
    return ApiError(
        422,
        reason="Invalid",
        message=f'{kind}.{group} "{name}" is invalid: {summary}'
        if group
        else f'{kind} "{name}" is invalid: {summary}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [
                {"reason": "FieldValueInvalid", "message": message, "field": field}
                for field, message in causes
            ],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, reason="BadRequest", message=message)


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    return ApiError(
        415,
        reason="UnsupportedMediaType",
        message=(
            f'the body of the request was in an unknown format "{content_type}" - accepted '
            f"media types include: {', '.join(accepted)}"
        ),
    )


def method_not_allowed(method: str) -> ApiError:
    return ApiError(
        405,
        reason="MethodNotAllowed",
        message=f"the server does not allow this method on the requested resource ({method})",
    )


def unauthorized() -> ApiError:
    """What the API server answers a missing, expired or unknown bearer token: no detail."""
    return ApiError(401, reason="Unauthorized", message="Unauthorized")


def expired(requested_rv: int, oldest_rv: int) -> ApiError:
    return ApiError(
        410,
        reason="Expired",
        message=f"too old resource version: {requested_rv} ({oldest_rv})",
    )


_FAULT_REASONS = {
    401: "Unauthorized",
    403: "Forbidden",
    409: "Conflict",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class Fault:
    """An error the server answers instead of serving matching requests (test hook)."""

    method: str | None
    path_contains: str
    code: int
    times: int
    retry_after_s: int | None = None
    # "error": answer with `code`; "disconnect": drop the connection without an answer;
    # "stall": send nothing for `stall_s` seconds, then drop it (a dead peer behind a NAT);
    # "drop_answer": carry the request out, then drop the connection before answering;
    # "slow_answer": carry the request out at once, answer `stall_s` seconds later;
    # "empty": answer 200 with no body at all
    action: str = "error"
    stall_s: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and self.path_contains in path

    def error(self) -> ApiError:
        reason = _FAULT_REASONS.get(self.code, "InternalError")
        return ApiError(self.code, reason=reason, message=f"injected fault: {reason}")
