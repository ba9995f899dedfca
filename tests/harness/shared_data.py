"""Locate the shared reference data (`../shared/data` beside the repository root).

CI clones the repository with `shared/` beside it, so tests read the real traces, CRDs and
metric samples from there at test time instead of copying them into the repository.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = (REPO_ROOT / ".." / "shared" / "data").resolve()


def shared_data_path(*parts: str) -> Path:
    """Path of a file under the shared data directory; raise if it is missing."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            f"shared data file {path} is missing; clone the repository with shared/ beside it"
        )
    return path
