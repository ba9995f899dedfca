"""One line per problem in a pydantic `ValidationError`, named as the reader wrote it.

The service's settings, the simulator's configuration and `check`'s flags are pydantic
models; their users wrote a YAML key, an environment variable or a flag, not a model, so the
errors name the setting (or the flag given for it) and leave out pydantic's type codes and
documentation links.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError


def refuse_yes_or_no(value: Any) -> Any:
    """A before-validator for a number: pydantic reads YAML's `true` as 1 (`step_s: true`
    ran 1 s steps, `http_port: true` served on port 1)."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is a yes/no; a number is expected here")
    return value


def describe_validation_error(
    err: ValidationError, *, names: Mapping[str, str] | None = None
) -> str:
    """Indented `where: what` lines. `names` renames a dotted location (e.g. `step_s` to
    `--step`) where the value came from a flag."""
    lines = []
    for error in err.errors():
        where = ".".join(str(part) for part in error["loc"]) or "settings"
        where = (names or {}).get(where, where)
        if error["type"] == "extra_forbidden":
            message = "unknown setting"
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)
