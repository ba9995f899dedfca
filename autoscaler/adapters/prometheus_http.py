"""Calls to the Prometheus HTTP API with one deadline, one retry layer and error counts.

prometheus-api-client's `PrometheusConnect` defaults to no timeout and three urllib3
retries with a 1 s backoff, so one dead Prometheus could stall a tick for minutes. Here the
client's own retries are off and every request carries a timeout that ends at the caller's
deadline; the single retry below happens only while time is left. The calls block, so the
source runs them in threads (`asyncio.to_thread`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ReadTimeoutError
from urllib3.util.retry import Retry

from autoscaler.adapters.prometheus_auth import PrometheusCredentials, file_auth, session_for

log = logging.getLogger(__name__)

# Statuses worth a second try: Prometheus restarting, a proxy in front of it, overload.
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
RETRY_BACKOFF_S = 0.2
_STATUS = re.compile(r"HTTP Status Code (\d{3})")


# Each history read (a day of one demand query for the whole fleet, or the learned-capacity
# lookup) runs on a thread of its own, off the tick, so it may take longer than a tick's
# query: a day of 800 leaders takes about 9 s, past the tick's 7.5 s.
HISTORY_TIMEOUT_S = 60.0


class PrometheusSourceError(Exception):
    """Base of the Prometheus adapter's errors."""


class PrometheusUnavailable(PrometheusSourceError):
    """A query got no usable answer: `kind` is timeout, connection, http_4xx, http_5xx or
    bad_response."""

    def __init__(
        self, query_name: str, *, kind: str, detail: str, status: int | None = None
    ) -> None:
        super().__init__(f"{query_name}: {kind}: {detail}")
        self.query_name = query_name
        self.kind = kind
        self.detail = detail
        self.status = status  # the HTTP status of an error answer


@dataclass
class PrometheusStats:
    """Counts for the service's own metrics. Mutated by the source, read by the service."""

    queries_sent: int = 0  # HTTP requests, retries included
    last_tick_queries: int = 0  # HTTP requests of the last observe() call
    errors: Counter[str] = field(default_factory=Counter)  # by kind
    last_error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_query(self) -> None:
        with self._lock:
            self.queries_sent += 1

    def count_error(self, error: PrometheusUnavailable) -> None:
        with self._lock:
            self.errors[error.kind] += 1
            self.last_error = str(error)


# Called once per failed query, from the worker thread that ran it (or the event loop for
# a query that never answered): it must be thread-safe, as prometheus_client metrics are.
ErrorCallback = Callable[[PrometheusUnavailable], None]


_URL_IN_TEXT = re.compile(r" with url: \S+")


def _describe(err: Exception) -> str:
    """What went wrong, without the request's URL: urllib3 puts the whole URL, its query
    percent-encoded, before the cause, and cut at 300 characters the cause was never seen
    (`... &timeout=7286m (Caused by` and no more, for a refused connection or a bad CA)."""
    wrapped = err.args[0] if isinstance(err, requests.RequestException) and err.args else None
    reason = getattr(wrapped, "reason", None)
    if isinstance(reason, Exception):
        return str(reason)[:300]
    return _URL_IN_TEXT.sub("", str(err))[:300]


def _classify(err: Exception) -> tuple[str, int | None]:
    if isinstance(err, requests.Timeout):
        return "timeout", None
    if isinstance(err, requests.ConnectionError):
        # With urllib3 retries at 0, a read timeout arrives wrapped in MaxRetryError and
        # requests reports it as a ConnectionError; the wrapped reason tells them apart.
        reason = getattr(err.args[0], "reason", None) if err.args else None
        if isinstance(reason, ReadTimeoutError):
            return "timeout", None
        return "connection", None
    if isinstance(err, PrometheusApiClientException):
        # The client only says "HTTP Status Code 503 (b'...')"; the status is in the text.
        match = _STATUS.search(str(err))
        if match:
            status = int(match.group(1))
            return ("http_4xx" if status < 500 else "http_5xx"), status
        return "bad_response", None
    return "bad_response", None


