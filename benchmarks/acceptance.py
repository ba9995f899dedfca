"""The simulator's acceptance table from `simulate --json` results, one row per trace.

Run from the repository root after `benchmarks/simulate_all.sh OUT_DIR`:

    python benchmarks/acceptance.py OUT_DIR

For each `OUT_DIR/<trace>.json`, in the order `simulate_all.sh` writes them (any other
trace after, by name), the `gang` policy against the criteria the simulator is held to:
SLO attainment at least 99 %, GPU-hours at most 1.3x `oracle`'s and under `static`'s, SLO
attainment above `reactive`'s, and no partial-gang GPU-hours. Where `reactive` missed no
request, no policy can beat it and the cell says so. Prints a Markdown table (the one in
docs/results.md); exits 1 if a cell fails, 2 if there is nothing to read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIN_SLO = 0.99
MAX_OVER_ORACLE = 1.3
# simulate_all.sh's order
TRACE_ORDER = (
    "builtin",
    "azure-conv",
    "azure-code",
    "azure-conv-1s",
    "azure-code-1s",
    "mooncake",
    "servegen-mm-image",
    "servegen-m-small",
    "servegen-m-mid",
)
HEADER = (
    "| trace | SLO >= 99% | GPU-h <= 1.3x oracle | GPU-h < static | SLO > reactive "
    "| no partial gangs |\n|---|---|---|---|---|---|"
)


@dataclass(frozen=True, slots=True)
class Cell:
    holds: bool
    shown: str

    def __str__(self) -> str:
        return f"{'yes' if self.holds else '**no**'} ({self.shown})"


def judge(policies: Mapping[str, Mapping[str, Any]]) -> list[Cell]:
    """The five cells of one trace from its `policies` results (DESIGN section 8 JSON)."""
    gang, oracle = policies["gang"], policies["oracle"]
    static, reactive = policies["static"], policies["reactive"]
    slo, gpu_hours = gang["slo_attainment"], gang["gpu_hours"]
    over_oracle = gpu_hours / oracle["gpu_hours"]
    beat = reactive["slo_attainment"]
    partial = gang["partial_gang_gpu_hours"]
    return [
        Cell(slo >= MIN_SLO, f"{slo:.2%}"),
        Cell(over_oracle <= MAX_OVER_ORACLE, f"{over_oracle:.2f}x"),
        Cell(gpu_hours < static["gpu_hours"], f"{gpu_hours:.0f} vs {static['gpu_hours']:.0f}"),
        Cell(
            slo > beat,
            f"{beat:.2%}" + (", missed none: at most a tie" if beat >= 1.0 else ""),
        ),
        Cell(partial == 0, f"{partial:.2f}"),
    ]


def table(results: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> tuple[str, bool]:
    """The Markdown table for `results` (trace -> policies), and whether every cell holds."""
    rows, every = [HEADER], True
    for trace, policies in results.items():
        cells = judge(policies)
        every = every and all(c.holds for c in cells)
        rows.append(f"| {trace} | " + " | ".join(map(str, cells)) + " |")
    return "\n".join(rows), every


def read_results(directory: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """`<trace>.json` files of `directory`, keyed by trace, in simulate_all.sh's order."""
    found = {path.stem: path for path in directory.glob("*.json")}
    order = [t for t in TRACE_ORDER if t in found] + sorted(set(found) - set(TRACE_ORDER))
    results = {}
    for trace in order:
        try:
            results[trace] = json.loads(found[trace].read_text(encoding="utf-8"))["policies"]
        except (OSError, ValueError, KeyError) as err:
            raise SystemExit(f"{found[trace]}: not a simulate --json result ({err})") from err
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="where simulate_all.sh wrote its JSON")
    args = parser.parse_args(argv)
    results = read_results(args.directory)
    if not results:
        print(f"acceptance: no <trace>.json in {args.directory}", file=sys.stderr)
        return 2
    text, every = table(results)
    print(text)
    return 0 if every else 1


if __name__ == "__main__":
    sys.exit(main())
