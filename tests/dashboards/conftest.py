"""Load the dashboards and pull every PromQL expression out of them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARD_DIR.glob("*.json"))

# What the test substitutes for Grafana's variables: a 1 s scrape interval in the test
# Prometheus makes 4 s the smallest window `rate()` can always fill (Grafana's own rule:
# at least four scrape intervals).
RATE_INTERVAL = "4s"
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$", re.S)


def load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression of a dashboard and where it sits."""

    dashboard: str
    where: str  # "panel 3 (Partial gangs) A", "annotation ...", "variable ..."
    expr: str
    grouped_by_component: bool


def queries(path: Path) -> list[Query]:
    """Every query: panel targets, Prometheus annotations, and variables (label_values(...)
    rewritten to the PromQL Grafana runs for it)."""
    board = load(path)
    found: list[Query] = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append(
                Query(
                    path.name,
                    f"panel {panel['id']} ({panel['title']}) {target['refId']}",
                    target["expr"],
                    "{{component}}" in target.get("legendFormat", ""),
                )
            )
    for annotation in board["annotations"]["list"]:
        if "expr" in annotation:
            found.append(
                Query(path.name, f"annotation {annotation['name']}", annotation["expr"], True)
            )
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.match(variable["query"]["query"])
        assert match, f"{path.name} variable {variable['name']}: only label_values() is used"
        expr = f"group by ({match['label']}) ({match['selector']})"
        found.append(Query(path.name, f"variable {variable['name']}", expr, False))
    return found


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana variables the way Grafana does; unknown `$name`s (like label_replace's
    `$1`) are left alone, as Grafana leaves them."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return _VARIABLE.sub(replace, expr)


def variable_names(expr: str) -> set[str]:
    """Grafana variables an expression uses; `$1`-style regex references are not variables."""
    names = {m.group(1) or m.group(2) for m in _VARIABLE.finditer(expr)}
    return {name for name in names if not name.isdigit()}
