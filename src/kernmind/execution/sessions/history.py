"""A stored session's history: every ``run_code`` call and its result, for ``export_notebook``.

Design: one JSON line per call in ``<session home>/history.jsonl`` (outside the working
directory: sandboxed code cannot reach it), the result as run_code built it (under its budgets).
At most ``MAX_ENTRIES`` calls and ``MAX_BYTES`` bytes: past either, the file is rewritten with
the newest half. Through ``diskio``: a failed append is cut back off (never half a line), a trim
replaces the file whole, a link, directory or FIFO is neither followed nor waited on.

Error policy: history is a convenience; a failure to write it is logged and returned (the
call adds a note), never raised into the call. Lines that do not parse are skipped when read;
an unreadable history reads as empty.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from kernmind.diskio import append_line, read_file, write_file
from kernmind.execution.results import RunResult

log = logging.getLogger(__name__)

MAX_ENTRIES = 500
MAX_BYTES = 64 * 1024 * 1024


# (size, lines) of each history file as our last write left it: the next append counts on from
# there instead of reading the whole file again (up to MAX_BYTES) after every call.
_lines_after_write: dict[Path, tuple[int, int]] = {}


def record(path: Path, code: str, result: RunResult) -> OSError | None:
    """Append one call (blocking: call it off the event loop); the error when it could not."""
    line = json.dumps({"code": code, "result": result.model_dump(mode="json", by_alias=True)}) + "\n"
    try:
        before, size = append_line(path, line.encode())
        known = _lines_after_write.pop(path, None)
        lines = known[1] + 1 if known is not None and known[0] == before else _count_lines(path)
        if size > MAX_BYTES or lines > MAX_ENTRIES:
            _trim(path)
        else:
            _lines_after_write[path] = (size, lines)
            while len(_lines_after_write) > 1024:
                _lines_after_write.pop(next(iter(_lines_after_write)))
    except OSError as exc:
        log.warning("could not record the call in %s: %s", path, exc)
        return exc
    return None


def read(path: Path) -> list[dict[str, Any]]:
    """The recorded calls, oldest first (``code`` and ``result``)."""
    entries: list[dict[str, Any]] = []
    for line in _lines(path):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("result"), dict):
            entries.append(entry)
    return entries


def _lines(path: Path) -> list[bytes]:
    try:
        return read_file(path, 2 * MAX_BYTES).splitlines(keepends=True)
    except OSError:
        return []


def _count_lines(path: Path) -> int:
    return len(_lines(path))


def _trim(path: Path) -> None:
    """Keep the newest half of the budget (by count and bytes)."""
    lines = _lines(path)
    kept: list[bytes] = []
    size = 0
    for line in reversed(lines):
        if len(kept) >= MAX_ENTRIES // 2 or size + len(line) > MAX_BYTES // 2:
            break
        kept.append(line)
        size += len(line)
    write_file(path, b"".join(reversed(kept)))
