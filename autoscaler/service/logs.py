"""Logging of `gang-autoscaler run`: one JSON object per line, or plain text.

Set up once by `run_service`, never on import. Fields passed with `extra=` (the decision's
component, gangs and reason) become keys of the JSON object, so a log pipeline can filter
on `reason` without parsing the message; in text mode they are left to the message, which
already says the same in words.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(log_format: str, *, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    # The HTTP access log and the client libraries' debug chatter are not decisions.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # The elector logs every failed Lease try at ERROR (a traceback for a failed create),
    # every 2 s; the service's Lease lock says each cause once, with what to fix.
    logging.getLogger("kubernetes_asyncio.leaderelection").setLevel(logging.CRITICAL)
