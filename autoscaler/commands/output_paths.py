"""Output paths checked before a long run, so that a bad one fails at once, not after it.

Missing directories are created, as the writers would create them. Writability is tested
by opening for writing, never by permission bits, which say nothing for root or on a
read-only mount; an existing file is opened to append, so it is left as it was.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
from pathlib import Path

EXIT_BAD_INPUT = 2


def cannot_write(command: str, path: Path, err: OSError) -> int:
    """Say that `path` cannot be written, on stderr; the exit code of a bad input."""
    print(f"gang-autoscaler {command}: cannot write {path}: {err.strerror or err}", file=sys.stderr)
    return EXIT_BAD_INPUT


def ensure_writable_file(path: Path) -> None:
    """Raise OSError unless a file can be written at `path`."""
    _make_directory(path.parent)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if path.exists():
        with path.open("a"):
            pass
    else:
        _try_writing_in(path.parent)


def ensure_writable_directory(path: Path) -> None:
    """Raise OSError unless `path` is, or can be made, a directory files can be written in."""
    _make_directory(path)
    _try_writing_in(path)


def _make_directory(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as err:  # "File exists" would not say that it is not a directory
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path)) from err


def _try_writing_in(directory: Path) -> None:
    with tempfile.TemporaryFile(dir=directory):
        pass