# Bytes read at most per call while an answer's body comes in (whatever has arrived is
# taken at once, so a slow stream is checked against its deadline at every piece).
_BODY_CHUNK = 65_536


class AnswerDeadline(HTTPAdapter):
    """A transport whose timeout bounds the whole answer, not each read of it.

    requests applies its timeout to the connection and to every read of the socket, so a
    server that keeps sending a byte now and then (a proxy or query frontend streaming under
    load) holds the calling thread for as long as it goes on: the tick gives up on the
    query, the thread does not, and they pile up tick after tick. Here the body is read as
    it arrives and dropped, as a `ReadTimeout`, once the request's timeout has passed since
    it was sent: a read already waiting may still take one read timeout, so the answer
    takes at most twice the timeout. Headers sent as slowly are not bounded (requests reads
    them itself); the realistic case, a large body streamed slowly, is."""

    def send(  # type: ignore[override]
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        budget_s = timeout[1] if isinstance(timeout, tuple) else timeout
        sent = time.monotonic()
        response = super().send(request, stream=True, timeout=timeout, **kwargs)
        if stream or not isinstance(budget_s, int | float):  # None, or urllib3's Timeout
            if not stream:
                _ = response.content  # read now, as requests does without `stream`
            return response
        body = bytearray()
        try:
            while chunk := response.raw.read1(_BODY_CHUNK, decode_content=True):
                body += chunk
                if time.monotonic() - sent > budget_s:
                    raise requests.exceptions.ReadTimeout(
                        f"the whole answer took longer than {budget_s:g}s ({len(body)} "
                        "bytes so far)",
                        request=request,
                        response=response,
                    )
        except urllib3.exceptions.HTTPError as err:
            # as requests maps them when it reads a body: a cut or undecodable body is a bad
            # answer (not retried), a read that timed out a timeout
            response.close()
            raise _requests_error(err, request) from err
        except BaseException:
            response.close()
            raise
        response._content = bytes(body)
        response._content_consumed = True
        response.close()  # the body is read: the connection goes back to the pool
        return response


def _requests_error(
    err: urllib3.exceptions.HTTPError, request: requests.PreparedRequest
) -> requests.RequestException:
    if isinstance(err, urllib3.exceptions.ReadTimeoutError):
        return requests.exceptions.ReadTimeout(err, request=request)
    if isinstance(err, urllib3.exceptions.DecodeError):
        return requests.exceptions.ContentDecodingError(err, request=request)
    if isinstance(err, urllib3.exceptions.ProtocolError):
        return requests.exceptions.ChunkedEncodingError(err, request=request)
    if isinstance(err, urllib3.exceptions.SSLError):
        return requests.exceptions.SSLError(err, request=request)
    return requests.exceptions.ConnectionError(err, request=request)


class PrometheusHttp:
    """A `PrometheusConnect` with retries off, a per-call deadline and one retry of our own."""

    def __init__(
        self,
        *,
        url: str,
        timeout_s: float,
        retries: int = 1,
        credentials: PrometheusCredentials | None = None,
        stats: PrometheusStats | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        """Raises PrometheusCredentialsError when a token, password or CA file of
        `credentials` cannot be read: a configuration error, found at start."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.retries = retries
        self.stats = stats if stats is not None else PrometheusStats()
        self._on_error = on_error
        # total=0: the client must not retry behind our back; raise_on_status=False lets a
        # 5xx come back as a response so its status is reported.
        no_retry = Retry(total=0, raise_on_status=False, raise_on_redirect=False)
        credentials = credentials if credentials is not None else PrometheusCredentials()
        session = session_for(credentials)
        self._client = PrometheusConnect(
            url=url.rstrip("/"),
            headers=dict(credentials.headers) or None,
            retry=no_retry,
            timeout=timeout_s,
            auth=file_auth(credentials),  # typed as a tuple, but any requests auth works
            session=session,
        )
        # PrometheusConnect mounted a plain HTTPAdapter (with `no_retry`) for the URL; the
        # same, bounding whole answers, replaces it.
        session.mount(url.rstrip("/"), AnswerDeadline(max_retries=no_retry))
        log.info("prometheus %s: %s", url, credentials.describe())

    def close(self) -> None:
        self._client.close()

    def instant(
        self,
        name: str,
        query: str,
        *,
        deadline: float,
        on_send: Callable[[], None] | None = None,
    ) -> list[dict[str, Any]]:
        """`/api/v1/query` answer (the result list), or PrometheusUnavailable.

        `deadline` is a `time.monotonic()` value; no request outlives it. `on_send` is
        called for every request sent (retries included), for the caller's own count.
        """
        return self._call(
            name,
            deadline,
            lambda timeout_s: self._client.custom_query(
                query, params={"timeout": f"{max(1, int(timeout_s * 1000))}ms"}, timeout=timeout_s
            ),
            on_send=on_send,
        )

    def range(
        self, name: str, query: str, *, start_s: float, end_s: float, step_s: float, deadline: float
    ) -> list[dict[str, Any]]:
        """`/api/v1/query_range` answer (the matrix), or PrometheusUnavailable."""
        start = datetime.fromtimestamp(start_s, tz=UTC)
        end = datetime.fromtimestamp(end_s, tz=UTC)
        return self._call(
            name,
            deadline,
            lambda timeout_s: self._client.custom_query_range(
                query,
                start_time=start,
                end_time=end,
                step=f"{step_s:g}",
                # Thanos and Cortex answer a query some of their stores failed with the rest
                # and a warning, which this client drops: a history of half the leaders,
                # taken as the whole. Refused instead, the chunk fails and says so.
                # Prometheus ignores the parameter. (The tick's instant queries keep partial
                # answers: a leader missing from one holds its component alone.)
                params={
                    "timeout": f"{max(1, int(timeout_s * 1000))}ms",
                    "partial_response": "false",
                },
                timeout=timeout_s,
            ),
        )

    def _call(
        self,
        name: str,
        deadline: float,
        send: Callable[[float], Any],
        *,
        on_send: Callable[[], None] | None = None,
    ) -> list[dict[str, Any]]:
        attempt = 0
        while True:
            # The caller's deadline bounds every request: the tick's queries get
            # `timeout_s`, history reads (back-fill, capacity restore) `HISTORY_TIMEOUT_S`.
            timeout_s = deadline - time.monotonic()
            if timeout_s <= 0:
                error = PrometheusUnavailable(name, kind="timeout", detail="deadline passed")
                break
            self.stats.count_query()
            if on_send is not None:
                on_send()
            try:
                result = send(timeout_s)
            except (
                requests.RequestException,
                PrometheusApiClientException,
                ValueError,  # a 200 whose body is not JSON
                KeyError,  # JSON without data.result
            ) as err:
                kind, status = _classify(err)
                detail = _describe(err)
                if isinstance(err, requests.exceptions.InvalidHeader) or (
                    isinstance(err, ValueError) and "header value" in str(err)  # http.client
                ):
                    # its message quotes the header's value, a credential perhaps (a token
                    # file with a line break in it), and goes to the log and /decisions
                    detail = (
                        "a header value requests refuses (leading whitespace or a line "
                        "break; the value is not shown): check the token file and headers"
                    )
                error = PrometheusUnavailable(name, kind=kind, detail=detail, status=status)
                error.__cause__ = err
                retryable = kind == "connection" or status in RETRYABLE_STATUSES
                if retryable and attempt < self.retries:
                    attempt += 1
                    if deadline - time.monotonic() > RETRY_BACKOFF_S:
                        time.sleep(RETRY_BACKOFF_S)
                        continue
                break
            if not isinstance(result, list):
                error = PrometheusUnavailable(
                    name, kind="bad_response", detail=f"expected a result list, got {result!r:.80}"
                )
                break
            return result
        self.report(error)
        raise error

    def report(self, error: PrometheusUnavailable) -> None:
        """Count an error and pass it to the service's callback."""
        self.stats.count_error(error)
        if self._on_error is not None:
            self._on_error(error)
