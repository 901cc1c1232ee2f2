"""JSON and JSON-lines files of a run folder: lines appended as things happen and read back
tolerantly; whole files replaced atomically.

Writers flush every line, so a run that dies keeps every line written before; a writer killed
mid-line leaves a torn last line, which readers skip. A whole JSON file that another process may
read while it is written (the controller's plan, the replicas' stagger) goes through
``write_json_atomic``, so a reader sees the old file or the new one, never a half.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any, TextIO

from testbed.errors import SpecError


def read_jsonl(path: Path, pattern: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``path`` (or of every file matching ``pattern`` inside the folder ``path``, in
    name order), skipping lines that are not a JSON object (a torn last line). A missing file or
    folder has no rows."""
    files = sorted(path.glob(pattern)) if pattern is not None else [path]
    rows = []
    for f in files:
        try:
            text = f.read_text()
        except (FileNotFoundError, NotADirectoryError):
            continue
        rows += _objects(text.splitlines())
    return rows


def _objects(lines: list[str] | list[bytes]) -> list[dict[str, Any]]:
    """The lines that are JSON objects, parsed (a torn or foreign line is skipped)."""
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in ``path``, a file written by the testbed. Raises SpecError naming the
    file, what is wrong with it (unreadable, not JSON, not an object) and ``fix``."""
    try:
        obj = json.loads(path.read_text())
    except OSError as e:
        raise SpecError(str(path), "(file)", str(path), f"cannot be read ({e.strerror})", fix) from None
    except ValueError as e:
        raise SpecError(str(path), "(file)", path.name, f"is not valid JSON ({e})", fix) from None
    if not isinstance(obj, dict):
        raise SpecError(str(path), "(top level)", type(obj).__name__, "is not a JSON object", fix)
    return obj


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file beside it and a rename (atomic
    on one file system, POSIX ``rename(2)``): a concurrent reader never sees a partial file."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only there when writing it failed


def open_jsonl(path: Path) -> TextIO:
    """``path`` opened for appending one line at a time (line-buffered: each line reaches the file
    when written), its folder made if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a", buffering=1)


def write_row(f: TextIO, row: dict[str, Any]) -> None:
    """Append one row as one line."""
    f.write(json.dumps(row) + "\n")


class JsonlFollower:
    """Follows a JSON-lines file another thread or process appends to: each ``new_rows`` returns the
    rows of the complete lines appended since the last call (a line still being written waits for
    the next call; a line that is not a JSON object is skipped). A file not there yet has none.
    ``events``: only lines whose ``event`` is one of these are parsed and returned, picked by
    their text as ``write_row`` writes it (a busy log, the grants' ``shaping.jsonl``, costs its
    followers a substring search per line rather than a parse)."""

    def __init__(self, path: Path, events: Collection[str] | None = None) -> None:
        self.path = path
        self.offset = 0
        self.marks = None if events is None else [json.dumps({"event": e})[1:-1].encode() for e in events]

    def new_rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = complete.splitlines()
        if self.marks is not None:
            lines = [line for line in lines if any(m in line for m in self.marks)]
        return _objects(lines)
